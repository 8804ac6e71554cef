#include "kvnode/controller/kv_index.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <new>
#include <random>
#include <stdexcept>
#include <utility>

namespace kvnode::controller {
namespace {

constexpr std::size_t kMinCapacity = 1024;
// Old slots moved per insert or erase while a rehash runs. A rehash starts with at most half of
// the new table live and must end before inserts fill it to 3/4, i.e. within capacity/4 inserts;
// it has at most `capacity` old slots to move, so 8 per call finishes within capacity/8.
constexpr std::size_t kMigrateStep = 8;

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

// ---- Mapping ----

KvIndex::Mapping::Mapping(std::size_t bytes, bool huge_pages) {
  constexpr std::size_t kHuge = 2u << 20;
  // Below 16 huge pages, rounding up to one would cost more memory than the TLB saves time.
  const bool huge = huge_pages && bytes >= 16 * kHuge;
  const std::size_t align = huge ? kHuge : 4096;
  bytes_ = (bytes + align - 1) / align * align;
  // Over-map by one huge page and trim, so the table starts on a huge-page boundary.
  const std::size_t span = bytes_ + (huge ? kHuge : 0);
  void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  char* raw = static_cast<char*>(p);
  base_ = raw;
  if (huge) {
    base_ = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(raw) + kHuge - 1) & ~(kHuge - 1));
    if (base_ != raw) munmap(raw, static_cast<std::size_t>(base_ - raw));
    if (const std::size_t tail = span - static_cast<std::size_t>(base_ - raw) - bytes_; tail > 0)
      munmap(base_ + bytes_, tail);
    madvise(base_, bytes_, MADV_HUGEPAGE);  // a hint: fine if THP is off
    page_ = kHuge;
  }
}

KvIndex::Mapping& KvIndex::Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    unmap();
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    populated_ = std::exchange(o.populated_, 0);
    released_ = std::exchange(o.released_, 0);
    page_ = o.page_;
  }
  return *this;
}

void KvIndex::Mapping::unmap() {
  if (base_) munmap(base_, bytes_);
  base_ = nullptr;
}

void KvIndex::Mapping::populate_below(std::size_t offset) {
  const std::size_t end = std::min(bytes_, (offset + page_ - 1) / page_ * page_);
  // A write fault maps a zeroed page (a whole huge page in a huge-page region); writing the
  // zero it already holds keeps every slot empty.
  for (; populated_ < end; populated_ += page_) *static_cast<volatile char*>(base_ + populated_) = 0;
}

void KvIndex::Mapping::release_below(std::size_t offset) {
  const std::size_t end = std::min(offset, bytes_) / page_ * page_;
  if (end <= released_) return;
  madvise(base_ + released_, end - released_, MADV_DONTNEED);
  released_ = end;
}

// ---- KvIndex ----

KvIndex::KvIndex(std::uint64_t seed) : seed_(seed == 0 ? random_seed() : seed) {}
KvIndex::KvIndex() : KvIndex(0) {}

std::size_t KvIndex::home(ChunkHash h, const Table& t) const {
  return mix(h.bits() ^ seed_ ^ (h.negative() ? 0x9E3779B97F4A7C15ull : 0)) & t.mask;
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
  // Plenty of dead entries: start reclaiming them now rather than at the next growth.
  if (!migrating() && used_ - std::min(used_, live_) > cur_.capacity / 2) {
    next_ = Table{};
    start_rehash(make_table(cur_.capacity, false));  // small pages: see reserve_for_insert
  }
}

KvIndex::Slot* KvIndex::find(ChunkHash hash, std::uint32_t want) const {
  auto scan = [&](const Table& t, std::size_t from) -> Slot* {
    if (t.capacity == 0) return nullptr;
    for (std::size_t i = home(hash, t);; i = (i + 1) & t.mask) {
      Slot& s = t.slots[i];
      if (s.tag == kEmpty) return nullptr;
      if (s.tag == want && s.key == hash.bits() && i >= from) return &s;
    }
  };
  if (Slot* s = scan(cur_, 0)) return s;
  return migrating() ? scan(old_, cursor_) : nullptr;
}

bool KvIndex::contains(ChunkHash hash, HolderId holder) const {
  if (holder >= holders_.size() || !holders_[holder].live) return false;
  return find(hash, (holder + 1) | tag_bits(hash)) != nullptr;
}

void KvIndex::prefetch(ChunkHash hash) const {
  if (cur_.capacity != 0) __builtin_prefetch(&cur_.slots[home(hash, cur_)]);
}

bool KvIndex::insert(ChunkHash hash, HolderId holder) {
  if (!holders_.at(holder).live) return false;
  reserve_for_insert();
  const std::uint32_t want = (holder + 1) | tag_bits(hash);
  std::size_t reuse = cur_.capacity;  // first dead slot on the probe path
  std::size_t i = home(hash, cur_);
  for (;; i = (i + 1) & cur_.mask) {
    const Slot& s = cur_.slots[i];
    if (s.tag == kEmpty) break;
    if (s.tag == want && s.key == hash.bits()) return false;
    if (reuse == cur_.capacity && !is_live(s.tag)) reuse = i;
  }
  if (migrating()) {
    for (std::size_t j = home(hash, old_);; j = (j + 1) & old_.mask) {
      const Slot& s = old_.slots[j];
      if (s.tag == kEmpty) break;
      if (s.tag == want && s.key == hash.bits() && j >= cursor_) return false;
    }
  }
  if (reuse != cur_.capacity) {
    i = reuse;  // a dead slot already counts in used_
  } else {
    ++used_;
  }
  cur_.slots[i] = Slot{hash.bits(), want};
  ++live_;
  ++holders_[holder].size;
  if (migrating())
    migrate(kMigrateStep);
  else
    prepare_next();
  return true;
}

