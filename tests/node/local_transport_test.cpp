// The local socket's transport hardening (local_socket_server.hpp) against a LocalService in
// this process: hostile connections (garbage, huge declared lengths, half frames, floods of
// connect-and-close) cost only themselves; beyond the connection cap a client is told it is
// refused; a reply nobody reads, or one read too slowly to finish in time, is cut while other
// clients are served.
#include <gtest/gtest.h>

#include <numeric>

#include "kvnode/client/local_protocol.hpp"
#include "local_rig.hpp"

namespace kvnode::node {
namespace {

using namespace local_rig;

// Hostile connections (garbage, a huge declared length, half a frame then silence, floods of
// connect-and-close) cost only themselves: the node answers every other client meanwhile.
TEST(LocalService, HostileConnectionsCostOnlyThemselves) {
  LocalServiceOptions o;
  o.stall_timeout = 300ms;
  ServiceRig rig("hostile", o);
  const std::string path = rig.path();
  auto served = [&] {
    auto c = client_of(path);
    Result<std::vector<bool>> has = c ? c->contains(ChunkKeys::of_hashes({1})) : make_error("no");
    return has && *has == std::vector<bool>{false};
  };

  // Garbage in a frame: an error answer, and the connection still serves a good request.
  RawLocalSocket garbage(path);
  ASSERT_TRUE(garbage.send_frame("\xc1\xc1\xc1"));
  expect_error(answer_of(garbage.read_frame(5000ms)), "invalid", "not a valid msgpack");
  ASSERT_TRUE(garbage.send_frame(request("contains", {1})));
  EXPECT_TRUE(answer_of(garbage.read_frame(5000ms)).ok);
  garbage.close();
  // Bytes that are no frame at all: the first four read as a length (here 542 MB): closed at once.
  RawLocalSocket noise(path);
  ASSERT_TRUE(noise.send_raw("GET / HTTP/1.1\r\n\r\n"));
  EXPECT_TRUE(noise.closed_within(2s));
  // A declared length over the limit, just over it and far over it: closed at once.
  for (const std::uint32_t length :
       {static_cast<std::uint32_t>(client::protocol::kMaxMessageBytes + 1), 0xffffffffu}) {
    RawLocalSocket huge(path);
    ASSERT_TRUE(huge.send_raw(RawLocalSocket::header(length)));
    EXPECT_TRUE(huge.closed_within(2s)) << length;
  }
  // Half a frame, then silence: everyone else is served meanwhile; it is cut after the stall
  // timeout. So is a client that stops inside the length.
  RawLocalSocket half(path), half_header(path);
  ASSERT_TRUE(half.send_raw(RawLocalSocket::header(100) + "0123456789"));
  ASSERT_TRUE(half_header.send_raw(std::string("\x10\x00", 2)));
  const auto t0 = Clock::now();
  EXPECT_TRUE(served());
  EXPECT_LT(Clock::now() - t0, 1s);
  EXPECT_TRUE(half.closed_within(5s));
  EXPECT_TRUE(half_header.closed_within(5s));
  // Floods of connections that close at once, some mid-frame.
  for (int i = 0; i < 2000; ++i) {
    RawLocalSocket s(path);
    ASSERT_TRUE(s.connected()) << i;
    if (i % 3 == 0) (void)s.send_raw(RawLocalSocket::header(1000) + "x");
    if (i % 3 == 1) (void)s.send_frame(request("contains", {1}));
  }
  // The flood's connections are closed by the time the socket thread has seen their ends (until
  // then, 256 of them fill the cap and a new client is refused, as it should be).
  EXPECT_TRUE(eventually([&] { return rig.service().connections() == 0; }))
      << rig.service().connections() << " connections still open";
  EXPECT_TRUE(served());
}

// Beyond max_connections a new connection is told it is refused, and closed; the client reports
// kRefused (not a lost peer: nothing is wrong with the node). One leaves: the next is served.
TEST(LocalService, ConnectionsBeyondTheCapAreRefusedUntilOneLeaves) {
  LocalServiceOptions o;
  o.max_connections = 4;
  ServiceRig rig("cap", o);
  std::vector<std::unique_ptr<RawLocalSocket>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<RawLocalSocket>(rig.path()));
    ASSERT_TRUE(held.back()->send_frame(request("contains", {1})));
    ASSERT_TRUE(answer_of(held.back()->read_frame(5000ms)).ok) << i;  // accepted and served
  }
  // Told why in one frame, then closed.
  RawLocalSocket extra(rig.path());
  expect_error(answer_of(extra.read_frame(2000ms)), "refused", "over max_connections 4");
  EXPECT_TRUE(extra.closed_within(2s));
  LocalClientOptions co;
  co.timeout = 2s;
  auto refused = LocalClient::connect(rig.path(), co);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kRefused) << refused.error().message;
  EXPECT_NE(refused.error().message.find("over max_connections 4"), std::string::npos)
      << refused.error().message;
  EXPECT_GE(rig.service().connections(), 4u);
  held.pop_back();
  std::unique_ptr<LocalClient> c;
  ASSERT_TRUE(eventually([&] {
    auto again = LocalClient::connect(rig.path(), co);
    if (again) c = std::move(again).value();
    return c != nullptr;
  }));
  EXPECT_TRUE(c->contains(ChunkKeys::of_hashes({1})));
}

