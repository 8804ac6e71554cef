// Registry behaviour, case by case from protocol reference §3 (and the answers a real LMCache
// controller gives, quoted there), plus kvnode's fixes for §6's defects.
#include "kvnode/controller/registry.hpp"

#include <gtest/gtest.h>

#include "kvnode/keys/chunk_hash.hpp"

namespace kvnode::controller {
namespace {

using wire::ChunkHash;
using wire::OpType;

constexpr const char* kCpu = "LocalCPUBackend";

wire::RegisterMsg reg(std::string inst, std::int64_t wid, std::int64_t port,
                      std::optional<std::string> peer) {
  return wire::RegisterMsg{std::move(inst), wid, "127.0.0.1", port, std::move(peer)};
}
wire::HeartbeatMsg hb(const wire::RegisterMsg& r) {
  return wire::HeartbeatMsg{r.instance_id, r.worker_id, r.ip, r.port, r.peer_init_url};
}
std::vector<ChunkHash> range(std::int64_t from, std::int64_t n) {
  std::vector<ChunkHash> v;
  for (std::int64_t i = 0; i < n; ++i) v.emplace_back(from + i);
  return v;
}
wire::BatchedKVOperationMsg ops(const std::string& inst, std::int64_t wid, OpType op,
                                const std::vector<ChunkHash>& keys, std::int64_t seq0 = 0,
                                const std::string& loc = kCpu) {
  wire::BatchedKVOperationMsg m{inst, wid, loc, {}};
  for (std::size_t i = 0; i < keys.size(); ++i)
    m.operations.push_back({op, keys[i], seq0 + static_cast<std::int64_t>(i)});
  return m;
}
std::optional<std::string> reason_of(const wire::HeartbeatRetMsg& r) {
  if (r.commands.empty()) return std::nullopt;
  return std::get<wire::FullSyncCommand>(r.commands.at(0)).reason;
}
wire::P2PLayout p2p(const Registry& r, std::vector<ChunkHash> hashes, std::string inst,
                    std::int64_t wid = 0) {
  auto ret = r.p2p_lookup(wire::BatchedP2PLookupMsg{std::move(hashes), std::move(inst), wid});
  EXPECT_EQ(ret.layout_info.size(), 1u);
  return ret.layout_info.at(0);
}
const wire::P2PLayout kSentinel{"", "", 0, ""};

class RegistryTest : public ::testing::Test {
 protected:
  Registry r{RegistryOptions{.heartbeat_url = "127.0.0.1:18401", .index_seed = 7}};
  wire::RegisterMsg a = reg("inst-A-t1", 0, 18501, "127.0.0.1:18601");
  wire::RegisterMsg b = reg("inst-B-t1", 0, 18502, "127.0.0.1:18602");
};

TEST_F(RegistryTest, RegistrationHandsOutHeartbeatUrl) {
  auto ret = r.register_worker(a, 100.0);
  ASSERT_NE(ret.extra_config.find("heartbeat_url"), nullptr);
  EXPECT_EQ(*ret.extra_config.find("heartbeat_url"), "127.0.0.1:18401");
  Registry no_hb;
  EXPECT_TRUE(no_hb.register_worker(a, 1.0).extra_config.items.empty());
}

TEST_F(RegistryTest, DuplicateRegistrationReplacesAddressAndClearsKeys) {
  r.register_worker(a, 100.0);
  r.apply(ops(a.instance_id, 0, OpType::kAdmit, range(1, 10)));
  auto moved = a;
  moved.ip = "10.0.0.9";
  moved.peer_init_url = "10.0.0.9:18601";
  std::optional<WorkerEndpoint> replaced;
  r.register_worker(moved, 200.0, &replaced);
  ASSERT_TRUE(replaced);
  EXPECT_EQ(replaced->ip, "127.0.0.1");
  auto infos = r.worker_infos("all", {});
  ASSERT_EQ(infos.size(), 1u);
  EXPECT_EQ(infos[0].ip, "10.0.0.9");
  EXPECT_EQ(infos[0].peer_init_url, "10.0.0.9:18601");
  EXPECT_EQ(r.stats().keys, 0u);
  EXPECT_NE(r.endpoint(a.instance_id, 0)->generation, replaced->generation);
}

TEST_F(RegistryTest, HeartbeatMatrix) {
  r.register_worker(a, 100.0);
  // Fresh controller: the first heartbeat asks for a sync.
  EXPECT_EQ(reason_of(r.heartbeat(hb(a), 101.0)), "controller_restart");
  EXPECT_TRUE(r.sync_status({a.instance_id, 0, "none"}).can_exit_freeze);  // clears the flag
  EXPECT_EQ(reason_of(r.heartbeat(hb(a), 101.5)), std::nullopt);
  // Unknown worker: registered from the heartbeat, asked to re-sync.
  auto c = reg("inst-C-t1", 3, 18503, std::nullopt);
  EXPECT_EQ(reason_of(r.heartbeat(hb(c), 102.0)), "worker_re_registered");
  auto infos = r.worker_infos("inst-C-t1", {});
  ASSERT_EQ(infos.size(), 1u);
  EXPECT_EQ(infos[0].registration_time, infos[0].last_heartbeat_time);
  EXPECT_FALSE(infos[0].peer_init_url);
  // SYNCING worker: nothing.
  ASSERT_TRUE(r.sync_start({a.instance_id, 0, kCpu, "s1", 0, 1}, 103.0).accepted);
  EXPECT_EQ(reason_of(r.heartbeat(hb(a), 104.0)), std::nullopt);
  // Sync times out: FAILED -> sync_failed_retry (the timeout is scheduled, unlike LMCache).
  EXPECT_EQ(r.expire_syncs(103.0 + 301.0), 1u);
  EXPECT_EQ(reason_of(r.heartbeat(hb(a), 405.0)), "sync_failed_retry");
  // Known worker from a new address: treated as a restarted worker.
  auto moved = hb(a);
  moved.port = 19999;
  EXPECT_EQ(reason_of(r.heartbeat(moved, 406.0)), "worker_re_registered");
  EXPECT_EQ(r.endpoint(a.instance_id, 0)->port, 19999);
}

TEST_F(RegistryTest, ThresholdClearsControllerRestart) {
  r.register_worker(a, 1.0);
  r.register_worker(b, 1.0);
  EXPECT_TRUE(r.need_full_sync_all());
  auto st = r.sync_status({a.instance_id, 0, "x"});
  EXPECT_DOUBLE_EQ(st.global_progress, 1.0);  // never-synced workers count as ready (LMCache)
  EXPECT_TRUE(st.can_exit_freeze);
  EXPECT_FALSE(r.need_full_sync_all());
  EXPECT_EQ(reason_of(r.heartbeat(hb(a), 2.0)), std::nullopt);
}

TEST_F(RegistryTest, DeregisterRemovesWorkerKeysAndEmptyInstance) {
  r.register_worker(a, 1.0);
  r.apply(ops(a.instance_id, 0, OpType::kAdmit, range(1, 5)));
  EXPECT_TRUE(r.deregister(a.instance_id, 0));
  EXPECT_FALSE(r.deregister(a.instance_id, 0));
  EXPECT_FALSE(r.has_instance(a.instance_id));
  EXPECT_EQ(r.stats().keys, 0u);
  EXPECT_EQ(p2p(r, range(1, 5), "inst-B-t1"), kSentinel);
}

TEST_F(RegistryTest, BatchesApplyInOrderAndCountOneGapPerBatch) {
  r.register_worker(a, 1.0);
  EXPECT_EQ(r.apply(ops(a.instance_id, 0, OpType::kAdmit, {})).outcome, ApplyOutcome::kEmpty);
  EXPECT_EQ(r.apply(ops("nobody", 0, OpType::kAdmit, range(1, 3))).outcome,
            ApplyOutcome::kUnknownWorker);
  EXPECT_FALSE(r.has_instance("nobody"));
  auto first = r.apply(ops(a.instance_id, 0, OpType::kAdmit, range(1, 10), 0));
  EXPECT_EQ(first.ops, 10u);
  EXPECT_FALSE(first.discontinuity);
  EXPECT_FALSE(r.apply(ops(a.instance_id, 0, OpType::kEvict, range(1, 2), 10)).discontinuity);
  // seq jumps 12 -> 20 and again -> 30 in one batch: counted once.
  auto gap = ops(a.instance_id, 0, OpType::kAdmit, range(100, 3), 20);
  gap.operations[2].seq_num = 30;
  auto res = r.apply(gap);
  EXPECT_TRUE(res.discontinuity);
  EXPECT_EQ(res.expected_seq, 12);
  EXPECT_EQ(res.actual_seq, 20);
  EXPECT_EQ(r.stats().seq_discontinuities, 1u);
  EXPECT_EQ(r.stats().keys, 8u + 3u);
  // Evicting a missing key is a no-op; a different location has its own tracker.
  r.apply(ops(a.instance_id, 0, OpType::kEvict, {ChunkHash(424242)}, 31));
  EXPECT_FALSE(r.apply(ops(a.instance_id, 0, OpType::kAdmit, range(1, 1), 500, "LocalDiskBackend"))
                   .discontinuity);
  EXPECT_EQ(r.stats().seq_discontinuities, 1u);
}

// The controller applies big batches in slices, releasing its lock in between: a slice picks up
// where the last stopped, the batch's gap counts once, and a worker re-registered between two
// slices does not receive the rest of a batch meant for its old key set.
TEST_F(RegistryTest, SlicesOfABatchApplyLikeTheWholeBatch) {
  r.register_worker(a, 1.0);
  r.apply(ops(a.instance_id, 0, OpType::kAdmit, range(1, 1), 0));
  auto batch = ops(a.instance_id, 0, OpType::kAdmit, range(10, 9), 5);  // gap 1 -> 5
  batch.operations[6].seq_num = 40;                                     // and again later
  ApplySlice slice{.first = 0, .count = 4};
  std::size_t applied = 0;
  bool gap = false;
  while (slice.first < batch.operations.size()) {
    const ApplyResult res = r.apply(batch, slice);
    ASSERT_EQ(res.outcome, ApplyOutcome::kApplied);
    ASSERT_NE(res.generation, 0u);
    applied += res.ops;
    gap = gap || res.discontinuity;
    slice.first += res.ops;
    slice.generation = res.generation;
    slice.gap_counted = gap;
  }
  EXPECT_EQ(applied, 9u);
  EXPECT_TRUE(gap);
  EXPECT_EQ(r.stats().seq_discontinuities, 1u);
  EXPECT_EQ(r.stats().keys, 10u);

  ApplySlice first{.first = 0, .count = 2};
  const ApplyResult head = r.apply(ops(a.instance_id, 0, OpType::kAdmit, range(100, 4)), first);
  r.register_worker(a, 2.0);  // restarted: keys cleared, new generation
  ApplySlice rest{.first = 2, .count = 2, .generation = head.generation};
  EXPECT_EQ(r.apply(ops(a.instance_id, 0, OpType::kAdmit, range(100, 4)), rest).outcome,
            ApplyOutcome::kWorkerChanged);
  EXPECT_EQ(r.stats().keys, 0u);
  r.deregister(a.instance_id, 0);
  EXPECT_EQ(r.apply(ops(a.instance_id, 0, OpType::kAdmit, range(100, 4)), rest).outcome,
            ApplyOutcome::kWorkerChanged);
}

TEST_F(RegistryTest, LegacySingleOpsApplyAsBatches) {
  r.register_worker(a, 1.0);
  r.apply(wire::KVAdmitMsg{a.instance_id, 0, ChunkHash(5), kCpu, 0});
  EXPECT_EQ(p2p(r, {ChunkHash(5)}, "inst-B-t1").num_hit_chunks, 1);
  r.apply(wire::KVEvictMsg{a.instance_id, 0, ChunkHash(5), kCpu, 1});
  EXPECT_EQ(p2p(r, {ChunkHash(5)}, "inst-B-t1"), kSentinel);
}

TEST_F(RegistryTest, P2PLookupMatchesRealControllerAnswers) {
  r.register_worker(a, 1.0);
  r.register_worker(b, 1.0);
  r.apply(ops(a.instance_id, 0, OpType::kAdmit, range(1, 100)));
  const wire::P2PLayout hit{"inst-A-t1", kCpu, 100, "127.0.0.1:18601"};
  EXPECT_EQ(p2p(r, range(1, 100), "inst-B-t1"), hit);
  auto partial = range(1, 10);
  for (auto h : range(5000, 11)) partial.push_back(h);
  EXPECT_EQ(p2p(r, partial, "inst-B-t1").num_hit_chunks, 10);
  EXPECT_EQ(p2p(r, {}, "inst-B-t1"), kSentinel);
  EXPECT_EQ(p2p(r, range(5000, 3), "inst-B-t1"), kSentinel);
  EXPECT_EQ(p2p(r, range(1, 100), "inst-A-t1"), kSentinel);     // the requester itself
  EXPECT_EQ(p2p(r, range(1, 100), "inst-B-t1", 1), kSentinel);  // no rank-1 holder
  r.apply(ops(a.instance_id, 0, OpType::kEvict, {ChunkHash(1)}, 100));
  EXPECT_EQ(p2p(r, range(1, 100), "inst-B-t1"), kSentinel);
}

TEST_F(RegistryTest, P2PLookupSkipsHoldersWithoutPeerUrlAndMatchesRank) {
  auto nopeer = reg("inst-N", 0, 18600, std::nullopt);
  r.register_worker(nopeer, 1.0);
  r.apply(ops("inst-N", 0, OpType::kAdmit, range(1, 4)));
  EXPECT_EQ(p2p(r, range(1, 4), "inst-B-t1"), kSentinel);
  // TP2 instance: rank 1 must get rank 1's peer (D9).
  r.register_worker(reg("inst-T", 0, 18610, "127.0.0.1:18700"), 1.0);
  r.register_worker(reg("inst-T", 1, 18611, "127.0.0.1:18701"), 1.0);
  r.apply(ops("inst-T", 0, OpType::kAdmit, range(1, 4)));
  r.apply(ops("inst-T", 1, OpType::kAdmit, range(1, 2)));
  EXPECT_EQ(p2p(r, range(1, 4), "inst-B-t1", 1),
            (wire::P2PLayout{"inst-T", kCpu, 2, "127.0.0.1:18701"}));
  EXPECT_EQ(p2p(r, range(1, 4), "inst-B-t1", 0).peer_init_url, "127.0.0.1:18700");
}

TEST_F(RegistryTest, OrchestratorLookupCreditsContiguousHoldersOnly) {
  keys::ChunkHashConfig cfg;
  std::vector<std::int64_t> tokens;
  for (int t = 1000; t < 2124; ++t) tokens.push_back(t);
  auto hashes = keys::chunk_hashes(tokens, cfg).value();
  ASSERT_EQ(hashes.size(), 5u);
  std::vector<std::int64_t> ends;
  for (std::size_t i = 0; i < hashes.size(); ++i)
    ends.push_back(static_cast<std::int64_t>(keys::chunk_end_token(i, tokens.size(), 256)));

  r.register_worker(a, 1.0);
  r.register_worker(b, 1.0);
  EXPECT_TRUE(r.lookup(hashes, ends).items.empty());
  r.apply(ops(a.instance_id, 0, OpType::kAdmit, hashes));
  auto all = r.lookup(hashes, ends);
  ASSERT_EQ(all.items.size(), 1u);
  EXPECT_EQ(all.items[0].first, "inst-A-t1");
  EXPECT_EQ(all.items[0].second.location, kCpu);
  EXPECT_EQ(all.items[0].second.end_token, 1124);
  // B holds chunks 0-1 -> credited 512; A keeps 1124; A first (chunk 0's first holder).
  r.apply(ops(b.instance_id, 0, OpType::kAdmit, {hashes[0], hashes[1]}));
  auto both = r.lookup(hashes, ends);
  ASSERT_EQ(both.items.size(), 2u);
  EXPECT_EQ(both.items[0].first, "inst-A-t1");
  EXPECT_EQ(both.items[1].second.end_token, 512);
  // A loses chunk 3: credited 768. C holds only chunks 0 and 2: 256.
  r.apply(ops(a.instance_id, 0, OpType::kEvict, {hashes[3]}, 5));
  auto c = reg("inst-C", 0, 18503, "127.0.0.1:18603");
  r.register_worker(c, 1.0);
  r.apply(ops("inst-C", 0, OpType::kAdmit, {hashes[0], hashes[2]}));
  auto some = r.lookup(hashes, ends);
  ASSERT_EQ(some.items.size(), 3u);
  EXPECT_EQ(some.find("inst-A-t1")->end_token, 768);
  EXPECT_EQ(some.find("inst-C")->end_token, 256);
  // Suffix-only holder: nothing.
  r.deregister("inst-A-t1", 0);
  r.deregister("inst-B-t1", 0);
  r.apply(ops("inst-C", 0, OpType::kEvict, {hashes[0]}, 2));
  EXPECT_TRUE(r.lookup(hashes, ends).items.empty());
}

TEST_F(RegistryTest, FullSyncMatchesRealControllerAndKeepsOldKeysServing) {
  r.register_worker(a, 1.0);
  r.register_worker(b, 1.0);
  r.apply(ops(a.instance_id, 0, OpType::kAdmit, range(1, 50)));
  ASSERT_TRUE(r.sync_start({a.instance_id, 0, kCpu, "sync-A", 120, 3}, 2.0).accepted);
  // Another sync_id while SYNCING is refused; the same one restarts.
  EXPECT_FALSE(r.sync_start({a.instance_id, 0, kCpu, "other", 1, 1}, 2.0).accepted);
  EXPECT_FALSE(r.sync_start({"ghost", 0, kCpu, "g", 1, 1}, 2.0).accepted);
  // During the sync: incremental batches are discarded, old keys still serve P2P (D10).
  EXPECT_EQ(r.apply(ops(a.instance_id, 0, OpType::kAdmit, range(900, 2))).outcome,
            ApplyOutcome::kWorkerSyncing);
  EXPECT_EQ(p2p(r, range(1, 50), "inst-B-t1").num_hit_chunks, 50);

  auto st = r.sync_status({a.instance_id, 0, "sync-A"});
  EXPECT_FALSE(st.is_complete);
  EXPECT_DOUBLE_EQ(st.global_progress, 0.5);
  EXPECT_FALSE(st.can_exit_freeze);
  EXPECT_EQ(st.missing_batches, (std::vector<std::int64_t>{0, 1, 2}));
  r.sync_batch({a.instance_id, 0, kCpu, "sync-A", 0, range(1, 40)}, 3.0);
  r.sync_batch({a.instance_id, 0, kCpu, "sync-A", 1, range(41, 40)}, 3.0);
  r.sync_batch({a.instance_id, 0, kCpu, "sync-A", 1, range(41, 40)}, 3.0);  // resend
  r.sync_batch({a.instance_id, 0, kCpu, "sync-A", 7, range(1, 1)}, 3.0);    // out of range
  EXPECT_EQ(r.sync_status({a.instance_id, 0, "sync-A"}).missing_batches,
            (std::vector<std::int64_t>{2}));
  EXPECT_EQ(r.stats().missing_batches, 1u);
  // End with batch 2 missing: not complete yet (LMCache completes and loses it).
  r.sync_end({a.instance_id, 0, kCpu, "sync-A", 120}, 4.0);
  EXPECT_FALSE(r.sync_status({a.instance_id, 0, "sync-A"}).is_complete);
  r.sync_batch({a.instance_id, 0, kCpu, "sync-A", 2, range(81, 40)}, 5.0);
  st = r.sync_status({a.instance_id, 0, "sync-A"});
  EXPECT_TRUE(st.is_complete);
  EXPECT_DOUBLE_EQ(st.global_progress, 1.0);
  EXPECT_TRUE(st.can_exit_freeze);
  EXPECT_TRUE(st.missing_batches.empty());
  EXPECT_EQ(p2p(r, range(1, 200), "inst-B-t1").num_hit_chunks, 120);
  EXPECT_EQ(r.stats().keys, 120u);
  EXPECT_EQ(reason_of(r.heartbeat(hb(a), 6.0)), std::nullopt);
  EXPECT_EQ(reason_of(r.heartbeat(hb(b), 6.0)), std::nullopt);
  // Incremental ops apply again after the sync.
  EXPECT_EQ(r.apply(ops(a.instance_id, 0, OpType::kAdmit, range(900, 2))).outcome,
            ApplyOutcome::kApplied);
}

TEST_F(RegistryTest, SyncStartRejectsAbsurdBatchCounts) {
  r.register_worker(a, 1.0);
  auto ret = r.sync_start({a.instance_id, 0, kCpu, "s", 1, std::int64_t{1} << 40}, 1.0);
  EXPECT_FALSE(ret.accepted);
  ASSERT_TRUE(ret.error_msg);
  EXPECT_NE(ret.error_msg->find("batch_count"), std::string::npos);
}

TEST_F(RegistryTest, ReaperRemovesOnlyWorkersWithAHeartbeatContract) {
  r.register_worker(a, 0.0);  // never heartbeats: kept (D5)
  r.register_worker(b, 0.0);
  r.heartbeat(hb(b), 10.0);
  EXPECT_TRUE(r.reap(35.0).empty());
  auto reaped = r.reap(41.0);
  ASSERT_EQ(reaped.size(), 1u);
  EXPECT_EQ(reaped[0].instance_id, "inst-B-t1");
  EXPECT_TRUE(r.has_instance("inst-A-t1"));
  EXPECT_FALSE(r.has_instance("inst-B-t1"));
  // It comes back through a heartbeat.
  EXPECT_EQ(reason_of(r.heartbeat(hb(b), 50.0)), "worker_re_registered");
}

TEST_F(RegistryTest, QueriesFollowLMCacheOrdering) {
  r.register_worker(reg("inst-T", 1, 1, "p1"), 1.0);
  r.register_worker(reg("inst-T", 0, 2, "p0"), 2.0);
  r.register_worker(a, 3.0);
  auto eps = r.endpoints("inst-T");
  ASSERT_EQ(eps.size(), 2u);
  EXPECT_EQ(eps[0].worker_id, 0);
  EXPECT_EQ(eps[0].endpoint(), "tcp://127.0.0.1:2");
  EXPECT_TRUE(r.endpoints("nope").empty());
  EXPECT_EQ(r.instance_by_ip("127.0.0.1"), "inst-T");
  EXPECT_EQ(r.instance_by_ip("10.1.1.1"), std::nullopt);
  auto all = r.worker_infos("all", {});
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].worker_id, 1);  // registration order
  auto t = r.worker_infos("inst-T", {});
  EXPECT_EQ(t[0].worker_id, 0);  // sorted
  EXPECT_EQ(r.worker_infos("inst-T", {1, 7}).size(), 1u);
  EXPECT_TRUE(r.worker_infos("ghost", {}).empty());
  auto st = r.stats();
  EXPECT_EQ(st.workers, 3u);
  EXPECT_EQ(st.instances, 2u);
  ASSERT_EQ(st.per_instance.size(), 2u);
  EXPECT_EQ(st.per_instance[0].worker_count, 2u);
  WorkerEndpoint v6{"i", 0, "::1", 5, std::nullopt, 1};
  EXPECT_EQ(v6.endpoint(), "tcp://[::1]:5");
}

}  // namespace
}  // namespace kvnode::controller
