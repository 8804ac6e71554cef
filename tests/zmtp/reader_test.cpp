// zmtp::Reader on byte sequences: what a libzmq PUSH peer sends, split at every boundary, and each
// way a peer can break the protocol.
#include "kvnode/zmtp/reader.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using kvnode::ErrorCode;
using kvnode::zmtp::Reader;

struct Frames final : kvnode::zmtp::FrameSink {
  void frame(std::string_view body, bool more) override {
    got.emplace_back(body);
    mores.push_back(more);
  }
  std::vector<std::string> got;
  std::vector<bool> mores;
};

constexpr auto kPull = kvnode::zmtp::SocketType::kPull;
constexpr auto kRouter = kvnode::zmtp::SocketType::kRouter;

std::string peer_greeting(int major = 3, int minor = 1, std::string mechanism = "NULL") {
  std::string g(64, '\0');
  g[0] = static_cast<char>(0xFF);
  g[8] = 1;
  g[9] = 0x7F;
  g[10] = static_cast<char>(major);
  g[11] = static_cast<char>(minor);
  g.replace(12, mechanism.size(), mechanism);
  return g;
}

std::string command(const std::string& name, const std::string& data) {
  std::string body(1, static_cast<char>(name.size()));
  body += name + data;
  std::string f;
  if (body.size() < 256) {
    f = {'\x04', static_cast<char>(body.size())};
  } else {
    f = "\x06";
    for (int i = 7; i >= 0; --i) f.push_back(static_cast<char>((body.size() >> (8 * i)) & 0xFF));
  }
  return f + body;
}

std::string ready(const std::string& socket_type) {
  std::string props = "\x0bSocket-Type";
  props += std::string("\0\0\0", 3) + static_cast<char>(socket_type.size()) + socket_type;
  return command("READY", props);
}

std::string message(const std::string& body, bool more = false) {
  std::string f;
  if (body.size() < 256) {
    f = {static_cast<char>(more ? 1 : 0), static_cast<char>(body.size())};
  } else {
    f.push_back(static_cast<char>(more ? 3 : 2));
    for (int i = 7; i >= 0; --i) f.push_back(static_cast<char>((body.size() >> (8 * i)) & 0xFF));
  }
  return f + body;
}

// Feeds `bytes` the way zmtp::Server does (keep what was not consumed, append what arrives).
kvnode::Status feed(Reader& r, const std::string& bytes, std::size_t step, Frames& sink,
                    std::string& replies) {
  std::string held;
  for (std::size_t at = 0; at < bytes.size(); at += step) {
    held += bytes.substr(at, step);
    auto used = r.consume(held, replies, sink);
    if (!used) return used.error();
    held.erase(0, *used);
  }
  EXPECT_TRUE(held.empty()) << held.size() << " bytes left unconsumed";
  return {};
}

TEST(ZmtpReader, APushPeersStreamGivesTheSameFramesAtEverySplit) {
  const std::string big(300, 'x');  // a long frame
  const std::string stream = peer_greeting() + ready("PUSH") + message("one") + message("") +
                             message("a", true) + message("b") + message(big);
  for (std::size_t step = 1; step <= stream.size(); ++step) {
    Reader r(kPull, 1 << 20);
    Frames sink;
    std::string replies;
    ASSERT_TRUE(feed(r, stream, step, sink, replies)) << "step " << step;
    EXPECT_EQ(sink.got, (std::vector<std::string>{"one", "", "a", "b", big})) << "step " << step;
    EXPECT_EQ(sink.mores, (std::vector<bool>{false, false, true, false, false}));
    EXPECT_EQ(r.phase(), Reader::Phase::kTraffic);
    EXPECT_EQ(replies, ready("PULL")) << "our READY, once, after the peer's greeting";
  }
}

TEST(ZmtpReader, ARouterPairsWithDealerAndReqNotPush) {
  for (const std::string type : {"DEALER", "REQ", "ROUTER"}) {
    Reader r(kRouter, 1 << 20);
    Frames sink;
    std::string replies;
    ASSERT_TRUE(
        feed(r, peer_greeting() + ready(type) + message("", true) + message("q"), 5, sink, replies))
        << type;
    EXPECT_EQ(replies, ready("ROUTER")) << type;
    EXPECT_EQ(sink.got, (std::vector<std::string>{"", "q"})) << type;
  }
  Reader r(kRouter, 1 << 20);
  Frames sink;
  std::string replies;
  auto used = r.consume(peer_greeting() + ready("PUSH"), replies, sink);
  ASSERT_FALSE(used);
  EXPECT_NE(used.error().message.find("ROUTER socket does not pair with 'PUSH'"), std::string::npos)
      << used.error().message;
}

TEST(ZmtpReader, OurGreetingIsVersion31WithTheNullMechanism) {
  const auto g = kvnode::zmtp::greeting();
  EXPECT_EQ(std::string(g.begin(), g.end()), peer_greeting(3, 1));
}

