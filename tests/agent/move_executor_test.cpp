// Moves run off the worker port's thread (issue 20 item 3), checked with a DEALER and a REQ
// straight to the agent's port: health is answered while a move runs, moves run one at a time in
// arrival order, a move beyond the queue bound is answered "busy" at once, and stopping waits for
// the running move and answers the queued ones, and a handler that throws anything at all gets
// its request answered with an ErrorMsg while the port keeps serving. The control handler is the
// test's own (the seam): its moves wait at a gate the test opens.
#include "move_executor.hpp"  // the texts of the ErrorMsgs the port writes itself

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "kvnode/agent/worker_agent.hpp"
#include "kvnode/controller/controller.hpp"
#include "kvnode/wire/codec.hpp"
#include "support/eventually.hpp"

namespace kvnode::agent {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
constexpr const char* kCpu = "LocalCPUBackend";
constexpr auto kPatience = 5s;
// Requests whose handler throws instead of answering: an int (no std::exception), or bad_alloc.
constexpr const char* kHealthThrowsInt = "throw an int";
constexpr std::int64_t kMoveThrowsInt = -7;
constexpr std::int64_t kMoveThrowsBadAlloc = -8;

// A control handler whose moves wait at a gate until the test opens it. A move's reply carries
// its first token as num_tokens, so each reply names its request.
class GatedMoves {
 public:
  wire::Msg handle(const wire::Msg& m) {
    if (const auto* health = std::get_if<wire::HealthWorkerMsg>(&m)) {
      if (health->worker_event_id == kHealthThrowsInt) throw 7;
      return wire::HealthWorkerRetMsg{0};
    }
    if (std::holds_alternative<wire::ClearWorkerMsg>(m)) return wire::ClearWorkerRetMsg{0};
    const auto* move = std::get_if<wire::MoveWorkerMsg>(&m);
    if (!move) return wire::ErrorMsg{"unexpected request"};
    const std::int64_t id = move->tokens && !move->tokens->empty() ? move->tokens->front() : -1;
    std::unique_lock lock(mutex_);
    started_.push_back(id);
    cv_.notify_all();
    if (id == kMoveThrowsInt) throw 7;
    if (id == kMoveThrowsBadAlloc) throw std::bad_alloc();
    cv_.wait(lock, [&] { return open_; });
    return wire::MoveWorkerRetMsg{id};
  }
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }
  // The moves whose handler has started, once at least `n` have (or the patience ran out).
  std::vector<std::int64_t> started(std::size_t n = 0) {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, kPatience, [&] { return started_.size() >= n; });
    return started_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
  std::vector<std::int64_t> started_;
};

wire::Msg move(std::int64_t id) {
  return wire::MoveWorkerMsg{
      "m" + std::to_string(id), kCpu, {"127.0.0.1:1", kCpu}, std::vector<std::int64_t>{id}, false};
}

// A DEALER that labels each request with a frame of its own ([label, "", payload]); the agent
// sends the envelope back with the reply, so replies that come out of order are told apart.
class Client {
 public:
  Client(zmq::context_t& ctx, int port) : socket_(ctx, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect("tcp://127.0.0.1:" + std::to_string(port));
  }
  void send(const std::string& label, const wire::Msg& m) {
    socket_.send(zmq::buffer(label), zmq::send_flags::sndmore);
    socket_.send(zmq::message_t(), zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(wire::encode(m)), zmq::send_flags::none);
  }
  // The next reply as (label, message), or nothing within `patience`.
  std::optional<std::pair<std::string, wire::Msg>> receive(std::chrono::milliseconds patience) {
    socket_.set(zmq::sockopt::rcvtimeo, static_cast<int>(patience.count()));
    std::vector<zmq::message_t> frames;
    zmq::message_t f;
    do {
      if (!socket_.recv(f)) return std::nullopt;
      frames.push_back(std::move(f));
    } while (frames.back().more());
    auto msg = wire::decode(frames.back().to_string_view());
    if (frames.size() != 3 || !msg) return std::nullopt;
    return std::pair{frames.front().to_string(), std::move(*msg)};
  }

 private:
  zmq::socket_t socket_;
};

std::int64_t moved(const wire::Msg& m) {
  const auto* ret = std::get_if<wire::MoveWorkerRetMsg>(&m);
  return ret ? ret->num_tokens : -1000;
}
std::string error_of(const wire::Msg& m) {
  const auto* e = std::get_if<wire::ErrorMsg>(&m);
  return e ? e->error : "not an ErrorMsg: " + std::string(wire::tag_of(m));
}

bool eventually(const std::function<bool()>& condition) {
  return test::eventually(condition, kPatience);
}