// A large inline get whose client never reads it is cut once it stalls; one whose client reads
// it a little at a time (the reply keeps moving, never a stall) is cut when it is not read whole
// within the stall timeout of its start. Every other client is served meanwhile.
TEST(LocalTransport, RepliesNotReadInTimeAreCutWhileOthersAreServed) {
  LocalServiceOptions o;
  o.stall_timeout = 500ms;
  ServiceRig rig("slow-readers", o, /*pages=*/128);
  std::vector<std::int64_t> keys(128);
  std::iota(keys.begin(), keys.end(), 1000);
  for (std::int64_t k : keys) ASSERT_TRUE(rig.engine().put(k, chunk_bytes(k, kBytes)));
  const std::string get = request("get", keys);  // an 8 MiB reply
  RawLocalSocket never(rig.path()), trickle(rig.path());
  ASSERT_TRUE(never.send_frame(get));
  ASSERT_TRUE(trickle.send_frame(get));

  // 128 KiB every 100 ms: the reply moves every few reads, and would take over 6 s whole.
  const auto t0 = Clock::now();
  std::size_t read = 0;
  std::optional<Clock::duration> cut_after;
  bool others_served = false;
  while (!cut_after && Clock::now() - t0 < 5s) {
    std::optional<std::size_t> n = trickle.read_up_to(128 << 10, 100ms);
    if (!n) {
      cut_after = Clock::now() - t0;
      break;
    }
    read += *n;
    if (!others_served) {
      const auto asked = Clock::now();
      auto c = client_of(rig.path(), false);
      Result<std::vector<bool>> has =
          c ? c->contains(ChunkKeys::of_hashes({keys[0]})) : make_error("no client");
      others_served = has && *has == std::vector<bool>{true};
      EXPECT_LT(Clock::now() - asked, 300ms);
    }
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(cut_after) << "a trickling reader held its reply for 5 s (" << read << " bytes)";
  EXPECT_LT(*cut_after, 3s);
  EXPECT_GT(read, 0u) << "it was reading";
  EXPECT_LT(read, keys.size() * kBytes);
  EXPECT_TRUE(others_served);
  EXPECT_TRUE(never.hung_up_within(2s)) << "a reply never read is cut";
  EXPECT_TRUE(eventually([&] { return rig.service().connections() == 0; }))
      << rig.service().connections() << " connections open";
}

}  // namespace
}  // namespace kvnode::node
