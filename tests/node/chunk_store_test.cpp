// The chunk store over a real pool: two-phase writes, events in order, LRU eviction that spares
// pinned and leased chunks, removal under a lease, clear, and many threads at once.
#include "kvnode/node/chunk_store.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <initializer_list>
#include <mutex>
#include <random>
#include <thread>

namespace kvnode::node {
namespace {

struct Recorder {
  std::mutex mutex;
  std::vector<std::pair<char, ChunkHash>> events;  // 'A' admit, 'E' evict
  ChunkStore::EventSink sink() {
    return [this](const StoreEvent& e) {
      std::lock_guard lock(mutex);
      events.emplace_back(e.kind == StoreEvent::Kind::kAdmit ? 'A' : 'E', e.hash);
    };
  }
};

gpu::ChunkPool make_pool(std::size_t pages) {
  gpu::PoolOptions o;
  o.page_bytes = 4096;
  o.pages = pages;
  return std::move(gpu::ChunkPool::create(o)).value();
}

using Events = std::vector<std::pair<char, ChunkHash>>;

// Stores each hash (reserve, then commit); false at the first that fails.
bool store_all(ChunkStore& store, std::initializer_list<ChunkHash> hashes) {
  for (ChunkHash h : hashes)
    if (!store.reserve(h) || !store.commit(h)) return false;
  return true;
}

TEST(ChunkStore, AChunkIsReadableOnlyAfterCommit) {
  gpu::ChunkPool pool = make_pool(4);
  Recorder rec;
  ChunkStore store(pool, "LocalCPUBackend", rec.sink());
  const gpu::PageId page = store.reserve(7).value();
  EXPECT_FALSE(store.contains(7));
  const ChunkHash hashes[] = {7};
  EXPECT_EQ(store.leading(hashes), 0u);
  EXPECT_FALSE(store.lease(7));
  EXPECT_TRUE(rec.events.empty());
  EXPECT_FALSE(store.reserve(7)) << "a chunk being written cannot be reserved twice";
  ASSERT_TRUE(store.commit(7));
  EXPECT_TRUE(store.contains(7));
  EXPECT_EQ(store.lease(7)->page(), page);
  EXPECT_EQ(rec.events, (Events{{'A', 7}}));
  EXPECT_FALSE(store.reserve(7));
  EXPECT_FALSE(store.commit(7));
  EXPECT_FALSE(store.commit(8));

  ASSERT_TRUE(store.reserve(9));
  store.abort(9);  // a failed write: page back, nothing said
  EXPECT_EQ(pool.free_pages(), 3u);
  EXPECT_EQ(rec.events.size(), 1u);
}

// A full sync reports the snapshot taken after freeze(true); nothing may change it until the sync
// ends, or the controller (which drops a syncing worker's events) would index the wrong set.
TEST(ChunkStore, FrozenTheReadableSetStaysWhatTheSnapshotSays) {
  gpu::ChunkPool pool = make_pool(4);
  Recorder rec;
  ChunkStore store(pool, "LocalCPUBackend", rec.sink());
  ASSERT_TRUE(store.reserve(1));
  ASSERT_TRUE(store.commit(1));
  ASSERT_TRUE(store.reserve(2));  // a write in flight when the sync starts
  store.freeze(true);
  EXPECT_TRUE(store.frozen());
  const std::vector<ChunkHash> snapshot = store.snapshot();
  EXPECT_EQ(snapshot, std::vector<ChunkHash>{1});

  const Status late = store.commit(2);
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().message, ChunkStore::kFrozenText);
  EXPECT_FALSE(store.contains(2));
  EXPECT_EQ(pool.free_pages(), 3u) << "the refused write's page went back";
  EXPECT_FALSE(store.reserve(3));
  EXPECT_FALSE(store.remove(1));
  const Result<std::size_t> cleared = store.clear();
  ASSERT_FALSE(cleared);
  EXPECT_EQ(cleared.error().code, ErrorCode::kFrozen);
  EXPECT_TRUE(store.lease(1)) << "reads go on";
  EXPECT_EQ(store.snapshot(), snapshot);
  EXPECT_EQ(rec.events, (Events{{'A', 1}}));

