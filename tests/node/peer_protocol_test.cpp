// The peer protocol's codec (every message round-trips; every wrong length, count, version, op
// or outcome is kInvalid and allocates nothing) and the peer service that answers it (a
// reservation is the asking peer's alone and comes back the same when asked again; holds end on
// their clock; a request that does not decode changes nothing).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <thread>

#include "fake_transport.hpp"

namespace kvnode::node {
namespace {

using namespace std::chrono_literals;
using namespace peer;

std::vector<std::byte> bytes(std::initializer_list<int> v) {
  std::vector<std::byte> out;
  for (int b : v) out.push_back(static_cast<std::byte>(b));
  return out;
}

TEST(PeerProtocol, EveryMessageRoundTrips) {
  const std::vector<Request> requests = {
      ReserveRequest{UINT64_MAX, {1, -2, INT64_MAX}}, FinishRequest{3, {{5, true}, {-6, false}}},
      LeaseRequest{{7}}, UnleaseRequest{{}}, HoldsRequest{{INT64_MIN, 0}}};
  for (const Request& r : requests) {
    const Result<Request> back = decode_request(encode(r));
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(encode(*back), encode(r)) << to_string(op_of(r));
  }
  const std::vector<Answer> answers = {
      ReserveAnswer{{{ReserveOutcome::kPage, 0xfffffffe}, {ReserveOutcome::kBusy, 0}}},
      FinishAnswer{{FinishOutcome::kStored, FinishOutcome::kFrozen, FinishOutcome::kReleased}},
      LeaseAnswer{{3, 4}}, UnleaseAnswer{}, HoldsAnswer{{1, 0, 1}}};
  for (const Answer& a : answers) {
    const Result<Answer> back = decode_answer(encode(a));
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(encode(*back), encode(a)) << to_string(op_of(a));
  }
  const auto reserved = std::get<ReserveAnswer>(*decode_answer(encode(answers[0])));
  EXPECT_EQ(reserved.chunks[0].page, 0xfffffffeu);
  EXPECT_EQ(reserved.chunks[1].outcome, ReserveOutcome::kBusy);
  // A 256-chunk finish, the largest request, fits an ask (8 KiB).
  FinishRequest big;
  big.chunks.resize(kMaxChunks);
  EXPECT_LE(encode(Request{big}).size(), 8u << 10);
  EXPECT_TRUE(decode_request(encode(Request{big})));
}

TEST(PeerProtocol, WrongBytesAreInvalid) {
  const std::vector<std::byte> reserve = encode(Request{ReserveRequest{1, {1, 2}}});
  std::vector<std::vector<std::byte>> bad = {
      {},
      bytes({0xA2, 1, 0}),           // shorter than the header
      bytes({1, 1, 0, 0}),           // the first protocol's op byte where the version goes
      bytes({0xA2, 0, 0, 0}),        // op 0
      bytes({0xA2, 6, 0, 0}),        // op past kHolds
      bytes({0xA2, 1, 0x01, 0x01}),  // 257 chunks
  };
  for (std::size_t cut = 0; cut < reserve.size(); ++cut)
    bad.emplace_back(reserve.begin(), reserve.begin() + static_cast<std::ptrdiff_t>(cut));
  std::vector<std::byte> longer = reserve;
  longer.push_back(std::byte{0});
  bad.push_back(longer);
  for (const std::vector<std::byte>& b : bad) {
    const Result<Request> r = decode_request(b);
    ASSERT_FALSE(r) << b.size() << " bytes";
    EXPECT_EQ(r.error().code, ErrorCode::kInvalid);
  }
  EXPECT_FALSE(
      decode_request(bytes({0xA2, 2, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2})))
      << "a finish's whole flag of 2";
  EXPECT_FALSE(decode_answer(bytes({0xA2, 1, 1, 0, 5, 0, 0, 0, 0}))) << "reserve outcome 5";
  EXPECT_FALSE(decode_answer(bytes({0xA2, 2, 1, 0, 4}))) << "finish outcome 4";
  EXPECT_FALSE(decode_answer(bytes({0xA2, 5, 1, 0, 2}))) << "a holds flag of 2";
  EXPECT_FALSE(decode_answer(bytes({0xA2, 4, 1, 0}))) << "an unlease answer with items";
  // An answer must answer its request.
  const Request q = HoldsRequest{{1, 2}};
  EXPECT_TRUE(answers(q, HoldsAnswer{{1, 0}}));
  EXPECT_FALSE(answers(q, HoldsAnswer{{1}}));
  EXPECT_FALSE(answers(q, FinishAnswer{{FinishOutcome::kStored, FinishOutcome::kStored}}));
  EXPECT_TRUE(answers(LeaseRequest{{1, 2}}, LeaseAnswer{{9}})) << "a lease may stop short";
  EXPECT_FALSE(answers(LeaseRequest{{1}}, LeaseAnswer{{9, 8}}));
}

TEST(PeerService, AReservationIsThePeersAloneAndEndsOnItsClock) {
  fake::FakeNetwork net;
  fake::FakeNode b(net, "127.0.0.1:1002", 4, {}, 100ms);
  PeerService& s = b.service;
  auto reserve = [&](const std::string& peer, ChunkHash h, std::uint64_t move = 1) {
    return std::get<ReserveAnswer>(s.answer(peer, ReserveRequest{move, {h}})).chunks.at(0);
  };
  auto finish = [&](const std::string& peer, ChunkHash h, bool whole, std::uint64_t move = 1) {
    return std::get<FinishAnswer>(s.answer(peer, FinishRequest{move, {{h, whole}}})).chunks.at(0);
  };
  const Reserved first = reserve("p", 11);
  ASSERT_EQ(first.outcome, ReserveOutcome::kPage);
  EXPECT_EQ(reserve("p", 11).page, first.page) << "asked again: the same page";
  EXPECT_EQ(reserve("q", 11).outcome, ReserveOutcome::kBusy) << "another peer's reservation";
  EXPECT_EQ(reserve("p", 11, 2).outcome, ReserveOutcome::kBusy) << "another move's reservation";
  EXPECT_EQ(finish("q", 11, true), FinishOutcome::kLost) << "another peer cannot commit it";
  EXPECT_EQ(finish("p", 11, false, 2), FinishOutcome::kReleased);
  EXPECT_EQ(b.store.counters().reserved, 1u) << "nor another move release it";
  EXPECT_EQ(s.reservations(), 1u);
  ASSERT_TRUE(b.put(12));
  EXPECT_EQ(reserve("p", 12).outcome, ReserveOutcome::kHave);
  b.engine.freeze(true);
  EXPECT_EQ(reserve("p", 13).outcome, ReserveOutcome::kFrozen);
  b.engine.freeze(false);
  // Its clock runs out: the page goes back, and a late finish stores nothing.
  std::this_thread::sleep_for(150ms);
  s.expire();
  EXPECT_EQ(s.reservations(), 0u);
  EXPECT_EQ(b.store.counters().reserved, 0u);
  EXPECT_EQ(finish("p", 11, true), FinishOutcome::kLost);
  EXPECT_FALSE(b.store.contains(11));
  // No room: 3 pages hold pinned chunks, one holds 12 (pinned too).
  for (ChunkHash h : {21, 22}) ASSERT_TRUE(b.put(h));
  const std::vector<ChunkHash> all = {12, 21, 22};
  ASSERT_EQ(b.store.leading(all, "pin"), 3u);
  ASSERT_EQ(reserve("p", 31).outcome, ReserveOutcome::kPage);
  EXPECT_EQ(reserve("p", 32).outcome, ReserveOutcome::kNoRoom);
  EXPECT_EQ(finish("p", 31, false), FinishOutcome::kReleased);
  EXPECT_EQ(b.store.counters().reserved, 0u);
}

TEST(PeerService, LeasesHoldTheLeadingChunksUntilUnleasedOrExpired) {
  fake::FakeNetwork net;
  fake::FakeNode a(net, "127.0.0.1:1001", 8, {}, 100ms);
  for (ChunkHash h : {1, 2, 4}) ASSERT_TRUE(a.put(h));
  const auto leased = std::get<LeaseAnswer>(a.service.answer("p", LeaseRequest{{1, 2, 3, 4}}));
  EXPECT_EQ(leased.pages.size(), 2u) << "stops at the first chunk not held";
  EXPECT_EQ(a.service.leases(), 2u);
  EXPECT_TRUE(a.store.remove(1)) << "removable while leased; its page returns with the lease";
  (void)a.service.answer("p", UnleaseRequest{{1}});
  EXPECT_EQ(a.service.leases(), 1u);
  std::this_thread::sleep_for(150ms);
  a.service.expire();
  EXPECT_EQ(a.service.leases(), 0u);
  const auto held = std::get<HoldsAnswer>(a.service.answer("p", HoldsRequest{{1, 2, 3}}));
  EXPECT_EQ(held.held, (std::vector<std::uint8_t>{0, 1, 0}));
}

TEST(PeerService, ARequestThatDoesNotDecodeIsInvalidAndChangesNothing) {
  fake::FakeNetwork net;
  fake::FakeNode b(net, "127.0.0.1:1002", 4);
  std::vector<std::byte> q = encode(Request{ReserveRequest{1, {1, 2}}});
  q.pop_back();
  const Result<std::vector<std::byte>> r = b.service.on_ask("p", q);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kInvalid);
  EXPECT_EQ(b.store.counters().reserved, 0u);
  const Result<std::vector<std::byte>> ok =
      b.service.on_ask("p", encode(Request{HoldsRequest{{1}}}));
  ASSERT_TRUE(ok);
  EXPECT_EQ(std::get<HoldsAnswer>(decode_answer(*ok).value()).held, (std::vector<std::uint8_t>{0}));
}

TEST(PeerService, HoldsEndOnTheirClockWhenNoPeerAsksAgain) {
  fake::FakeNetwork net;
  fake::FakeNode b(net, "127.0.0.1:1002", 4, {}, 100ms);
  ASSERT_TRUE(b.put(1));
  const auto start = std::chrono::steady_clock::now();
  const auto reserved = std::get<ReserveAnswer>(b.service.answer("p", ReserveRequest{1, {11}}));
  ASSERT_EQ(reserved.chunks.at(0).outcome, ReserveOutcome::kPage);
  ASSERT_EQ(std::get<LeaseAnswer>(b.service.answer("q", LeaseRequest{{1}})).pages.size(), 1u);
  EXPECT_EQ(b.store.counters().reserved, 1u);
  // Both peers vanish: no ask, no expire() call. The service's own sweeper ends their holds.
  while (std::chrono::steady_clock::now() - start < 2s &&
         (b.store.counters().reserved != 0 || b.service.leases() != 0))
    std::this_thread::sleep_for(5ms);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms) << "not before the ttl";
  EXPECT_EQ(b.store.counters().reserved, 0u) << "the page went back";
  EXPECT_EQ(b.service.reservations(), 0u);
  EXPECT_EQ(b.service.leases(), 0u);
  EXPECT_TRUE(b.store.remove(1)) << "no lease keeps it";
}

