// Both daemons' HTTP listeners against a hostile or careless client (issue 19, items 4, 11, 14),
// as real processes on real sockets: a thousand idle connections must not slow /health and
// /metrics, and a listener whose port is taken must refuse to start (exit 1), naming the port and
// who holds it, whichever of kvcontroller and kvnode came first.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "node_rig.hpp"
#include "support/child_process.hpp"

namespace kvnode::node {
namespace {

using rig::Clock;
using rig::free_port;
using rig::free_ports;
using namespace std::chrono_literals;

constexpr std::size_t kIdleConnections = 1000;
constexpr std::size_t kSamples = 200;            // GETs timed while they are open
constexpr auto kTarget = 100ms;                  // p99 wanted (issue 19)
constexpr std::size_t kGiveUpAfterFailures = 3;  // without the fix each failure costs 2 s

// Idle clients: connected TCP sockets that never send a byte.
class IdleClients {
 public:
  IdleClients(int port, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<std::uint16_t>(port));
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        ::close(fd);
        break;
      }
      fds_.push_back(fd);
    }
  }
  ~IdleClients() {
    for (int fd : fds_) ::close(fd);
  }
  // How many the server has closed (a read finds EOF or an error instead of nothing yet).
  std::size_t closed() const {
    std::size_t n = 0;
    char byte = 0;
    for (int fd : fds_) {
      const ssize_t r = ::recv(fd, &byte, 1, MSG_DONTWAIT);
      if (!(r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) ++n;
    }
    return n;
  }
  IdleClients(const IdleClients&) = delete;
  IdleClients& operator=(const IdleClients&) = delete;
  std::size_t size() const { return fds_.size(); }

 private:
  std::vector<int> fds_;
};

// This process holds the idle connections: lift its soft descriptor limit to the hard one.
std::size_t connections_we_can_hold() {
  rlimit r{};
  ::getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = r.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &r);
  ::getrlimit(RLIMIT_NOFILE, &r);
  constexpr rlim_t kOwnDescriptors = 128;
  return r.rlim_cur > kOwnDescriptors
             ? std::min<std::size_t>(kIdleConnections, r.rlim_cur - kOwnDescriptors)
             : 0;
}

bool answers(int port, const std::string& path) {
  httplib::Client http("127.0.0.1", port);
  http.set_connection_timeout(1s);
  http.set_read_timeout(2s);
  auto r = http.Get(path.c_str());
  return r && r->status == 200;
}

// Times `samples` GETs alternating between the paths, each on a new connection as a probe
// makes it. A failed GET counts as its timeout.
std::vector<Clock::duration> time_gets(int port, const std::vector<std::string>& paths,
                                       std::size_t samples) {
  std::vector<Clock::duration> took;
  std::size_t failures = 0;
  for (std::size_t i = 0; i < samples && failures < kGiveUpAfterFailures; ++i) {
    const auto start = Clock::now();
    if (!answers(port, paths[i % paths.size()])) ++failures;
    took.push_back(Clock::now() - start);
  }
  std::sort(took.begin(), took.end());
  return took;
}

std::string ms(Clock::duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(d).count() / 1000.0) +
         " ms";
}

void expect_fast_with_idle_clients(int port, const std::vector<std::string>& paths,
                                   const char* who) {
  const std::size_t n = connections_we_can_hold();
  ASSERT_GT(n, 100u) << "descriptor limit too low for this test";
  IdleClients idle(port, n);
  ASSERT_EQ(idle.size(), n);
  const auto took = time_gets(port, paths, kSamples);
  ASSERT_EQ(took.size(), kSamples) << who << ": GETs failed with " << n << " idle connections open";
  const auto p50 = took[took.size() / 2];
  const auto p99 = took[took.size() * 99 / 100];
  std::printf("%s, %zu idle connections: GET p50 %s, p99 %s, max %s\n", who, n, ms(p50).c_str(),
              ms(p99).c_str(), ms(took.back()).c_str());
  EXPECT_LT(p99, kTarget) << who << " p50 " << ms(p50) << " p99 " << ms(p99);
  // They were idle throughout, not closed by the idle timeout (5 s) half way.
  EXPECT_EQ(idle.closed(), 0u) << who << ": idle connections closed while sampling";
}

int connect_to_port(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
  if (fd >= 0) ::close(fd);
  return -1;
}

