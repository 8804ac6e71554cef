// kvnode::httpd::Server::stop() against a client that asked for a large answer and never reads
// it (issue 19 review, item 8): stop() cuts it after its grace instead of waiting for the write
// timeout (10 s without progress, per write) or the body timeout (60 s).
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "kvnode/httpd/server.hpp"

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

}  // namespace
}  // namespace kvnode::httpd
