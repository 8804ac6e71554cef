// kvnode::httpd when memory runs out on a handler thread (issue 19 items 4 and 6, after review):
// std::bad_alloc thrown by a handler, by the allocation of a request body (through the server's
// test-only fault hook) or out of httplib altogether must cost only that request: it is answered
// 500 or its connection is closed, the server serves the next request, and nothing is left
// behind (the in-flight body budget back to 0, the connection count back to 0).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "kvnode/httpd/server.hpp"
#include "raw_http.hpp"
#include "support/eventually.hpp"
#include "support/http_client.hpp"

namespace kvnode::httpd::testing {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t kMiB = 1 << 20;

using test::eventually;

class HttpFaults : public ::testing::Test {
 protected:
  void start() {
    server_.post("/echo", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content(std::to_string(req.body.size()), "text/plain");
    });
    server_.post("/throw", [this](const httplib::Request&, httplib::Response&) {
      ++thrown_;
      throw std::bad_alloc();  // as a handler parsing a large body would
    });
    server_.get("/ok", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok", "text/plain");
    });
    auto port = server_.start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.error().message;
    port_ = *port;
  }

  // One request on its own connection, read until the server closes it or it idles out.
  std::string exchange(const std::string& request) {
    UniqueFd fd = connect_to(port_);
    EXPECT_TRUE(fd.valid());
    if (!fd) return {};
    send_all(fd.get(), request);  // the server may stop reading early: its answer still counts
    ::shutdown(fd.get(), SHUT_WR);
    return read_until_closed(fd.get(), 10s);
  }
  std::string post(const std::string& path, std::size_t size) {
    return exchange(post_head(path, size) + std::string(size, ' '));
  }

  // The server still serves, and once its clients are gone it holds nothing for them.
  void expect_serving_and_clean() {
    httplib::Client c("127.0.0.1", port_);
    auto ok = c.Get("/ok");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200);
    auto echo = c.Post("/echo", std::string(kMiB, ' '), "application/json");
    ASSERT_TRUE(echo);
    EXPECT_EQ(echo->status, 200);
    EXPECT_EQ(echo->body, std::to_string(kMiB));
    c.stop();
    EXPECT_TRUE(eventually([&] { return server_.counters().connections_open == 0; }))
        << server_.counters().connections_open << " connections open";
    EXPECT_EQ(server_.counters().body_bytes_in_flight, 0u);
  }

  Server server_{"test/http"};
  int port_ = 0;
  std::atomic<int> thrown_{0};
};

TEST_F(HttpFaults, AHandlerThrowingBadAllocIsAnswered500) {
  start();
  const std::vector<std::size_t> sizes = {0, 100, 4 * kMiB};
  for (const std::size_t size : sizes) {
    const std::string reply = post("/throw", size);
    EXPECT_EQ(status_line(reply), "HTTP/1.1 500 Internal Server Error") << size << ": " << reply;
  }
  EXPECT_EQ(thrown_, static_cast<int>(sizes.size()));
  expect_serving_and_clean();
}

// The body's buffer cannot grow (the test hook throws as the allocation would): the request is
// answered 500 on a connection that then closes, the rest of its body unread, and its share of
// the budget comes back.
TEST_F(HttpFaults, ABodyBufferThatCannotGrowIsAnswered500) {
  std::atomic<int> failed{0};
  server_.inject_faults({.body_buffer = [&](std::size_t bytes) {
    if (bytes > kMiB) {
      ++failed;
      throw std::bad_alloc();
    }
  }});
  start();
  for (int i = 0; i < 3; ++i) {
    const std::string reply = post("/echo", 4 * kMiB);
    EXPECT_EQ(status_line(reply), "HTTP/1.1 500 Internal Server Error") << reply;
    EXPECT_NE(reply.find("Connection: close"), std::string::npos) << reply;
  }
  EXPECT_EQ(failed, 3);
  EXPECT_EQ(post("/echo", kMiB).find("HTTP/1.1 200 OK"), 0u);  // within the hook's limit
  expect_serving_and_clean();
}

// An exception out of httplib's own handling (here its exception handler throws) reaches the
// handler thread: the connection is closed without an answer, and the thread serves on.
TEST_F(HttpFaults, BadAllocOutOfHttplibClosesTheConnection) {
  server_.raw().set_exception_handler([](const httplib::Request&, httplib::Response&,
                                         std::exception_ptr) { throw std::bad_alloc(); });
  start();
  const Limits& limits = server_.limits();
  // More than there are handler threads: each must have survived its throw.
  const std::size_t requests = limits.handler_threads + 2;
  for (std::size_t i = 0; i < requests; ++i) {
    const std::string reply = post("/throw", 100);
    EXPECT_EQ(reply, "") << reply;
  }
  EXPECT_EQ(thrown_, static_cast<int>(requests));
  expect_serving_and_clean();
}

}  // namespace
}  // namespace kvnode::httpd::testing
