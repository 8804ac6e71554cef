// Issue 20's "done when": a health request answered through the controller in under 100 ms p99
// while a 10 s move runs. A real kvcontroller process, two real worker agents registered with it
// over ZMQ, the move started through the controller's HTTP API (POST /move, as kvctl sends it)
// and /health asked over and over while it runs. The source's control handler is the test's own
// (the seam): its move takes 10 s and moves 4096 tokens. Before moves had their own thread, each
// health request waited behind the move for what was left of its 10 s.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kvnode/agent/worker_agent.hpp"
#include "support/child_process.hpp"
#include "support/http_client.hpp"

namespace kvnode::agent {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;
constexpr const char* kCpu = "LocalCPUBackend";
constexpr auto kMoveTakes = 10s;
constexpr std::int64_t kMovedTokens = 4096;

struct ControllerPorts {
  int http = 0, pull = 0, reply = 0;
};

// kvcontroller on ephemeral ports: they are read from the line its log opens with.
std::optional<ControllerPorts> ports_of(test::ChildProcess& controller) {
  for (const auto until = Clock::now() + 30s; Clock::now() < until && controller.running();) {
    const std::string log = controller.output();
    const auto at = log.find("kvcontroller listening on ");
    ControllerPorts p;
    if (at != std::string::npos &&
        std::sscanf(log.c_str() + log.find(": http ", at), ": http %d pull %d reply %d", &p.http,
                    &p.pull, &p.reply) == 3)
      return p;
    std::this_thread::sleep_for(20ms);
  }
  return std::nullopt;
}

AgentOptions agent_options(const std::string& instance, const ControllerPorts& ports,
                           int peer_port) {
  AgentOptions o;
  o.instance_id = instance;
  o.controller_pull_url = "127.0.0.1:" + std::to_string(ports.pull);
  o.controller_reply_url = "127.0.0.1:" + std::to_string(ports.reply);
  o.peer_init_url = "127.0.0.1:" + std::to_string(peer_port);  // a destination's address
  o.heartbeat_period = 1s;
  o.full_sync_startup_delay = 0ms;
  return o;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v.empty() ? 0 : v[std::clamp<std::size_t>(rank, 1, v.size()) - 1];
}

TEST(HealthDuringAMove, TheControllerAnswersHealthUnder100msP99WhileA10sMoveRuns) {
  test::ChildProcess controller({KVCONTROLLER_PATH, "--host", "127.0.0.1", "--port", "0",
                                 "--monitor-ports", R"({"pull":0,"reply":0,"heartbeat":0})",
                                 "--log-level", "info"});
  const std::optional<ControllerPorts> ports = ports_of(controller);
  ASSERT_TRUE(ports.has_value()) << controller.output();

  std::atomic<bool> moving{false};
  AgentHandlers source;
  source.control = [&](const wire::Msg& m) -> wire::Msg {
    if (std::holds_alternative<wire::HealthWorkerMsg>(m)) return wire::HealthWorkerRetMsg{0};
    if (std::holds_alternative<wire::MoveWorkerMsg>(m)) {
      moving = true;
      std::this_thread::sleep_for(kMoveTakes);
      return wire::MoveWorkerRetMsg{kMovedTokens};
    }
    return wire::ErrorMsg{"unexpected request"};
  };
  source.snapshot = [] { return std::vector<std::int64_t>{}; };
  AgentHandlers destination;
  destination.snapshot = source.snapshot;
  auto a = std::move(WorkerAgent::start(agent_options("inst-A", *ports, 18711), source)).value();
  auto b =
      std::move(WorkerAgent::start(agent_options("inst-B", *ports, 18712), destination)).value();
  for (const auto until = Clock::now() + 30s;
       !(a->registered() && b->registered()) && Clock::now() < until;)
    std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(a->registered() && b->registered()) << controller.output();

  auto client = [&] {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", ports->http);
    c->set_connection_timeout(5s);
    c->set_read_timeout(60s);
    return c;
  };
  int move_status = 0;
  std::string move_body;
  std::atomic<bool> move_done{false};
  const auto move_started = Clock::now();
  std::thread mover([&] {
    const Json body{{"old_position", {"inst-A", kCpu}},
                    {"new_position", {"inst-B", kCpu}},
                    {"tokens", {1, 2, 3}}};
    if (auto r = client()->Post("/move", body.dump(), "application/json")) {
      move_status = r->status;
      move_body = r->body;
    }
    move_done = true;
  });
  for (const auto until = Clock::now() + 10s; !moving && Clock::now() < until;)
    std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(moving.load()) << "the move never reached the source";

  // One keep-alive connection for every sample: what is measured is the controller's answer, not
  // a TCP connect (on a loaded CI host a connect alone can take longer than the p99 allows). The
  // connection is opened before the first sample; httplib reconnects if the server closes it.
  // NODELAY, as a latency-minded client sets it: httplib sends a POST's headers and body apart.
  const std::unique_ptr<httplib::Client> health = client();
  health->set_keep_alive(true);
  health->set_tcp_nodelay(true);
  const Json ask{{"instance_id", "inst-A"}};
  ASSERT_TRUE(health->Post("/health", ask.dump(), "application/json")) << "no answer to /health";
  std::vector<double> ms;  // /health round trips while the move runs
  while (!move_done) {
    const auto t0 = Clock::now();
    auto r = health->Post("/health", ask.dump(), "application/json");
    const auto took = Clock::now() - t0;
    if (move_done) break;  // it may have waited for the move's end: not a sample of "during"
    ms.push_back(std::chrono::duration<double, std::milli>(took).count());
    ASSERT_TRUE(r) << "no answer to /health";
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(Json::parse(r->body, nullptr, false).value("error_codes", Json()), (Json{{"0", 0}}))
        << r->body;
    std::this_thread::sleep_for(20ms);
  }
  mover.join();
  const auto move_took = Clock::now() - move_started;

  ASSERT_EQ(move_status, 200) << move_body;
  EXPECT_EQ(Json::parse(move_body, nullptr, false).value("num_tokens", -1), kMovedTokens)
      << move_body;
  EXPECT_GE(move_took, kMoveTakes);
  ASSERT_GE(ms.size(), 50u) << "too few health requests answered during the move";
  const double p99 = percentile(ms, 0.99);
  std::printf("/health during a %lld s move: %zu requests, p50 %.2f ms, p99 %.2f ms, max %.2f ms\n",
              static_cast<long long>(kMoveTakes.count()), ms.size(), percentile(ms, 0.5), p99,
              percentile(ms, 1.0));
  EXPECT_LT(p99, 100.0);
  // On a kept-alive connection an answer must not wait for the client's delayed ACK (40 ms a
  // request, the median's floor when the server's sockets kept Nagle on).
  EXPECT_LT(percentile(ms, 0.5), 20.0);
}

}  // namespace
}  // namespace kvnode::agent
