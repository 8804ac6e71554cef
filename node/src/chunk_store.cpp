#include "kvnode/node/chunk_store.hpp"

#include <algorithm>

namespace kvnode::node {

Lease::~Lease() {
  if (store_) store_->release_lease(hash_);
}

ChunkStore::ChunkStore(gpu::ChunkPool& pool, std::string location, EventSink on_event)
    : pool_(pool), location_(std::move(location)), on_event_(std::move(on_event)) {
  counters_.capacity = pool.page_count();
}

void ChunkStore::emit(StoreEvent::Kind kind, ChunkHash hash) {
  if (kind == StoreEvent::Kind::kAdmit)
    ++counters_.admitted;
  else
    ++counters_.evicted;
  if (on_event_) on_event_(StoreEvent{kind, hash});
}

Result<gpu::PageId> ChunkStore::take_page(std::uint64_t evict_up_to) {
  if (std::optional<gpu::PageId> page = pool_.allocate()) return *page;
  // Full: evict the least recently used chunk nobody pins or reads (and old enough).
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    Entry& e = entries_.at(*it);
    if (e.pins || e.leases || e.stamp > evict_up_to) continue;
    const gpu::PageId page = e.page;
    const ChunkHash victim = *it;
    lru_.erase(it);
    entries_.erase(victim);
    --counters_.chunks;
    ++counters_.evicted_for_space;
    emit(StoreEvent::Kind::kEvict, victim);
    return page;  // reused directly: it never goes back through the pool
  }
  return make_error(ErrorCode::kNoRoom,
                    "location " + location_ + " is full: all " +
                        std::to_string(pool_.page_count()) +
                        " pages are pinned, being read or being written" +
                        (evict_up_to == kAnyAge ? "" : ", or hold this writer's own chunks"));
}

Result<gpu::PageId> ChunkStore::reserve(ChunkHash hash, std::uint64_t evict_up_to) {
  std::lock_guard lock(mutex_);
  if (frozen_) return make_error(ErrorCode::kFrozen, kFrozenText);
  if (const auto it = entries_.find(hash); it != entries_.end())
    return make_error(ErrorCode::kRefused, it->second.state == State::kWriting
                                               ? "chunk is already being written"
                                               : "chunk is already present");
  Result<gpu::PageId> page = take_page(evict_up_to);
  if (!page) return page.error();
  Entry e;
  e.page = *page;
  entries_.emplace(hash, e);
  ++counters_.reserved;
  return *page;
}

Result<std::vector<gpu::PageId>> ChunkStore::reserve(std::span<const ChunkHash> hashes) {
  std::vector<gpu::PageId> pages;
  for (std::size_t i = 0; i < hashes.size(); ++i) {
    Result<gpu::PageId> p = reserve(hashes[i]);
    if (!p) {
      for (std::size_t j = 0; j < i; ++j) abort(hashes[j]);
      return wrap_error("chunk " + std::to_string(i) + ": ", p.error());
    }
    pages.push_back(*p);
  }
  return pages;
}

Status ChunkStore::commit(ChunkHash hash) {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(hash);
  if (it == entries_.end() || it->second.state != State::kWriting)
    return make_error(ErrorCode::kNotFound, "commit of a chunk that was not reserved");
  if (frozen_) {  // written, but the sync's snapshot is taken: it would be a key nobody reports
    (void)pool_.release(it->second.page);
    entries_.erase(it);
    --counters_.reserved;
    return make_error(ErrorCode::kFrozen, kFrozenText);
  }
  it->second.state = State::kReadable;
  it->second.stamp = ++tick_;
  it->second.lru = lru_.insert(lru_.end(), hash);
  --counters_.reserved;
  ++counters_.chunks;
  emit(StoreEvent::Kind::kAdmit, hash);
  return {};
}

void ChunkStore::abort(ChunkHash hash) {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(hash);
  if (it == entries_.end() || it->second.state != State::kWriting) return;
  (void)pool_.release(it->second.page);
  entries_.erase(it);
  --counters_.reserved;
}

bool ChunkStore::contains(ChunkHash hash) const {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(hash);
  return it != entries_.end() && it->second.state == State::kReadable;
}

std::uint64_t ChunkStore::tick() const {
  std::lock_guard lock(mutex_);
  return tick_;
}

bool ChunkStore::refresh(ChunkHash hash) {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(hash);
  if (it == entries_.end() || it->second.state != State::kReadable) return false;
  it->second.stamp = ++tick_;
  lru_.splice(lru_.end(), lru_, it->second.lru);
  return true;
}

