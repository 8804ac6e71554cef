#include "kvnode/controller/kv_index.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <new>
#include <random>
#include <stdexcept>
#include <utility>

namespace kvnode::controller {
namespace {

constexpr std::size_t kMinBuckets = 256;
// Old buckets moved per insert or erase while a rehash runs. A rehash starts with at most 2/5 of
// the new table live (4/5 of a table half its size) and must end before inserts fill it to 4/5,
// i.e. within 2/5 x slots = 4 x old buckets inserts. Two buckets per call end it within half the
// old bucket count, so the old table's memory goes soon (at one, 10 M entries still held both).
constexpr std::size_t kMigrateStep = 2;
constexpr std::size_t kMigratePrefetch = 2;  // buckets ahead whose entries' new homes are loaded
constexpr std::size_t kLookupAhead = 8;      // hashes ahead whose buckets leading_held loads

// murmur3's finaliser over the seeded bits: a bijection, so distinct hashes stay distinct, and
// without the seed an attacker cannot aim many chunk hashes at one bucket.
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

// Load limits, as fractions of a table's slots.
bool above_max_load(std::size_t used, std::size_t slots) {
  return used * 5 > slots * 4;
}
bool above_prepare_load(std::size_t used, std::size_t slots) {
  return used * 5 >= slots * 3;
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
    base_ =
        reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(raw) + kHuge - 1) & ~(kHuge - 1));
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
  for (; populated_ < end; populated_ += page_)
    *static_cast<volatile char*>(base_ + populated_) = 0;
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

ChunkHash KvIndex::hash_of(std::uint64_t key, std::uint32_t tag) {
  return (tag & kNegative) ? ChunkHash::from_signed(static_cast<std::int64_t>(key))
                           : ChunkHash::from_unsigned(key);
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
  if (!migrating() && used_ - std::min(used_, live_) > cur_.slots() / 2) {
    next_ = Table{};
    start_rehash(make_table(cur_.buckets_n, false));  // small pages: see reserve_for_insert
  }
}

KvIndex::Place KvIndex::find_in(const Table& t, ChunkHash hash, std::uint32_t want,
                                std::size_t from) const {
  return walk(t, hash, from, [&](const Bucket& k, std::size_t j) {
    return k.tags[j] == want && k.keys[j] == hash.bits();
  });
}

bool KvIndex::contains(ChunkHash hash, HolderId holder) const {
  if (holder >= holders_.size() || !holders_[holder].live) return false;
  const std::uint32_t want = (holder + 1) | tag_bits(hash);
  return find_in(cur_, hash, want, 0).found() ||
         (migrating() && find_in(old_, hash, want, cursor_).found());
}

void KvIndex::prefetch(ChunkHash hash) const {
  if (cur_.buckets_n != 0) __builtin_prefetch(&cur_.buckets[home(hash, cur_)]);
  // While a rehash runs, an insert checks the old table too and an erase may find its pair there.
  if (migrating()) __builtin_prefetch(&old_.buckets[home(hash, old_)]);
}

std::size_t KvIndex::leading_held(std::span<const ChunkHash> hashes, HolderId holder) const {
  if (holder >= holders_.size() || !holders_[holder].live) return 0;
  const std::size_t n = hashes.size();
  if (migrating()) {  // two tables to search: the plain way
    for (std::size_t i = 0; i < n; ++i) {
      if (i + kLookupAhead < n) prefetch(hashes[i + kLookupAhead]);
      if (!contains(hashes[i], holder)) return i;
    }
    return n;
  }
  if (cur_.buckets_n == 0) return 0;
  std::size_t homes[kLookupAhead];  // ring: the home of hash i at i % kLookupAhead
  const auto load = [&](std::size_t i) {
    homes[i % kLookupAhead] = home(hashes[i], cur_);
    __builtin_prefetch(&cur_.buckets[homes[i % kLookupAhead]]);
  };
  for (std::size_t i = 0; i < std::min(n, kLookupAhead); ++i) load(i);
  for (std::size_t i = 0; i < n; ++i) {
    const ChunkHash h = hashes[i];
    const std::uint32_t want = (holder + 1) | tag_bits(h);
    const std::size_t at = homes[i % kLookupAhead];
    if (i + kLookupAhead < n) load(i + kLookupAhead);
    const Place p = walk_from(cur_, at, 0, [&](const Bucket& k, std::size_t j) {
      return k.tags[j] == want && k.keys[j] == h.bits();
    });
    if (!p.found()) return i;
  }
  return n;
}

bool KvIndex::insert(ChunkHash hash, HolderId holder) {
  if (!holders_.at(holder).live) return false;
  reserve_for_insert();
  const std::uint32_t want = (holder + 1) | tag_bits(hash);
  const Place p = find_in(cur_, hash, want, 0);
  if (p.found()) return false;
  if (migrating() && find_in(old_, hash, want, cursor_).found()) return false;
  place(hash.bits(), want, p.home);
  ++live_;
  ++holders_[holder].size;
  if (migrating())
    migrate(kMigrateStep);
  else
    prepare_next();
  return true;
}

void KvIndex::place(std::uint64_t key, std::uint32_t tag, std::size_t home_bucket) {
  for (std::size_t b = home_bucket;; b = (b + 1) & cur_.mask) {
    Bucket& k = cur_.buckets[b];
    for (std::size_t j = 0; j < kBucketSlots; ++j) {
      if (k.tags[j] == kEmpty) {
        k.keys[j] = key;
        k.tags[j] = tag;
        ++used_;
        return;
      }
    }
    ++k.overflow;  // full: the entry's search must go on past it
  }
}

bool KvIndex::erase(ChunkHash hash, HolderId holder) {
  if (!holders_.at(holder).live) return false;
  const std::uint32_t want = (holder + 1) | tag_bits(hash);
  if (Place p = find_in(cur_, hash, want, 0); p.found()) {
    p.bucket->keys[p.slot] = 0;
    p.bucket->tags[p.slot] = kEmpty;
    // Lower the counts the insert raised on the full buckets it passed.
    const std::size_t at = static_cast<std::size_t>(p.bucket - cur_.buckets);
    for (std::size_t b = p.home; b != at; b = (b + 1) & cur_.mask) --cur_.buckets[b].overflow;
    --used_;
    refill(at, p.slot);
  } else if (Place o = migrating() ? find_in(old_, hash, want, cursor_) : Place{}; o.found()) {
    o.bucket->tags[o.slot] = kTombstone;  // the old table is only drained: skipped when moved
  } else {
    return false;
  }
  --live_;
  --holders_[holder].size;
  if (migrating()) migrate(kMigrateStep);
  return true;
}

// Entries pass over a bucket only while it is full. When a slot frees up in a bucket that
// entries passed, the nearest of them moves back into it (and so on for the slot it leaves), so
// churn does not leave entries stranded far from home: without this, a cache that admits as much
// as it evicts made every search a little longer with each million ops.
void KvIndex::refill(std::size_t bucket, std::size_t slot) {
  while (cur_.buckets[bucket].overflow > 0) {
    const Place from = nearest_passing(bucket);
    if (!from.found()) return;  // counts and contents disagree: cannot happen; never loop forever
    Bucket& to = cur_.buckets[bucket];
    to.keys[slot] = from.bucket->keys[from.slot];
    to.tags[slot] = from.bucket->tags[from.slot];
    from.bucket->keys[from.slot] = 0;
    from.bucket->tags[from.slot] = kEmpty;
    const auto c = static_cast<std::size_t>(from.bucket - cur_.buckets);
    for (std::size_t b = bucket; b != c; b = (b + 1) & cur_.mask) --cur_.buckets[b].overflow;
    bucket = c;
    slot = from.slot;
  }
}

KvIndex::Place KvIndex::nearest_passing(std::size_t bucket) const {
  for (std::size_t c = (bucket + 1) & cur_.mask; c != bucket; c = (c + 1) & cur_.mask) {
    Bucket& k = cur_.buckets[c];
    for (std::size_t j = 0; j < kBucketSlots; ++j) {
      if (k.tags[j] == kEmpty) continue;
      const std::size_t h = home(hash_of(k.keys[j], k.tags[j]), cur_);
      // Its search passes the bucket when the bucket lies between its home and where it is.
      if (((bucket - h) & cur_.mask) < ((c - h) & cur_.mask)) return {&k, j, h};
    }
  }
  return {};
}

std::size_t KvIndex::holder_size(HolderId holder) const {
  return holder < holders_.size() && holders_[holder].live ? holders_[holder].size : 0;
}

std::size_t KvIndex::memory_bytes() const {
  return (cur_.buckets_n + old_.buckets_n) * sizeof(Bucket) + next_.memory.populated() +
         holders_.capacity() * sizeof(HolderState) +
         (free_holders_.capacity() + retired_holders_.capacity() + draining_holders_.capacity()) *
             sizeof(HolderId);
}

KvIndex::Table KvIndex::make_table(std::size_t buckets, bool huge_pages) {
  Table t;
  t.memory = Mapping(buckets * sizeof(Bucket), huge_pages);  // zeroed: all slots empty
  t.buckets = static_cast<Bucket*>(t.memory.data());
  t.buckets_n = buckets;
  t.mask = buckets - 1;
  return t;
}

std::size_t KvIndex::target_buckets() const {
  std::size_t wanted = std::max(kMinBuckets, cur_.buckets_n);
  // Grow only when live entries need it; a table full of dead entries is rehashed at its size.
  // Live entries at most half the new table.
  while ((live_ + 1) * 2 > wanted * kBucketSlots) wanted *= 2;
  return wanted;
}

void KvIndex::prepare_next() {
  if (!above_prepare_load(used_, cur_.slots())) return;
  if (next_.buckets_n == 0) {
    next_ = make_table(target_buckets(), true);
    next_from_used_ = used_;
  }
  // Fault the table in evenly over the inserts left until it takes over at 4/5 load: one huge
  // page (about 1 ms to zero here) every few thousand inserts instead of a burst of them in the
  // first few hundred inserts after the switch.
  const std::size_t span = std::max<std::size_t>(1, cur_.slots() * 4 / 5 - next_from_used_);
  const std::size_t done = std::min(span, used_ - next_from_used_ + 1);
  next_.memory.populate_below(next_.buckets_n * sizeof(Bucket) / span * done);
}

void KvIndex::reserve_for_insert() {
  // Keep non-empty slots (live + dead) at most 4/5 of the table so searches stay in one bucket.
  if (cur_.buckets_n != 0 && !above_max_load(used_ + 1, cur_.slots())) return;
  // A rehash still running here cannot happen at kMigrateStep; stay correct anyway. Finishing it
  // only adds to used_, so the table is still too full afterwards.
  if (migrating()) migrate(old_.buckets_n);
  const std::size_t wanted = target_buckets();
  if (next_.buckets_n == wanted) {
    next_.memory.populate_below(wanted * sizeof(Bucket));
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
  last_clear_ = 0;
  used_ = 0;
  // Entries of holders retired so far all lie in old_ and are dropped by the move; holders
  // retired from now on may leave entries in cur_ and wait for the next rehash.
  draining_holders_ = std::move(retired_holders_);
  retired_holders_.clear();
  if (old_.buckets_n == 0) migrate(0);  // nothing to move: finish at once
}

void KvIndex::migrate(std::size_t buckets) {
  const std::size_t end = std::min(old_.buckets_n, cursor_ + buckets);
  for (; cursor_ < end; ++cursor_) {
    // Each entry lands at a random bucket of cur_: start loading those of a bucket a little
    // ahead, so the misses overlap instead of costing one full memory latency each.
    if (const std::size_t ahead = cursor_ + kMigratePrefetch; ahead < old_.buckets_n) {
      const Bucket& a = old_.buckets[ahead];
      for (std::size_t j = 0; j < kBucketSlots; ++j)
        if (a.tags[j] != kEmpty)
          __builtin_prefetch(&cur_.buckets[home(hash_of(a.keys[j], a.tags[j]), cur_)], 1);
    }
    const Bucket& k = old_.buckets[cursor_];
    for (std::size_t j = 0; j < kBucketSlots; ++j)
      if (k.tags[j] != kEmpty && is_live(k.tags[j]))
        place(k.keys[j], k.tags[j], home(hash_of(k.keys[j], k.tags[j]), cur_));
    if (k.overflow == 0) last_clear_ = cursor_;
  }
  if (cursor_ < old_.buckets_n) {
    // A search that starts below the last moved bucket nothing overflowed stops there, so
    // nothing reads the moved buckets before it any more: give their pages back.
    old_.memory.release_below(last_clear_ * sizeof(Bucket));
    return;
  }
  old_ = Table{};
  cursor_ = 0;
  // No entry refers to a drained holder any more: its id may be handed out again.
  free_holders_.insert(free_holders_.end(), draining_holders_.begin(), draining_holders_.end());
  draining_holders_.clear();
}

}  // namespace kvnode::controller
