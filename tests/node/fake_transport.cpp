#include "fake_transport.hpp"

#include <cstring>
#include <future>

namespace kvnode::node::fake {
namespace {

template <class T>
std::future<T> ready(T value) {
  std::promise<T> p;
  p.set_value(std::move(value));
  return p.get_future();
}

class FakeTransport final : public transfer::PeerTransport {
 public:
  FakeTransport(FakeNetwork& network, std::string url) : network_(network), url_(std::move(url)) {}
  std::string url() const override { return url_; }
  std::future<transfer::TransferResult> pull(const std::string& peer,
                                             std::vector<transfer::PageCopy> pages,
                                             transfer::TransferOptions) override {
    return ready(network_.copy(url_, peer, Kind::kPull, pages));
  }
  std::future<transfer::TransferResult> push(const std::string& peer,
                                             std::vector<transfer::PageCopy> pages,
                                             transfer::TransferOptions) override {
    return ready(network_.copy(url_, peer, Kind::kPush, pages));
  }
  std::future<Result<std::vector<std::byte>>> ask(const std::string& peer,
                                                  std::vector<std::byte> request,
                                                  transfer::TransferOptions) override {
    return ready(network_.ask(url_, peer, request));
  }

 private:
  FakeNetwork& network_;
  std::string url_;
};

}  // namespace

void FakeNetwork::add(const std::string& url, gpu::ChunkPool& pool, AskHandler on_ask) {
  std::lock_guard lock(mutex_);
  nodes_[url] = Node{&pool, std::move(on_ask), false};
}

void FakeNetwork::set_down(const std::string& url, bool down) {
  std::lock_guard lock(mutex_);
  nodes_.at(url).down = down;
}

std::unique_ptr<transfer::PeerTransport> FakeNetwork::transport(const std::string& url) {
  return std::make_unique<FakeTransport>(*this, url);
}

std::size_t FakeNetwork::calls(Kind kind) const {
  std::lock_guard lock(mutex_);
  const auto it = per_kind_.find(kind);
  return it == per_kind_.end() ? 0 : it->second;
}

Fault FakeNetwork::begin(Call& call, Node* node_out, bool* reachable) {
  {
    std::lock_guard lock(mutex_);
    call.nth = calls_++;
    ++per_kind_[call.kind];
  }
  // The hook runs unlocked: it may freeze a node, evict a chunk, or take a peer down.
  Fault f = fault ? fault(call) : Fault{};
  std::lock_guard lock(mutex_);
  const auto it = nodes_.find(call.to);
  *reachable = it != nodes_.end() && !it->second.down && f.what != Fault::What::kUnreachable;
  if (it != nodes_.end()) *node_out = it->second;
  return f;
}

transfer::TransferResult FakeNetwork::copy(const std::string& from, const std::string& to,
                                           Kind kind,
                                           const std::vector<transfer::PageCopy>& pages) {
  transfer::TransferResult r;
  r.done.assign(pages.size(), 0);
  Call call{from, to, kind, 0, {}, pages.size()};
  Node peer, self;
  bool reachable = false;
  const Fault f = begin(call, &peer, &reachable);
  {
    std::lock_guard lock(mutex_);
    if (const auto it = nodes_.find(from); it != nodes_.end()) self = it->second;
  }
  if (!reachable || !self.pool) {
    r.failure = transfer::Failure::kPeerLost;
    r.message = to + " is unreachable";
    return r;
  }
  const bool partial = f.what == Fault::What::kPartial;
  for (std::size_t i = 0; i < pages.size(); ++i) {
    const bool arrives =
        !partial || (f.arrive.empty() ? i < f.done : i < f.arrive.size() && f.arrive[i]);
    if (!arrives) continue;
    std::byte* local = self.pool->page(pages[i].local);
    std::byte* remote = peer.pool->page(pages[i].remote);
    if (!local || !remote || self.pool->page_bytes() != peer.pool->page_bytes()) {
      r.failure = transfer::Failure::kInvalid;
      r.message = "a page outside a pool";
      return r;
    }
    if (kind == Kind::kPush)
      std::memcpy(remote, local, peer.pool->page_bytes());
    else
      std::memcpy(local, remote, self.pool->page_bytes());
    r.done[i] = 1;
    r.stats.bytes += peer.pool->page_bytes();
    ++r.stats.chunks;
  }
  if (partial) {
    r.failure = transfer::Failure::kPeerLost;
    r.message = "the peer was lost mid-transfer";
  } else if (f.what == Fault::What::kAnswerLost) {
    r.done.assign(pages.size(), 0);
    r.stats = {};
    r.failure = transfer::Failure::kTimeout;
    r.message = "no completion before the deadline";
  }
  return r;
}

Result<std::vector<std::byte>> FakeNetwork::ask(const std::string& from, const std::string& to,
                                                const std::vector<std::byte>& request) {
  Call call{from, to, Kind::kAsk, 0, request, 0};
  Node peer;
  bool reachable = false;
  const Fault f = begin(call, &peer, &reachable);
  if (!reachable) return make_error(ErrorCode::kPeerLost, to + " is unreachable");
  if (!peer.on_ask) return make_error(ErrorCode::kRefused, "the peer answers no asks");
  Result<std::vector<std::byte>> answer = peer.on_ask(from, request);
  if (f.what == Fault::What::kAnswerLost)
    return make_error(ErrorCode::kDeadline, "no answer before the deadline");
  return answer;
}

std::optional<peer::Op> op_of(const Call& call) {
  if (call.kind != Kind::kAsk) return std::nullopt;
  Result<peer::Request> r = peer::decode_request(call.request);
  if (!r) return std::nullopt;
  return peer::op_of(*r);
}

std::function<Fault(const Call&)> at(Kind kind, std::size_t n, Fault f,
                                     std::optional<peer::Op> op) {
  auto seen = std::make_shared<std::size_t>(0);
  return [=](const Call& call) {
    if (call.kind != kind || (op && op_of(call) != op)) return Fault{};
    return (*seen)++ == n ? f : Fault{};
  };
}

std::vector<std::byte> pattern(ChunkHash h, std::size_t size) {
  std::vector<std::byte> b(size);
  const std::uint64_t base = static_cast<std::uint64_t>(h) * 7;
  for (std::size_t i = 0; i < size; ++i) b[i] = static_cast<std::byte>((base + i) & 0xff);
  return b;
}

FakeNode::FakeNode(FakeNetwork& network, std::string u, std::size_t pages, PeerMovesOptions options,
                   std::chrono::milliseconds ttl)
    : url(std::move(u)),
      pool(make_pool(pages)),
      store(pool, "LocalCPUBackend",
            [this](const StoreEvent& e) {
              if (e.kind == StoreEvent::Kind::kAdmit) ++admits;
            }),
      engine(store, engine_options()),
      service(engine, service_options(ttl)),
      transport(network.transport(url)),
      moves(engine, *transport, hooked(std::move(options))) {
  network.add(url, pool, [this](const std::string& peer, std::span<const std::byte> request) {
    return service.on_ask(peer, request);
  });
}

bool FakeNode::put(ChunkHash h) {
  return engine.put(h, pattern(h)).ok();
}

bool FakeNode::intact(ChunkHash h) {
  std::vector<std::byte> out(kPageBytes);
  Result<std::size_t> got = engine.get(h, out);
  return got && *got == kPageBytes && out == pattern(h);
}

EngineOptions FakeNode::engine_options() {
  EngineOptions o;
  o.hashing.chunk_size = kTokensPerChunk;
  return o;
}

gpu::ChunkPool FakeNode::make_pool(std::size_t pages) {
  gpu::PoolOptions o;
  o.page_bytes = kPageBytes;
  o.pages = pages;
  return std::move(gpu::ChunkPool::create(o)).value();
}

PeerServiceOptions FakeNode::service_options(std::chrono::milliseconds ttl) {
  PeerServiceOptions o;
  o.ttl = ttl;
  o.before_reserve = [this](ChunkHash h) {
    if (before_reserve) before_reserve(h);
  };
  return o;
}

PeerMovesOptions FakeNode::hooked(PeerMovesOptions o) {
  o.on_move_state = [this](MoveState s) {
    if (on_move_state) on_move_state(s);
  };
  o.on_retrieve_state = [this](RetrieveState s) {
    if (on_retrieve_state) on_retrieve_state(s);
  };
  return o;
}

}  // namespace kvnode::node::fake