// Reads until the server closes (or `patience` ends).
std::string read_to_close(int fd, Clock::duration patience) {
  std::string reply;
  for (const auto until = Clock::now() + patience; Clock::now() < until;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    reply.append(buf, static_cast<std::size_t>(n));
  }
  return reply;
}

// Clients that send a request a byte at a time (issue 19 item 4's trickling case): `head` first
// (all of it when `whole_head`), then one byte per period, reconnecting whenever closed.
class Tricklers {
 public:
  Tricklers(int port, std::size_t n, std::string head, bool whole_head) {
    for (std::size_t i = 0; i < n; ++i)
      threads_.emplace_back([this, port, head, whole_head] { run(port, head, whole_head); });
  }
  ~Tricklers() {
    stop_ = true;
    for (auto& t : threads_) t.join();
  }
  Tricklers(const Tricklers&) = delete;
  Tricklers& operator=(const Tricklers&) = delete;
  std::size_t bytes_sent() const { return sent_.load(); }

 private:
  void run(int port, const std::string& head, bool whole_head) {
    while (!stop_) {
      const int fd = connect_to_port(port);
      if (fd < 0) continue;
      bool open = true;
      if (whole_head) open = ::send(fd, head.data(), head.size(), MSG_NOSIGNAL) > 0;
      for (std::size_t i = 0; open && !stop_; ++i) {
        const char byte = whole_head ? ' ' : head[i % head.size()];
        open = ::send(fd, &byte, 1, MSG_NOSIGNAL) == 1;
        if (open) ++sent_;
        std::this_thread::sleep_for(kPeriod);  // the trickle's pace, not a synchronisation
      }
      ::close(fd);
    }
  }
  static constexpr auto kPeriod = 100ms;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> sent_{0};
  std::vector<std::thread> threads_;
};

// Issue 19 review item 1: headers are read by the poller, so clients trickling header bytes hold
// no handler thread; clients trickling a body hold one for a bounded time (the minimum body rate
// or the drain's time limit). /health stays fast. Failed before: 4 handler threads, each held
// for up to 5 s by a client that had sent one header byte.
void expect_fast_with_tricklers(int port, const std::string& path, const std::string& body_path,
                                std::size_t header_tricklers, const char* who) {
  const std::string request_line = "GET " + path + " HTTP/1.1\r\nHost: x\r\nX-Pad: ";
  Tricklers headers(port, header_tricklers, request_line, false);
  Tricklers bodies(port, 2,
                   "POST " + body_path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",
                   true);
  ASSERT_TRUE(rig::eventually([&] { return headers.bytes_sent() > 8 * header_tricklers; }, 20s));
  const auto took = time_gets(port, {path}, kSamples);
  ASSERT_EQ(took.size(), kSamples)
      << who << ": GETs failed while " << header_tricklers << " clients trickled header bytes";
  const auto p50 = took[took.size() / 2];
  const auto p99 = took[took.size() * 99 / 100];
  std::printf("%s, %zu header and 2 body tricklers: GET p50 %s, p99 %s, max %s\n", who,
              header_tricklers, ms(p50).c_str(), ms(p99).c_str(), ms(took.back()).c_str());
  EXPECT_LT(p99, kTarget) << who << " p50 " << ms(p50) << " p99 " << ms(p99);
}

std::vector<std::string> controller_args(int http, const std::string& host = "127.0.0.1") {
  const auto zmq = free_ports(3);
  return {KVCONTROLLER_PATH,
          "--host",
          host,
          "--port",
          std::to_string(http),
          "--monitor-ports",
          "{\"pull\": " + std::to_string(zmq[0]) + ", \"reply\": " + std::to_string(zmq[1]) +
              ", \"heartbeat\": " + std::to_string(zmq[2]) + "}"};
}

std::vector<std::string> node_args(const controller::BoundPorts& ctl, int http,
                                   const std::string& host, const std::string& instance) {
  return {KVNODE_PATH,
          "--instance-id",
          instance,
          "--controller-pull-url",
          "127.0.0.1:" + std::to_string(ctl.pull),
          "--controller-reply-url",
          "127.0.0.1:" + std::to_string(ctl.reply),
          "--chunk-bytes",
          "65536",
          "--max-local-cpu-size",
          "0.01",
          "--local-socket",
          "off",
          "--http-host",
          host,
          "--http-port",
          std::to_string(http),
          "--ucx-tls",
          "tcp",
          "--ucx-net-devices",
          "lo"};
}

