// The retrieve's state machine through the fake transport (fake_transport.hpp), with a fault at
// every state: the lookup failing or finding nobody, the holder lost or its answer lost at each
// call, no room here, a pull that completes only some chunks, a full sync here refusing the
// commit. Each asserts the guarantees: only the leading chunks pulled whole become readable,
// with their bytes; nothing stays reserved here; the holder's leases end (at once, or on its
// clock); the counts are exact.
#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <thread>

#include "fake_transport.hpp"

namespace kvnode::node {
namespace {

using namespace std::chrono_literals;
using fake::FakeNetwork;
using fake::FakeNode;
using fake::Fault;
using fake::Kind;
using peer::Op;

constexpr std::size_t kChunks = 10;  // B holds chunk 0 and pulls 9: batches of 4, 4, 1
constexpr auto kTtl = 150ms;         // the holder's lease clock

PeerMovesOptions quick() {
  PeerMovesOptions o;
  o.batch = 4;
  return o;
}

struct Pair {
  explicit Pair(std::size_t b_pages = 64, std::chrono::milliseconds ttl = kTtl)
      : a(net, "127.0.0.1:1001", 64, quick(), ttl),
        b(net, "127.0.0.1:1002", b_pages, quick(), ttl) {
    std::vector<std::int64_t> t(kChunks * FakeNode::kTokensPerChunk);
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::int64_t>(5000 + i);
    hashes = a.engine.hashes(t).value();
    for (ChunkHash h : hashes) EXPECT_TRUE(a.put(h));
    EXPECT_TRUE(b.put(hashes[0]));
    locate =
        [this](
            const std::vector<ChunkHash>& missing) -> Result<std::pair<std::string, std::size_t>> {
      ++located;
      return std::make_pair(a.url, a.store.leading(missing));
    };
  }
  RetrieveResult retrieve() { return b.moves.retrieve_chunks(hashes, locate); }
  FakeNetwork net;
  FakeNode a;
  FakeNode b;
  std::vector<ChunkHash> hashes;
  Locate locate;
  int located = 0;
};

void expect_guarantees(Pair& p, const RetrieveResult& r) {
  EXPECT_EQ(p.b.store.leading(p.hashes), r.chunks_local + r.chunks_pulled)
      << "B holds exactly the run it reports";
  std::size_t held = 0;
  for (ChunkHash h : p.hashes) {
    held += p.b.store.contains(h) ? 1 : 0;
    if (p.b.store.contains(h)) {
      EXPECT_TRUE(p.b.intact(h)) << "B reads a chunk not pulled whole";
    }
    EXPECT_TRUE(p.a.intact(h)) << "a retrieve copies; the holder keeps its chunks";
  }
  EXPECT_EQ(held, r.chunks_local + r.chunks_pulled) << "nothing past the run";
  EXPECT_EQ(p.b.store.counters().reserved, 0u) << "nothing left reserved here";
  std::this_thread::sleep_for(kTtl + 20ms);
  p.a.service.expire();
  EXPECT_EQ(p.a.service.leases(), 0u) << "the holder's leases end";
}

TEST(RetrieveProtocol, ARetrieveRunsEveryStateInOrderAndCostsTwoAsksPerBatch) {
  Pair p;
  std::vector<RetrieveState> states;
  p.b.on_retrieve_state = [&](RetrieveState s) { states.push_back(s); };
  const RetrieveResult r = p.retrieve();
  EXPECT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.peer, p.a.url);
  EXPECT_EQ(r.chunks_local, 1u);
  EXPECT_EQ(r.chunks_pulled, 9u);
  using S = RetrieveState;
  std::vector<S> want = {S::kLocate};
  for (int i = 0; i < 3; ++i)
    want.insert(want.end(),
                {S::kLeaseRemote, S::kReserveLocal, S::kPull, S::kCommitLocal, S::kUnlease});
  want.push_back(S::kDone);
  EXPECT_EQ(states, want);
  EXPECT_EQ(p.net.calls(Kind::kAsk), 6u) << "lease and unlease per batch";
  EXPECT_EQ(p.net.calls(Kind::kPull), 3u);
  EXPECT_EQ(p.a.service.leases(), 0u) << "unleased at once";
  expect_guarantees(p, r);