  store.freeze(false);
  ASSERT_TRUE(store.reserve(2));
  ASSERT_TRUE(store.commit(2));
  EXPECT_TRUE(store.remove(1));
  EXPECT_EQ(rec.events, (Events{{'A', 1}, {'A', 2}, {'E', 1}}));
  EXPECT_EQ(store.counters().reserved, 0u);
}

// A move's source gives up what the destination confirmed. During a full sync the chunks stay
// (the snapshot says so) and go when it ends; a pin taken meanwhile keeps one.
TEST(ChunkStore, ARemovalDeferredWhileFrozenHappensWhenTheSyncEnds) {
  gpu::ChunkPool pool = make_pool(4);
  Recorder rec;
  ChunkStore store(pool, "LocalCPUBackend", rec.sink());
  ASSERT_TRUE(store_all(store, {1, 2, 3}));
  const ChunkHash two[] = {2}, three[] = {3};
  ASSERT_EQ(store.leading(two, "p"), 1u);
  store.freeze(true);
  using R = ChunkStore::Removal;
  EXPECT_EQ(store.remove_or_defer(1), R::kWhenThawed);
  EXPECT_EQ(store.remove_or_defer(2), R::kRefused) << "pinned";
  EXPECT_EQ(store.remove_or_defer(9), R::kRefused) << "absent";
  EXPECT_EQ(store.remove_or_defer(3), R::kWhenThawed);
  ASSERT_EQ(store.leading(three, "q"), 1u);  // pinned after the deferral
  EXPECT_TRUE(store.contains(1));
  EXPECT_EQ(store.snapshot(), (std::vector<ChunkHash>{1, 2, 3}));
  EXPECT_EQ(rec.events.size(), 3u) << "nothing said while frozen";

  store.freeze(false);
  EXPECT_FALSE(store.contains(1));
  EXPECT_TRUE(store.contains(2));
  EXPECT_TRUE(store.contains(3)) << "the pin taken meanwhile keeps it";
  EXPECT_EQ(rec.events, (Events{{'A', 1}, {'A', 2}, {'A', 3}, {'E', 1}}));
  EXPECT_EQ(pool.free_pages(), 2u);

  store.unpin("q");
  store.freeze(true);
  store.freeze(false);
  EXPECT_TRUE(store.contains(3)) << "a deferral ends with the sync it waited for";
  store.unpin("p");
  EXPECT_EQ(store.remove_or_defer(2), R::kDone);
  EXPECT_EQ(rec.events.back(), (std::pair<char, ChunkHash>{'E', 2}));
}

TEST(ChunkStore, LeadingCountsFromTheFirstAndPinsUnderAnId) {
  gpu::ChunkPool pool = make_pool(8);
  ChunkStore store(pool, "LocalCPUBackend", nullptr);
  ASSERT_TRUE(store_all(store, {1, 2, 3, 5}));
  const ChunkHash query[] = {1, 2, 3, 4, 5};
  EXPECT_EQ(store.leading(query), 3u);
  EXPECT_EQ(store.leading(query, "pin-a"), 3u);
  EXPECT_EQ(store.counters().pinned, 3u);
  EXPECT_FALSE(store.remove(2)) << "pinned";
  EXPECT_EQ(store.clear().value(), 1u) << "only chunk 5 is unpinned";
  store.unpin("pin-a");
  EXPECT_EQ(store.counters().pinned, 0u);
  EXPECT_TRUE(store.remove(2));
  EXPECT_EQ(store.clear().value(), 2u);
  EXPECT_EQ(pool.free_pages(), 8u);
}

TEST(ChunkStore, AFullPoolEvictsTheLeastRecentlyUsedChunkNobodyHolds) {
  gpu::ChunkPool pool = make_pool(3);
  Recorder rec;
  ChunkStore store(pool, "LocalCPUBackend", rec.sink());
  ASSERT_TRUE(store_all(store, {1, 2, 3}));
  const ChunkHash one[] = {1};
  store.leading(one);  // 1 is now the most recent: 2 is the oldest
  ASSERT_TRUE(store.reserve(4));
  ASSERT_TRUE(store.commit(4));
  EXPECT_FALSE(store.contains(2));
  store.leading(one, "keep");                  // 1 pinned
  std::optional<Lease> held = store.lease(3);  // 3 being read
  ASSERT_TRUE(store.reserve(5));               // evicts 4: 3 is leased, 1 pinned
  EXPECT_FALSE(store.contains(4));
  EXPECT_TRUE(store.contains(3));
  EXPECT_FALSE(store.reserve(6)) << "1 pinned, 3 leased, 5 being written: nothing to evict";
  ASSERT_TRUE(store.commit(5));
  EXPECT_EQ(rec.events,
            (Events{{'A', 1}, {'A', 2}, {'A', 3}, {'E', 2}, {'A', 4}, {'E', 4}, {'A', 5}}));
  EXPECT_EQ(store.counters().evicted_for_space, 2u);
  EXPECT_EQ(store.counters().chunks, 3u);
}

TEST(ChunkStore, RemovingALeasedChunkHidesItNowAndFreesItsPageAfterTheRead) {
  gpu::ChunkPool pool = make_pool(2);
  Recorder rec;
  ChunkStore store(pool, "LocalCPUBackend", rec.sink());
  ASSERT_TRUE(store.reserve(1));
  ASSERT_TRUE(store.commit(1));
  {
    std::optional<Lease> reading = store.lease(1);
    ASSERT_TRUE(reading);
    EXPECT_TRUE(store.remove(1));
    EXPECT_FALSE(store.contains(1));
    EXPECT_EQ(rec.events.back(), std::make_pair('E', ChunkHash{1}));
    EXPECT_EQ(pool.free_pages(), 1u) << "the page is still being read";
    EXPECT_FALSE(store.reserve(1)) << "still held by the reader";
  }
  EXPECT_EQ(pool.free_pages(), 2u);
  EXPECT_TRUE(store.reserve(1));
}

TEST(ChunkStore, BatchReserveIsAllOrNothing) {
  gpu::ChunkPool pool = make_pool(3);
  ChunkStore store(pool, "LocalCPUBackend", nullptr);
  const ChunkHash four[] = {1, 2, 3, 4};
  const auto r = store.reserve(four);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("chunk 3"), std::string::npos) << r.error().message;
  EXPECT_EQ(pool.free_pages(), 3u);
  const ChunkHash three[] = {1, 2, 3};
  EXPECT_EQ(store.reserve(three).value().size(), 3u);
}