class MoveExecutorTest : public ::testing::Test {
 protected:
  void start(std::size_t max_queued_moves = 8) {
    controller::ControllerConfig c;
    c.controller_host = "127.0.0.1";
    c.controller_port = 0;
    c.controller_monitor_ports = {0, 0, 0};
    c.log_level = "warn";
    ctl_ = std::move(controller::Controller::start(c)).value();
    AgentOptions o;
    o.instance_id = "inst-A";
    o.controller_pull_url = "127.0.0.1:" + std::to_string(ctl_->ports().pull);
    o.controller_reply_url = "127.0.0.1:" + std::to_string(ctl_->ports().reply);
    o.heartbeat_period = 0ms;
    o.max_queued_moves = max_queued_moves;
    AgentHandlers h;
    h.control = [this](const wire::Msg& m) { return gate_.handle(m); };
    agent_ = std::move(WorkerAgent::start(o, h)).value();
    client_.emplace(ctx_, agent_->port());
  }
  void TearDown() override {
    gate_.open();  // a failed test must not leave the agent's stop waiting on a move
    client_.reset();
    agent_.reset();
  }

  GatedMoves gate_;  // outlives the agent that calls it
  std::unique_ptr<controller::Controller> ctl_;
  std::unique_ptr<WorkerAgent> agent_;
  zmq::context_t ctx_;
  std::optional<Client> client_;
};

TEST_F(MoveExecutorTest, HealthAndClearAreAnsweredWhileAMoveRuns) {
  start();
  client_->send("move", move(1));
  ASSERT_EQ(gate_.started(1), std::vector<std::int64_t>{1});
  // A REQ, as LMCache's controller asks, and the DEALER the move came on: both answered now.
  zmq::socket_t req(ctx_, zmq::socket_type::req);
  req.set(zmq::sockopt::linger, 0);
  req.set(zmq::sockopt::rcvtimeo, 2000);
  req.connect("tcp://127.0.0.1:" + std::to_string(agent_->port()));
  const auto asked = Clock::now();
  req.send(zmq::buffer(wire::encode(wire::HealthWorkerMsg{"h1"})), zmq::send_flags::none);
  zmq::message_t reply;
  ASSERT_TRUE(req.recv(reply)) << "health waited behind the move";
  EXPECT_LT(Clock::now() - asked, 1s);
  EXPECT_EQ(std::move(wire::decode(reply.to_string_view())).value(),
            wire::Msg(wire::HealthWorkerRetMsg{0}));
  client_->send("clear", wire::ClearWorkerMsg{"c1", kCpu});
  auto cleared = client_->receive(2s);
  ASSERT_TRUE(cleared.has_value()) << "clear waited behind the move";
  EXPECT_EQ(cleared->first, "clear");
  EXPECT_TRUE(std::holds_alternative<wire::ClearWorkerRetMsg>(cleared->second));

  EXPECT_EQ(agent_->counters().moves_running, 1u);
  EXPECT_FALSE(client_->receive(100ms).has_value()) << "the move answered before it ended";
  gate_.open();
  auto done = client_->receive(kPatience);
  ASSERT_TRUE(done.has_value()) << "the move's reply never came";
  EXPECT_EQ(done->first, "move");
  EXPECT_EQ(moved(done->second), 1);
  const AgentCounters c = agent_->counters();
  EXPECT_EQ(c.control_requests, 3u);
  EXPECT_EQ(c.control_errors, 0u);
  EXPECT_EQ(c.moves_running, 0u);
}

TEST_F(MoveExecutorTest, QueuedMovesRunOneAtATimeInArrivalOrder) {
  start();
  for (std::int64_t id : {1, 2, 3}) client_->send("move " + std::to_string(id), move(id));
  ASSERT_EQ(gate_.started(1), std::vector<std::int64_t>{1});
  ASSERT_TRUE(eventually([&] { return agent_->counters().moves_queued == 2; }));
  EXPECT_EQ(agent_->counters().moves_running, 1u);
  EXPECT_EQ(gate_.started(), std::vector<std::int64_t>{1}) << "a second move ran alongside";
  gate_.open();
  for (std::int64_t id : {1, 2, 3}) {
    auto r = client_->receive(kPatience);
    ASSERT_TRUE(r.has_value()) << "no reply for move " << id;
    EXPECT_EQ(r->first, "move " + std::to_string(id));
    EXPECT_EQ(moved(r->second), id);
  }
  EXPECT_EQ(gate_.started(), (std::vector<std::int64_t>{1, 2, 3}));
  const AgentCounters c = agent_->counters();
  EXPECT_EQ(c.moves_queued, 0u);
  EXPECT_EQ(c.moves_refused, 0u);
}