bool wait_exit(test::ChildProcess& p, Clock::duration patience = 30s) {
  for (const auto until = Clock::now() + patience; Clock::now() < until && p.running();)
    std::this_thread::sleep_for(20ms);
  return !p.running();
}

TEST(HttpHardening, ControllerAnswersQuicklyWithAThousandIdleConnections) {
  const int http = free_port();
  test::ChildProcess ctl(controller_args(http));
  ASSERT_TRUE(rig::eventually([&] { return answers(http, "/metrics") || !ctl.running(); }, 20s));
  ASSERT_TRUE(ctl.running()) << ctl.describe_exit() << "\n" << ctl.output();
  expect_fast_with_idle_clients(http, {"/metrics", "/controller/key-stats"}, "kvcontroller");
}

TEST(HttpHardening, NodeAnswersHealthQuicklyWithAThousandIdleConnections) {
  auto ctl = rig::start_controller();
  const int http = free_port();
  test::ChildProcess node(
      node_args(ctl->ports(), http, "127.0.0.1", "idle-http-" + std::to_string(getpid())));
  ASSERT_TRUE(rig::eventually([&] { return answers(http, "/health") || !node.running(); }, 20s));
  ASSERT_TRUE(node.running()) << node.describe_exit() << "\n" << node.output();
  expect_fast_with_idle_clients(http, {"/health", "/metrics"}, "kvnode");

  // Another method on a known path is 405 (issue 19 item 14), an unknown path 404.
  httplib::Client c("127.0.0.1", http);
  for (const char* path : {"/health", "/ready", "/metrics"}) {
    auto put = c.Put(path, "{}", "application/json");
    auto del = c.Delete(path);
    ASSERT_TRUE(put && del) << path;
    EXPECT_EQ(put->status, 405) << path;
    EXPECT_EQ(del->status, 405) << path;
    EXPECT_EQ(put->get_header_value("Allow"), "GET, HEAD") << path;
  }
  auto unknown = c.Delete("/nope");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
}

TEST(HttpHardening, NodeAnswersHealthQuicklyWhileClientsTrickle) {
  auto ctl = rig::start_controller();
  const int http = free_port();
  test::ChildProcess node(
      node_args(ctl->ports(), http, "127.0.0.1", "trickle-" + std::to_string(getpid())));
  ASSERT_TRUE(rig::eventually([&] { return answers(http, "/health") || !node.running(); }, 20s));
  ASSERT_TRUE(node.running()) << node.describe_exit() << "\n" << node.output();
  expect_fast_with_tricklers(http, "/health", "/health", 8, "kvnode");
  ASSERT_TRUE(node.running()) << node.output();
}

TEST(HttpHardening, ControllerAnswersQuicklyWhileClientsTrickle) {
  const int http = free_port();
  test::ChildProcess ctl(controller_args(http));
  ASSERT_TRUE(rig::eventually([&] { return answers(http, "/metrics") || !ctl.running(); }, 20s));
  ASSERT_TRUE(ctl.running()) << ctl.describe_exit() << "\n" << ctl.output();
  expect_fast_with_tricklers(http, "/controller/key-stats", "/lookup", 32, "kvcontroller");
  ASSERT_TRUE(ctl.running()) << ctl.output();
}

// Item 2: headers are counted; over 64 KiB the answer is 431 and the connection closes
// (httplib alone grew its line buffer without limit). Counted in /metrics.
TEST(HttpHardening, NodeRefusesHeadersOver64KiB) {
  auto ctl = rig::start_controller();
  const int http = free_port();
  test::ChildProcess node(
      node_args(ctl->ports(), http, "127.0.0.1", "bighead-" + std::to_string(getpid())));
  ASSERT_TRUE(rig::eventually([&] { return answers(http, "/health") || !node.running(); }, 20s));
  const int fd = connect_to_port(http);
  ASSERT_GE(fd, 0);
  const std::string head = "GET /health HTTP/1.1\r\nX-Big: " + std::string(80 << 10, 'a');
  (void)::send(fd, head.data(), head.size(), MSG_NOSIGNAL);
  const std::string reply = read_to_close(fd, 4s);  // before the 5 s header timeout
  ::close(fd);
  EXPECT_EQ(reply.substr(0, reply.find("\r\n")), "HTTP/1.1 431 Request Header Fields Too Large")
      << reply.substr(0, 200);
  httplib::Client c("127.0.0.1", http);
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("kvnode_http_headers_refused_total 1"), std::string::npos);
  EXPECT_NE(metrics->body.find("kvnode_http_connections_refused_total 0"), std::string::npos);
}

