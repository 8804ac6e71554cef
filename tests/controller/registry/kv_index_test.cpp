// KvIndex against a reference model (std::set of pairs) under random admit/evict/retire, plus
// the properties the controller relies on: holders of one hash, O(1) retire, bounded memory.
#include "kvnode/controller/kv_index.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

namespace kvnode::controller {
namespace {

using Pair = std::pair<ChunkHash, HolderId>;

TEST(KvIndex, InsertEraseContains) {
  KvIndex index(42);
  const HolderId a = index.new_holder(), b = index.new_holder();
  EXPECT_TRUE(index.insert(ChunkHash(7), a));
  EXPECT_FALSE(index.insert(ChunkHash(7), a));
  EXPECT_TRUE(index.insert(ChunkHash(7), b));
  EXPECT_TRUE(index.contains(ChunkHash(7), a));
  EXPECT_FALSE(index.contains(ChunkHash(8), a));
  EXPECT_EQ(index.size(), 2u);
  EXPECT_TRUE(index.erase(ChunkHash(7), a));
  EXPECT_FALSE(index.erase(ChunkHash(7), a));
  EXPECT_FALSE(index.contains(ChunkHash(7), a));
  EXPECT_TRUE(index.contains(ChunkHash(7), b));
  EXPECT_EQ(index.holder_size(a), 0u);
  EXPECT_EQ(index.holder_size(b), 1u);
}

TEST(KvIndex, SignedAndUnsignedHashesWithEqualBitsAreDistinct) {
  KvIndex index(1);
  const HolderId a = index.new_holder();
  const ChunkHash minus_one(-1);
  const ChunkHash max_u64 = ChunkHash::from_unsigned(~0ull);
  ASSERT_EQ(minus_one.bits(), max_u64.bits());
  EXPECT_EQ(index.leading_held(std::vector{minus_one}, a), 0u);  // empty table
  EXPECT_TRUE(index.insert(minus_one, a));
  EXPECT_FALSE(index.contains(max_u64, a));
  EXPECT_EQ(index.leading_held(std::vector{minus_one, max_u64}, a), 1u);
  EXPECT_EQ(index.leading_held(std::vector{max_u64, minus_one}, a), 0u);
  EXPECT_TRUE(index.insert(max_u64, a));
  EXPECT_EQ(index.size(), 2u);
  EXPECT_EQ(index.leading_held(std::vector{max_u64, minus_one}, a), 2u);
  EXPECT_EQ(index.leading_held(std::vector{max_u64, minus_one}, a + 1), 0u);  // no such holder
}

TEST(KvIndex, ForEachHolderListsEveryLiveHolderOnce) {
  KvIndex index(3);
  std::vector<HolderId> hs;
  for (int i = 0; i < 10; ++i) hs.push_back(index.new_holder());
  for (HolderId h : hs) index.insert(ChunkHash(99), h);
  index.retire_holder(hs[3]);
  index.erase(ChunkHash(99), hs[5]);
  std::multiset<HolderId> seen;
  index.for_each_holder(ChunkHash(99), [&](HolderId h) { seen.insert(h); });
  EXPECT_EQ(seen.size(), 8u);
  EXPECT_EQ(seen.count(hs[3]), 0u);
  EXPECT_EQ(seen.count(hs[5]), 0u);
  EXPECT_EQ(seen.count(hs[0]), 1u);
}

TEST(KvIndex, RetireDropsAllEntriesAndIdIsReusedOnlyAfterRebuild) {
  KvIndex index(5);
  const HolderId a = index.new_holder();
  for (int i = 0; i < 5000; ++i) index.insert(ChunkHash(i), a);
  index.retire_holder(a);
  EXPECT_EQ(index.size(), 0u);
  EXPECT_FALSE(index.contains(ChunkHash(10), a));
  const HolderId b = index.new_holder();
  for (int i = 0; i < 5000; ++i) index.insert(ChunkHash(i + 1'000'000), b);
  // Whatever id b got, a's old entries never show up under it.
  EXPECT_FALSE(index.contains(ChunkHash(10), b));
  EXPECT_EQ(index.holder_size(b), 5000u);
}

TEST(KvIndex, MatchesReferenceModelUnderRandomOperations) {
  std::mt19937_64 rng(12345);
  KvIndex index(rng());
  std::set<Pair> model;
  std::vector<HolderId> live;
  for (int i = 0; i < 6; ++i) live.push_back(index.new_holder());
  auto random_hash = [&] {
    const std::uint64_t v = rng() % 3000;  // small domain: many repeats and shared hashes
    return (v & 1) ? ChunkHash(-static_cast<std::int64_t>(v)) : ChunkHash::from_unsigned(v << 50);
  };
  for (int step = 0; step < 200000; ++step) {
    const HolderId h = live[rng() % live.size()];
    const ChunkHash key = random_hash();
    const int what = static_cast<int>(rng() % 100);
    if (what < 55) {
      EXPECT_EQ(index.insert(key, h), model.insert({key, h}).second);
    } else if (what < 97) {
      EXPECT_EQ(index.erase(key, h), model.erase({key, h}) == 1);
    } else if (what < 98) {
      index.retire_holder(h);
      std::erase_if(model, [&](const Pair& p) { return p.second == h; });
      std::erase(live, h);
      live.push_back(index.new_holder());
    } else if (what < 99) {
      EXPECT_EQ(index.contains(key, h), model.contains({key, h}));
    } else {  // a P2P lookup: mostly held hashes, so the leading run is long, then any
      std::vector<ChunkHash> chain;
      for (auto it = model.begin(); it != model.end() && chain.size() < 30; ++it)
        if (it->second == h && rng() % 4 != 0) chain.push_back(it->first);
      for (int j = 0; j < 3; ++j)
        chain.insert(chain.begin() + rng() % (chain.size() + 1), random_hash());
      std::size_t expected = 0;
      while (expected < chain.size() && model.contains({chain[expected], h})) ++expected;
      EXPECT_EQ(index.leading_held(chain, h), expected);
    }
  }
  EXPECT_EQ(index.size(), model.size());
  for (HolderId h : live) {
    const auto n =
        std::count_if(model.begin(), model.end(), [&](auto& p) { return p.second == h; });
    EXPECT_EQ(index.holder_size(h), static_cast<std::size_t>(n));
  }
  for (const auto& [key, h] : model) ASSERT_TRUE(index.contains(key, h));
}

// Growth moves a few old slots per call: right after the insert that grows the table both
// tables exist, and every query, erase and duplicate check must see entries in either.
TEST(KvIndex, GrowthIsIncrementalAndEveryOperationSeesBothTables) {
  KvIndex index(11);
  const HolderId a = index.new_holder(), b = index.new_holder();
  auto key = [](std::uint64_t i) { return ChunkHash::from_unsigned(i * 0x9E3779B97F4A7C15ull); };
  index.insert(key(0), a);
  std::uint64_t n = 1;
  const std::size_t cap = index.capacity();
  while (index.capacity() == cap) index.insert(key(n++), a);
  const double slot_bytes = 64.0 / 5;  // 5 entries per 64-byte bucket
  // The old table is still held, so memory covers both; it was not rehashed in one go.
  EXPECT_GE(index.memory_bytes(), static_cast<double>(index.capacity() + cap) * slot_bytes);
  // Entries still in the old table: found, not inserted twice, erasable, listed once.
  EXPECT_TRUE(index.contains(key(n - 2), a));
  EXPECT_FALSE(index.insert(key(n - 3), a));
  EXPECT_TRUE(index.insert(key(n - 3), b));
  EXPECT_TRUE(index.erase(key(n - 4), a));
  EXPECT_FALSE(index.contains(key(n - 4), a));
  int holders = 0;
  index.for_each_holder(key(n - 3), [&](HolderId) { ++holders; });
  EXPECT_EQ(holders, 2);
  std::vector<ChunkHash> chain;  // a P2P lookup over keys in either table stops at the erased one
  for (std::uint64_t i = 0; i < n; ++i) chain.push_back(key(i));
  EXPECT_EQ(index.leading_held(chain, a), n - 4);
  EXPECT_EQ(index.leading_held({chain.end() - 3, chain.end()}, b), 1u);  // b holds key(n - 3) only
  // Retiring during the migration hides the holder at once and frees its id only later.
  index.retire_holder(b);
  EXPECT_FALSE(index.contains(key(n - 3), b));
  EXPECT_EQ(index.leading_held({chain.end() - 3, chain.end()}, b), 0u);
  const std::size_t grown = index.capacity();
  const std::uint64_t more = n / 2;  // enough to finish the migration, too few to grow again
  for (std::uint64_t i = 0; i < more; ++i) index.insert(key(n + i), a);
  ASSERT_EQ(index.capacity(), grown);
  EXPECT_LT(index.memory_bytes(), static_cast<double>(grown + cap) * slot_bytes);
  for (std::uint64_t i = 0; i < n + more; ++i)
    ASSERT_EQ(index.contains(key(i), a), i != n - 4) << i;
  EXPECT_EQ(index.leading_held(chain, a), n - 4);  // one table again: the fast path
  EXPECT_EQ(index.size(), n + more - 1);
}

// A full cache admits as much as it evicts. Evicts leave no tombstones, so the table never has
// to be rebuilt: same capacity, same memory, after many times its size in churn, at high load
// and with chunks held by several holders (overflowing buckets and moving entries back).
TEST(KvIndex, ChurnAtConstantSizeNeverRebuilds) {
  KvIndex index(13);
  const HolderId a = index.new_holder(), b = index.new_holder();
  auto key = [](std::uint64_t i) { return ChunkHash::from_unsigned(i * 0x9E3779B97F4A7C15ull); };
  std::uint64_t oldest = 0, next = 0;  // the cache holds chunks oldest..next-1
  auto admit = [&] {
    EXPECT_TRUE(index.insert(key(next), a));
    if (next % 3 == 0) {
      EXPECT_TRUE(index.insert(key(next), b));
    }
    ++next;
  };
  auto evict = [&] {
    EXPECT_TRUE(index.erase(key(oldest), a)) << oldest;
    if (oldest % 3 == 0) {
      EXPECT_TRUE(index.erase(key(oldest), b)) << oldest;
    }
    ++oldest;
  };
  while (index.size() < 20000 || index.size() * 100 < index.capacity() * 70) admit();
  for (int i = 0; i < 1000; ++i) admit();  // a rehash that started meanwhile ends
  const std::size_t cap = index.capacity(), bytes = index.memory_bytes(), size = index.size();
  for (std::size_t round = 0; round < 10 * size; ++round) {
    evict();
    admit();
    // A rebuild would map a second table (or drop pages of this one) at some step.
    ASSERT_EQ(index.memory_bytes(), bytes) << "after " << round << " evict + admit rounds";
  }
  EXPECT_EQ(index.capacity(), cap);
  EXPECT_EQ(index.size(), size);
  for (std::uint64_t i = oldest; i < next; ++i) {
    ASSERT_TRUE(index.contains(key(i), a)) << i;
    ASSERT_EQ(index.contains(key(i), b), i % 3 == 0) << i;
  }
  EXPECT_FALSE(index.contains(key(oldest - 1), a));
}

TEST(KvIndex, MemoryPerEntryStaysWithinBudget) {
  KvIndex index(9);
  const HolderId a = index.new_holder();
  for (std::uint64_t i = 0; i < 300000; ++i) {
    index.insert(ChunkHash::from_unsigned(i * 0x9E3779B97F4A7C15ull), a);
    if (i > 1000 && i % 977 == 0) {
      const double per_entry = static_cast<double>(index.memory_bytes()) / index.size();
      ASSERT_LE(per_entry, 48.0) << "at " << i << " entries";
    }
  }
}

}  // namespace
}  // namespace kvnode::controller