TEST(PeerService, ASweepCountsWhatItEndedPerPeer) {
  fake::FakeNetwork net;
  fake::FakeNode b(net, "127.0.0.1:1002", 8);
  for (ChunkHash h : {1, 2}) ASSERT_TRUE(b.put(h));
  auto now = std::chrono::steady_clock::now();
  PeerServiceOptions o;
  o.ttl = std::chrono::hours(1);  // its sweeper never runs here: time is the test's
  o.now = [&] { return now; };
  PeerService s(b.engine, o);
  (void)s.answer("p", ReserveRequest{1, {11, 12, 13}});
  (void)s.answer("q", ReserveRequest{1, {14, 15}});
  (void)s.answer("p", LeaseRequest{{1, 2}});
  EXPECT_TRUE(s.expire().reservations.empty()) << "not yet";
  now += std::chrono::hours(2);
  const PeerService::Expired e = s.expire();  // one log line per peer and kind
  EXPECT_EQ(e.reservations, (std::map<std::string, std::size_t>{{"p", 3}, {"q", 2}}));
  EXPECT_EQ(e.leases, (std::map<std::string, std::size_t>{{"p", 2}}));
  EXPECT_EQ(b.store.counters().reserved, 0u);
}

TEST(PeerService, AChunkStoredHereDuringItsReserveIsThereNotBusy) {
  fake::FakeNetwork net;
  fake::FakeNode b(net, "127.0.0.1:1002", 4);
  // A local client's put commits the chunk after the service saw it missing, before it reserves.
  b.before_reserve = [&](ChunkHash h) {
    if (h == 11) {
      EXPECT_TRUE(b.put(11));
    }
  };
  const auto a = std::get<ReserveAnswer>(b.service.answer("p", ReserveRequest{1, {11, 12}}));
  EXPECT_EQ(a.chunks.at(0).outcome, ReserveOutcome::kHave) << "there: the source's run goes on";
  EXPECT_EQ(a.chunks.at(1).outcome, ReserveOutcome::kPage);
  // Still being written by another writer: busy.
  ASSERT_TRUE(b.engine.reserve(13));
  b.before_reserve = nullptr;
  const auto busy = std::get<ReserveAnswer>(b.service.answer("p", ReserveRequest{1, {13}}));
  EXPECT_EQ(busy.chunks.at(0).outcome, ReserveOutcome::kBusy);
  b.engine.abort(13);
}

TEST(PeerService, BadRequestsAreLoggedOnceASecondWithTheirCount) {
  using Clock = std::chrono::steady_clock;
  LogThrottle t(1s);
  const Clock::time_point t0 = Clock::now();
  EXPECT_EQ(t.pass(t0), 1u) << "the first is logged";
  for (int i = 0; i < 4; ++i) EXPECT_EQ(t.pass(t0 + 10ms * i), 0u);
  EXPECT_EQ(t.pass(t0 + 1s), 5u) << "a second later: one line for the 4 kept quiet and this one";
  EXPECT_EQ(t.pass(t0 + 1500ms), 0u);
  EXPECT_EQ(t.pass(t0 + 2100ms), 2u);
}

}  // namespace
}  // namespace kvnode::node
