#include "kvnode/controller/kv_index.hpp"

#include <algorithm>
#include <bit>
#include <random>
#include <stdexcept>

namespace kvnode::controller {
namespace {

constexpr std::size_t kMinCapacity = 1024;

// murmur3's finaliser over the seeded bits: a bijection, so distinct hashes stay distinct, and
// without the seed an attacker cannot aim many chunk hashes at one probe run.
std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

std::uint64_t random_seed() {
  std::random_device rd;
  return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace

KvIndex::KvIndex(std::uint64_t seed) : seed_(seed == 0 ? random_seed() : seed) {}
KvIndex::KvIndex() : KvIndex(0) {}

std::size_t KvIndex::home(ChunkHash h) const {
  return mix(h.bits() ^ seed_ ^ (h.negative() ? 0x9E3779B97F4A7C15ull : 0)) & mask_;
}

HolderId KvIndex::new_holder() {
  HolderId id;
  if (!free_holders_.empty()) {
    id = free_holders_.back();
    free_holders_.pop_back();
  } else {
    if (holders_.size() >= kMaxHolders) throw std::length_error("KvIndex: too many holders");
    id = static_cast<HolderId>(holders_.size());
    holders_.emplace_back();
  }
  holders_[id] = HolderState{0, true};
  return id;
}

void KvIndex::retire_holder(HolderId holder) {
  HolderState& h = holders_.at(holder);
  if (!h.live) return;
  live_ -= h.size;
  h = HolderState{0, false};
  retired_holders_.push_back(holder);
  // Plenty of dead entries: reclaim them now rather than at the next growth.
  if (used_ - live_ > capacity_ / 2) rebuild(capacity_);
}

bool KvIndex::contains(ChunkHash hash, HolderId holder) const {
  if (capacity_ == 0) return false;
  const std::uint32_t want = (holder + 1) | tag_bits(hash);
  for (std::size_t i = home(hash);; i = (i + 1) & mask_) {
    const std::uint32_t tag = tags_[i];
    if (tag == kEmpty) return false;
    if (tag == want && keys_[i] == hash.bits()) return holders_[holder].live;
  }
}

bool KvIndex::insert(ChunkHash hash, HolderId holder) {
  if (!holders_.at(holder).live) return false;
  reserve_for_insert();
  const std::uint32_t want = (holder + 1) | tag_bits(hash);
  std::size_t reuse = capacity_;  // first dead slot on the probe path
  std::size_t i = home(hash);
  for (;; i = (i + 1) & mask_) {
    const std::uint32_t tag = tags_[i];
    if (tag == kEmpty) break;
    if (tag == want && keys_[i] == hash.bits()) return false;
    if (reuse == capacity_ && !is_live(tag)) reuse = i;
  }
  if (reuse != capacity_) {
    i = reuse;  // a dead slot already counts in used_
  } else {
    ++used_;
  }
  keys_[i] = hash.bits();
  tags_[i] = want;
  ++live_;
  ++holders_[holder].size;
  return true;
}

bool KvIndex::erase(ChunkHash hash, HolderId holder) {
  if (capacity_ == 0 || !holders_.at(holder).live) return false;
  const std::uint32_t want = (holder + 1) | tag_bits(hash);
  for (std::size_t i = home(hash);; i = (i + 1) & mask_) {
    const std::uint32_t tag = tags_[i];
    if (tag == kEmpty) return false;
    if (tag == want && keys_[i] == hash.bits()) {
      tags_[i] = kTombstone;
      --live_;
      --holders_[holder].size;
      return true;
    }
  }
}

std::size_t KvIndex::holder_size(HolderId holder) const {
  return holder < holders_.size() && holders_[holder].live ? holders_[holder].size : 0;
}

std::size_t KvIndex::memory_bytes() const {
  return capacity_ * (sizeof(std::uint64_t) + sizeof(std::uint32_t)) +
         holders_.capacity() * sizeof(HolderState) +
         (free_holders_.capacity() + retired_holders_.capacity()) * sizeof(HolderId);
}

void KvIndex::reserve_for_insert() {
  // Keep non-empty slots (live + dead) at most 3/4 of the table so probe runs stay short.
  if ((used_ + 1) * 4 <= capacity_ * 3) return;
  std::size_t wanted = std::max(kMinCapacity, capacity_);
  // Grow only when live entries need it; a table full of dead slots is rebuilt in place.
  while ((live_ + 1) * 2 > wanted) wanted *= 2;  // live entries at most half the new table
  rebuild(wanted);
}

void KvIndex::rebuild(std::size_t new_capacity) {
  auto old_keys = std::move(keys_);
  auto old_tags = std::move(tags_);
  const std::size_t old_capacity = capacity_;

  keys_ = std::make_unique<std::uint64_t[]>(new_capacity);
  tags_ = std::make_unique<std::uint32_t[]>(new_capacity);  // zeroed: all empty
  capacity_ = new_capacity;
  mask_ = new_capacity - 1;
  used_ = 0;
  for (std::size_t j = 0; j < old_capacity; ++j) {
    const std::uint32_t tag = old_tags[j];
    if (tag == kEmpty || !is_live(tag)) continue;
    const ChunkHash h = (tag & kNegative)
                            ? ChunkHash::from_signed(static_cast<std::int64_t>(old_keys[j]))
                            : ChunkHash::from_unsigned(old_keys[j]);
    std::size_t i = home(h);
    while (tags_[i] != kEmpty) i = (i + 1) & mask_;
    keys_[i] = old_keys[j];
    tags_[i] = tag;
    ++used_;
  }
  // No entry refers to a retired holder any more: its id may be handed out again.
  free_holders_.insert(free_holders_.end(), retired_holders_.begin(), retired_holders_.end());
  retired_holders_.clear();
}

}  // namespace kvnode::controller
