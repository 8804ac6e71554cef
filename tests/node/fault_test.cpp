// Faults across real processes, real ZeroMQ sockets and real UCX over loopback (no mocks):
// - a move's destination, a kvnode process, is SIGKILLed while the move runs (and just before
//   it is asked for): the source keeps every chunk the destination cannot confirm it holds when
//   the move ends, the move answers in bounded time, the controller reaps the dead node, and the
//   node restarted on the same ports takes a new move whose bytes come back intact;
// - the kvcontroller process is SIGKILLed and restarted on the same ports: the nodes re-register
//   through heartbeats and full syncs, and its index holds every chunk again, nothing more;
// - a kvnode process's REP port gets garbage, msgpack of the wrong shape, truncated and hostile
//   messages: each gets an ErrorMsg (or LMCache's reply), and the node keeps serving.
// Over tcp, over UCX's default same-host transports (shared memory, cma), and same-host (the
// source maps the destination's pool and copies) where data moves.
#include <signal.h>
#include <unistd.h>

#include <future>
#include <optional>
#include <tuple>
#include <zmq.hpp>

#include "kvnode/wire/codec.hpp"
#include "node_rig.hpp"
#include "support/child_process.hpp"

namespace kvnode::node {
namespace {

using namespace rig;
using test::ChildProcess;

std::string loopback(int port) {
  return "127.0.0.1:" + std::to_string(port);
}

// JSON over HTTP; a reply that is not a 200 comes back as {"failed": ..., "status": ...}.
Json post_json(int port, const std::string& path, const Json& body,
               std::chrono::seconds patience = 30s) {
  httplib::Client http("127.0.0.1", port);
  http.set_connection_timeout(2s);
  http.set_read_timeout(patience);
  auto r = http.Post(path, body.dump(), "application/json");
  if (!r) return Json{{"failed", path + ": no answer"}, {"status", 0}};
  if (r->status != 200) return Json{{"failed", r->body}, {"status", r->status}};
  return Json::parse(r->body, nullptr, false);
}

Json get_json(int port, const std::string& path) {
  httplib::Client http("127.0.0.1", port);
  http.set_connection_timeout(2s);
  http.set_read_timeout(10s);
  auto r = http.Get(path);
  if (!r) return Json{{"failed", path + ": no answer"}, {"status", 0}};
  if (r->status != 200) return Json{{"failed", r->body}, {"status", r->status}};
  return Json::parse(r->body, nullptr, false);
}

std::vector<std::int64_t> token_range(std::size_t chunks, std::int64_t first) {
  std::vector<std::int64_t> t(chunks * 256);
  std::iota(t.begin(), t.end(), first);
  return t;
}

Json move_body(const std::string& from, const std::string& to,
               const std::vector<std::int64_t>& tokens, bool copy) {
  return Json{{"old_position", {from, kCpu}},
              {"new_position", {to, kCpu}},
              {"tokens", tokens},
              {"should_copy", copy}};
}

// msgpack by hand, for messages the encoder would never write: a short string, and a map of
// short keys to already-encoded values.
std::string fixstr(std::string_view s) {
  return static_cast<char>(0xa0 | s.size()) + std::string(s);
}
std::string pack_map(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string out(1, static_cast<char>(0x80 | entries.size()));
  for (const auto& [key, value] : entries) out += fixstr(key) + value;
  return out;
}

// Chunks the move's reply says the destination took (a reply with an error: none).
std::size_t confirmed_chunks(const Json& reply) {
  if (!reply.is_object() || !reply.contains("num_tokens") ||
      !reply["num_tokens"].is_number_integer())
    return 0;
  return reply["num_tokens"].get<std::size_t>() / 256;
}

// A kvnode process on fixed ports, so a restart comes back at the same addresses.
class KvnodeProcess {
 public:
  // `same_host`: --same-host auto (its pool mapped by same-host peers, theirs by it); else off,
  // so UCX (`tls`, or UCX's default) carries every move.
  KvnodeProcess(const std::string& instance, const controller::BoundPorts& ctl, const char* tls,
                double gigabytes, bool same_host = false)
      : instance_(instance),
        ports_(free_ports(3)),
        worker_port_(ports_[0]),
        p2p_port_(ports_[1]),
        http_port_(ports_[2]) {
    argv_ = {KVNODE_PATH,
             "--instance-id",
             instance,
             "--controller-pull-url",
             loopback(ctl.pull),
             "--controller-reply-url",
             loopback(ctl.reply),
             "--worker-ports",
             std::to_string(worker_port_),
             "--p2p-init-ports",
             std::to_string(p2p_port_),
             "--http-port",
             std::to_string(http_port_),
             "--chunk-bytes",
             std::to_string(kChunkBytes),
             "--max-local-cpu-size",
             std::to_string(gigabytes),
             "--heartbeat-time",
             "0.2",
             "--log-level",
             "warn",
             "--same-host",
             same_host ? "auto" : "off"};
    if (tls) argv_.insert(argv_.end(), {"--ucx-tls", tls, "--ucx-net-devices", "lo"});
  }
  // A clean stop: the node de-registers and releases what it named after itself (its local
  // socket, its shared pool); a SIGKILLed one leaves them to its restart.
  ~KvnodeProcess() {
    if (running()) stop();
  }
  void start() { process_ = std::make_unique<ChildProcess>(argv_); }
  std::optional<int> stop() {
    process_->signal(SIGCONT);  // a frozen process takes no SIGTERM
    return process_->stop(SIGTERM, 15s);
  }
  // Up, registered, and heartbeating: the controller reaps only a worker it has heard a
  // heartbeat from (one that never sends any has heartbeats off, as LMCache's default).
  bool ready() {
    return eventually(
               [&] {
                 const Json h = get_json(http_port_, "/health");
                 return !running() || (h.is_object() && h.value("registered", false) &&
                                       metric("kvnode_controller_heartbeats_total") >= 1);
               },
               30s) &&
           running();
  }
  bool running() { return process_ && process_->running(); }
  void signal(int sig) { process_->signal(sig); }
  // SIGKILL, and reaped.
  bool kill() {
    process_->signal(SIGKILL);
    return eventually([&] { return !process_->running(); });
  }
  std::string log() const { return process_ ? process_->output() : std::string(); }
  double metric(const std::string& name) { return node_metric(http_port_, name); }
  const std::string& instance() const { return instance_; }
  int worker_port() const { return worker_port_; }
  std::string peer_init_url() const { return loopback(p2p_port_); }

