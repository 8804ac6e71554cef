// The reverse KV index: which holders have which chunk. A holder is one (worker, location) key
// set; an entry is one (chunk hash, holder) pair. Open addressing with linear probing over one
// flat array of 12-byte slots (hash bits and tag side by side, so a probe step is one cache
// miss), load kept between 3/8 and 3/4: a pair costs 16-32 bytes and admit, evict and membership
// are O(1). All holders of a chunk probe from the same home slot, so "who holds h" is one short
// scan. Slots are placed by a seeded mix of the hash, so chosen hashes cannot pile up in one run.
// Growth is incremental, so no single call pays for a whole rehash (at 10 M entries that held the
// registry's lock for 0.7 s). From 5/8 load the next table is mapped (zeroed by the kernel, on
// huge pages where offered: a table of hundreds of MB probed at random needs them) and faulted in
// a page every so many inserts; at 3/4 load it takes over, and every later insert or erase moves
// a few slots of the old table, whose drained pages go back to the kernel as it goes.
// Dropping a whole holder (re-registration, deregistration, full sync) is O(1): the holder is
// retired and its entries count as deleted until the next rehash reclaims them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
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
  // Starts loading the hash's home slot; batch appliers call it a few ops ahead.
  void prefetch(ChunkHash hash) const;

  // Calls f(holder) for each live holder of the hash.
  template <class F>
  void for_each_holder(ChunkHash hash, F&& f) const {
    const std::uint32_t want = tag_bits(hash);
    auto visit = [&](const Table& t, std::size_t from) {
      if (t.capacity == 0) return;
      for (std::size_t i = home(hash, t);; i = (i + 1) & t.mask) {
        const Slot& s = t.slots[i];
        if (s.tag == kEmpty) return;
        if (i >= from && s.key == hash.bits() && (s.tag & kNegative) == want && is_live(s.tag))
          f(holder_of(s.tag));
      }
    };
    visit(cur_, 0);
    if (migrating()) visit(old_, cursor_);
  }

  std::size_t holder_size(HolderId holder) const;  // live entries of the holder
  std::size_t size() const { return live_; }       // live entries in all
  std::size_t capacity() const { return cur_.capacity; }
  std::size_t memory_bytes() const;                // slot tables plus holder table

 private:
  static constexpr std::uint32_t kEmpty = 0;
  static constexpr std::uint32_t kTombstone = 0x7FFFFFFFu;
  static constexpr std::uint32_t kNegative = 0x80000000u;  // sign of the hash
  static constexpr HolderId kMaxHolders = 0x7FFFFFFDu;

  // tag: 0 empty; else (holder + 1) | sign bit; or tombstone. Packed to 12 bytes: a misaligned
  // 8-byte load costs nothing measurable on x86-64 and aarch64, a third more slots per line does.
  struct __attribute__((packed)) Slot {
    std::uint64_t key;
    std::uint32_t tag;
  };
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
    Slot* slots = nullptr;
    std::size_t capacity = 0;
    std::size_t mask = 0;
  };

  static std::uint32_t tag_bits(ChunkHash h) { return h.negative() ? kNegative : 0; }
  static HolderId holder_of(std::uint32_t tag) { return (tag & ~kNegative) - 1; }
  bool is_live(std::uint32_t tag) const {
    const std::uint32_t t = tag & ~kNegative;
    return t != kTombstone && holders_[t - 1].live;
  }
  std::size_t home(ChunkHash h, const Table& t) const;
  bool migrating() const { return old_.capacity != 0; }
  // The slot holding the pair, or nullptr; searches the unmoved part of the old table too.
  Slot* find(ChunkHash hash, std::uint32_t want) const;
  static Table make_table(std::size_t capacity, bool huge_pages);
  std::size_t target_capacity() const;  // for the next rehash, from the live count
  void prepare_next();                  // maps and faults in next_ from 5/8 load
  void reserve_for_insert();
  void start_rehash(Table fresh);
  void migrate(std::size_t slots);  // moves up to `slots` old slots into cur_
  void place(const Slot& s);        // into cur_, known absent

  struct HolderState {
    std::uint32_t size = 0;
    bool live = false;
  };

  std::uint64_t seed_;
  Table cur_;             // inserts go here
  Table old_;             // being drained while migrating(); empty otherwise
  Table next_;            // being faulted in before it takes over; empty otherwise
  std::size_t next_from_used_ = 0;  // used_ when next_ was mapped
  std::size_t cursor_ = 0;  // old_ slots below it have been moved
  std::size_t last_empty_ = 0;  // an empty old_ slot below cursor_: no probe run crosses it
  std::size_t used_ = 0;    // non-empty slots of cur_: live, tombstones, retired holders' entries
  std::size_t live_ = 0;
  std::vector<HolderState> holders_;
  std::vector<HolderId> free_holders_;      // reusable now
  std::vector<HolderId> retired_holders_;   // reusable after a rehash that starts later
  std::vector<HolderId> draining_holders_;  // reusable when the running rehash ends
};

}  // namespace kvnode::controller
