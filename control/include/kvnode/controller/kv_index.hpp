// The reverse KV index: which holders have which chunk. A holder is one (worker, location) key
// set; an entry is one (chunk hash, holder) pair. The table is an array of 64-byte buckets, each
// one cache line holding 5 entries and an overflow count (how many entries passed over the bucket
// because it was full). A pair lives in its home bucket or, when that is full, in the first
// following bucket with room; a search scans buckets until one that nothing overflowed. So admit,
// evict and membership touch about one cache line at any load up to 4/5. An evict empties its
// slot, lowers the counts it had raised, and moves back into the bucket the nearest entry that
// overflowed past it: no tombstones and no drift, so a cache that evicts as much as it admits
// never pays a rebuild (F14's scheme; linear probing with tombstones rebuilt the whole table every
// few million such ops, and slowed sharply near its maximum load).
// All holders of a chunk start from one home bucket, so "who holds h" is one short scan. Homes
// come from a seeded mix of the hash, so chosen hashes cannot pile up in one bucket.
// Growth is incremental, so no single call pays for a whole rehash (at 10 M entries that held the
// registry's lock for 0.7 s). From 3/5 load the next table is mapped (zeroed by the kernel, on
// huge pages where offered: a table of hundreds of MB probed at random needs them) and faulted in
// a page every so many inserts; at 4/5 load it takes over, and every later insert or erase moves
// two buckets of the old table, whose drained pages go back to the kernel as it goes.
// Dropping a whole holder (re-registration, deregistration, full sync) is O(1): the holder is
// retired and its entries count as deleted until the next rehash reclaims them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "kvnode/wire/wide_int.hpp"

namespace kvnode::controller {

using HolderId = std::uint32_t;
using wire::ChunkHash;

class KvIndex {
 public:
  explicit KvIndex(std::uint64_t seed);
  KvIndex();  // random seed

  HolderId new_holder();
  // Forgets every entry of the holder at once; its id is reused after the next rehash.
  void retire_holder(HolderId holder);

  bool insert(ChunkHash hash, HolderId holder);  // true when the pair was new
  bool erase(ChunkHash hash, HolderId holder);   // true when the pair was present
  bool contains(ChunkHash hash, HolderId holder) const;
  // Starts loading the hash's home bucket; batch appliers call it a few ops ahead.
  void prefetch(ChunkHash hash) const;
  // How many of the leading hashes the holder holds (a P2P lookup's answer): the buckets are
  // loaded several hashes ahead, each home computed once.
  std::size_t leading_held(std::span<const ChunkHash> hashes, HolderId holder) const;

  // Calls f(holder) for each live holder of the hash.
  template <class F>
  void for_each_holder(ChunkHash hash, F&& f) const {
    const std::uint32_t sign = tag_bits(hash);
    auto visit = [&](const Bucket& k, std::size_t j) {
      if (k.keys[j] == hash.bits() && k.tags[j] != kEmpty && (k.tags[j] & kNegative) == sign &&
          is_live(k.tags[j]))
        f(holder_of(k.tags[j]));
      return false;
    };
    walk(cur_, hash, 0, visit);
    if (migrating()) walk(old_, hash, cursor_, visit);
  }

  std::size_t holder_size(HolderId holder) const;        // live entries of the holder
  std::size_t size() const { return live_; }             // live entries in all
  std::size_t capacity() const { return cur_.slots(); }  // entries the table has room for
  std::size_t memory_bytes() const;                      // slot tables plus holder table

 private:
  static constexpr std::uint32_t kEmpty = 0;
  static constexpr std::uint32_t kTombstone = 0x7FFFFFFFu;
  static constexpr std::uint32_t kNegative = 0x80000000u;  // sign of the hash
  static constexpr HolderId kMaxHolders = 0x7FFFFFFDu;

  // tag: 0 empty; else (holder + 1) | sign bit; or tombstone (an erased entry of the old table,
  // which is only drained). Keys and tags of a bucket side by side: one cache line in all.
  static constexpr std::size_t kBucketSlots = 5;
  struct alignas(64) Bucket {
    std::uint64_t keys[kBucketSlots];
    std::uint32_t tags[kBucketSlots];
    std::uint32_t overflow;  // entries stored past this bucket whose search passes it
  };
  static_assert(sizeof(Bucket) == 64);
  // Anonymous memory mapped for one table and unmapped with it.
  class Mapping {
   public:
    Mapping() = default;
    Mapping(std::size_t bytes, bool huge_pages);  // zeroed; throws std::bad_alloc
    Mapping(Mapping&& o) noexcept { *this = std::move(o); }
    Mapping& operator=(Mapping&& o) noexcept;
    ~Mapping() { unmap(); }
    void* data() const { return base_; }
    std::size_t populated() const { return populated_; }
    // Faults in the pages below `offset` (rounded up to a page) that are not yet.
    void populate_below(std::size_t offset);
    // Hands the whole pages below `offset` back to the kernel; they read as zeros afterwards.
    void release_below(std::size_t offset);