 private:
  std::string instance_;
  std::vector<int> ports_;
  int worker_port_, p2p_port_, http_port_;
  std::vector<std::string> argv_;
  std::unique_ptr<ChildProcess> process_;
};

// Instance ids are unique per test process: a kvnode process names host-wide resources (its
// local socket, its shared pool) after its instance, and ctest runs tests side by side.
std::string unique_instance(const std::string& base) {
  return base + "-" + std::to_string(::getpid());
}

// ---- A move's destination dies --------------------------------------------------------------

enum class Kill { kBeforeTheMove, kWhileItRuns };

class FaultMove : public ::testing::TestWithParam<std::tuple<Transport, Kill>> {};

TEST_P(FaultMove, ADeadDestinationLosesNoUnconfirmedChunkAndComesBackOnTheSamePorts) {
  const Transport& transport = std::get<0>(GetParam());
  const char* tls = transport.tls;
  const Kill when = std::get<1>(GetParam());
  // A fast reaper: a worker silent for 3 s goes (the nodes here heartbeat every 0.1-0.2 s).
  auto ctl = start_controller([](controller::ControllerConfig& c) {
    c.health_check_interval = 1;
    c.lmcache_worker_timeout = 3;
  });
  const int http = ctl->ports().http;
  // Enough chunks for several of the move's batches (256 chunks each), so a kill lands mid-move.
  const std::size_t n = when == Kill::kWhileItRuns ? 8 * PeerMoves::kBatch : 2 * PeerMoves::kBatch;
  NodeOptions big = TwoNodes::options(transport);
  big.pages = n + 64;
  Node a(ctl->ports(), unique_instance("fault-A"), tls, big);
  ASSERT_TRUE(eventually([&] { return a.settled(); }));
  KvnodeProcess b(unique_instance("fault-B"), ctl->ports(), tls, 0.15,
                  transport.same_host);  // 2288 chunks of 64 KiB
  b.start();
  ASSERT_TRUE(b.ready()) << b.log();

  // A warm-up move: A has a session to B, and the controller indexes chunks at B.
  const std::vector<std::int64_t> warm = token_range(4, 1'000'000);
  for (ChunkHash h : a.engine().hashes(warm).value())
    ASSERT_TRUE(a.engine().put(h, chunk_bytes(h)));
  Json r = post_json(http, "/move", move_body(a.instance(), b.instance(), warm, true));
  ASSERT_EQ(r.value("num_tokens", -1), 1024) << r.dump() << b.log();
  ASSERT_TRUE(eventually([&] {
    return post_json(http, "/lookup", Json{{"tokens", warm}})["layout_info"].contains(b.instance());
  }));
  // Same-host: A's moves to B copy through its mapping of B's pool from here on.
  if (transport.same_host) {
    ASSERT_TRUE(map_peer(a, b.peer_init_url(), 1'100'000)) << "A never mapped B's pool" << b.log();
  }

  const std::vector<std::int64_t> tokens = token_range(n, 2'000'000);
  const std::vector<ChunkHash> hashes = a.engine().hashes(tokens).value();
  for (ChunkHash h : hashes) ASSERT_TRUE(a.engine().put(h, chunk_bytes(h)));
  const std::size_t held_before = a.store().counters().chunks;
  const Json body = move_body(a.instance(), b.instance(), tokens, false);

  std::future<Json> move;
  Clock::time_point killed_at;
  const std::uint64_t pushed_before = a.plane().counters().bytes_pushed;
  const std::uint64_t mapped_before = a.plane().counters().bytes_same_host;
  if (when == Kill::kBeforeTheMove) {
    ASSERT_TRUE(b.kill());
    killed_at = Clock::now();
    move = std::async(std::launch::async, [&] { return post_json(http, "/move", body, 60s); });
  } else {
    move = std::async(std::launch::async, [&] { return post_json(http, "/move", body, 60s); });
    // Freeze B, look, let it run a little, repeat; kill it (still frozen) once the second batch
    // has been pushed: the first was confirmed then (batches go one after another), and six
    // more are to come. Frozen, B answers nothing, so the move cannot finish between the look
    // and the kill: the kill lands while the move runs, whatever the machine's load.
    const std::uint64_t two_batches = pushed_before + 2 * PeerMoves::kBatch * kChunkBytes;
    bool killed = false;
    for (const auto until = Clock::now() + 30s; Clock::now() < until;) {
      b.signal(SIGSTOP);
      std::this_thread::sleep_for(500us);
      if (move.wait_for(0s) == std::future_status::ready) break;
      if (a.plane().counters().bytes_pushed >= two_batches) {
        ASSERT_TRUE(b.kill());
        killed_at = Clock::now();
        killed = true;
        break;
      }
      b.signal(SIGCONT);
      std::this_thread::sleep_for(1ms);
    }
    ASSERT_TRUE(killed) << "the move ended before B could be killed under it: "
                        << (move.wait_for(0s) == std::future_status::ready ? move.get().dump()
                                                                           : "");
  }
  ASSERT_EQ(move.wait_for(30s), std::future_status::ready) << "the move never answered";
  const auto answered_in =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed_at);
  const Json moved = move.get();
  const std::size_t confirmed = confirmed_chunks(moved);
  if (transport.same_host && when == Kill::kWhileItRuns) {
    EXPECT_GE(a.plane().counters().bytes_same_host - mapped_before,
              2 * PeerMoves::kBatch * kChunkBytes)
        << "the batches before the kill were copied through the mapped pool";
  } else if (!transport.same_host) {
    EXPECT_EQ(a.plane().counters().bytes_same_host, 0u) << "UCX carried every byte";
  }
  std::cout << "[ fault    ] " << transport.name << ": the move answered " << answered_in.count()
            << " ms after the kill: " << moved.dump().substr(0, 300) << "; confirmed " << confirmed
            << " of " << n << " chunks\n";
  EXPECT_LT(answered_in, 20s) << "bounded: a dead peer is noticed, not waited out";
  if (moved.contains("num_tokens")) {
    EXPECT_EQ(moved["num_tokens"].get<std::size_t>() % 256, 0u) << moved.dump();
  }
  EXPECT_LT(confirmed, n) << "B died before the move ended, so it cannot have confirmed all: "
                          << moved.dump();
  // Killed mid-move, B had confirmed the first batch, but those chunks died with it: the source
  // asks what the destination still holds before it evicts anything, gets no answer, and keeps
  // every chunk (evicting what B confirmed would have lost them).
  EXPECT_EQ(confirmed, 0u) << moved.dump();

