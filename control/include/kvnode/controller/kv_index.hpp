// The reverse KV index: which holders have which chunk. A holder is one (worker, location) key
// set; an entry is one (chunk hash, holder) pair. Open addressing with linear probing over two
// flat arrays (12 bytes a slot, load kept between 3/8 and 3/4), so a (chunk, holder) pair costs
// 16-32 bytes and admit, evict and membership are O(1). All holders of a chunk probe from the
// same home slot, so "who holds h" is one short scan. Slots are placed by a seeded mix of the
// hash, so chosen chunk hashes cannot pile up in one probe run.
// Dropping a whole holder (re-registration, deregistration, full sync) is O(1): the holder is
// retired and its entries count as deleted until the next rebuild reclaims them.
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
  // Forgets every entry of the holder at once; its id is reused after the next rebuild.
  void retire_holder(HolderId holder);

  bool insert(ChunkHash hash, HolderId holder);  // true when the pair was new
  bool erase(ChunkHash hash, HolderId holder);   // true when the pair was present
  bool contains(ChunkHash hash, HolderId holder) const;

  // Calls f(holder) for each live holder of the hash, in slot order.
  template <class F>
  void for_each_holder(ChunkHash hash, F&& f) const {
    if (capacity_ == 0) return;
    const std::uint32_t want = tag_bits(hash);
    for (std::size_t i = home(hash);; i = (i + 1) & mask_) {
      const std::uint32_t tag = tags_[i];
      if (tag == kEmpty) return;
      if (keys_[i] == hash.bits() && (tag & kNegative) == want && is_live(tag)) f(holder_of(tag));
    }
  }

  std::size_t holder_size(HolderId holder) const;  // live entries of the holder
  std::size_t size() const { return live_; }       // live entries in all
  std::size_t capacity() const { return capacity_; }
  std::size_t memory_bytes() const;                // slot arrays plus holder table

 private:
  static constexpr std::uint32_t kEmpty = 0;
  static constexpr std::uint32_t kTombstone = 0x7FFFFFFFu;
  static constexpr std::uint32_t kNegative = 0x80000000u;  // sign of the hash
  static constexpr HolderId kMaxHolders = 0x7FFFFFFDu;

  static std::uint32_t tag_bits(ChunkHash h) { return h.negative() ? kNegative : 0; }
  static HolderId holder_of(std::uint32_t tag) { return (tag & ~kNegative) - 1; }
  bool is_live(std::uint32_t tag) const {
    const std::uint32_t t = tag & ~kNegative;
    return t != kTombstone && holders_[t - 1].live;
  }
  std::size_t home(ChunkHash h) const;
  void reserve_for_insert();
  void rebuild(std::size_t new_capacity);

  struct HolderState {
    std::uint32_t size = 0;
    bool live = false;
  };

  std::uint64_t seed_;
  std::unique_ptr<std::uint64_t[]> keys_;
  std::unique_ptr<std::uint32_t[]> tags_;  // 0 empty; else (holder + 1) | sign bit; or tombstone
  std::size_t capacity_ = 0;
  std::size_t mask_ = 0;
  std::size_t used_ = 0;  // non-empty slots: live, tombstones and retired holders' entries
  std::size_t live_ = 0;
  std::vector<HolderState> holders_;
  std::vector<HolderId> free_holders_;     // reusable now
  std::vector<HolderId> retired_holders_;  // reusable after the next rebuild
};

}  // namespace kvnode::controller