   private:
    void unmap();
    char* base_ = nullptr;
    std::size_t bytes_ = 0, populated_ = 0, released_ = 0, page_ = 4096;
  };
  struct Table {
    Mapping memory;
    Bucket* buckets = nullptr;
    std::size_t buckets_n = 0;  // a power of two
    std::size_t mask = 0;
    std::size_t slots() const { return buckets_n * kBucketSlots; }
  };
  // Where a pair lives: bucket and slot, found() false when absent; and its home bucket.
  struct Place {
    Bucket* bucket = nullptr;
    std::size_t slot = 0;
    std::size_t home = 0;
    bool found() const { return bucket != nullptr; }
  };

  static std::uint32_t tag_bits(ChunkHash h) { return h.negative() ? kNegative : 0; }
  static HolderId holder_of(std::uint32_t tag) { return (tag & ~kNegative) - 1; }
  bool is_live(std::uint32_t tag) const {
    const std::uint32_t t = tag & ~kNegative;
    return t != kTombstone && holders_[t - 1].live;
  }
  std::size_t home(ChunkHash h, const Table& t) const;  // the home bucket
  bool migrating() const { return old_.buckets_n != 0; }
  // A search for the hash in table t: from its home bucket until one that nothing overflowed,
  // calling stop(bucket, slot) on each slot of the buckets from `from` on (moved ones are below)
  // until it returns true. Returns the home bucket and where it stopped (not found() if nowhere).
  template <class Stop>
  Place walk(const Table& t, ChunkHash hash, std::size_t from, Stop&& stop) const {
    if (t.buckets_n == 0) return {};
    return walk_from(t, home(hash, t), from, stop);
  }
  // walk, from a home bucket already computed.
  template <class Stop>
  static Place walk_from(const Table& t, std::size_t h, std::size_t from, Stop&& stop) {
    for (std::size_t b = h;; b = (b + 1) & t.mask) {
      Bucket& k = t.buckets[b];
      if (b >= from)
        for (std::size_t j = 0; j < kBucketSlots; ++j)
          if (stop(std::as_const(k), j)) return {&k, j, h};
      if (k.overflow == 0) return {nullptr, 0, h};
    }
  }
  // The pair's place in table t (see walk).
  Place find_in(const Table& t, ChunkHash hash, std::uint32_t want, std::size_t from) const;
  static Table make_table(std::size_t buckets, bool huge_pages);
  std::size_t target_buckets() const;  // for the next rehash, from the live count
  void prepare_next();                 // maps and faults in next_ from 3/5 load
  void reserve_for_insert();
  void start_rehash(Table fresh);
  void migrate(std::size_t buckets);  // moves up to `buckets` old buckets into cur_
  // Stores the entry in cur_ (known absent): the first bucket from its home with room.
  void place(std::uint64_t key, std::uint32_t tag, std::size_t home_bucket);
  // Fills the free slot of cur_'s bucket with an entry that passed over it, if any, repeatedly.
  void refill(std::size_t bucket, std::size_t slot);
  // The entry of cur_ nearest after the bucket whose search passes over it; not found() if none.
  Place nearest_passing(std::size_t bucket) const;
  static ChunkHash hash_of(std::uint64_t key, std::uint32_t tag);

  struct HolderState {
    std::uint32_t size = 0;
    bool live = false;
  };

  std::uint64_t seed_;
  Table cur_;                       // inserts go here
  Table old_;                       // being drained while migrating(); empty otherwise
  Table next_;                      // being faulted in before it takes over; empty otherwise
  std::size_t next_from_used_ = 0;  // used_ when next_ was mapped
  std::size_t cursor_ = 0;          // old_ buckets below it have been moved
  std::size_t last_clear_ = 0;      // a moved old_ bucket nothing overflowed: no search crosses it
  std::size_t used_ = 0;            // non-empty slots of cur_: live and retired holders' entries
  std::size_t live_ = 0;
  std::vector<HolderState> holders_;
  std::vector<HolderId> free_holders_;      // reusable now
  std::vector<HolderId> retired_holders_;   // reusable after a rehash that starts later
  std::vector<HolderId> draining_holders_;  // reusable when the running rehash ends
};

}  // namespace kvnode::controller