  // Nothing lost: A still holds, byte for byte, every chunk the move did not confirm, and (the
  // move did not copy) none that it did.
  std::vector<std::byte> out(kChunkBytes);
  for (std::size_t i = 0; i < n; ++i) {
    if (i < confirmed) {
      EXPECT_FALSE(a.store().contains(hashes[i]))
          << "confirmed chunk " << i << " stayed at the source";
      continue;
    }
    ASSERT_TRUE(a.store().contains(hashes[i]))
        << "unconfirmed chunk " << i << " of " << n << " lost";
    ASSERT_EQ(a.engine().get(hashes[i], out).value(), kChunkBytes);
    ASSERT_TRUE(out == chunk_bytes(hashes[i])) << "chunk " << i << "'s bytes";
  }
  EXPECT_EQ(a.store().counters().chunks, held_before - confirmed);
  EXPECT_EQ(a.store().counters().reserved, 0u);

  // The controller reaps B: its registration goes, and lookups stop naming it.
  ASSERT_TRUE(eventually(
      [&] {
        return get_json(http, "/controller/workers?instance_id=" + b.instance())
                   .value("status", 200) == 404;
      },
      30s))
      << get_json(http, "/controller/workers").dump();
  EXPECT_FALSE(
      post_json(http, "/lookup", Json{{"tokens", warm}})["layout_info"].contains(b.instance()));
  const std::vector<std::int64_t> head(tokens.begin(),
                                       tokens.begin() + 2 * 256);  // lookups walk from chunk 0
  EXPECT_FALSE(
      post_json(http, "/lookup", Json{{"tokens", head}})["layout_info"].contains(b.instance()));