TEST(ChunkStore, ManyThreadsKeepTheBooksStraight) {
  gpu::ChunkPool pool = make_pool(64);
  std::atomic<long> admitted{0}, evicted{0};
  ChunkStore store(pool, "LocalCPUBackend", [&](const StoreEvent& e) {
    (e.kind == StoreEvent::Kind::kAdmit ? admitted : evicted)++;
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 5000; ++i) {
        const ChunkHash h = static_cast<ChunkHash>(rng() % 200);
        switch (rng() % 5) {
          case 0:
          case 1:
            if (store.reserve(h)) {
              if (rng() % 4)
                (void)store.commit(h);
              else
                store.abort(h);
            }
            break;
          case 2: {
            auto lease = store.lease(h);
            if (lease) {
              EXPECT_LT(lease->page(), 64u);
            }
            break;
          }
          case 3:
            store.remove(h);
            break;
          default: {
            const ChunkHash q[] = {h, h + 1};
            store.leading(q, rng() % 2 ? "p" + std::to_string(t) : "");
            if (rng() % 8 == 0) store.unpin("p" + std::to_string(t));
          }
        }
      }
      store.unpin("p" + std::to_string(t));
    });
  for (auto& th : threads) th.join();
  const StoreCounters c = store.counters();
  EXPECT_EQ(c.reserved, 0u);
  EXPECT_EQ(c.pinned, 0u);
  EXPECT_EQ(static_cast<long>(c.chunks), admitted - evicted);
  EXPECT_EQ(c.chunks + pool.free_pages(), 64u) << "every page is either a chunk or free";
  EXPECT_EQ(store.snapshot().size(), c.chunks);
  EXPECT_EQ(store.clear().value(), c.chunks);
  EXPECT_EQ(pool.free_pages(), 64u);
}

}  // namespace
}  // namespace kvnode::node

namespace kvnode::node {
namespace {

// A writer of many chunks reserves with the tick it began at: only chunks stored before then
// make room, so its own (and chunks it found already there, refreshed) never do (issue 19 item 3).
TEST(ChunkStore, AWriterEvictsOnlyChunksOlderThanItsTick) {
  gpu::ChunkPool pool = make_pool(4);
  Recorder rec;
  ChunkStore store(pool, "LocalCPUBackend", rec.sink());
  ASSERT_TRUE(store_all(store, {1, 2, 3}));  // older chunks
  const std::uint64_t since = store.tick();
  EXPECT_GT(since, 0u);
  EXPECT_TRUE(store.refresh(2));  // the writer found 2 there: its own now
  EXPECT_FALSE(store.refresh(99));
  for (ChunkHash h : {10, 11, 12}) {  // a free page, then 1 and 3 (older) make room
    ASSERT_TRUE(store.reserve(h, since)) << h;
    ASSERT_TRUE(store.commit(h));
  }
  EXPECT_FALSE(store.contains(1));
  EXPECT_FALSE(store.contains(3));
  // Full of 2, 10, 11, 12, all the writer's own: no room, and nothing evicted for it.
  const Result<gpu::PageId> full = store.reserve(13, since);
  ASSERT_FALSE(full);
  EXPECT_NE(full.error().message.find("this writer's own chunks"), std::string::npos)
      << full.error().message;
  for (ChunkHash h : {2, 10, 11, 12}) EXPECT_TRUE(store.contains(h)) << h;
  // Any other writer still evicts least recently used first.
  ASSERT_TRUE(store.reserve(13));
  EXPECT_FALSE(store.contains(2));
}

}  // namespace
}  // namespace kvnode::node
