// Issue 19 item 5 over real sockets: registrations that never heartbeat are reaped once their
// worker port refuses a connection (a live one is kept, D5), and --max-workers refuses beyond
// the limit with an ErrorMsg that names it.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "support/http_client.hpp"
#include "zmq_peers.hpp"

namespace kvnode::test {
namespace {

using namespace controller;

// A loopback port nothing listens on: bound, then closed (the kernel hands ports out
// round-robin, so it stays free for the test's few seconds).
int dead_port() {
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

wire::RegisterMsg worker(const std::string& inst, std::int64_t port) {
  return wire::RegisterMsg{inst, 0, "127.0.0.1", port, std::nullopt};
}

std::vector<std::string> registered(int http_port) {
  httplib::Client http("127.0.0.1", http_port);
  auto res = http.Get("/controller/workers");
  std::vector<std::string> out;
  if (!res || res->status != 200) {
    ADD_FAILURE() << "GET /controller/workers: "
                  << (res ? std::to_string(res->status) + " " + res->body
                          : httplib::to_string(res.error()));
    return out;
  }
  const auto body = nlohmann::json::parse(res->body);
  for (const auto& w : body.at("workers")) out.push_back(w.at("instance_id").get<std::string>());
  return out;
}

TEST(WorkerLiveness, NeverHeartbeatedWorkersAtDeadPortsAreReapedLiveOnesKept) {
  auto c = loopback_config();
  c.health_check_interval = 1;
  c.lmcache_worker_timeout = 1;
  auto ctl = start_controller(c);
  ASSERT_TRUE(ctl);
  zmq::context_t ctx;
  // A worker without heartbeats (LMCache's default) whose REP port is alive.
  zmq::socket_t rep(ctx, zmq::socket_type::rep);
  rep.set(zmq::sockopt::linger, 0);
  rep.bind("tcp://127.0.0.1:*");
  const std::string ep = rep.get(zmq::sockopt::last_endpoint);
  const int live_port = std::stoi(ep.substr(ep.rfind(':') + 1));
  Dealer d(ctx, ctl->ports().reply);
  d.call_as<wire::RegisterRetMsg>(worker("inst-live", live_port));
  constexpr int kDead = 300;  // died before their first heartbeat, or never existed
  const int port = dead_port();
  for (int i = 0; i < kDead; ++i)
    d.call_as<wire::RegisterRetMsg>(worker("inst-dead-" + std::to_string(i), port));
  ASSERT_EQ(registered(ctl->ports().http).size(), std::size_t{kDead + 1});
  EXPECT_TRUE(eventually([&] { return registered(ctl->ports().http).size() == 1; },
                         std::chrono::seconds(20)));
  EXPECT_EQ(registered(ctl->ports().http), std::vector<std::string>{"inst-live"});
  httplib::Client http("127.0.0.1", ctl->ports().http);
  EXPECT_TRUE(eventually([&] {  // counted just after the registry let them go
    auto metrics = http.Get("/metrics");
    return metrics &&
           metrics->body.find("kvnode_controller_workers_reaped_total 300\n") != std::string::npos;
  }));
  // One more dies before its first heartbeat: reaped in a later round, the live one stays.
  d.call_as<wire::RegisterRetMsg>(worker("inst-dead-late", port));
  EXPECT_TRUE(eventually([&] { return registered(ctl->ports().http).size() == 1; },
                         std::chrono::seconds(20)));
  EXPECT_EQ(registered(ctl->ports().http), std::vector<std::string>{"inst-live"});
}

TEST(WorkerLimit, RegistrationsBeyondMaxWorkersGetAnErrorNamingTheLimit) {
  auto c = loopback_config();
  c.max_workers = 3;
  auto ctl = start_controller(c);
  ASSERT_TRUE(ctl);
  zmq::context_t ctx;
  Dealer d(ctx, ctl->ports().reply);
  Dealer hb(ctx, ctl->ports().heartbeat);
  for (int i = 0; i < 3; ++i)
    d.call_as<wire::RegisterRetMsg>(worker("inst-" + std::to_string(i), 18500 + i));
  auto refused = d.call(worker("inst-3", 18503));
  ASSERT_TRUE(std::holds_alternative<wire::ErrorMsg>(refused));
  EXPECT_NE(std::get<wire::ErrorMsg>(refused).error.find("--max-workers is 3"), std::string::npos)
      << std::get<wire::ErrorMsg>(refused).error;
  // A heartbeat would register it too: refused the same way.
  auto beat = hb.call(wire::HeartbeatMsg{"inst-4", 0, "127.0.0.1", 18504, std::nullopt});
  EXPECT_TRUE(std::holds_alternative<wire::ErrorMsg>(beat));
  // Known workers re-register and heartbeat as before.
  d.call_as<wire::RegisterRetMsg>(worker("inst-0", 18510));
  hb.call_as<wire::HeartbeatRetMsg>(
      wire::HeartbeatMsg{"inst-1", 0, "127.0.0.1", 18501, std::nullopt});
  EXPECT_EQ(registered(ctl->ports().http).size(), 3u);
  // A place freed is a place taken.
  Pusher p(ctx, ctl->ports().pull);
  p.send(wire::DeRegisterMsg{"inst-2", 0, "127.0.0.1", 18502});
  EXPECT_TRUE(eventually([&] {
    return std::holds_alternative<wire::RegisterRetMsg>(d.call(worker("inst-3", 18503)));
  }));
  httplib::Client http("127.0.0.1", ctl->ports().http);
  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("kvnode_controller_registrations_refused_total"), std::string::npos);
}

}  // namespace
}  // namespace kvnode::test