  // B again, same instance and ports: it registers, and a new move to it carries every byte.
  b.start();
  ASSERT_TRUE(b.ready()) << b.log();
  EXPECT_EQ(b.metric("kvnode_chunks{location=\"LocalCPUBackend\"}"), 0)
      << "a restarted node starts empty";
  // Same-host: A maps the restarted B's pool (a new one), never the dead B's, and copies the new
  // move through it; the round trip below shows the bytes landed in the new B.
  const std::uint64_t mapped_before_restart = a.plane().counters().bytes_same_host;
  if (transport.same_host) {
    ASSERT_TRUE(map_peer(a, b.peer_init_url(), 4'000'000)) << "A never mapped the new B's pool";
  }
  const double warm_chunks_at_b = b.metric("kvnode_chunks{location=\"LocalCPUBackend\"}");
  const Json info =
      get_json(http, "/controller/workers?instance_id=" + b.instance() + "&worker_id=0");
  EXPECT_EQ(info.value("peer_init_url", ""), b.peer_init_url()) << info.dump();
  EXPECT_EQ(info.value("port", 0), b.worker_port()) << info.dump();
  const std::vector<std::int64_t> fresh = token_range(16, 3'000'000);
  const std::vector<ChunkHash> fresh_hashes = a.engine().hashes(fresh).value();
  for (ChunkHash h : fresh_hashes) ASSERT_TRUE(a.engine().put(h, chunk_bytes(h)));
  r = post_json(http, "/move", move_body(a.instance(), b.instance(), fresh, false));
  ASSERT_EQ(r.value("num_tokens", -1), 16 * 256) << r.dump() << b.log();
  for (ChunkHash h : fresh_hashes) EXPECT_FALSE(a.store().contains(h));
  EXPECT_EQ(b.metric("kvnode_chunks{location=\"LocalCPUBackend\"}"), warm_chunks_at_b + 16);
  if (transport.same_host) {
    EXPECT_GE(a.plane().counters().bytes_same_host - mapped_before_restart, 16 * kChunkBytes)
        << "the move to the restarted B went through its mapped pool";
  }
  // Back to A (a copy): the bytes went through B's memory intact.
  r = post_json(http, "/move", move_body(b.instance(), a.instance(), fresh, true));
  ASSERT_EQ(r.value("num_tokens", -1), 16 * 256) << r.dump() << b.log();
  for (ChunkHash h : fresh_hashes) {
    ASSERT_EQ(a.engine().get(h, out).value(), kChunkBytes);
    ASSERT_TRUE(out == chunk_bytes(h))
        << "chunk " << h << " after a round trip through the restarted B";
  }
  ASSERT_TRUE(eventually([&] {
    return post_json(http, "/lookup", Json{{"tokens", fresh}})["layout_info"].contains(
        b.instance());
  })) << "the restarted B's chunks are indexed";
  EXPECT_EQ(b.stop(), 0) << b.log();
}

INSTANTIATE_TEST_SUITE_P(Fault, FaultMove,
                         ::testing::Combine(::testing::Values(kTcp, kShm, kSameHost),
                                            ::testing::Values(Kill::kBeforeTheMove,
                                                              Kill::kWhileItRuns)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) +
                                  (std::get<1>(info.param) == Kill::kBeforeTheMove
                                       ? "_KilledBeforeTheMove"
                                       : "_KilledWhileItRuns");
                         });