TEST(ZmtpReader, PingIsAnsweredWithPongCarryingItsContext) {
  Reader r(kPull, 1 << 20);
  Frames sink;
  std::string replies;
  ASSERT_TRUE(feed(r, peer_greeting() + ready("PUSH"), 1000, sink, replies));
  replies.clear();
  ASSERT_TRUE(feed(r, command("PING", std::string("\x00\x64", 2) + "ctx") + message("m"), 1000,
                   sink, replies));
  EXPECT_EQ(replies, command("PONG", "ctx"));
  EXPECT_EQ(sink.got, std::vector<std::string>{"m"});
  replies.clear();  // an empty ping, and a context past the spec's 16 bytes is cut
  ASSERT_TRUE(
      feed(r, command("PING", "") + command("PING", std::string(2, '\0') + std::string(40, 'c')),
           1000, sink, replies));
  EXPECT_EQ(replies, command("PONG", "") + command("PONG", std::string(16, 'c')));
}

TEST(ZmtpReader, PeersItDoesNotServeAreRefusedWithTheReason) {
  struct Case {
    std::string name, bytes, says;
    ErrorCode code;
  };
  const std::vector<Case> cases = {
      {"zmtp 1.0", std::string("\x05\x00hello", 7) + std::string(57, 'x'), "ZMTP 2+",
       ErrorCode::kRefused},
      {"zmtp 2.0", peer_greeting(1, 0), "ZMTP 3 is required", ErrorCode::kRefused},
      {"curve", peer_greeting(3, 0, "CURVE"), "'CURVE'", ErrorCode::kRefused},
      {"dealer", peer_greeting() + ready("DEALER"), "PULL socket does not pair with 'DEALER'",
       ErrorCode::kRefused},
      {"no socket type", peer_greeting() + command("READY", ""), "no Socket-Type",
       ErrorCode::kInvalid},
      {"cut property", peer_greeting() + command("READY", "\x0bSocket-Type\x00\x00"), "cut short",
       ErrorCode::kInvalid},
      {"value past the end",
       peer_greeting() + command("READY", std::string("\x0bSocket-Type\0\0\0\x09PUSH", 20)),
       "cut short", ErrorCode::kInvalid},
      {"message first", peer_greeting() + message("m"), "before the handshake",
       ErrorCode::kInvalid},
      {"other command first", peer_greeting() + command("PING", "\0\0"), "expected READY",
       ErrorCode::kInvalid},
      {"reserved flags", peer_greeting() + ready("PUSH") + "\x10\x01m", "reserved",
       ErrorCode::kInvalid},
      {"command with more", peer_greeting() + ready("PUSH") + "\x05\x01m", "'more'",
       ErrorCode::kInvalid},
      {"name past the end", peer_greeting() + ready("PUSH") + "\x04\x02\x09P", "name is cut short",
       ErrorCode::kInvalid},
      {"error command", peer_greeting() + ready("PUSH") + command("ERROR", "\x04gone"),
       "ERROR: gone", ErrorCode::kPeerLost},
  };
  for (const Case& c : cases) {
    Reader r(kPull, 1 << 20);
    Frames sink;
    std::string replies;
    auto used = r.consume(c.bytes, replies, sink);
    ASSERT_FALSE(used) << c.name;
    EXPECT_EQ(used.error().code, c.code) << c.name << ": " << used.error().message;
    EXPECT_NE(used.error().message.find(c.says), std::string::npos)
        << c.name << ": " << used.error().message;
    EXPECT_TRUE(sink.got.empty()) << c.name;
  }
}

TEST(ZmtpReader, AFrameOverTheLimitIsRefusedFromItsHeaderAlone) {
  Reader r(kPull, 1000);
  Frames sink;
  std::string replies;
  ASSERT_TRUE(feed(r, peer_greeting() + ready("PUSH"), 1000, sink, replies));
  std::string header = "\x02";  // a long frame of 2^63 bytes: nine bytes in hand, nothing else
  header += std::string("\x80\0\0\0\0\0\0\0", 8);
  EXPECT_EQ(r.wanted(header), 9u) << "never ask the caller to buffer what will be refused";
  auto used = r.consume(header, replies, sink);
  ASSERT_FALSE(used);
  EXPECT_NE(used.error().message.find("over the limit of 1000"), std::string::npos);
  // At the limit it is taken.
  Reader ok(kPull, 300);
  ASSERT_TRUE(
      feed(ok, peer_greeting() + ready("PUSH") + message(std::string(300, 'y')), 7, sink, replies));
  EXPECT_EQ(sink.got.back().size(), 300u);
}

TEST(ZmtpReader, WantedNamesTheWholeUnitInProgress) {
  Reader r(kPull, 1 << 20);
  EXPECT_EQ(r.wanted(""), 64u);
  Frames sink;
  std::string replies;
  ASSERT_TRUE(feed(r, peer_greeting() + ready("PUSH"), 1000, sink, replies));
  EXPECT_EQ(r.wanted(""), 2u);
  EXPECT_EQ(r.wanted("\x02"), 9u);
  EXPECT_EQ(r.wanted(message(std::string(70000, 'z')).substr(0, 9)), 9u + 70000u);
  EXPECT_EQ(r.wanted(message("abc").substr(0, 2)), 5u);
}

}  // namespace
