// The node tests' rig: a controller in-process on ephemeral loopback ports, nodes assembled as
// the kvnode daemon assembles them (pool, store, engine, peer service, transfer plane, moves,
// control handler, agent) so a test can reach each part, and the helpers every node test uses.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "control_handler.hpp"
#include "kvnode/agent/worker_agent.hpp"
#include "kvnode/controller/controller.hpp"
#include "kvnode/node/peer_moves.hpp"
#include "kvnode/transfer/plane.hpp"
#include "peer_service.hpp"
#include "support/eventually.hpp"
#include "support/http_client.hpp"

namespace kvnode::node::rig {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;
inline constexpr const char* kCpu = "LocalCPUBackend";
inline constexpr std::size_t kChunkBytes = 64 << 10;

// A chunk's bytes: a function of its hash, so any copy can be checked.
// Byte i is (h * 7 + i) mod 256, computed unsigned (no signed overflow for any hash); it repeats
// every 256 bytes, so one period is computed and copied.
inline std::vector<std::byte> chunk_bytes(ChunkHash h, std::size_t size = kChunkBytes) {
  std::vector<std::byte> b(size);
  const std::uint64_t base = static_cast<std::uint64_t>(h) * 7;
  for (std::size_t i = 0; i < size && i < 256; ++i)
    b[i] = static_cast<std::byte>((base + i) & 0xff);
  for (std::size_t i = 256; i < size; i += 256)
    std::memcpy(b.data() + i, b.data(), std::min<std::size_t>(256, size - i));
  return b;
}

using test::eventually;

// `n` distinct loopback TCP ports free right now, for processes that must come back on the same
// ports. They are taken below the kernel's ephemeral range where it leaves room (so no outgoing
// connection of a test running alongside takes one while its process restarts), and all are held
// until the last is chosen, so no two are the same.
inline std::vector<int> free_ports(std::size_t n) {
  int ephemeral_low = 32768, ephemeral_high = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &ephemeral_low, &ephemeral_high) != 2) ephemeral_low = 0;
    std::fclose(f);
  }
  std::mt19937 pick(static_cast<unsigned>(::getpid()) ^
                    static_cast<unsigned>(Clock::now().time_since_epoch().count()));
  std::vector<int> fds, ports;
  auto hold = [&](int wanted) {  // binds `wanted` (0: any), keeps it; the port, or -1
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(wanted));
    socklen_t len = sizeof(a);
    if (fd < 0) return -1;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ::close(fd);
      return -1;
    }
    fds.push_back(fd);
    return static_cast<int>(ntohs(a.sin_port));
  };
  for (std::size_t i = 0; i < n; ++i) {
    int port = -1;
    for (int tries = 0; port < 0 && tries < 100 && ephemeral_low > 11000; ++tries)
      port = hold(10000 + static_cast<int>(pick() % static_cast<unsigned>(ephemeral_low - 10000)));
    if (port < 0) port = hold(0);
    ports.push_back(port);
  }
  for (int fd : fds) ::close(fd);
  return ports;
}
inline int free_port() {
  return free_ports(1)[0];
}

// The value of the Prometheus sample `name` (labels included, as written) in `text`; -1: absent.
inline double prometheus_sample(const std::string& text, const std::string& name) {
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + at, end - at);
    if (line.size() > name.size() && line.substr(0, name.size()) == name &&
        line[name.size()] == ' ')
      return std::stod(std::string(line.substr(name.size() + 1)));
    at = end + 1;
  }
  return -1;
}

// The sample `name` of a kvnode's /metrics at `http_port` on loopback; -1: absent or no answer.
inline double node_metric(int http_port, const std::string& name) {
  httplib::Client http("127.0.0.1", http_port);
  http.set_connection_timeout(2s);
  http.set_read_timeout(10s);
  auto r = http.Get("/metrics");
  return r && r->status == 200 ? prometheus_sample(r->body, name) : -1;
}

// `adjust` may change the config first (e.g. a fast reaper).
inline std::unique_ptr<controller::Controller> start_controller(
    const std::function<void(controller::ControllerConfig&)>& adjust = nullptr) {
  controller::ControllerConfig c;
  c.controller_host = "127.0.0.1";
  c.controller_port = 0;
  c.controller_monitor_ports = {0, 0, 0};
  c.log_level = "warn";
  if (adjust) adjust(c);
  return std::move(controller::Controller::start(c)).value();
}

