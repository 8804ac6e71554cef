#include "kvnode/client/local_client.hpp"

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <optional>

#include "kvnode/client/local_protocol.hpp"
#include "kvnode/common/unique_fd.hpp"
#include "shared_staging.hpp"
#include "unix_socket.hpp"

namespace kvnode::client {
namespace {

// The same error (its code kept) with what the call had done before it.
Error with_stored(Error e, std::size_t stored) {
  e.message += " (" + std::to_string(stored) + " chunks stored before)";
  return e;
}

}  // namespace

// One call at a time per client (local_client.hpp): a second call at the same time would share the
// connection and the staging slots (wrong answers, timeouts), so it is refused at once.
class OneCall {
 public:
  explicit OneCall(std::atomic<bool>& busy)
      : busy_(busy), mine_(!busy.exchange(true, std::memory_order_acquire)) {}
  ~OneCall() {
    if (mine_) busy_.store(false, std::memory_order_release);
  }
  OneCall(const OneCall&) = delete;
  OneCall& operator=(const OneCall&) = delete;
  explicit operator bool() const { return mine_; }
  static Error refused() {
    return Error{ErrorCode::kInvalid,
                 "busy: one call at a time per client (another thread's call on this client is "
                 "in progress; use a client per thread)"};
  }

 private:
  std::atomic<bool>& busy_;
  bool mine_;
};

struct LocalClient::Impl {
  std::atomic<bool> busy{false};  // a call is in progress (one at a time per client)
  std::string path;
  LocalClientOptions options;
  UniqueFd socket;  // invalid between a broken connection and the next call
  NodeInfo info;
  std::optional<detail::SharedStaging> pool;
  std::size_t slots = 0;  // chunks per shared-memory round trip
  // KV registrations by the id this client answered: the request (registered again on every new
  // connection, for the node forgets them with the old one), the caller's descriptors it
  // carries, and the node's id on the current connection.
  struct Registered {
    protocol::Request request;
    std::vector<int> fds;
    std::uint64_t node_id = 0;
  };
  std::map<std::uint64_t, Registered> registrations;
  std::uint64_t next_registration = 1;

  // One request, one reply, within the timeout. A connection that failed (timed out, closed,
  // answered garbage) is dropped: a late reply must never answer the next request. A new
  // connection first asks the node for its geometry again: a node restarted since has a new
  // staging region (same name, new memory) that must be mapped again. A kept connection the node
  // closed meanwhile (it restarted, or cut us) is replaced before use; and when the request
  // cannot be sent on a kept connection (it closed just now), it was never delivered: it goes
  // once more on a new connection, within the same deadline. Never once it went out: the node
  // may have acted on it.
  Result<protocol::Reply> call(const protocol::Request& q, std::span<const int> fds = {}) {
    // The node's decoder refuses longer arrays; said here, by name, before anything is sent.
    for (const auto& [name, n] :
         {std::pair{"tokens", q.tokens.size()}, std::pair{"hashes", q.hashes.size()}})
      if (n > protocol::kMaxKeys)
        return make_error(ErrorCode::kInvalid, std::string(name) + ": " + std::to_string(n) +
                                                   " in one request; a request carries at most " +
                                                   std::to_string(protocol::kMaxKeys) +
                                                   " (split it)");
    const auto deadline = detail::Clock::now() + options.timeout;
    if (socket && !detail::idle_and_open(socket.get())) socket.reset();
    for (bool resent = false;; resent = true) {
      const bool kept = socket.valid();
      if (!kept) {
        if (Status s = open(q.op, deadline); !s) return s.error();
      }
      bool delivered = false;
      Result<protocol::Reply> r = exchange(q, deadline, &delivered, fds);
      if (!r && kept && !delivered && !resent && r.error().code == ErrorCode::kPeerLost) {
        socket.reset();
        continue;
      }
      return settle(q, std::move(r));
    }
  }

  // A new connection, with the node's geometry adopted again unless `op` asks for it.
  Status open(protocol::LocalOp op, detail::Clock::time_point deadline) {
    Result<UniqueFd> fd = detail::connect_unix(path, deadline);
    if (!fd) return fd.error();
    socket = std::move(fd).value();
    if (info.chunk_bytes != 0 && op != protocol::LocalOp::kInfo) {
      protocol::Request again;
      again.op = protocol::LocalOp::kInfo;
      Result<protocol::Reply> r = settle(again, exchange(again, deadline, nullptr));
      if (!r) return r.error();
      if (Status s = adopt(*r); !s) {
        socket.reset();
        return s.error();
      }
    }
    return register_again(deadline);
  }

