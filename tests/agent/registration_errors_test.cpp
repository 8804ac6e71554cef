// Issue 19 item 13, the agent's side: a failed registration is known within a second or two,
// with its reason (refused connection, a silent controller, the controller's ErrorMsg), and
// counted; none of them waits out the 30 s request timeout.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>
#include <zmq.hpp>

#include "kvnode/agent/worker_agent.hpp"
#include "kvnode/controller/controller.hpp"

namespace kvnode::agent {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

int closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), len), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

AgentOptions options_for(const std::string& instance, int pull, int reply) {
  AgentOptions o;
  o.instance_id = instance;
  o.controller_pull_url = "127.0.0.1:" + std::to_string(pull);
  o.controller_reply_url = "127.0.0.1:" + std::to_string(reply);
  o.heartbeat_period = 0ms;
  o.full_sync_startup_delay = 0ms;
  // request_timeout stays LMCache's 30 s: registration must not wait for it.
  return o;
}

// Waits for the first counted failure; its reason, or "" after `patience`.
std::string first_failure(WorkerAgent& agent, std::chrono::milliseconds patience) {
  for (const auto until = Clock::now() + patience; Clock::now() < until;
       std::this_thread::sleep_for(10ms)) {
    const AgentCounters c = agent.counters();
    if (c.register_failures > 0) return c.last_register_error;
  }
  return {};
}

TEST(RegistrationErrors, AnUnreachableControllerIsReportedAtOnce) {
  const int port = closed_port();
  auto agent = std::move(WorkerAgent::start(options_for("inst-refused", port, port), {})).value();
  const std::string why = first_failure(*agent, 2s);
  EXPECT_NE(why.find("connection refused"), std::string::npos) << why;
  EXPECT_NE(why.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << why;
  EXPECT_FALSE(agent->registered());
}

TEST(RegistrationErrors, ASilentControllerCostsTheRegistrationTimeoutNotTheRequestTimeout) {
  zmq::context_t ctx;
  zmq::socket_t mute(ctx, zmq::socket_type::router);  // accepts, never answers
  mute.set(zmq::sockopt::linger, 0);
  mute.bind("tcp://127.0.0.1:*");
  const std::string ep = mute.get(zmq::sockopt::last_endpoint);
  const int port = std::stoi(ep.substr(ep.rfind(':') + 1));
  AgentOptions o = options_for("inst-silent", port, port);
  o.register_timeout = 300ms;
  auto agent = std::move(WorkerAgent::start(o, {})).value();
  const std::string why = first_failure(*agent, 5s);
  EXPECT_NE(why.find("no reply"), std::string::npos) << why;
}

TEST(RegistrationErrors, TheControllersRefusalIsKeptWordForWord) {
  controller::ControllerConfig c;
  c.controller_host = "127.0.0.1";
  c.controller_port = 0;
  c.controller_monitor_ports = {0, 0, 0};
  c.log_level = "warn";
  c.max_workers = 1;
  auto ctl = std::move(controller::Controller::start(c)).value();
  const auto ports = ctl->ports();
  auto first =
      std::move(WorkerAgent::start(options_for("inst-1", ports.pull, ports.reply), {})).value();
  for (const auto until = Clock::now() + 10s; !first->registered() && Clock::now() < until;)
    std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(first->registered());
  auto second =
      std::move(WorkerAgent::start(options_for("inst-2", ports.pull, ports.reply), {})).value();
  const std::string why = first_failure(*second, 5s);
  EXPECT_NE(why.find("the controller refused: worker limit reached"), std::string::npos) << why;
  EXPECT_FALSE(second->registered());
}

}  // namespace
}  // namespace kvnode::agent