// A node's shape and its agent's pace; the defaults are what every node test started with.
struct NodeOptions {
  std::int64_t worker_id = 0;  // the TP rank
  std::size_t pages = 32;
  std::size_t page_bytes = kChunkBytes;
  std::chrono::milliseconds heartbeat_period{100};
  std::chrono::milliseconds request_timeout{5000};
  // Same-host moves: the pool is a memfd offered to peers on this host, and the plane maps
  // theirs (kvnode's --same-host auto); off, every move goes through UCX.
  bool same_host = false;
  std::chrono::milliseconds peer_ttl{60'000};  // PeerServiceOptions::ttl
};

// The transports the parametrised node tests run over: UCX over tcp, UCX's default same-host
// transports (shared memory, cma), and same-host moves (the dialling node maps its peer's pool
// and copies; UCX, its default, carries the asks and what goes before the mapping is made).
struct Transport {
  const char* name;
  const char* tls;  // UCX_TLS; nullptr: UCX's default
  bool same_host;
};
inline constexpr Transport kTcp{"tcp", "tcp", false};
inline constexpr Transport kShm{"shm", nullptr, false};
inline constexpr Transport kSameHost{"same_host", nullptr, true};
inline std::string transport_name(const ::testing::TestParamInfo<Transport>& info) {
  return info.param.name;
}
inline void PrintTo(const Transport& t, std::ostream* os) {
  *os << t.name;
}

// One node: what the kvnode daemon assembles, minus the daemon.
class Node {
 public:
  Node(const controller::BoundPorts& ports, const std::string& instance, const char* tls,
       const NodeOptions& options = NodeOptions())
      : instance_(instance),
        options_(options),
        pool_(make_pool(options)),
        store_(pool_, kCpu,
               [this](const StoreEvent& e) {
                 if (auto* a = agent_ptr_.load())
                   a->report(kCpu,
                             e.kind == StoreEvent::Kind::kAdmit ? wire::OpType::kAdmit
                                                                : wire::OpType::kEvict,
                             e.hash);
               }),
        engine_(store_),
        peers_(engine_, peer_options(options)),
        plane_(start_plane(tls, options.same_host, pool_, peers_)),
        moves_(engine_, *plane_),
        control_(engine_, &moves_) {
    agent::AgentOptions o;
    o.instance_id = instance;
    o.worker_id = options.worker_id;
    o.controller_pull_url = "127.0.0.1:" + std::to_string(ports.pull);
    o.controller_reply_url = "127.0.0.1:" + std::to_string(ports.reply);
    o.peer_init_url = plane_->url();
    o.heartbeat_period = options.heartbeat_period;
    o.request_timeout = options.request_timeout;
    o.full_sync_startup_delay = 0ms;
    o.full_sync_poll_interval = 50ms;
    agent::AgentHandlers h;
    h.control = [this](const wire::Msg& m) { return control_(m); };
    h.snapshot = [this] { return engine_.snapshot(); };
    h.freeze = [this](bool on) { engine_.freeze(on); };
    agent_ = std::move(agent::WorkerAgent::start(o, h)).value();
    agent_ptr_ = agent_.get();
  }
  ~Node() {
    agent_ptr_ = nullptr;
    agent_.reset();
    plane_.reset();
  }
  RetrieveResult retrieve(const std::vector<std::int64_t>& tokens) {
    return moves_.retrieve(
        tokens, locate_through([this](const wire::Msg& m) { return agent_->call(m); }, instance_,
                               options_.worker_id));
  }
  // Registered, heard by the controller, and through the full sync it was asked for, if any:
  // stores and moves are taken now. (A fresh controller asks every worker's first heartbeat for
  // a full sync only until the first syncs report progress; a node whose first heartbeat comes
  // later is never asked, so waiting for a completed sync would wait for nothing.)
  bool settled() {
    const agent::AgentCounters c = agent_->counters();
    return c.registered && c.heartbeats >= 3 && c.full_syncs_started == c.full_syncs_completed &&
           !engine_.frozen();
  }
  Engine& engine() { return engine_; }
  PeerMoves& moves() { return moves_; }
  PeerService& peers() { return peers_; }
  ChunkStore& store() { return store_; }
  agent::WorkerAgent& agent() { return *agent_; }
  transfer::TransferPlane& plane() { return *plane_; }
  std::string url() const { return plane_->url(); }  // its peer_init_url
  const std::string& instance() const { return instance_; }
  std::int64_t worker_id() const { return options_.worker_id; }
  std::size_t page_bytes() const { return options_.page_bytes; }

