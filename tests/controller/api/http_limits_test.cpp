// The HTTP API's limits and what it accepts (issue 19, items 6, 7 and 14's 405): a body labelled
// as a form is still JSON, another method on a known path is 405, bodies over the per-request
// limit are 413 and over the in-flight budget 503, each with a clear detail and the server still
// serving afterwards.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api_fixture.hpp"

namespace kvnode::controller::testing {
namespace {

using HttpLimitsTest = ApiTest;

std::vector<std::int64_t> many_tokens(std::size_t n) {
  std::vector<std::int64_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::int64_t>(i % 50000);
  return t;
}

// curl -d labels its body application/x-www-form-urlencoded; httplib parsed such bodies as forms
// and refused them beyond 8 KB (413), so the README's curl examples failed past ~4,000 tokens.
TEST_F(HttpLimitsTest, JsonLabelledAsAFormIsReadAsJson) {
  add_worker("inst-A", 0, tokens(0));
  const std::vector<std::int64_t> t = many_tokens(100000);
  admit("inst-A", 0, hashes_of(t));
  const std::string body = Json{{"tokens", t}}.dump();
  ASSERT_GT(body.size(), 100000u);
  for (const char* type : {"application/x-www-form-urlencoded", "text/plain", "application/json"}) {
    auto r = from(client()->Post("/lookup", body, type));
    ASSERT_EQ(r.status, 200) << type << ": " << r.body;
    EXPECT_EQ(r.json()["layout_info"]["inst-A"][1], 100000) << type << ": " << r.body;
  }
}

TEST_F(HttpLimitsTest, OtherMethodsOnKnownPathsAre405AndUnknownPaths404) {
  auto c = client();
  for (const char* path : {"/lookup", "/move", "/metrics", "/controller/workers"}) {
    std::vector<httplib::Result> replies;
    replies.push_back(c->Put(path, "{}", "application/json"));
    replies.push_back(c->Delete(path));
    replies.push_back(c->Patch(path, "{}", "application/json"));
    for (const auto& r : replies) {
      ASSERT_TRUE(r) << path;
      EXPECT_EQ(r->status, 405) << path;
      EXPECT_EQ(r->body, R"({"detail":"Method Not Allowed"})") << path;
      EXPECT_FALSE(r->get_header_value("Allow").empty()) << path;
    }
  }
  auto r = c->Put("/nope", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  r = c->Delete("/nope");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(post("/lookup", Json{{"tokens", {1}}}).status, 200);
}

class BodyBudgetTest : public ApiTest {
 protected:
  static constexpr std::size_t kMiB = 1 << 20;
  void SetUp() override {
    ApiTest::SetUp();
    api_.reset();
    httpd::Limits limits = HttpApi::default_limits();
    limits.max_body_bytes = 2 * kMiB;
    limits.max_bodies_in_flight_bytes = 3 * kMiB;
    api_ = std::make_unique<HttpApi>(*orch_, *registry_, metrics_, limits);
    auto port = api_->start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.error().message;
    port_ = *port;
  }

  // A /lookup body of exactly `size` bytes: valid JSON padded with spaces.
  static std::string lookup_body(std::size_t size) {
    std::string b = R"({"tokens":[1,2,3]})";
    b.insert(b.size() - 1, std::string(size - b.size(), ' '));
    return b;
  }

  // A client that sent the headers and part of its body and then waits: its body is in flight.
  int start_slow_request(std::size_t size) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port_));
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    const std::string head =
        "POST /lookup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(size) + "\r\n\r\n" + lookup_body(size).substr(0, 100);
    EXPECT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(head.size()));
    return fd;
  }
  static void finish_slow_request(int fd, std::size_t size) {
    const std::string rest = lookup_body(size).substr(100);
    std::size_t sent = 0;
    while (sent < rest.size()) {
      const ssize_t n = ::send(fd, rest.data() + sent, rest.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<std::size_t>(n);
    }
    char reply[4096];
    const ssize_t n = ::recv(fd, reply, sizeof(reply) - 1, 0);
    EXPECT_GT(n, 0);
    if (n > 0)
      EXPECT_EQ(std::string(reply, 12), "HTTP/1.1 200")
          << std::string(reply, static_cast<std::size_t>(n));
    ::close(fd);
  }
};

TEST_F(BodyBudgetTest, OverThePerRequestLimitIs413) {
  auto r = post_text("/lookup", lookup_body(2 * kMiB + 1));
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(r.body, R"j({"detail":"Request body too large (limit 2 MiB)"})j");
  EXPECT_EQ(post_text("/lookup", lookup_body(2 * kMiB)).status, 200);  // at the limit: served
}

TEST_F(BodyBudgetTest, OverTheInFlightBudgetIs503UntilABodyFinishes) {
  const int slow = start_slow_request(2 * kMiB);  // holds 2 of the 3 MiB
  // The server reserves once it has read the slow request's headers.
  ASSERT_TRUE(
      eventually([&] { return post_text("/lookup", lookup_body(2 * kMiB)).status == 503; }));
  auto r = post_text("/lookup", lookup_body(2 * kMiB));
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(
      r.body,
      R"({"detail":"request bodies being read are over their budget of 3 MiB: retry later"})");
  EXPECT_EQ(post_text("/lookup", lookup_body(kMiB / 2)).status, 200);  // what fits is served
  EXPECT_EQ(get("/metrics").status, 200);                              // and what has no body
  finish_slow_request(slow, 2 * kMiB);
  EXPECT_EQ(post_text("/lookup", lookup_body(2 * kMiB)).status, 200);  // the budget came back
}

}  // namespace
}  // namespace kvnode::controller::testing