TEST_F(MoveExecutorTest, AMoveBeyondTheQueueBoundIsAnsweredBusyAtOnce) {
  start(/*max_queued_moves=*/1);
  client_->send("move 1", move(1));
  ASSERT_EQ(gate_.started(1), std::vector<std::int64_t>{1});
  client_->send("move 2", move(2));  // waits
  client_->send("move 3", move(3));  // one too many
  auto busy = client_->receive(2s);
  ASSERT_TRUE(busy.has_value()) << "the refused move was not answered at once";
  EXPECT_EQ(busy->first, "move 3");
  EXPECT_TRUE(error_of(busy->second).starts_with(kBusyPrefix)) << error_of(busy->second);
  EXPECT_EQ(error_of(busy->second), busy_text(/*running=*/1, /*queued=*/1));
  EXPECT_EQ(agent_->counters().moves_refused, 1u);
  gate_.open();
  for (std::int64_t id : {1, 2}) {
    auto r = client_->receive(kPatience);
    ASSERT_TRUE(r.has_value()) << "no reply for move " << id;
    EXPECT_EQ(r->first, "move " + std::to_string(id));
    EXPECT_EQ(moved(r->second), id);
  }
  EXPECT_EQ(gate_.started(), (std::vector<std::int64_t>{1, 2}));
}

TEST_F(MoveExecutorTest, StoppingWaitsForTheRunningMoveAndRefusesTheQueuedOnes) {
  start();
  client_->send("move 1", move(1));
  client_->send("move 2", move(2));
  ASSERT_EQ(gate_.started(1), std::vector<std::int64_t>{1});
  ASSERT_TRUE(eventually([&] { return agent_->counters().moves_queued == 1; }));
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    agent_.reset();
    stopped = true;
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(stopped.load()) << "the agent stopped while its move still ran";
  gate_.open();
  stopper.join();
  auto first = client_->receive(kPatience);
  ASSERT_TRUE(first.has_value()) << "the running move was not answered";
  EXPECT_EQ(first->first, "move 1");
  EXPECT_EQ(moved(first->second), 1);
  auto second = client_->receive(kPatience);
  ASSERT_TRUE(second.has_value()) << "the queued move was not answered";
  EXPECT_EQ(second->first, "move 2");
  EXPECT_EQ(error_of(second->second), kStoppingText);
  EXPECT_EQ(gate_.started(), std::vector<std::int64_t>{1});
}

TEST_F(MoveExecutorTest, AHandlerThatThrowsAnythingIsAnsweredWithAnErrorMsgAndServingGoesOn) {
  start();
  // On the port's thread: an int is no std::exception, and once ended the process.
  client_->send("health throws", wire::HealthWorkerMsg{kHealthThrowsInt});
  auto health = client_->receive(2s);
  ASSERT_TRUE(health.has_value()) << "the throwing health request was not answered";
  EXPECT_EQ(health->first, "health throws");
  EXPECT_EQ(error_of(health->second), kUnknownExceptionText);
  // On the move executor's thread: an int, then a std::exception (its what() is the reason).
  client_->send("move throws int", move(kMoveThrowsInt));
  auto thrown = client_->receive(kPatience);
  ASSERT_TRUE(thrown.has_value()) << "the move that threw an int was not answered";
  EXPECT_EQ(thrown->first, "move throws int");
  EXPECT_EQ(error_of(thrown->second), kUnknownExceptionText);
  client_->send("move throws bad_alloc", move(kMoveThrowsBadAlloc));
  auto no_memory = client_->receive(kPatience);
  ASSERT_TRUE(no_memory.has_value()) << "the move that threw bad_alloc was not answered";
  EXPECT_EQ(no_memory->first, "move throws bad_alloc");
  EXPECT_EQ(error_of(no_memory->second), std::string(kWorkerErrorPrefix) + std::bad_alloc().what());

  // Both threads still serve.
  client_->send("health", wire::HealthWorkerMsg{"h2"});
  auto healthy = client_->receive(2s);
  ASSERT_TRUE(healthy.has_value()) << "health was not answered after a handler threw";
  EXPECT_EQ(healthy->second, wire::Msg(wire::HealthWorkerRetMsg{0}));
  gate_.open();
  client_->send("move 1", move(1));
  auto moved_one = client_->receive(kPatience);
  ASSERT_TRUE(moved_one.has_value()) << "a move was not answered after a move threw";
  EXPECT_EQ(moved_one->first, "move 1");
  EXPECT_EQ(moved(moved_one->second), 1);
  EXPECT_EQ(gate_.started(), (std::vector<std::int64_t>{kMoveThrowsInt, kMoveThrowsBadAlloc, 1}));
  const AgentCounters c = agent_->counters();
  EXPECT_EQ(c.control_requests, 5u);
  EXPECT_EQ(c.control_errors, 3u);
  EXPECT_EQ(c.moves_running, 0u);
}

}  // namespace
}  // namespace kvnode::agent