  // Everything here now: no lookup, no ask.
  states.clear();
  const RetrieveResult again = p.retrieve();
  EXPECT_EQ(again.chunks_local, kChunks);
  EXPECT_EQ(states, (std::vector<S>{S::kLocate, S::kDone}));
  EXPECT_EQ(p.located, 1);
}

TEST(RetrieveProtocol, ALookupThatFailsOrFindsNobodyEndsBeforeAnyAsk) {
  Pair p;
  std::vector<RetrieveState> states;
  p.b.on_retrieve_state = [&](RetrieveState s) { states.push_back(s); };
  const Locate fails =
      [](const std::vector<ChunkHash>&) -> Result<std::pair<std::string, std::size_t>> {
    return make_error(ErrorCode::kPeerLost, "P2P lookup: no controller");
  };
  const Locate nobody =
      [](const std::vector<ChunkHash>&) -> Result<std::pair<std::string, std::size_t>> {
    return std::make_pair(std::string(), std::size_t{0});
  };
  for (const Locate* l : {&fails, &nobody}) {
    states.clear();
    const RetrieveResult r = p.b.moves.retrieve_chunks(p.hashes, *l);
    EXPECT_EQ(states, (std::vector<RetrieveState>{RetrieveState::kLocate, RetrieveState::kFailed}));
    EXPECT_FALSE(r.error.empty());
    EXPECT_EQ(r.chunks_pulled, 0u);
  }
  EXPECT_EQ(p.net.calls(Kind::kAsk), 0u);
  expect_guarantees(p, p.b.moves.retrieve_chunks(p.hashes, nobody));
}

// The calls of the retrieve above, in order.
struct Step {
  Kind kind;
  std::optional<Op> op;
  std::size_t n;
};
const std::vector<Step> kSteps = {
    {Kind::kAsk, Op::kLease, 0}, {Kind::kPull, std::nullopt, 0}, {Kind::kAsk, Op::kUnlease, 0},
    {Kind::kAsk, Op::kLease, 1}, {Kind::kPull, std::nullopt, 1}, {Kind::kAsk, Op::kUnlease, 1},
    {Kind::kAsk, Op::kLease, 2}, {Kind::kPull, std::nullopt, 2}, {Kind::kAsk, Op::kUnlease, 2},
};

TEST(RetrieveProtocol, AHolderLostAtAnyCallLeavesTheRunPulledBeforeIt) {
  const std::vector<std::size_t> pulled = {0, 0, 4, 4, 4, 8, 8, 8, 9};
  for (std::size_t i = 0; i < kSteps.size(); ++i) {
    SCOPED_TRACE("lost at call " + std::to_string(i));
    Pair p;
    auto trigger =
        fake::at(kSteps[i].kind, kSteps[i].n, Fault{Fault::What::kUnreachable, 0}, kSteps[i].op);
    p.net.fault = [&](const fake::Call& c) {
      const Fault f = trigger(c);
      if (f.what != Fault::What::kNone) p.net.set_down(p.a.url, true);
      return f;
    };
    const RetrieveResult r = p.retrieve();
    EXPECT_EQ(r.chunks_pulled, pulled[i]) << r.error;
    if (i != 8) {
      EXPECT_FALSE(r.error.empty());
    }
    expect_guarantees(p, r);
  }
}

TEST(RetrieveProtocol, AnAnswerLostAtAnyCallCostsOnlyItsBatch) {
  const std::vector<std::size_t> pulled = {0, 0, 9, 4, 4, 9, 8, 8, 9};
  for (std::size_t i = 0; i < kSteps.size(); ++i) {
    SCOPED_TRACE("answer lost at call " + std::to_string(i));
    Pair p;
    p.net.fault =
        fake::at(kSteps[i].kind, kSteps[i].n, Fault{Fault::What::kAnswerLost, 0}, kSteps[i].op);
    const RetrieveResult r = p.retrieve();
    EXPECT_EQ(r.chunks_pulled, pulled[i]) << r.error;
    expect_guarantees(p, r);
  }
}

TEST(RetrieveProtocol, ALeaseAnswerLostIsUnleasedAtOnce) {
  Pair p(64, 60s);  // the holder's clock ends nothing during this test
  p.net.fault = fake::at(Kind::kAsk, 0, Fault{Fault::What::kAnswerLost, 0}, Op::kLease);
  const RetrieveResult r = p.retrieve();
  EXPECT_EQ(r.chunks_pulled, 0u);
  EXPECT_FALSE(r.error.empty());
  EXPECT_EQ(p.a.service.leases(), 0u) << "unleased, not left to the holder's clock";
  EXPECT_EQ(p.b.store.counters().reserved, 0u);
}

TEST(RetrieveProtocol, StopEndsARetrieveAndGivesBackThePagesItReservedHere) {
  Pair p;
  std::vector<RetrieveState> states;
  p.b.on_retrieve_state = [&](RetrieveState s) {
    states.push_back(s);
    if (s == RetrieveState::kPull) p.b.moves.stop();  // the pages here are reserved by now
  };
  const RetrieveResult r = p.retrieve();
  EXPECT_EQ(r.chunks_pulled, 0u);
  EXPECT_FALSE(r.error.empty());
  EXPECT_EQ(p.net.calls(Kind::kPull), 0u);
  EXPECT_EQ(states.back(), RetrieveState::kFailed);
  EXPECT_EQ(p.b.store.counters().reserved, 0u) << "aborted, not left reserved";
  expect_guarantees(p, r);
  // A retrieve after stop() asks nobody.
  const int located = p.located;
  EXPECT_FALSE(p.retrieve().error.empty());
  EXPECT_EQ(p.located, located);
}

TEST(RetrieveProtocol, ALookupAnswerThatIsNoLookupAnswerHasACodeToBranchOn) {
  using Answer = std::function<Result<wire::Msg>(const wire::Msg&)>;
  auto code = [](Answer answer) {
    const Result<std::pair<std::string, std::size_t>> r =
        locate_through(std::move(answer), "inst", 0)({1, 2});
    return r ? std::optional<ErrorCode>() : r.error().code;
  };
  EXPECT_EQ(
      code([](const wire::Msg&) -> Result<wire::Msg> { return wire::Msg{wire::ErrorMsg{"no"}}; }),
      ErrorCode::kRefused);
  EXPECT_EQ(code([](const wire::Msg&) -> Result<wire::Msg> {
              return wire::Msg{wire::BatchedP2PLookupRetMsg{}};
            }),
            ErrorCode::kInternal)
      << "the controller always answers one layout";
  EXPECT_EQ(code([](const wire::Msg&) -> Result<wire::Msg> {
              return make_error(ErrorCode::kPeerLost, "the controller is gone");
            }),
            ErrorCode::kPeerLost);
}

TEST(RetrieveProtocol, APartialPullCommitsOnlyTheLeadingWholeChunks) {
  Pair p;
  p.net.fault = fake::at(Kind::kPull, 1, Fault{Fault::What::kPartial, 2});
  const RetrieveResult r = p.retrieve();
  EXPECT_EQ(r.chunks_pulled, 6u);
  EXPECT_FALSE(r.error.empty());
  EXPECT_EQ(p.a.service.leases(), 0u) << "unleased at once";
  expect_guarantees(p, r);
}

TEST(RetrieveProtocol, APullWithAHoleCommitsOnlyTheChunksBeforeIt) {
  Pair p;
  p.net.fault = fake::at(Kind::kPull, 0, Fault{Fault::What::kPartial, 0, {1, 0, 1, 1}});
  const RetrieveResult r = p.retrieve();
  EXPECT_EQ(r.chunks_pulled, 1u) << "chunks 3 and 4 arrived whole, after the hole";
  EXPECT_FALSE(p.b.store.contains(p.hashes[3]));
  expect_guarantees(p, r);
}

TEST(RetrieveProtocol, NoRoomHerePullsWhatFitsAndUnleasesTheRest) {
  for (const std::size_t pages : {3, 5}) {  // 0 and 2 pages free
    SCOPED_TRACE(std::to_string(pages) + " pages");
    Pair p(pages);
    const std::vector<ChunkHash> pinned = {77, 78};
    for (ChunkHash h : pinned) ASSERT_TRUE(p.b.put(h));
    ASSERT_EQ(p.b.store.leading(pinned, "hold"), 2u);
    std::vector<RetrieveState> states;
    p.b.on_retrieve_state = [&](RetrieveState s) { states.push_back(s); };
    const RetrieveResult r = p.retrieve();
    EXPECT_EQ(r.chunks_pulled, pages - 3);
    EXPECT_EQ(p.a.service.leases(), 0u) << "unleased at once";
    if (pages == 3) {
      EXPECT_FALSE(r.error.empty());
      EXPECT_EQ(states,
                (std::vector<RetrieveState>{RetrieveState::kLocate, RetrieveState::kLeaseRemote,
                                            RetrieveState::kReserveLocal, RetrieveState::kUnlease,
                                            RetrieveState::kDone}));
    }
    expect_guarantees(p, r);
  }
}

TEST(RetrieveProtocol, ACommitRefusedByASyncHereStoresNothingAndGivesThePagesBack) {
  Pair p;
  p.b.on_retrieve_state = [&](RetrieveState s) {
    if (s == RetrieveState::kCommitLocal) p.b.engine.freeze(true);
  };
  const RetrieveResult r = p.retrieve();
  EXPECT_EQ(r.chunks_pulled, 0u);
  EXPECT_FALSE(r.error.empty());
  EXPECT_EQ(p.b.admits.load(), 1u) << "no ADMIT but the chunk B held";
  p.b.engine.freeze(false);
  expect_guarantees(p, r);
}

TEST(RetrieveProtocol, AHolderWithFewerChunksThanLocatedEndsTheRunWhereItsEnds) {
  Pair p;
  for (std::size_t i = 6; i < kChunks; ++i) ASSERT_TRUE(p.a.store.remove(p.hashes[i]));
  const Locate stale =
      [&](const std::vector<ChunkHash>&) -> Result<std::pair<std::string, std::size_t>> {
    return std::make_pair(p.a.url, kChunks - 1);
  };
  const RetrieveResult r = p.b.moves.retrieve_chunks(p.hashes, stale);
  EXPECT_EQ(r.chunks_pulled, 5u);
  EXPECT_EQ(p.b.store.leading(p.hashes), 6u);
  EXPECT_EQ(p.a.service.leases(), 0u);
  EXPECT_EQ(p.b.store.counters().reserved, 0u);
}

}  // namespace
}  // namespace kvnode::node