// ---- The controller dies --------------------------------------------------------------------

TEST(FaultTest, ARestartedControllerIndexesEveryChunkAgain) {
  const std::vector<int> chosen = free_ports(4);
  controller::BoundPorts ports;
  ports.pull = chosen[0];
  ports.reply = chosen[1];
  ports.heartbeat = chosen[2];
  ports.http = chosen[3];
  const std::vector<std::string> argv = {
      KVCONTROLLER_PATH,
      "--host",
      "127.0.0.1",
      "--port",
      std::to_string(ports.http),
      "--monitor-ports",
      Json{{"pull", ports.pull}, {"reply", ports.reply}, {"heartbeat", ports.heartbeat}}.dump(),
      "--health-check-interval",
      "1",
      "--lmcache-worker-timeout",
      "10",
      "--log-level",
      "warn"};
  auto controller = std::make_unique<ChildProcess>(argv);
  auto up = [&] {
    return eventually(
        [&] { return !get_json(ports.http, "/controller/workers").contains("failed"); }, 30s);
  };
  ASSERT_TRUE(up()) << controller->output();

  // Nodes that notice a dead controller within a second (request timeout) rather than five.
  NodeOptions quick;
  quick.request_timeout = 1s;
  Node a(ports, "inst-A", "tcp", quick);
  Node b(ports, "inst-B", "tcp", quick);
  ASSERT_TRUE(eventually([&] { return a.settled() && b.settled(); }, 30s));

  struct Held {
    Node* node;
    std::vector<std::int64_t> tokens;
    std::size_t chunks;  // leading chunks the node holds in the end
  };
  std::vector<Held> held = {{&a, token_range(12, 10'000), 12}, {&b, token_range(10, 20'000), 10}};
  auto store = [](Held& h, std::size_t chunks) {
    for (ChunkHash c : h.node->engine().hashes(h.tokens).value()) {
      if (chunks-- == 0) break;
      ASSERT_TRUE(h.node->engine().put(c, chunk_bytes(c)));
    }
  };
  store(held[0], 12);
  store(held[1], 10);
  auto lookup = [&](const Held& h) {
    return post_json(ports.http, "/lookup", Json{{"tokens", h.tokens}})["layout_info"];
  };
  auto indexed = [&](const Held& h) {
    const Json want{{h.node->instance(), {kCpu, static_cast<std::int64_t>(h.chunks * 256)}}};
    return lookup(h) == want;
  };
  auto total_keys = [&] {
    return get_json(ports.http, "/controller/key-stats").value("total_key_count", -1);
  };
  ASSERT_TRUE(eventually([&] { return indexed(held[0]) && indexed(held[1]); }))
      << lookup(held[0]) << lookup(held[1]);
  EXPECT_EQ(total_keys(), 22);

  controller->signal(SIGKILL);
  ASSERT_TRUE(eventually([&] { return !controller->running(); }));
  const auto syncs_a = a.agent().counters().full_syncs_completed;
  const auto syncs_b = b.agent().counters().full_syncs_completed;
  // While it is away: A stores more, B drops its last two chunks.
  held.push_back({&a, token_range(5, 30'000), 5});
  store(held[2], 5);
  const std::vector<ChunkHash> b_hashes = b.engine().hashes(held[1].tokens).value();
  ASSERT_TRUE(b.store().remove(b_hashes[8]));
  ASSERT_TRUE(b.store().remove(b_hashes[9]));
  held[1].chunks = 8;
  std::this_thread::sleep_for(300ms);  // a few heartbeats go unanswered

  controller = std::make_unique<ChildProcess>(argv);  // the same ports
  ASSERT_TRUE(up()) << controller->output();
  const auto restarted = Clock::now();
  ASSERT_TRUE(eventually(
      [&] {
        return a.agent().counters().full_syncs_completed > syncs_a &&
               b.agent().counters().full_syncs_completed > syncs_b;
      },
      30s))
      << "the nodes re-register through heartbeats and run a full sync";
  EXPECT_TRUE(eventually([&] { return indexed(held[0]) && indexed(held[1]) && indexed(held[2]); }))
      << lookup(held[0]) << lookup(held[1]) << lookup(held[2]);
  EXPECT_EQ(total_keys(), 12 + 8 + 5) << "every chunk held, and none that is not";
  const Json workers = get_json(ports.http, "/controller/workers");
  EXPECT_EQ(workers.value("total_count", -1), 2) << workers.dump();
  std::cout
      << "[ fault    ] the restarted controller indexed every chunk "
      << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - restarted).count()
      << " ms after it came up\n";
}

// ---- Bad requests on a node's REP port -------------------------------------------------------

// A REQ client of the node's REP port.
class ReqClient {
 public:
  explicit ReqClient(int port, std::chrono::milliseconds patience = 10s)
      : port_(port), patience_(patience) {
    reconnect();
  }
  // Sends `frames` as one request; the reply, or nullopt when none came in time.
  std::optional<std::string> ask(const std::vector<std::string>& frames) {
    for (std::size_t i = 0; i < frames.size(); ++i)
      socket_->send(zmq::buffer(frames[i]),
                    i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    zmq::message_t reply;
    if (!socket_->recv(reply)) {
      reconnect();  // a REQ socket without its answer cannot ask again
      return std::nullopt;
    }
    return reply.to_string();
  }
  zmq::context_t& context() { return context_; }

 private:
  void reconnect() {
    socket_.emplace(context_, zmq::socket_type::req);
    socket_->set(zmq::sockopt::linger, 0);
    socket_->set(zmq::sockopt::rcvtimeo, static_cast<int>(patience_.count()));
    socket_->connect("tcp://127.0.0.1:" + std::to_string(port_));
  }
  int port_;
  std::chrono::milliseconds patience_;
  zmq::context_t context_;
  std::optional<zmq::socket_t> socket_;
};

TEST(FaultTest, BadRequestsOnANodesRepPortAreAnsweredAndTheNodeKeepsServing) {
  auto ctl = start_controller();
  KvnodeProcess node(unique_instance("fault-rep"), ctl->ports(), "tcp", 0.01);
  node.start();
  ASSERT_TRUE(node.ready()) << node.log();
  ReqClient client(node.worker_port());
  std::size_t asked = 0, errors = 0;
  // One request: its reply decoded (an ErrorMsg with "no reply" when none came).
  auto ask = [&](const std::vector<std::string>& frames) -> wire::Msg {
    ++asked;
    const auto start = Clock::now();
    const std::optional<std::string> reply = client.ask(frames);
    EXPECT_LT(Clock::now() - start, 5s)
        << "slow answer to a " << frames.back().size() << "-byte request";
    if (!reply) {
      ADD_FAILURE() << "no reply to a " << frames.back().size() << "-byte request";
      return wire::ErrorMsg{"no reply"};
    }
    Result<wire::Msg> m = wire::decode(*reply);
    if (!m) {
      ADD_FAILURE() << "an undecodable reply: " << m.error().message;
      return wire::ErrorMsg{"undecodable reply"};
    }
    if (std::holds_alternative<wire::ErrorMsg>(*m)) ++errors;
    return std::move(m).value();
  };
  auto error_of = [&](const std::string& payload) {
    const wire::Msg m = ask({payload});
    const auto* e = std::get_if<wire::ErrorMsg>(&m);
    return e ? e->error : "not an ErrorMsg but a " + std::string(wire::tag_of(m));
  };
  auto tokens_of = [&](const wire::Msg& m) -> std::int64_t {
    return std::visit(
        [](const auto& r) -> std::int64_t {
          if constexpr (requires { r.num_tokens; })
            return r.num_tokens;
          else
            return -1;
        },
        m);
  };
  const std::string health = wire::encode(wire::HealthWorkerMsg{"h"});
  auto healthy = [&] {
    const wire::Msg m = ask({health});
    const auto* h = std::get_if<wire::HealthWorkerRetMsg>(&m);
    return h && h->error_code == 0;
  };
  ASSERT_TRUE(healthy());

  // Not msgpack, or msgpack that is not a message.
  for (const std::string& bad :
       {std::string("\xc1 not msgpack"), std::string(), std::string("\x2a"),
        std::string("\x93\x01\x02\x03"),
        std::string("\x81\xa1"
                    "a\x01"),
        pack_map({{"type", fixstr("NoSuchMsg")}}), pack_map({{"type", "\x01"}}),
        std::string("{\"type\": 1"), std::string("\xff\xff\xff\xff")}) {
    EXPECT_FALSE(error_of(bad).empty()) << "an ErrorMsg for " << bad.size() << " bytes";
  }
  // Messages of the wrong type for this port, and control messages with wrong or missing fields.
  EXPECT_EQ(error_of(wire::encode(wire::LookupMsg{"e9", {1, 2, 3}})),
            "Unknown message: " + wire::python_class_text("LookupMsg"));
  EXPECT_EQ(error_of(wire::encode(wire::ErrorMsg{"a reply is no request"})),
            "Unknown message: " + wire::python_class_text("ErrorMsg"));
  const std::string wrong_type = error_of(pack_map({{"type", fixstr("ClearWorkerMsg")},
                                                    {"worker_event_id", fixstr("e")},
                                                    {"location", "\x05"}}));
  EXPECT_NE(wrong_type.find("Expected `str`, got `int`"), std::string::npos) << wrong_type;
  EXPECT_NE(wrong_type.find("$.location"), std::string::npos) << wrong_type;
  const std::string missing =
      error_of(pack_map({{"type", fixstr("ClearWorkerMsg")}, {"worker_event_id", fixstr("e")}}));
  EXPECT_NE(missing.find("location"), std::string::npos) << missing;
  EXPECT_NE(error_of(wire::encode(wire::CompressWorkerMsg{"z", "cachegen", kCpu, std::nullopt}))
                .find("not supported"),
            std::string::npos);
  EXPECT_FALSE(error_of(wire::encode(wire::CheckFinishWorkerMsg{"cf"})).empty());
  EXPECT_NE(error_of(wire::encode(wire::MoveWorkerMsg{
                         "m3", kCpu, {"127.0.0.1:1", "LocalDiskBackend"}, {{1, 2}}, false}))
                .find("LocalCPUBackend"),
            std::string::npos);

  // Every truncation of valid control messages (msgpack and JSON).
  std::vector<std::int64_t> tokens(16);
  std::iota(tokens.begin(), tokens.end(), 0);
  for (const std::string& whole :
       {wire::encode(wire::MoveWorkerMsg{"m1", kCpu, {"127.0.0.1:1", kCpu}, tokens, false}),
        wire::encode(wire::ClearWorkerMsg{"c1", kCpu}),
        wire::encode(wire::PinWorkerMsg{"p1", kCpu, tokens}), health,
        std::string(R"({"type": "HealthWorkerMsg", "worker_event_id": "j1"})")}) {
    for (std::size_t len = 1; len < whole.size(); ++len) {
      const std::string error = error_of(whole.substr(0, len));
      if (error.starts_with("not an ErrorMsg"))
        ADD_FAILURE() << whole.size() << "-byte message cut to " << len << ": " << error;
    }
  }

  // Hostile lengths and nesting: refused at once, nothing allocated for them.
  for (const std::string& hostile :
       {std::string("\xdd\xff\xff\xff\xff"), std::string("\xdf\xff\xff\xff\xff"),
        std::string("\xdb\xff\xff\xff\xff"), std::string("\xc6\xff\xff\xff\xff"),
        std::string(100000, '\x91') + "\x01",
        pack_map({{"type", fixstr("PinWorkerMsg")},
                  {"worker_event_id", fixstr("p")},
                  {"location", fixstr(kCpu)},
                  {"tokens", "\xdd\xff\xff\xff\xff"}})}) {
    EXPECT_FALSE(error_of(hostile).starts_with("not an ErrorMsg")) << hostile.size() << " bytes";
  }

  // What LMCache's worker answers: 0 tokens for another location or chunks not held, unknown
  // keys ignored, JSON accepted, a request in several frames read from its last.
  EXPECT_EQ(tokens_of(ask({wire::encode(wire::ClearWorkerMsg{"c2", "LocalDiskBackend"})})), 0);
  EXPECT_EQ(tokens_of(ask({pack_map({{"type", fixstr("ClearWorkerMsg")},
                                     {"worker_event_id", fixstr("c3")},
                                     {"location", fixstr(kCpu)},
                                     {"extra", "\x01"}})})),
            0);
  EXPECT_EQ(tokens_of(ask({wire::encode(wire::PinWorkerMsg{"p2", kCpu, tokens})})), 0);
  EXPECT_EQ(tokens_of(ask({wire::encode(wire::MoveWorkerMsg{
                "m2", "LocalDiskBackend", {"127.0.0.1:1", kCpu}, tokens, false})})),
            0);
  EXPECT_EQ(tokens_of(ask({wire::encode(
                wire::MoveWorkerMsg{"m4", kCpu, {"127.0.0.1:1", kCpu}, tokens, false})})),
            0);
  EXPECT_TRUE(std::holds_alternative<wire::HealthWorkerRetMsg>(
      ask({R"({"type": "HealthWorkerMsg", "worker_event_id": "j2"})"})));
  EXPECT_TRUE(std::holds_alternative<wire::HealthWorkerRetMsg>(ask({"garbage", health})));
  EXPECT_TRUE(std::holds_alternative<wire::ErrorMsg>(ask({health, "garbage"})));

  // A client that leaves before its answer does not wedge the port.
  {
    zmq::socket_t gone(client.context(), zmq::socket_type::req);
    gone.set(zmq::sockopt::linger, 2000);  // the request still goes out
    gone.connect("tcp://127.0.0.1:" + std::to_string(node.worker_port()));
    gone.send(zmq::buffer(health), zmq::send_flags::none);
    ++asked;
  }
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(healthy()) << "still serving, request " << i;

  // Every request was answered and counted, the errors as errors; the node runs on.
  EXPECT_TRUE(eventually([&] {
    return node.metric("kvnode_control_requests_total") == static_cast<double>(asked) &&
           node.metric("kvnode_control_errors_total") == static_cast<double>(errors);
  })) << node.metric("kvnode_control_requests_total")
      << " requests, " << node.metric("kvnode_control_errors_total") << " errors; asked " << asked
      << ", " << errors << " errors";
  const Json h = post_json(ctl->ports().http, "/health", Json{{"instance_id", node.instance()}});
  EXPECT_EQ(h["error_codes"], Json({{"0", 0}})) << h.dump();
  EXPECT_TRUE(node.running()) << node.log();
  std::cout << "[ fault    ] " << asked << " requests, " << errors << " answered with ErrorMsg\n";
}

// A peer that sends a message without the REQ envelope (a DEALER that skips the empty delimiter
// frame) once made libzmq 4.3.4's REP socket lose the reply to a later valid request, whoever sent
// it. The worker agent now serves the port with a ROUTER: every client gets its reply, and the
// delimiter-less DEALER gets one too (a single frame).
TEST(FaultTest, AMessageWithoutTheReqEnvelopeCostsNoOtherClientItsReply) {
  auto ctl = start_controller();
  KvnodeProcess node(unique_instance("fault-env"), ctl->ports(), "tcp", 0.01);
  node.start();
  ASSERT_TRUE(node.ready()) << node.log();
  const std::string health = wire::encode(wire::HealthWorkerMsg{"h"});
  int lost = 0;
  for (int round = 0; round < 10; ++round) {
    ReqClient client(node.worker_port(), 3s);
    if (!client.ask({health})) ++lost;
    {
      zmq::socket_t raw(client.context(), zmq::socket_type::dealer);
      raw.set(zmq::sockopt::linger, 2000);
      raw.connect("tcp://127.0.0.1:" + std::to_string(node.worker_port()));
      raw.set(zmq::sockopt::rcvtimeo, 3000);
      raw.send(zmq::buffer(health), zmq::send_flags::none);  // no empty frame first
      zmq::message_t answer;
      const bool got = raw.recv(answer, zmq::recv_flags::none).has_value() && !answer.more();
      const auto decoded = got ? wire::decode(answer.to_string_view()) : make_error("no reply");
      if (!decoded || !std::holds_alternative<wire::HealthWorkerRetMsg>(*decoded)) ++lost;
    }
    for (int i = 0; i < 3; ++i)
      if (!client.ask({health})) ++lost;
  }
  EXPECT_EQ(lost, 0) << "valid requests that got no reply";
  const Json h =
      post_json(ctl->ports().http, "/health", Json{{"instance_id", node.instance()}}, 60s);
  EXPECT_EQ(h["error_codes"], Json({{"0", 0}})) << h.dump();
}

}  // namespace
}  // namespace kvnode::node
