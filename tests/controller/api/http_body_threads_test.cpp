// Requests with a body may hold only a share of the handler threads (issue 19 item 4, after
// review): clients POSTing bodies just above the minimum rate are never cut, and each used to hold
// a handler thread for the whole body, so a few of them (kvnode has 4 threads) left none for
// /health and a liveness probe failed. Now a body beyond the share is answered 503 at once
// (Retry-After: 1, Connection: close) and a request without a body always finds a thread:
// /health and /metrics answer in under 100 ms p99 while such clients send.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "api_fixture.hpp"
#include "kvnode/httpd/server.hpp"
#include "support/eventually.hpp"
#include "support/http_client.hpp"
#include "trickle.hpp"

namespace kvnode::httpd::testing {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t kKiB = 1 << 10;
constexpr std::size_t kMiB = 1 << 20;
constexpr std::size_t kProbes = 50;
constexpr std::chrono::microseconds kProbeTarget = 100ms;  // issue 19 item 4: p99 under 100 ms
constexpr std::chrono::microseconds kProbeTimeout = 1s;    // a probe this late has failed
constexpr std::size_t kGiveUpAfter = 3;  // failed probes: the answer is known, stop early

using test::eventually;

// GETs `path` on a new connection each time, as a liveness probe does; the latencies sorted, a
// failed or late probe counting as kProbeTimeout.
std::vector<std::chrono::microseconds> probe(int port, const std::string& path) {
  std::vector<std::chrono::microseconds> took;
  std::size_t failed = 0;
  for (std::size_t i = 0; i < kProbes && failed < kGiveUpAfter; ++i) {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(kProbeTimeout);
    c.set_read_timeout(kProbeTimeout);
    const auto start = Clock::now();
    const auto r = c.Get(path.c_str());
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
    if (!r || r->status != 200) {
      ++failed;
      us = std::max(us, kProbeTimeout);
    }
    took.push_back(us);
    std::this_thread::sleep_for(10ms);
  }
  std::sort(took.begin(), took.end());
  return took;
}

std::chrono::microseconds p99(const std::vector<std::chrono::microseconds>& sorted) {
  return sorted.at((sorted.size() * 99 + 99) / 100 - 1);
}

// `clients` POST bodies of `declared` bytes at 1.5 times the minimum rate (never cut) while
// `path` is probed; checks the probes' p99, that the bodies beyond `share` were refused 503 at
// once with Retry-After and Connection: close, and that the others are still being read.
void expect_probes_fast_while_bodies_trickle(int port, const std::string& probed,
                                             const std::string& posted, std::size_t clients,
                                             std::size_t declared, std::size_t share,
                                             const Limits& limits,
                                             const std::function<Counters()>& counters) {
  Trickle slow;
  const std::size_t rate = limits.min_body_bytes_per_second * 3 / 2;
  for (std::size_t i = 0; i < clients; ++i) slow.start(port, posted, declared, rate);
  // Every refused one has been answered; the others hold their threads.
  const std::size_t refused = clients > share ? clients - share : 0;
  EXPECT_TRUE(eventually([&] { return slow.spoken() >= refused; }, 5s));
  std::this_thread::sleep_for(200ms);
  const auto took = probe(port, probed);
  std::printf(
      "%zu clients POSTing %zu MiB at %zu KiB/s, %zu handler threads: GET %s p50 %.2f ms, "
      "p99 %.2f ms over %zu probes; %zu bodies answered\n",
      clients, declared / kMiB, rate / kKiB, limits.handler_threads, probed.c_str(),
      static_cast<double>(took[took.size() / 2].count()) / 1000,
      static_cast<double>(p99(took).count()) / 1000, took.size(), slow.spoken());
  EXPECT_EQ(took.size(), kProbes) << "probes failed";
  EXPECT_LT(p99(took), kProbeTarget);
  EXPECT_EQ(slow.spoken(), refused) << "bodies within the share must be read, not refused";
  std::size_t checked = 0;
  for (std::size_t i = 0; i < clients; ++i) {
    const auto spoke = slow.spoke_after(i);
    if (!spoke) continue;
    ++checked;
    const std::string reply = slow.reply(i);
    EXPECT_EQ(status_line(reply), "HTTP/1.1 503 Service Unavailable") << reply;
    EXPECT_NE(reply.find("Retry-After: 1\r\n"), std::string::npos) << reply;
    EXPECT_NE(reply.find("Connection: close\r\n"), std::string::npos) << reply;
    EXPECT_LT(*spoke, 2s) << "refused at once";
  }
  EXPECT_EQ(checked, refused);
  EXPECT_GE(counters().bodies_refused, refused);
  slow.close_all();
  EXPECT_TRUE(eventually([&] { return counters().connections_open == 0; }));
}

// kvnode's listener: 4 handler threads. Before the fix 16 clients (4 would do) trickling bodies
// held all 4 for up to the 60 s body timeout and every /health probe timed out.
TEST(HttpBodyThreads, HealthAnswersQuicklyWhileBodiesTrickle) {
  Limits limits;
  limits.handler_threads = 4;  // as kvnode
  constexpr std::size_t kClients = 16;
  Server server("test/http", limits);
  server.get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  server.post("/echo", [](const httplib::Request& req, httplib::Response& res) {
    res.set_content(std::to_string(req.body.size()), "text/plain");
  });
  auto port = server.start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.error().message;
  const std::size_t share = body_handler_threads(limits);
  EXPECT_EQ(share, limits.handler_threads - 1);
  expect_probes_fast_while_bodies_trickle(*port, "/health", "/echo", kClients,
                                          limits.max_body_bytes, share, limits,
                                          [&] { return server.counters(); });
  // The threads come back: a body is served again.
  httplib::Client c("127.0.0.1", *port);
  c.set_read_timeout(10s);
  auto r = c.Post("/echo", std::string(kMiB, ' '), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, std::to_string(kMiB));
}

// With the share taken, any request that announces a body is refused at once, whether it comes
// on a new connection (a GET with a Content-Length too) or after an answer on a kept-alive one,
// while the same connection's request without a body is served.
TEST(HttpBodyThreads, EveryBodyBeyondTheShareIsRefusedAtOnce) {
  Limits limits;
  limits.handler_threads = 2;
  Server server("test/http", limits);
  server.get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok", "text/plain");
  });
  server.post("/echo", [](const httplib::Request& req, httplib::Response& res) {
    res.set_content(std::to_string(req.body.size()), "text/plain");
  });
  auto port = server.start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.error().message;
  ASSERT_EQ(body_handler_threads(limits), 1u);
  Trickle slow;
  slow.start(*port, "/echo", limits.max_body_bytes, limits.min_body_bytes_per_second * 2);
  ASSERT_TRUE(eventually([&] { return server.counters().body_bytes_in_flight > 0; }));

  const UniqueFd get_with_body = connect_to(*port);
  ASSERT_TRUE(send_all(get_with_body.get(),
                       "GET /health HTTP/1.1\r\nHost: x\r\n"
                       "Content-Length: 5\r\n\r\nhello"));
  const std::string refused = read_until_closed(get_with_body.get(), 5s);
  EXPECT_EQ(status_line(refused), "HTTP/1.1 503 Service Unavailable") << refused;
  EXPECT_NE(refused.find("Retry-After: 1\r\n"), std::string::npos) << refused;

  const UniqueFd pipelined = connect_to(*port);
  ASSERT_TRUE(send_all(pipelined.get(), "GET /health HTTP/1.1\r\nHost: x\r\n\r\n" +
                                            post_head("/echo", 10) + "0123456789"));
  const std::string both = read_until_closed(pipelined.get(), 5s);
  EXPECT_EQ(status_line(both), "HTTP/1.1 200 OK") << both;
  EXPECT_NE(both.find("HTTP/1.1 503 Service Unavailable"), std::string::npos) << both;
  EXPECT_EQ(server.counters().bodies_refused, 2u);
  EXPECT_EQ(slow.spoken(), 0u) << "the body within the share is still being read";
}

