// The move's state machine through the fake transport (fake_transport.hpp), with a fault at every
// state: the peer lost or its answer lost at each call, a push that completes only some chunks, a
// destination frozen at the reserve or between reserve and finish, without room, or evicting a
// confirmed chunk before the holds check; a source frozen or pinning when it evicts. Each asserts
// the guarantees: no chunk readable anywhere unless written whole, every chunk at the source or
// the destination, the source evicts only the leading run the destination holds, reservations
// are given back, the result's counts are exact.
#include <gtest/gtest.h>

#include <future>
#include <numeric>
#include <thread>
#include <utility>

#include "fake_transport.hpp"

namespace kvnode::node {
namespace {

using namespace std::chrono_literals;
using fake::FakeNetwork;
using fake::FakeNode;
using fake::Fault;
using fake::Kind;
using peer::Op;

constexpr std::size_t kChunks = 10;  // 3 batches of 4, 4, 2
constexpr auto kTtl = 150ms;         // the destination's reservation clock

PeerMovesOptions quick() {
  PeerMovesOptions o;
  o.batch = 4;
  o.frozen_wait = 300ms;
  o.frozen_poll = 10ms;
  return o;
}

std::vector<std::int64_t> tokens(std::size_t chunks) {
  std::vector<std::int64_t> t(chunks * FakeNode::kTokensPerChunk);
  std::iota(t.begin(), t.end(), 1000);
  return t;
}

struct Pair {
  explicit Pair(std::size_t b_pages = 64, std::chrono::milliseconds ttl = kTtl,
                PeerMovesOptions a_options = quick())
      : a(net, "127.0.0.1:1001", 64, std::move(a_options), ttl),
        b(net, "127.0.0.1:1002", b_pages, quick(), ttl) {
    hashes = a.engine.hashes(t).value();
    for (ChunkHash h : hashes) EXPECT_TRUE(a.put(h));
  }
  MoveResult move(bool copy = false) { return a.moves.move(b.url, t, copy); }
  // How many of the leading chunks left A (copy=false): they must be exactly that.
  std::size_t evicted_run() const {
    std::size_t n = 0;
    while (n < hashes.size() && !a.store.contains(hashes[n])) ++n;
    return n;
  }
  FakeNetwork net;
  FakeNode a;
  FakeNode b;
  std::vector<std::int64_t> t = tokens(kChunks);
  std::vector<ChunkHash> hashes;
};

// What holds after any move, whatever went wrong: counts add up; nothing lost; A gave up exactly
// the leading run the answer names, which B holds; everything B can read is whole; B's
// reservations end (at once, or on its clock).
void expect_guarantees(Pair& p, const MoveResult& r, bool copy = false) {
  EXPECT_EQ(r.chunks_sent + r.chunks_present + r.chunks_failed, kChunks);
  const std::size_t run = r.tokens_confirmed / FakeNode::kTokensPerChunk;
  EXPECT_EQ(r.tokens_confirmed % FakeNode::kTokensPerChunk, 0u);
  EXPECT_EQ(p.evicted_run(), copy ? 0 : run) << "A evicts exactly the confirmed run";
  for (std::size_t i = 0; i < kChunks; ++i) {
    const ChunkHash h = p.hashes[i];
    EXPECT_TRUE(p.a.store.contains(h) || p.b.store.contains(h)) << "chunk " << i << " is nowhere";
    if (p.a.store.contains(h)) {
      EXPECT_TRUE(p.a.intact(h)) << i;
    }
    if (p.b.store.contains(h)) {
      EXPECT_TRUE(p.b.intact(h)) << "B reads chunk " << i << " not written whole";
    }
    if (i < run) {
      EXPECT_TRUE(p.b.store.contains(h)) << "confirmed chunk " << i << " is not at B";
    }
    if (!copy && i >= run) {
      EXPECT_TRUE(p.a.store.contains(h)) << "unconfirmed chunk " << i << " left A";
    }
  }
  EXPECT_EQ(p.a.store.counters().reserved, 0u);
  std::this_thread::sleep_for(kTtl + 20ms);
  p.b.service.expire();
  EXPECT_EQ(p.b.service.reservations(), 0u);
  EXPECT_EQ(p.b.store.counters().reserved, 0u) << "reservations given back";
}

TEST(MoveProtocol, AMoveRunsEveryStateInOrderAndCostsTwoAsksPerBatch) {
  Pair p;
  ASSERT_TRUE(p.b.put(p.hashes[3]));  // B has chunk 3: neither pushed nor admitted again
  std::vector<MoveState> states;
  p.a.on_move_state = [&](MoveState s) { states.push_back(s); };
  const MoveResult r = p.move();
  EXPECT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.chunks_sent, 9u);
  EXPECT_EQ(r.chunks_present, 1u);
  EXPECT_EQ(r.chunks_failed, 0u);
  EXPECT_EQ(r.tokens_confirmed, kChunks * FakeNode::kTokensPerChunk);
  EXPECT_EQ(r.bytes, 9 * FakeNode::kPageBytes);
  using S = MoveState;
  const std::vector<S> batch = {S::kReserve, S::kPush, S::kFinish, S::kNextBatch};
  std::vector<S> want = {S::kLeaseLocal};
  for (int i = 0; i < 3; ++i) want.insert(want.end(), batch.begin(), batch.end());
  want.insert(want.end(), {S::kCheckHolds, S::kEvictSource, S::kDone});
  EXPECT_EQ(states, want);
  // Reserve and finish per batch (commit and release folded into one), and the holds check.
  EXPECT_EQ(p.net.calls(Kind::kAsk), 3u * 2 + 3);
  EXPECT_EQ(p.net.calls(Kind::kPush), 3u);
  EXPECT_EQ(p.b.admits.load(), kChunks);
  expect_guarantees(p, r);
  EXPECT_EQ(p.a.store.counters().chunks, 0u);
}

TEST(MoveProtocol, ACopyKeepsTheSourceAndAMoveToItselfTriesNothing) {
  Pair p;
  std::vector<MoveState> states;
  p.a.on_move_state = [&](MoveState s) { states.push_back(s); };
  const MoveResult copied = p.move(true);
  EXPECT_EQ(copied.chunks_sent, kChunks);
  EXPECT_EQ(states.back(), MoveState::kDone);
  EXPECT_EQ(states[states.size() - 2], MoveState::kCheckHolds) << "no kEvictSource with copy";
  expect_guarantees(p, copied, true);
  EXPECT_EQ(p.a.store.counters().chunks, kChunks);

  states.clear();
  const std::size_t calls = p.net.calls(Kind::kAsk);
  const MoveResult self = p.a.moves.move("localhost:1001", p.t, false);
  EXPECT_TRUE(self.refused);
  EXPECT_EQ(states, (std::vector<MoveState>{MoveState::kLeaseLocal, MoveState::kFailed}));
  EXPECT_EQ(p.net.calls(Kind::kAsk), calls);
  EXPECT_EQ(p.a.store.counters().chunks, kChunks);
}

// The calls of the move above, in order (3 batches, then 3 holds asks), and how many leading
// chunks A may give up when the destination is lost from that call on.
struct Step {
  Kind kind;
  std::optional<Op> op;
  std::size_t n;  // among calls of its kind (and op)
};
const std::vector<Step> kSteps = {
    {Kind::kAsk, Op::kReserve, 0}, {Kind::kPush, std::nullopt, 0}, {Kind::kAsk, Op::kFinish, 0},
    {Kind::kAsk, Op::kReserve, 1}, {Kind::kPush, std::nullopt, 1}, {Kind::kAsk, Op::kFinish, 1},
    {Kind::kAsk, Op::kReserve, 2}, {Kind::kPush, std::nullopt, 2}, {Kind::kAsk, Op::kFinish, 2},
    {Kind::kAsk, Op::kHolds, 0},   {Kind::kAsk, Op::kHolds, 1},    {Kind::kAsk, Op::kHolds, 2},
};

TEST(MoveProtocol, ADestinationLostAtAnyCallKeepsEveryUnconfirmedChunkAtTheSource) {
  // Lost from call i on: the holds check answers for the batches before it only.
  const std::vector<std::size_t> run = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 8};
  for (std::size_t i = 0; i < kSteps.size(); ++i) {
    SCOPED_TRACE("lost at call " + std::to_string(i));
    Pair p;
    const Step s = kSteps[i];
    auto trigger = fake::at(s.kind, s.n, Fault{Fault::What::kUnreachable, 0}, s.op);
    p.net.fault = [&](const fake::Call& c) {
      const Fault f = trigger(c);
      if (f.what != Fault::What::kNone) p.net.set_down(p.b.url, true);
      return f;
    };
    const MoveResult r = p.move();
    EXPECT_EQ(r.tokens_confirmed, run[i] * FakeNode::kTokensPerChunk) << r.error;
    EXPECT_FALSE(r.error.empty());
    EXPECT_EQ(r.chunks_failed, kChunks - run[i]);
    expect_guarantees(p, r);
  }
}

