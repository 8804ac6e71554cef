// kvnode::httpd::Server::stop() against a client that asked for a large answer and never reads
// it (issue 19 review, item 8): stop() cuts it after its grace instead of waiting for the write
// timeout (10 s without progress, per write) or the body timeout (60 s); nor can a body waiting
// for the in-flight body budget.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "kvnode/httpd/server.hpp"
#include "support/http_client.hpp"

namespace kvnode::httpd {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(HttpdStop, AClientThatDoesNotReadCannotHoldStop) {
  constexpr std::size_t kAnswerBytes = 64 << 20;  // far beyond the socket buffers
  Server server("test/http");
  std::atomic<bool> answering{false};
  server.get("/big", [&](const httplib::Request&, httplib::Response& res) {
    answering = true;
    res.set_content(std::string(kAnswerBytes, 'x'), "text/plain");
  });
  auto port = server.start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.error().message;

  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(*port));
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const std::string ask = "GET /big HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(fd, ask.data(), ask.size(), MSG_NOSIGNAL), static_cast<ssize_t>(ask.size()));
  const auto until = Clock::now() + 10s;
  while (!answering && Clock::now() < until) std::this_thread::yield();
  ASSERT_TRUE(answering);

  const auto start = Clock::now();
  server.stop();
  const auto took = Clock::now() - start;
  ::close(fd);
  EXPECT_LT(took, 6s) << "stop() took "
                      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                      << " ms";
}

// A body waiting for the in-flight budget behind an older body does not hold stop() for the 5 s
// it may wait: stop() ends the older body's read, which gives its budget back, and the waiting
// body's read ends the same way.
TEST(HttpdStop, ABodyWaitingForTheBudgetDoesNotHoldStop) {
  constexpr std::size_t kMiB = 1 << 20;
  Limits limits;
  limits.max_body_bytes = 2 * kMiB;
  limits.max_bodies_in_flight_bytes = 3 * kMiB;
  Server server("test/http", limits);
  server.post("/echo", [](const httplib::Request& req, httplib::Response& res) {
    res.set_content(std::to_string(req.body.size()), "text/plain");
  });
  auto port = server.start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.error().message;

  // The older body: 1.5 of its 2 MiB sent, so it holds a 2 MiB buffer, and then nothing.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(*port));
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const std::string older =
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(2 * kMiB) + "\r\n\r\n" +
      std::string(3 * kMiB / 2, ' ');
  for (std::size_t sent = 0; sent < older.size();) {
    const ssize_t n = ::send(fd, older.data() + sent, older.size() - sent, MSG_NOSIGNAL);
    ASSERT_GT(n, 0);
    sent += static_cast<std::size_t>(n);
  }
  auto until = Clock::now() + 10s;
  while (server.counters().body_bytes_in_flight != 2 * kMiB && Clock::now() < until)
    std::this_thread::sleep_for(5ms);
  ASSERT_EQ(server.counters().body_bytes_in_flight, 2 * kMiB);

  // The younger one holds 512 KiB and runs short at its step to 1 MiB (1.5 MiB more): it waits.
  std::thread younger([&] {
    httplib::Client c("127.0.0.1", *port);
    c.Post("/echo", std::string(2 * kMiB, ' '), "application/json");
  });
  until = Clock::now() + 10s;
  while (server.counters().body_bytes_in_flight != 2 * kMiB + kMiB / 2 && Clock::now() < until)
    std::this_thread::sleep_for(5ms);
  ASSERT_EQ(server.counters().body_bytes_in_flight, 2 * kMiB + kMiB / 2);
  std::this_thread::sleep_for(100ms);  // it has asked for more than is left and waits

  const auto start = Clock::now();
  server.stop();
  const auto took = Clock::now() - start;
  younger.join();
  ::close(fd);
  EXPECT_LT(took, 2s) << "stop() took "
                      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                      << " ms";
  EXPECT_EQ(server.counters().body_bytes_in_flight, 0u);
}

}  // namespace
}  // namespace kvnode::httpd