// The share: all handler threads but one (at least one), or Limits::body_handler_threads.
TEST(HttpBodyThreads, TheShareIsAllButOneThreadAndAtLeastOne) {
  Limits limits;
  limits.handler_threads = 1;
  EXPECT_EQ(body_handler_threads(limits), 1u);
  limits.handler_threads = 4;
  EXPECT_EQ(body_handler_threads(limits), 3u);
  limits.body_handler_threads = 2;
  EXPECT_EQ(body_handler_threads(limits), 2u);
  limits.body_handler_threads = 9;
  EXPECT_EQ(body_handler_threads(limits), 4u);
}

}  // namespace
}  // namespace kvnode::httpd::testing

namespace kvnode::controller::testing {
namespace {

using HttpBodyThreadsApi = ApiTest;

// kvcontroller's listener: 16 handler threads. Before the fix 16 clients trickling /lookup bodies
// made GET /metrics time out.
TEST_F(HttpBodyThreadsApi, MetricsAnswersQuicklyWhileBodiesTrickle) {
  const httpd::Limits limits = HttpApi::default_limits();
  constexpr std::size_t kClients = 32;
  httpd::testing::expect_probes_fast_while_bodies_trickle(
      port_, "/metrics", "/lookup", kClients, limits.max_body_bytes,
      httpd::body_handler_threads(limits), limits, [&] {
        httpd::Counters c;
        // The API does not expose its server's counters; /metrics is probed for them instead.
        const HttpReply r = get("/metrics");
        const auto value = [&](const std::string& name) -> std::uint64_t {
          const auto at = r.body.find("\n" + name + " ");
          if (at == std::string::npos) return 0;
          return std::stoull(r.body.substr(at + name.size() + 2));
        };
        c.connections_open = value("kvcontroller_http_connections_open");
        c.bodies_refused = value("kvcontroller_http_bodies_refused_total");
        // The probe's own connection is open while /metrics is written.
        if (c.connections_open > 0) --c.connections_open;
        return c;
      });
  EXPECT_EQ(post("/lookup", Json{{"tokens", {1}}}).status, 200);
}

}  // namespace
}  // namespace kvnode::controller::testing