TEST(MoveProtocol, AnAnswerLostAtAnyCallCostsOnlyWhatWasNotConfirmed) {
  // One answer lost (past its deadline) at call i; the peer acted on it.
  const std::vector<std::size_t> run = {0, 0, 0, 4, 4, 4, 8, 8, 8, 0, 4, 8};
  for (std::size_t i = 0; i < kSteps.size(); ++i) {
    SCOPED_TRACE("answer lost at call " + std::to_string(i));
    Pair p;
    const Step s = kSteps[i];
    p.net.fault = fake::at(s.kind, s.n, Fault{Fault::What::kAnswerLost, 0}, s.op);
    const MoveResult r = p.move();
    EXPECT_EQ(r.tokens_confirmed, run[i] * FakeNode::kTokensPerChunk) << r.error;
    expect_guarantees(p, r);
  }
}

TEST(MoveProtocol, AReserveAnswerLostGivesItsPagesBackSoAMoveRetriedAtOnceSendsEverything) {
  Pair p(64, 60s);  // the destination's clock ends nothing during this test
  p.net.fault = fake::at(Kind::kAsk, 0, Fault{Fault::What::kAnswerLost, 0}, Op::kReserve);
  const MoveResult lost = p.move();
  EXPECT_EQ(lost.tokens_confirmed, 0u);
  EXPECT_EQ(lost.chunks_failed, kChunks);
  EXPECT_EQ(p.b.service.reservations(), 0u) << "released by a finish of none whole";
  EXPECT_EQ(p.b.store.counters().reserved, 0u);
  p.net.fault = nullptr;
  const MoveResult again = p.move();
  EXPECT_EQ(again.chunks_sent, kChunks) << again.error;
  EXPECT_EQ(again.tokens_confirmed, kChunks * FakeNode::kTokensPerChunk);
  expect_guarantees(p, again);
}