// Item 11: one connection over --http-max-connections is answered 503 and closed; the ones
// within the cap are served.
TEST(HttpHardening, NodeAnswers503OverTheConnectionCap) {
  auto ctl = rig::start_controller();
  const int http = free_port();
  auto args = node_args(ctl->ports(), http, "127.0.0.1", "cap-" + std::to_string(getpid()));
  args.insert(args.end(), {"--http-max-connections", "4"});
  test::ChildProcess node(args);
  ASSERT_TRUE(rig::eventually([&] { return answers(http, "/health") || !node.running(); }, 20s));
  // The server closes a "Connection: close" request's connection before the client sees EOF:
  // once one finds itself the only connection open, earlier probes are gone.
  ASSERT_TRUE(rig::eventually([&] {
    const int fd = connect_to_port(http);
    const std::string ask = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    (void)::send(fd, ask.data(), ask.size(), MSG_NOSIGNAL);
    const std::string reply = read_to_close(fd, 4s);
    ::close(fd);
    return reply.find("kvnode_http_connections_open 1\n") != std::string::npos;
  }));
  IdleClients idle(http, 4);
  ASSERT_EQ(idle.size(), 4u);
  const int over = connect_to_port(http);
  ASSERT_GE(over, 0);
  const std::string reply = read_to_close(over, 4s);
  ::close(over);
  EXPECT_EQ(reply.substr(0, reply.find("\r\n")), "HTTP/1.1 503 Service Unavailable") << reply;
  EXPECT_NE(reply.find("too many connections (limit 4)"), std::string::npos) << reply;
  EXPECT_EQ(idle.closed(), 0u);
}

// kvcontroller on 0.0.0.0:P first, then kvnode asked for 127.0.0.1:P: Linux lets both bind when
// both set SO_REUSEPORT (httplib's default), and the node took every localhost request.
TEST(HttpHardening, NodeRefusesAnHttpPortTheControllerHolds) {
  auto zmq = rig::start_controller();
  const int port = free_port();
  test::ChildProcess ctl(controller_args(port, "0.0.0.0"));
  ASSERT_TRUE(rig::eventually([&] { return answers(port, "/metrics") || !ctl.running(); }, 20s));
  ASSERT_TRUE(ctl.running()) << ctl.output();
  test::ChildProcess node(
      node_args(zmq->ports(), port, "127.0.0.1", "clash-" + std::to_string(getpid())));
  ASSERT_TRUE(wait_exit(node)) << "kvnode started beside kvcontroller on port " << port;
  EXPECT_EQ(node.describe_exit(), "exited with code 1");
  const std::string out = node.output();
  EXPECT_NE(out.find("cannot listen for HTTP at 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << out;
  EXPECT_NE(
      out.find("port " + std::to_string(port) + " in use (held by 0.0.0.0:" + std::to_string(port)),
      std::string::npos)
      << out;
  EXPECT_TRUE(answers(port, "/controller/key-stats"));  // the controller still has its port
}

// The other order: a node on 127.0.0.1:P, then kvcontroller on 0.0.0.0:P.
TEST(HttpHardening, ControllerRefusesAnHttpPortANodeHolds) {
  auto zmq = rig::start_controller();
  const int port = free_port();
  test::ChildProcess node(
      node_args(zmq->ports(), port, "127.0.0.1", "clash2-" + std::to_string(getpid())));
  ASSERT_TRUE(rig::eventually([&] { return answers(port, "/health") || !node.running(); }, 20s));
  ASSERT_TRUE(node.running()) << node.output();
  test::ChildProcess ctl(controller_args(port, "0.0.0.0"));
  ASSERT_TRUE(wait_exit(ctl)) << "kvcontroller started beside kvnode on port " << port;
  EXPECT_EQ(ctl.describe_exit(), "exited with code 1");
  const std::string out = ctl.output();
  EXPECT_NE(out.find("cannot listen for HTTP at 0.0.0.0:" + std::to_string(port)),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("(held by 127.0.0.1:" + std::to_string(port)), std::string::npos) << out;
  EXPECT_TRUE(answers(port, "/health"));  // the node keeps its port
}

}  // namespace
}  // namespace kvnode::node