  // Registrations made on an earlier connection, made again on this one.
  Status register_again(detail::Clock::time_point deadline) {
    for (auto& [id, reg] : registrations) {
      Result<protocol::Reply> r =
          settle(reg.request, exchange(reg.request, deadline, nullptr, reg.fds));
      if (!r)
        return wrap_error("registering KV cache " + std::to_string(id) + " again: ", r.error());
      reg.node_id = r->kv;
    }
    return {};
  }

  // An exchange's outcome as the caller sees it: a failed exchange drops the connection.
  Result<protocol::Reply> settle(const protocol::Request& q, Result<protocol::Reply> r) {
    if (!r) {
      socket.reset();
      Error e =
          wrap_error("kvnode at " + path + ", '" + protocol::to_string(q.op) + "': ", r.error());
      if (e.code == ErrorCode::kDeadline)
        e.message += " (timeout " + std::to_string(options.timeout.count()) + " ms)";
      return e;
    }
    if (!r->ok) return make_error(r->code, r->error);
    return r;
  }

  // The node's answer to info: its geometry, and its staging region mapped when it is used.
  // Once connected, a node that comes back with another chunk geometry is refused.
  Status adopt(const protocol::Reply& r) {
    if (r.chunk_bytes == 0 || r.pages == 0 || (r.slots != 0 && r.chunk_bytes > SIZE_MAX / r.slots))
      return make_error(ErrorCode::kInternal,
                        "kvnode at " + path + " answered an inconsistent pool geometry");
    if (info.chunk_bytes != 0 &&
        (r.chunk_bytes != info.chunk_bytes || r.chunk_size != info.chunk_size))
      return make_error(ErrorCode::kPeerLost, "kvnode at " + path + " restarted with chunks of " +
                                                  std::to_string(r.chunk_bytes) + " bytes and " +
                                                  std::to_string(r.chunk_size) + " tokens (were " +
                                                  std::to_string(info.chunk_bytes) + " and " +
                                                  std::to_string(info.chunk_size) +
                                                  "): connect again");
    pool.reset();
    slots = 0;
    info = NodeInfo{r.chunk_bytes,   r.chunk_size,      r.pages,
                    r.shm,           r.location,        r.instance,
                    r.worker_id,     r.memory,          r.save_unfull_chunk.value_or(true),
                    r.binary_tokens, r.hash_generation, r.hash_init,
                    r.none_hash};
    if (!options.use_shared_memory || r.shm.empty() || r.slots == 0) return {};
    Result<detail::SharedStaging> mapped =
        detail::SharedStaging::open(r.shm, r.slots * r.chunk_bytes);
    if (!mapped)
      return wrap_error(
          "kvnode at " + path + ": ",
          Error{mapped.error().code,
                mapped.error().message + " (use_shared_memory=false sends bytes inline)"});
    pool.emplace(std::move(mapped).value());
    slots = r.slots;
    return {};
  }

  // `delivered` (when given): set once the whole request went out.
  Result<protocol::Reply> exchange(const protocol::Request& q, detail::Clock::time_point deadline,
                                   bool* delivered, std::span<const int> fds = {}) {
    if (Status sent = detail::send_frame(socket.get(), protocol::encode(q), deadline, fds); !sent) {
      if (sent.error().code != ErrorCode::kPeerLost) return sent.error();
      // A node that refused this connection (over its cap) said why before closing it: an error
      // frame already here. Anything else here answers no request of ours.
      Result<std::vector<std::byte>> said =
          detail::receive_frame(socket.get(), detail::Clock::now());
      Result<protocol::Reply> r = said ? protocol::decode_reply(*said) : said.error();
      if (r && !r->ok) return r;
      return sent.error();
    }
    if (delivered) *delivered = true;
    Result<std::vector<std::byte>> frame = detail::receive_frame(socket.get(), deadline);
    if (!frame) return frame.error();
    Result<protocol::Reply> r = protocol::decode_reply(*frame);
    if (!r) return make_error(ErrorCode::kInternal, "the node's answer: " + r.error().message);
    return r;
  }

  protocol::Request request(protocol::LocalOp op, const ChunkKeys& keys) {
    protocol::Request q;
    q.op = op;
    q.by_tokens = keys.tokens;
    q.binary_tokens = keys.tokens && info.binary_tokens;
    (keys.tokens ? q.tokens : q.hashes) = keys.values;
    return q;
  }