TEST(MoveProtocol, StopEndsAMoveWaitingForAFrozenDestinationAtOnceAndKeepsEveryChunk) {
  PeerMovesOptions patient = quick();
  patient.frozen_wait = 20s;  // as the node's default: without stop() the move waits it out
  patient.frozen_poll = 10s;  // one long wait, which stop() must cut short
  Pair p(64, kTtl, patient);
  p.b.engine.freeze(true);
  std::promise<void> waiting;
  bool told = false;
  p.a.on_move_state = [&](MoveState s) {
    if (s == MoveState::kWaitThaw && !std::exchange(told, true)) waiting.set_value();
  };
  MoveResult r;
  std::chrono::steady_clock::time_point ended;
  std::thread mover([&] {
    r = p.move();
    ended = std::chrono::steady_clock::now();
  });
  EXPECT_EQ(waiting.get_future().wait_for(5s), std::future_status::ready);
  std::this_thread::sleep_for(20ms);  // inside the wait
  const auto stopped = std::chrono::steady_clock::now();
  p.a.moves.stop();
  mover.join();
  EXPECT_LT(ended - stopped, 200ms) << "stop() wakes the wait for the thaw";
  EXPECT_EQ(r.chunks_failed, kChunks);
  EXPECT_EQ(r.chunks_sent + r.chunks_present, 0u);
  EXPECT_EQ(r.tokens_confirmed, 0u);
  EXPECT_FALSE(r.error.empty());
  for (ChunkHash h : p.hashes) EXPECT_TRUE(p.a.intact(h)) << "every chunk still at A";
  // A move after stop() tries nothing.
  const std::size_t asks = p.net.calls(Kind::kAsk);
  const MoveResult later = p.move();
  EXPECT_EQ(p.net.calls(Kind::kAsk), asks);
  EXPECT_EQ(later.tokens_confirmed, 0u);
  EXPECT_FALSE(later.error.empty());
  p.b.engine.freeze(false);
  expect_guarantees(p, r);
}

TEST(MoveProtocol, APartialPushCommitsTheWholeChunksAndReleasesTheRest) {
  Pair p;
  p.net.fault = fake::at(Kind::kPush, 1, Fault{Fault::What::kPartial, 1});  // batch 2: 1 of 4
  const MoveResult r = p.move();
  EXPECT_EQ(r.chunks_sent, 5u);
  EXPECT_EQ(r.chunks_failed, 5u);
  EXPECT_EQ(r.tokens_confirmed, 5 * FakeNode::kTokensPerChunk);
  EXPECT_EQ(p.b.service.reservations(), 0u) << "released by the finish, not by the clock";
  EXPECT_EQ(p.b.store.counters().reserved, 0u);
  EXPECT_EQ(p.b.store.counters().chunks, 5u);
  expect_guarantees(p, r);
}