std::size_t ChunkStore::leading(std::span<const ChunkHash> hashes, const std::string& pin_id) {
  std::lock_guard lock(mutex_);
  std::size_t n = 0;
  for (; n < hashes.size(); ++n) {
    const auto it = entries_.find(hashes[n]);
    if (it == entries_.end() || it->second.state != State::kReadable) break;
    Entry& e = it->second;
    lru_.splice(lru_.end(), lru_, e.lru);  // used: most recent
    if (!pin_id.empty()) {
      if (e.pins++ == 0) ++counters_.pinned;
      pins_[pin_id].push_back(hashes[n]);
    }
  }
  return n;
}

void ChunkStore::unpin(const std::string& pin_id) {
  std::lock_guard lock(mutex_);
  const auto it = pins_.find(pin_id);
  if (it == pins_.end()) return;
  for (ChunkHash h : it->second) {
    const auto e = entries_.find(h);
    if (e == entries_.end() || e->second.pins == 0) continue;
    if (--e->second.pins == 0 && e->second.state == State::kReadable) --counters_.pinned;
  }
  pins_.erase(it);
}

std::vector<Lease> ChunkStore::lease_leading(std::span<const ChunkHash> hashes) {
  std::lock_guard lock(mutex_);
  std::vector<Lease> out;
  for (ChunkHash h : hashes) {
    const auto it = entries_.find(h);
    if (it == entries_.end() || it->second.state != State::kReadable) break;
    ++it->second.leases;
    lru_.splice(lru_.end(), lru_, it->second.lru);
    out.push_back(Lease(this, h, it->second.page));
  }
  return out;
}

std::optional<Lease> ChunkStore::lease(ChunkHash hash) {
  std::vector<Lease> one = lease_leading(std::span<const ChunkHash>(&hash, 1));
  if (one.empty()) return std::nullopt;
  return std::move(one.front());
}

void ChunkStore::release_lease(ChunkHash hash) {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(hash);
  if (it == entries_.end() || it->second.leases == 0) return;
  if (--it->second.leases == 0 && it->second.state == State::kDoomed) {
    (void)pool_.release(it->second.page);
    entries_.erase(it);
  }
}

void ChunkStore::drop(ChunkHash hash, Entry& e) {
  lru_.erase(e.lru);
  --counters_.chunks;
  if (e.pins) --counters_.pinned;
  emit(StoreEvent::Kind::kEvict, hash);
  if (e.leases) {
    e.state = State::kDoomed;  // the page returns with the last lease
    return;
  }
  (void)pool_.release(e.page);
  entries_.erase(hash);
}

bool ChunkStore::remove(ChunkHash hash) {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(hash);
  if (frozen_ || it == entries_.end() || it->second.state != State::kReadable || it->second.pins)
    return false;
  drop(hash, it->second);
  return true;
}

ChunkStore::Removal ChunkStore::remove_or_defer(ChunkHash hash) {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(hash);
  if (it == entries_.end() || it->second.state != State::kReadable || it->second.pins)
    return Removal::kRefused;
  if (frozen_) {
    remove_when_thawed_.push_back(hash);
    return Removal::kWhenThawed;
  }
  drop(hash, it->second);
  return Removal::kDone;
}

Result<std::size_t> ChunkStore::clear() {
  std::lock_guard lock(mutex_);  // frozen is decided under the lock that keeps it
  if (frozen_)
    return make_error(ErrorCode::kFrozen, "a full sync is running; ask again when it ends");
  std::vector<ChunkHash> victims;
  for (ChunkHash h : lru_)
    if (entries_.at(h).pins == 0) victims.push_back(h);
  for (ChunkHash h : victims) drop(h, entries_.at(h));
  return victims.size();
}

void ChunkStore::freeze(bool on) {
  std::lock_guard lock(mutex_);
  frozen_ = on;
  if (on) return;
  // Whatever was deferred is still readable (nothing leaves a frozen store) unless pinned since.
  for (ChunkHash h : remove_when_thawed_) {
    const auto it = entries_.find(h);
    if (it != entries_.end() && it->second.state == State::kReadable && !it->second.pins)
      drop(h, it->second);
  }
  remove_when_thawed_.clear();
}

bool ChunkStore::frozen() const {
  std::lock_guard lock(mutex_);
  return frozen_;
}

std::vector<ChunkHash> ChunkStore::snapshot() const {
  std::lock_guard lock(mutex_);
  return {lru_.begin(), lru_.end()};
}

StoreCounters ChunkStore::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

}  // namespace kvnode::node
