// The worker agent against the real controller (in-process, real ZMQ sockets on loopback):
// registration and its retries, batched admits and evicts the controller indexes, heartbeats that
// bring a full sync, requests on the worker's DEALER, control requests on its REP port (every
// one answered), and de-registration on a clean stop.
#include "kvnode/agent/worker_agent.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <zmq.hpp>

#include "kvnode/controller/controller.hpp"
#include "kvnode/wire/codec.hpp"
#include "support/eventually.hpp"

namespace kvnode::agent {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
constexpr const char* kCpu = "LocalCPUBackend";

controller::ControllerConfig loopback(int pull = 0, int reply = 0, int heartbeat = 0) {
  controller::ControllerConfig c;
  c.controller_host = "127.0.0.1";
  c.controller_port = 0;
  c.controller_monitor_ports = {pull, reply, heartbeat};
  c.log_level = "warn";
  return c;
}

using test::eventually;

AgentOptions options_for(int pull, int reply) {
  AgentOptions o;
  o.instance_id = "inst-A";
  o.worker_id = 0;
  o.controller_pull_url = "127.0.0.1:" + std::to_string(pull);
  o.controller_reply_url = "127.0.0.1:" + std::to_string(reply);
  o.peer_init_url = "127.0.0.1:18601";
  o.heartbeat_period = 100ms;
  o.request_timeout = 500ms;
  o.register_backoff_first = 20ms;
  o.register_backoff_max = 100ms;
  o.full_sync_startup_delay = 0ms;
  o.full_sync_retry_delay = 50ms;
  o.full_sync_poll_interval = 50ms;
  return o;
}

// Hits the controller reports for `hashes` to another instance (rank 0).
std::int64_t hits_for_others(WorkerAgent& asker, std::int64_t first, std::int64_t n) {
  wire::BatchedP2PLookupMsg q{{}, "someone-else", 0};
  for (std::int64_t i = 0; i < n; ++i) q.hashes.emplace_back(first + i);
  Result<wire::Msg> r = asker.call(q);
  if (!r) return -1;
  const auto* ret = std::get_if<wire::BatchedP2PLookupRetMsg>(&*r);
  if (!ret || ret->layout_info.empty()) return -1;
  return ret->layout_info[0].instance_id == "inst-A" ? ret->layout_info[0].num_hit_chunks : 0;
}

TEST(WorkerAgent, RegistersReportsHeartbeatsAndDeregisters) {
  auto ctl = std::move(controller::Controller::start(loopback())).value();
  std::mutex mutex;
  std::vector<bool> freezes;
  AgentHandlers handlers;
  handlers.snapshot = [] { return std::vector<std::int64_t>{}; };
  handlers.freeze = [&](bool on) {
    std::lock_guard lock(mutex);
    freezes.push_back(on);
  };
  auto agent =
      std::move(WorkerAgent::start(options_for(ctl->ports().pull, ctl->ports().reply), handlers))
          .value();
  ASSERT_TRUE(eventually([&] { return agent->registered(); }));
  EXPECT_GT(agent->port(), 0);
  // A fresh controller asks every worker's first heartbeat for a full sync; it runs frozen.
  // (A node is frozen then: nothing it stores meanwhile would survive the sync's reset.)
  ASSERT_TRUE(eventually([&] { return agent->counters().full_syncs_completed >= 1; }));
  {
    std::lock_guard lock(mutex);
    ASSERT_GE(freezes.size(), 2u);
    EXPECT_TRUE(freezes[0]);
    EXPECT_FALSE(freezes[1]);
  }
  EXPECT_GT(agent->counters().heartbeats, 0u);

  for (std::int64_t h = 1; h <= 120; ++h) agent->report(kCpu, wire::OpType::kAdmit, h);
  ASSERT_TRUE(eventually([&] { return hits_for_others(*agent, 1, 120) == 120; }));
  for (std::int64_t h = 61; h <= 120; ++h) agent->report(kCpu, wire::OpType::kEvict, h);
  ASSERT_TRUE(eventually([&] { return hits_for_others(*agent, 1, 120) == 60; }));
  EXPECT_TRUE(eventually([&] { return agent->counters().events_sent == 180u; }));
  EXPECT_EQ(agent->counters().events_dropped, 0u);

  // Another agent asks; after inst-A stops cleanly the controller forgets it and its chunks.
  AgentOptions other = options_for(ctl->ports().pull, ctl->ports().reply);
  other.instance_id = "someone-else";
  auto asker = std::move(WorkerAgent::start(other, {})).value();
  EXPECT_EQ(hits_for_others(*asker, 1, 60), 60);
  agent.reset();
  wire::BatchedP2PLookupMsg q{{wire::ChunkHash(1)}, "third", 0};
  ASSERT_TRUE(eventually([&] {
    Result<wire::Msg> r = asker->call(q);
    const auto* ret = r ? std::get_if<wire::BatchedP2PLookupRetMsg>(&*r) : nullptr;
    return ret && !ret->layout_info.empty() && ret->layout_info[0].num_hit_chunks == 0;
  }));
}

TEST(WorkerAgent, AFullSyncRebuildsTheIndexAfterTheControllerRestarts) {
  auto ctl = std::move(controller::Controller::start(loopback())).value();
  const int pull = ctl->ports().pull, reply = ctl->ports().reply, beat = ctl->ports().heartbeat;
  std::vector<std::int64_t> held;
  for (std::int64_t h = 1000; h < 5500; ++h) held.push_back(h);  // 4500 keys: 3 batches of 2000
  AgentHandlers handlers;
  handlers.snapshot = [&] { return held; };
  std::atomic<int> frozen{0};
  handlers.freeze = [&](bool on) { frozen += on ? 1 : -1; };
  auto agent = std::move(WorkerAgent::start(options_for(pull, reply), handlers)).value();
  AgentOptions other = options_for(pull, reply);
  other.instance_id = "someone-else";
  other.heartbeat_period = 0ms;
  auto asker = std::move(WorkerAgent::start(other, {})).value();
  ASSERT_TRUE(eventually([&] { return agent->counters().full_syncs_completed >= 1; }));
  EXPECT_EQ(hits_for_others(*asker, 1000, 4500), 4500) << "the first heartbeat's full sync";
  EXPECT_EQ(frozen.load(), 0);

  // The controller dies and comes back empty on the same ports: the next heartbeat
  // re-registers the worker and its full sync restores every key.
  ctl.reset();
  const auto syncs = agent->counters().full_syncs_completed;
  ctl = std::move(controller::Controller::start(loopback(pull, reply, beat))).value();
  ASSERT_TRUE(eventually([&] { return agent->counters().full_syncs_completed > syncs; }));
  EXPECT_EQ(hits_for_others(*asker, 1000, 4500), 4500);
  EXPECT_EQ(frozen.load(), 0) << "every freeze was undone";
}

TEST(WorkerAgent, KeepsTryingToRegisterUntilTheControllerIsUp) {
  // Ports nobody listens on yet: take two free ones from a controller, then stop it.
  int pull = 0, reply = 0;
  {
    auto probe = std::move(controller::Controller::start(loopback())).value();
    pull = probe->ports().pull;
    reply = probe->ports().reply;
  }
  auto agent = std::move(WorkerAgent::start(options_for(pull, reply), {})).value();
  agent->report(kCpu, wire::OpType::kAdmit, 7);  // waits for registration, then goes out
  std::this_thread::sleep_for(700ms);
  EXPECT_FALSE(agent->registered());
  EXPECT_GE(agent->counters().register_attempts, 1u);
  auto ctl = std::move(controller::Controller::start(loopback(pull, reply))).value();
  ASSERT_TRUE(eventually([&] { return agent->registered(); }));
  AgentOptions other = options_for(pull, reply);
  other.instance_id = "someone-else";
  auto asker = std::move(WorkerAgent::start(other, {})).value();
  EXPECT_TRUE(eventually([&] { return hits_for_others(*asker, 7, 1) == 1; }));
}

// A controller that dies with a heartbeat in flight: the heartbeat's connection drops, so the
// agent gives up on it at once and the next heartbeat reaches the controller that comes back on
// the same port, long before the request timeout (LMCache's worker waits that long, 30 s).
TEST(WorkerAgent, AHeartbeatInFlightWhenTheControllerDiesIsRetriedAtOnce) {
  // Each fake in its own context: closing a context waits until its listener is gone, so the
  // port can be bound again at once.
  auto first_ctx = std::make_unique<zmq::context_t>();
  zmq::context_t second_ctx;
  auto fake_controller = [&](zmq::context_t& ctx, int port) {
    zmq::socket_t s(ctx, zmq::socket_type::router);
    s.set(zmq::sockopt::linger, 0);
    s.bind("tcp://127.0.0.1:" + std::to_string(port));
    return s;
  };
  // The next request's [identity, payload], or nothing within `patience`.
  auto next_request = [](zmq::socket_t& s, std::chrono::milliseconds patience)
      -> std::optional<std::pair<zmq::message_t, wire::Msg>> {
    s.set(zmq::sockopt::rcvtimeo, static_cast<int>(patience.count()));
    std::vector<zmq::message_t> frames;
    zmq::message_t f;
    do {
      if (!s.recv(f)) return std::nullopt;
      frames.push_back(std::move(f));
    } while (frames.back().more());
    auto msg = wire::decode(frames.back().to_string_view());
    if (!msg) return std::nullopt;
    return std::pair{std::move(frames.front()), std::move(*msg)};
  };
  zmq::socket_t first = fake_controller(*first_ctx, 0);
  const std::string bound = first.get(zmq::sockopt::last_endpoint);
  const int port = std::stoi(bound.substr(bound.rfind(':') + 1));

  AgentOptions o = options_for(1, port);  // PULL events go nowhere; this test is about requests
  o.request_timeout = 20s;
  auto agent = std::move(WorkerAgent::start(o, {})).value();
  auto hello = next_request(first, 5s);
  ASSERT_TRUE(hello && std::holds_alternative<wire::RegisterMsg>(hello->second));
  first.send(hello->first, zmq::send_flags::sndmore);
  first.send(zmq::message_t(), zmq::send_flags::sndmore);
  first.send(zmq::buffer(wire::encode(wire::RegisterRetMsg{})), zmq::send_flags::none);
  ASSERT_TRUE(eventually([&] { return agent->registered(); }));
  auto beat = next_request(first, 5s);
  ASSERT_TRUE(beat && std::holds_alternative<wire::HeartbeatMsg>(beat->second));

  first.close();  // dies without answering
  first_ctx.reset();
  const auto died = Clock::now();
  zmq::socket_t second = fake_controller(second_ctx, port);
  auto after = next_request(second, 10s);
  const auto waited = Clock::now() - died;
  ASSERT_TRUE(after.has_value()) << "no request reached the controller that came back";
  EXPECT_TRUE(std::holds_alternative<wire::HeartbeatMsg>(after->second));
  EXPECT_LT(waited, 5s) << "the agent waited out the request timeout";
  EXPECT_GE(agent->counters().heartbeat_failures, 1u);
}

TEST(WorkerAgent, AnswersEveryControlRequest) {
  auto ctl = std::move(controller::Controller::start(loopback())).value();
  AgentHandlers handlers;
  handlers.control = [](const wire::Msg& m) -> wire::Msg {
    if (std::holds_alternative<wire::HealthWorkerMsg>(m))
      throw std::runtime_error("memcheck exploded");
    if (const auto* clear = std::get_if<wire::ClearWorkerMsg>(&m))
      return wire::ClearWorkerRetMsg{clear->location == kCpu ? 512 : 0};
    return wire::ErrorMsg{"not supported by this node"};
  };
  auto agent =
      std::move(WorkerAgent::start(options_for(ctl->ports().pull, ctl->ports().reply), handlers))
          .value();
  zmq::context_t ctx;
  zmq::socket_t req(ctx, zmq::socket_type::req);
  req.set(zmq::sockopt::linger, 0);
  req.set(zmq::sockopt::rcvtimeo, 5000);
  req.connect("tcp://127.0.0.1:" + std::to_string(agent->port()));
  auto ask = [&](const std::string& payload) -> wire::Msg {
    req.send(zmq::buffer(payload), zmq::send_flags::none);
    zmq::message_t reply;
    if (!req.recv(reply)) {
      ADD_FAILURE() << "no answer";
      return wire::ErrorMsg{"no answer"};
    }
    return std::move(wire::decode(reply.to_string_view())).value();
  };
  const wire::Msg cleared = ask(wire::encode(wire::ClearWorkerMsg{"e1", kCpu}));
  ASSERT_TRUE(std::holds_alternative<wire::ClearWorkerRetMsg>(cleared));
  EXPECT_EQ(std::get<wire::ClearWorkerRetMsg>(cleared).num_tokens, 512);

  auto error_of = [](const wire::Msg& m) {
    const auto* e = std::get_if<wire::ErrorMsg>(&m);
    return e ? e->error : std::string("not an ErrorMsg");
  };
  EXPECT_EQ(error_of(ask(wire::encode(wire::HealthWorkerMsg{"e2"}))),
            "Worker error: memcheck exploded");
  EXPECT_EQ(error_of(ask(wire::encode(wire::LookupMsg{"e9", {1, 2, 3}}))),
            "Unknown message: " + wire::python_class_text("LookupMsg"));
  EXPECT_NE(error_of(ask("\xc1 not msgpack")).find("Worker error: "), std::string::npos);
  EXPECT_EQ(error_of(ask(wire::encode(wire::PinWorkerMsg{"e3", kCpu, {1}}))),
            "not supported by this node");
  const AgentCounters c = agent->counters();
  EXPECT_EQ(c.control_requests, 5u);
  EXPECT_EQ(c.control_errors, 4u);
}

TEST(WorkerAgent, BadOptionsAreRefusedByName) {
  AgentOptions o;
  EXPECT_NE(WorkerAgent::start(o, {}).error().message.find("instance_id"), std::string::npos);
  o.instance_id = "x";
  EXPECT_NE(WorkerAgent::start(o, {}).error().message.find("controller_pull_url"),
            std::string::npos);
}

}  // namespace
}  // namespace kvnode::agent