bool KvIndex::erase(ChunkHash hash, HolderId holder) {
  if (!holders_.at(holder).live) return false;
  Slot* s = find(hash, (holder + 1) | tag_bits(hash));
  if (!s) return false;
  s->tag = kTombstone;  // keeps the probe run intact, in either table
  --live_;
  --holders_[holder].size;
  if (migrating()) migrate(kMigrateStep);
  return true;
}

std::size_t KvIndex::holder_size(HolderId holder) const {
  return holder < holders_.size() && holders_[holder].live ? holders_[holder].size : 0;
}

std::size_t KvIndex::memory_bytes() const {
  return (cur_.capacity + old_.capacity) * sizeof(Slot) + next_.memory.populated() +
         holders_.capacity() * sizeof(HolderState) +
         (free_holders_.capacity() + retired_holders_.capacity() +
          draining_holders_.capacity()) * sizeof(HolderId);
}

KvIndex::Table KvIndex::make_table(std::size_t capacity, bool huge_pages) {
  Table t;
  t.memory = Mapping(capacity * sizeof(Slot), huge_pages);  // zeroed: all slots empty
  t.slots = static_cast<Slot*>(t.memory.data());
  t.capacity = capacity;
  t.mask = capacity - 1;
  return t;
}

std::size_t KvIndex::target_capacity() const {
  std::size_t wanted = std::max(kMinCapacity, cur_.capacity);
  // Grow only when live entries need it; a table full of dead slots is rehashed at its size.
  while ((live_ + 1) * 2 > wanted) wanted *= 2;  // live entries at most half the new table
  return wanted;
}

void KvIndex::prepare_next() {
  if (used_ * 8 < cur_.capacity * 5) return;
  if (next_.capacity == 0) {
    next_ = make_table(target_capacity(), true);
    next_from_used_ = used_;
  }
  // Fault the table in evenly over the inserts left until it takes over at 3/4 load: one huge
  // page (about 1 ms to zero here) every few thousand inserts instead of a burst of them in the
  // first few hundred inserts after the switch.
  const std::size_t span = std::max<std::size_t>(1, cur_.capacity * 3 / 4 - next_from_used_);
  const std::size_t done = std::min(span, used_ - next_from_used_ + 1);
  next_.memory.populate_below(next_.capacity * sizeof(Slot) / span * done);
}

void KvIndex::reserve_for_insert() {
  // Keep non-empty slots (live + dead) at most 3/4 of the table so probe runs stay short.
  if ((used_ + 1) * 4 <= cur_.capacity * 3) return;
  if (migrating()) migrate(old_.capacity);  // cannot happen at kMigrateStep; stay correct anyway
  if ((used_ + 1) * 4 <= cur_.capacity * 3) return;
  const std::size_t wanted = target_capacity();
  if (next_.capacity == wanted) {
    next_.memory.populate_below(wanted * sizeof(Slot));
    start_rehash(std::move(next_));
    next_ = Table{};
  } else {
    // Deletes changed the size needed since next_ was mapped: small pages fault in cheaply
    // one by one as inserts touch them.
    next_ = Table{};
    start_rehash(make_table(wanted, false));
  }
}

void KvIndex::start_rehash(Table fresh) {
  old_ = std::move(cur_);
  cur_ = std::move(fresh);
  cursor_ = 0;
  last_empty_ = 0;
  used_ = 0;
  // Entries of holders retired so far all lie in old_ and are dropped by the move; holders
  // retired from now on may leave entries in cur_ and wait for the next rehash.
  draining_holders_ = std::move(retired_holders_);
  retired_holders_.clear();
  if (old_.capacity == 0) migrate(0);  // nothing to move: finish at once
}

void KvIndex::place(const Slot& s) {
  const ChunkHash h = (s.tag & kNegative) ? ChunkHash::from_signed(static_cast<std::int64_t>(s.key))
                                          : ChunkHash::from_unsigned(s.key);
  std::size_t i = home(h, cur_);
  while (cur_.slots[i].tag != kEmpty) i = (i + 1) & cur_.mask;
  cur_.slots[i] = s;
  ++used_;
}

void KvIndex::migrate(std::size_t slots) {
  const std::size_t end = std::min(old_.capacity, cursor_ + slots);
  for (; cursor_ < end; ++cursor_) {
    const Slot s = old_.slots[cursor_];
    if (s.tag == kEmpty)
      last_empty_ = cursor_;
    else if (is_live(s.tag))
      place(s);
  }
  if (cursor_ < old_.capacity) {
    // A probe that starts below the last empty slot stops there, so nothing reads the moved
    // slots before it any more: give their pages back (they would read as empty anyway).
    old_.memory.release_below(last_empty_ * sizeof(Slot));
    return;
  }
  old_ = Table{};
  cursor_ = 0;
  // No entry refers to a drained holder any more: its id may be handed out again.
  free_holders_.insert(free_holders_.end(), draining_holders_.begin(), draining_holders_.end());
  draining_holders_.clear();
}

}  // namespace kvnode::controller