TEST(MoveProtocol, APushWithAHoleStoresTheWholeChunksButConfirmsOnlyTheRunBeforeIt) {
  Pair p;
  p.net.fault = fake::at(Kind::kPush, 0, Fault{Fault::What::kPartial, 0, {1, 0, 1, 1}});
  const MoveResult r = p.move();
  EXPECT_EQ(r.tokens_confirmed, 1 * FakeNode::kTokensPerChunk);
  EXPECT_EQ(r.chunks_sent, 3u) << "chunks 0, 2 and 3 are stored there";
  EXPECT_EQ(r.chunks_failed, 7u);
  EXPECT_FALSE(p.b.store.contains(p.hashes[1]));
  EXPECT_TRUE(p.a.store.contains(p.hashes[2])) << "after the hole: kept at the source too";
  expect_guarantees(p, r);
}

TEST(MoveProtocol, AFrozenDestinationIsWaitedForThenTakesEverything) {
  Pair p;
  p.b.engine.freeze(true);
  int waits = 0;
  p.a.on_move_state = [&](MoveState s) {
    if (s == MoveState::kWaitThaw && ++waits == 3) p.b.engine.freeze(false);
  };
  const MoveResult r = p.move();
  EXPECT_EQ(waits, 3);
  EXPECT_EQ(r.chunks_sent, kChunks) << r.error;
  expect_guarantees(p, r);
  EXPECT_EQ(p.a.store.counters().chunks, 0u);
}

TEST(MoveProtocol, ADestinationFrozenPastTheDeadlineKeepsEverythingAtTheSource) {
  Pair p;
  p.b.engine.freeze(true);
  const auto start = std::chrono::steady_clock::now();
  const MoveResult r = p.move();
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, quick().frozen_wait);
  EXPECT_LT(took, 5s);
  EXPECT_EQ(r.chunks_failed, kChunks);
  EXPECT_EQ(r.tokens_confirmed, 0u);
  EXPECT_FALSE(r.error.empty());
  expect_guarantees(p, r);
}

TEST(MoveProtocol, ASyncBetweenReserveAndFinishIsPushedAgainAndCountedOnce) {
  Pair p;
  bool froze = false;
  p.a.on_move_state = [&](MoveState s) {
    if (s == MoveState::kPush && !froze) {
      froze = true;
      p.b.engine.freeze(true);  // the finish's commits are refused, their pages given back
    }
    if (s == MoveState::kWaitThaw) p.b.engine.freeze(false);
  };
  const MoveResult r = p.move();
  EXPECT_TRUE(froze);
  EXPECT_EQ(r.chunks_sent, kChunks) << r.error;
  EXPECT_EQ(r.chunks_present, 0u);
  EXPECT_EQ(p.net.calls(Kind::kPush), 4u) << "batch 1 pushed twice";
  EXPECT_EQ(p.b.admits.load(), kChunks) << "one ADMIT per chunk";
  expect_guarantees(p, r);
}

TEST(MoveProtocol, ASyncBetweenReserveAndFinishThatOutlastsTheWaitKeepsTheBatch) {
  Pair p;
  p.a.on_move_state = [&](MoveState s) {
    if (s == MoveState::kPush) p.b.engine.freeze(true);
  };
  const MoveResult r = p.move();
  EXPECT_EQ(r.tokens_confirmed, 0u);
  EXPECT_EQ(r.chunks_failed, kChunks);
  EXPECT_EQ(p.b.store.counters().reserved, 0u) << "each refused commit gave its page back";
  p.b.engine.freeze(false);
  expect_guarantees(p, r);
}

TEST(MoveProtocol, ADestinationLostWhileWaitingForAThawKeepsEverything) {
  Pair p;
  p.b.engine.freeze(true);
  p.a.on_move_state = [&](MoveState s) {
    if (s == MoveState::kWaitThaw) p.net.set_down(p.b.url, true);
  };
  const MoveResult r = p.move();
  EXPECT_EQ(r.tokens_confirmed, 0u);
  EXPECT_EQ(p.a.store.counters().chunks, kChunks);
  expect_guarantees(p, r);
}