 private:
  static PeerServiceOptions peer_options(const NodeOptions& n) {
    PeerServiceOptions o;
    o.ttl = n.peer_ttl;
    return o;
  }
  static std::unique_ptr<transfer::TransferPlane> start_plane(const char* tls, bool same_host,
                                                              gpu::ChunkPool& pool,
                                                              PeerService& peers) {
    transfer::PlaneOptions po;
    if (tls) {
      po.tls = tls;
      po.net_devices = "lo";
    }
    po.same_host = same_host ? transfer::SameHost::kAuto : transfer::SameHost::kOff;
    po.on_ask = [&peers](const std::string& peer, const std::vector<std::byte>& r) {
      return peers.on_ask(peer, r);
    };
    return std::move(transfer::TransferPlane::start(po, pool)).value();
  }
  static gpu::ChunkPool make_pool(const NodeOptions& n) {
    gpu::PoolOptions o;
    o.page_bytes = n.page_bytes;
    o.pages = n.pages;
    o.region.shareable = n.same_host;
    return std::move(gpu::ChunkPool::create(o)).value();
  }
  std::string instance_;
  NodeOptions options_;
  gpu::ChunkPool pool_;
  std::atomic<agent::WorkerAgent*> agent_ptr_{nullptr};
  ChunkStore store_;
  Engine engine_;
  PeerService peers_;
  std::unique_ptr<transfer::TransferPlane> plane_;
  PeerMoves moves_;
  ControlHandler control_;
  std::unique_ptr<agent::WorkerAgent> agent_;
};

// Same-host moves map the peer's pool asynchronously once the dialling node's first session with
// it opens, so a move is copied through the mapping only some time after the first. Moves fresh
// chunks (tokens from `first_token`, one chunk at a time) from `from` to the node at `to_url`
// until one was copied through `from`'s mapping of its pool: from then on `from`'s moves to it and
// pulls from it take that path. `drop` removes each chunk at the destination again (unset: they
// stay there). False after 15 s.
inline bool map_peer(Node& from, const std::string& to_url, std::int64_t first_token,
                     const std::function<void(ChunkHash)>& drop = nullptr) {
  const std::uint64_t before = from.plane().counters().bytes_same_host;
  return eventually([&] {
    std::vector<std::int64_t> tokens(256);
    std::iota(tokens.begin(), tokens.end(), first_token);
    first_token += 256;
    const ChunkHash h = from.engine().hashes(tokens).value().at(0);
    if (!from.engine().put(h, chunk_bytes(h, from.page_bytes()))) return false;
    const MoveResult moved = from.moves().move(to_url, tokens, false);
    if (drop) drop(h);
    from.store().remove(h);  // when the move failed
    return moved.chunks_sent == 1 && from.plane().counters().bytes_same_host > before;
  });
}
inline bool map_peer(Node& from, Node& to, std::int64_t first_token) {
  return map_peer(from, to.url(), first_token, [&to](ChunkHash h) { to.store().remove(h); });
}

// Which path `from`'s transfers with `to` take, for a test over a Transport: same-host, `from`
// maps `to`'s pool first (map_peer) and expect_copied() checks that the test's transfers were
// copied through that mapping; otherwise it checks that nothing was (UCX carried every byte).
class MappedPath {
 public:
  MappedPath(Node& from, Node& to, const Transport& t, std::int64_t warm_up_tokens)
      : from_(from), same_host_(t.same_host) {
    mapped_ = !same_host_ || map_peer(from, to, warm_up_tokens);
    before_ = from.plane().counters().bytes_same_host;
  }
  bool ready() const { return mapped_; }
  // Bytes `from` copied through mapped pools since the warm-up.
  std::uint64_t copied() const { return from_.plane().counters().bytes_same_host - before_; }
  void expect_copied(std::uint64_t at_least) const {
    if (same_host_) {
      EXPECT_GE(copied(), at_least) << "the same-host path carried the transfers";
    } else {
      EXPECT_EQ(from_.plane().counters().bytes_same_host, 0u) << "UCX carried every byte";
    }
  }

 private:
  Node& from_;
  bool same_host_;
  bool mapped_ = false;
  std::uint64_t before_ = 0;
};

// A controller and two nodes, A and B; synced(): both settled (through the full sync the
// controller asked them for, if any: a node frozen in one refuses chunks).
struct TwoNodes {
  explicit TwoNodes(const char* tls)
      : ctl(start_controller()), a(ctl->ports(), "inst-A", tls), b(ctl->ports(), "inst-B", tls) {}
  explicit TwoNodes(const Transport& t)
      : ctl(start_controller()),
        a(ctl->ports(), "inst-A", t.tls, options(t)),
        b(ctl->ports(), "inst-B", t.tls, options(t)) {}
  static NodeOptions options(const Transport& t) {
    NodeOptions o;
    o.same_host = t.same_host;
    return o;
  }
  bool synced() {
    return eventually([&] { return a.settled() && b.settled(); });
  }
  std::unique_ptr<controller::Controller> ctl;
  Node a;
  Node b;
};

}  // namespace kvnode::node::rig