  protocol::Request finish(protocol::LocalOp op, std::uint64_t hold) {
    protocol::Request q;
    q.op = op;
    q.hold = hold;
    return q;
  }

  // Put and get go by chunk hash: tokens are hashed by the daemon first, so rounds split cleanly.
  Result<std::vector<std::int64_t>> hashes_of(const ChunkKeys& keys) {
    if (!keys.tokens) return keys.values;
    Result<protocol::Reply> r = call(request(protocol::LocalOp::kHashes, keys));
    if (!r) return r.error();
    return std::move(r->hashes);
  }

  // Chunks per request: the staging slots, or what fits a quarter of an inline message; never
  // more than the pool holds (the daemon refuses such a request whole).
  std::size_t round_chunks() const {
    const std::size_t n =
        pool ? slots : std::max<std::size_t>(1, protocol::kMaxInlineBytes / 4 / info.chunk_bytes);
    return std::max<std::size_t>(1, std::min(n, info.pages));
  }
};

Result<std::unique_ptr<LocalClient>> LocalClient::connect(const std::string& socket_path,
                                                          LocalClientOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->path = socket_path;
  impl->options = options;
  protocol::Request q;
  q.op = protocol::LocalOp::kInfo;
  Result<protocol::Reply> r = impl->call(q);
  if (!r) return r.error();
  if (Status s = impl->adopt(*r); !s) return s.error();
  return std::unique_ptr<LocalClient>(new LocalClient(std::move(impl)));
}

LocalClient::LocalClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LocalClient::~LocalClient() = default;
const NodeInfo& LocalClient::info() const {
  return impl_->info;
}
bool LocalClient::shared_memory() const {
  return impl_->pool.has_value();
}

Result<std::size_t> LocalClient::put(const ChunkKeys& keys, std::span<const std::byte> data,
                                     PutSeries* series) {
  const OneCall one(impl_->busy);
  if (!one) return OneCall::refused();
  Impl& m = *impl_;
  const std::size_t chunk = m.info.chunk_bytes;
  Result<std::vector<std::int64_t>> hashed = m.hashes_of(keys);
  if (!hashed) return hashed.error();
  const std::vector<std::int64_t>& all = *hashed;
  if (data.size() != all.size() * chunk)
    return make_error(ErrorCode::kInvalid, std::to_string(all.size()) + " chunks need " +
                                               std::to_string(all.size() * chunk) + " bytes, got " +
                                               std::to_string(data.size()));
  std::size_t stored = 0;
  // Every round of this put evicts only chunks stored before its first (the node's tick then).
  PutSeries own;
  PutSeries& put_series = series ? *series : own;
  const std::size_t round = m.round_chunks();
  for (std::size_t first = 0; first < all.size(); first += round) {
    const std::size_t n = std::min(round, all.size() - first);
    protocol::Request q;
    q.hashes.assign(all.begin() + static_cast<std::ptrdiff_t>(first),
                    all.begin() + static_cast<std::ptrdiff_t>(first + n));
    q.since = put_series.since;
    const std::span<const std::byte> bytes = data.subspan(first * chunk, n * chunk);
    if (!m.pool) {
      q.op = protocol::LocalOp::kPut;
      q.data.assign(bytes.begin(), bytes.end());
      Result<protocol::Reply> r = m.call(q);
      if (!r) return with_stored(r.error(), stored);
      if (put_series.since == 0) put_series.since = r->since;
      stored += std::min<std::size_t>(r->count, n);
      if (r->count < n) break;  // the node is full: the stored prefix ends here
      continue;
    }
    q.op = protocol::LocalOp::kReserve;
    Result<protocol::Reply> r = m.call(q);
    if (!r) return with_stored(r.error(), stored);
    if (r->offsets.size() != n || !m.pool) {  // (no pool: the node restarted without staging)
      (void)m.call(m.finish(protocol::LocalOp::kAbort, r->hold));
      return make_error(ErrorCode::kInternal, "the daemon answered " +
                                                  std::to_string(r->offsets.size()) +
                                                  " slots for " + std::to_string(n) + " chunks");
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (r->offsets[i] < 0) continue;  // stored already
      std::byte* slot = m.pool->at(r->offsets[i], chunk);
      if (!slot) {
        (void)m.call(m.finish(protocol::LocalOp::kAbort, r->hold));
        return make_error(ErrorCode::kInternal,
                          "the daemon answered a slot outside its staging region");
      }
      std::memcpy(slot, bytes.data() + i * chunk, chunk);
    }
    if (put_series.since == 0) put_series.since = r->since;
    Result<protocol::Reply> done = m.call(m.finish(protocol::LocalOp::kCommit, r->hold));
    if (!done) return with_stored(done.error(), stored);
    // The daemon stores the writes in order until one finds no room: the prefix ends there.
    std::size_t writes = 0, prefix = 0;
    for (; prefix < n; ++prefix) {
      if (r->offsets[prefix] >= 0 && writes++ >= done->count) break;
    }
    stored += prefix;
    if (prefix < n) break;
  }
  return stored;
}

Result<std::size_t> LocalClient::get(const ChunkKeys& keys, std::span<std::byte> out) {
  const OneCall one(impl_->busy);
  if (!one) return OneCall::refused();
  Impl& m = *impl_;
  const std::size_t chunk = m.info.chunk_bytes;
  Result<std::vector<std::int64_t>> hashed = m.hashes_of(keys);
  if (!hashed) return hashed.error();
  const std::vector<std::int64_t>& all = *hashed;
  const std::size_t fits = std::min(all.size(), out.size() / chunk);
  std::size_t read = 0;
  const std::size_t round = m.round_chunks();
  while (read < fits) {
    const std::size_t n = std::min(round, fits - read);
    protocol::Request q;
    const bool leased = m.pool.has_value();
    q.op = leased ? protocol::LocalOp::kLease : protocol::LocalOp::kGet;
    q.hashes.assign(all.begin() + static_cast<std::ptrdiff_t>(read),
                    all.begin() + static_cast<std::ptrdiff_t>(read + n));
    Result<protocol::Reply> r = m.call(q);
    if (!r) return r.error();
    std::size_t got = 0;
    if (!leased) {
      if (r->data.size() != r->count * chunk || r->count > n)
        return make_error(ErrorCode::kInternal, "the daemon answered a short chunk");
      if (!r->data.empty())  // an empty answer may have no buffer: memcpy from null is UB
        std::memcpy(out.data() + read * chunk, r->data.data(), r->data.size());
      got = r->count;
    } else {
      std::string error;
      if (r->offsets.size() > n) error = "the daemon answered more chunks than asked";
      if (!m.pool) error = "the node restarted without its staging region";
      for (std::size_t i = 0; error.empty() && i < r->offsets.size(); ++i) {
        const std::byte* slot = m.pool->at(r->offsets[i], chunk);
        if (!slot) {
          error = "the daemon answered a slot outside its staging region";
        } else {
          std::memcpy(out.data() + (read + i) * chunk, slot, chunk);
        }
      }
      Result<protocol::Reply> done = m.call(m.finish(protocol::LocalOp::kRelease, r->hold));
      if (!error.empty()) return make_error(ErrorCode::kInternal, error);
      if (!done) return done.error();
      got = r->offsets.size();
    }
    read += got;
    if (got < n) break;  // the stored prefix ends here
  }
  if (read == fits && fits < all.size()) {
    // Asked here, not through contains(): this call holds the client (OneCall).
    Result<protocol::Reply> more =
        m.call(m.request(protocol::LocalOp::kContains, ChunkKeys::of_hashes({all[fits]})));
    if (more && !more->present.empty() && more->present[0])
      return make_error(ErrorCode::kInvalid,
                        "the buffer holds " + std::to_string(fits) + " chunks; more are stored");
  }
  return read;
}

Result<std::vector<bool>> LocalClient::contains(const ChunkKeys& keys) {
  const OneCall one(impl_->busy);
  if (!one) return OneCall::refused();
  Result<protocol::Reply> r = impl_->call(impl_->request(protocol::LocalOp::kContains, keys));
  if (!r) return r.error();
  return std::move(r->present);
}

Result<std::vector<std::int64_t>> LocalClient::hashes(const std::vector<std::int64_t>& tokens) {
  const OneCall one(impl_->busy);
  if (!one) return OneCall::refused();
  return impl_->hashes_of(ChunkKeys::of_tokens(tokens));
}

Result<std::size_t> LocalClient::lookup(const std::vector<std::int64_t>& tokens) {
  const OneCall one(impl_->busy);
  if (!one) return OneCall::refused();
  Result<protocol::Reply> r =
      impl_->call(impl_->request(protocol::LocalOp::kLookup, ChunkKeys::of_tokens(tokens)));
  if (!r) return r.error();
  return r->tokens;
}

Result<RetrieveReply> LocalClient::retrieve(const ChunkKeys& keys) {
  const OneCall one(impl_->busy);
  if (!one) return OneCall::refused();
  Result<protocol::Reply> r = impl_->call(impl_->request(protocol::LocalOp::kRetrieve, keys));
  if (!r) return r.error();
  return RetrieveReply{r->count, r->pulled, r->tokens, r->peer};
}

Result<RetrieveReply> LocalClient::peek(const ChunkKeys& keys) {
  const OneCall one(impl_->busy);
  if (!one) return OneCall::refused();
  protocol::Request q = impl_->request(protocol::LocalOp::kRetrieve, keys);
  q.peek = true;
  Result<protocol::Reply> r = impl_->call(q);
  if (!r) return r.error();
  return RetrieveReply{r->count, 0, r->tokens, r->peer, r->peer_tokens, r->peer_chunks};
}

Result<std::uint64_t> LocalClient::register_kv(const KvLayout& layout,
                                               std::span<const KvAllocation> allocations) {
  const OneCall one(impl_->busy);
  if (!one) return OneCall::refused();
  Impl& m = *impl_;
  Result<KvWireLayout> wire = to_wire(layout, allocations);
  if (!wire) return wire.error();
  Impl::Registered reg;
  for (std::size_t i = 0; i < allocations.size(); ++i) {
    const KvAllocation& a = allocations[i];
    if (a.kind != KvMemoryKind::kHostFd && a.kind != KvMemoryKind::kCudaVmmFd) continue;
    // Checked here: sendmsg would fail with EBADF, which reads as a lost connection.
    if (::fcntl(a.fd, F_GETFD) < 0)
      return make_error(ErrorCode::kInvalid, "allocations[" + std::to_string(i) +
                                                 "].fd: " + std::to_string(a.fd) +
                                                 " is not an open descriptor");
    reg.fds.push_back(a.fd);
  }
  reg.request.op = protocol::LocalOp::kRegisterKv;
  reg.request.kv_layout = std::move(wire).value();
  reg.request.fds = reg.fds.size();
  Result<protocol::Reply> r = m.call(reg.request, reg.fds);
  if (!r) return r.error();
  reg.node_id = r->kv;
  const std::uint64_t id = m.next_registration++;
  m.registrations.emplace(id, std::move(reg));
  return id;
}

Status LocalClient::unregister_kv(std::uint64_t kv) {
  const OneCall one(impl_->busy);
  if (!one) return OneCall::refused();
  Impl& m = *impl_;
  const auto it = m.registrations.find(kv);
  if (it == m.registrations.end())
    return make_error(ErrorCode::kNotFound, "no KV registration " + std::to_string(kv));
  protocol::Request q;
  q.op = protocol::LocalOp::kUnregisterKv;
  q.kv = it->second.node_id;
  m.registrations.erase(it);
  Result<protocol::Reply> r = m.call(q);
  // A node that lost the connection since has dropped the registration with it already.
  if (!r && r.error().code != ErrorCode::kNotFound) return r.error();
  return {};
}

namespace {

Result<KvTransferReply> kv_transfer(LocalClient::Impl& m, protocol::LocalOp op,
                                    const KvTransfer& t) {
  const auto it = m.registrations.find(t.kv);
  if (it == m.registrations.end())
    return make_error(ErrorCode::kNotFound, "no KV registration " + std::to_string(t.kv));
  protocol::Request q = m.request(op, t.keys);
  q.kv = it->second.node_id;
  q.block_ids = t.block_ids;
  q.num_tokens = t.num_tokens;
  q.retrieve = t.retrieve;
  if (t.wait_event) q.wait_event.assign(t.wait_event->begin(), t.wait_event->end());
  if (t.done_event) q.done_event.assign(t.done_event->begin(), t.done_event->end());
  Result<protocol::Reply> r = m.call(q);
  if (!r) return r.error();
  return KvTransferReply{r->count, r->tokens, r->pulled, r->peer};
}

}  // namespace

Result<KvTransferReply> LocalClient::store(const KvTransfer& transfer) {
  const OneCall one(impl_->busy);
  if (!one) return OneCall::refused();
  return kv_transfer(*impl_, protocol::LocalOp::kStore, transfer);
}

Result<KvTransferReply> LocalClient::load(const KvTransfer& transfer) {
  const OneCall one(impl_->busy);
  if (!one) return OneCall::refused();
  return kv_transfer(*impl_, protocol::LocalOp::kLoad, transfer);
}

}  // namespace kvnode::client