TEST(MoveProtocol, ADestinationWithoutRoomTakesWhatFitsAndABusyChunkBreaksTheRun) {
  Pair p(6);
  for (ChunkHash h = 1; h <= 4; ++h) ASSERT_TRUE(p.b.put(h));
  const std::vector<ChunkHash> pinned = {1, 2, 3, 4};
  ASSERT_EQ(p.b.store.leading(pinned, "hold"), 4u);  // 2 pages left
  const MoveResult r = p.move();
  EXPECT_EQ(r.chunks_sent, 2u);
  EXPECT_EQ(r.chunks_failed, 8u);
  EXPECT_EQ(r.tokens_confirmed, 2 * FakeNode::kTokensPerChunk);
  expect_guarantees(p, r);

  Pair q;
  ASSERT_TRUE(q.b.engine.reserve(q.hashes[1]));  // another writer is storing chunk 1 at B
  const MoveResult busy = q.move();
  EXPECT_EQ(busy.tokens_confirmed, 1 * FakeNode::kTokensPerChunk);
  EXPECT_EQ(busy.chunks_sent, 3u) << "chunks 0, 2 and 3 were stored";
  EXPECT_EQ(busy.chunks_failed, 7u);
  q.b.engine.abort(q.hashes[1]);
  expect_guarantees(q, busy);
}

TEST(MoveProtocol, TwoMovesFromOneNodeNeverShareOrReleaseEachOthersPages) {
  Pair p;
  bool nested = false;
  MoveResult second;
  std::size_t held_after = 0, reserved_after = 0, pushes_by_second = 0;
  p.a.on_move_state = [&](MoveState s) {
    if (s != MoveState::kPush || nested) return;
    nested = true;  // a second move of the same chunks while the first is about to push
    const std::size_t pushes = p.net.calls(Kind::kPush);
    second = p.move();
    pushes_by_second = p.net.calls(Kind::kPush) - pushes;
    held_after = p.b.service.reservations();
    reserved_after = p.b.store.counters().reserved;
  };
  const MoveResult first = p.move();
  EXPECT_TRUE(nested);
  EXPECT_EQ(second.tokens_confirmed, 0u) << "the first move's chunks are busy there";
  EXPECT_EQ(second.chunks_failed, kChunks);
  EXPECT_EQ(pushes_by_second, 0u) << "no page of the first move's is given to the second";
  EXPECT_EQ(held_after, 4u) << "the first move's batch is still reserved for it";
  EXPECT_EQ(reserved_after, 4u);
  EXPECT_EQ(first.chunks_sent, kChunks) << first.error;
  expect_guarantees(p, first);
}

TEST(MoveProtocol, AChunkTheDestinationEvictsBeforeTheHoldsCheckStaysAtTheSource) {
  Pair p;
  p.a.on_move_state = [&](MoveState s) {
    if (s == MoveState::kCheckHolds) {
      ASSERT_TRUE(p.b.store.remove(p.hashes[5]));
    }
  };
  const MoveResult r = p.move();
  EXPECT_EQ(r.tokens_confirmed, 5 * FakeNode::kTokensPerChunk);
  EXPECT_EQ(r.chunks_sent, 5u) << "exact: the 5 B dropped are failed, not sent";
  EXPECT_EQ(r.chunks_failed, 5u);
  expect_guarantees(p, r);

  // A later batch's reservations evict an earlier batch's chunks there (a 5-page pool): the
  // run breaks at chunk 0, and A keeps every chunk.
  Pair small(5);
  const MoveResult s = small.move();
  EXPECT_EQ(s.tokens_confirmed, 0u);
  EXPECT_EQ(small.a.store.counters().chunks, kChunks);
  expect_guarantees(small, s);
}

TEST(MoveProtocol, ASourceFrozenOrPinningWhenItEvictsKeepsItsChunksAsItMust) {
  Pair p;
  p.a.on_move_state = [&](MoveState s) {
    if (s == MoveState::kEvictSource) p.a.engine.freeze(true);
  };
  const MoveResult r = p.move();
  EXPECT_EQ(r.tokens_confirmed, kChunks * FakeNode::kTokensPerChunk);
  EXPECT_EQ(p.a.store.counters().chunks, kChunks) << "no EVICT while A's sync runs";
  p.a.engine.freeze(false);
  EXPECT_EQ(p.a.store.counters().chunks, 0u) << "the deferred EVICTs, once it ended";
  expect_guarantees(p, r);

  Pair q;
  ASSERT_EQ(
      q.a.store.leading(std::vector<ChunkHash>(q.hashes.begin(), q.hashes.begin() + 2), "pin"), 2u);
  const MoveResult pinned = q.move();
  EXPECT_EQ(pinned.tokens_confirmed, kChunks * FakeNode::kTokensPerChunk);
  EXPECT_EQ(q.a.store.counters().chunks, 2u) << "pinned chunks stay here too";
  EXPECT_TRUE(q.b.store.contains(q.hashes[0]));
}

}  // namespace
}  // namespace kvnode::node
