// One location's chunks (LMCache's "LocalCPUBackend", or the GPU pool): which chunk hash lives in
// which pool page, whether its bytes are complete, who pins it, and the LRU order that eviction
// follows. Every change the controller must hear about becomes an event, in order: ADMIT when a
// chunk becomes readable, EVICT when it stops being readable.
//
// Writing is two-phase, so no chunk is ever reported present before its bytes are: reserve()
// hands out a page (evicting the least recently used chunk that is neither pinned nor being
// read, if the pool is full), the caller fills it (a memcpy, a transfer), then commit() makes it
// readable and emits ADMIT, or abort() gives the page back silently. Readers hold a Lease, which
// keeps the page from being freed under them; a chunk removed while leased disappears from
// lookups at once (EVICT) and its page returns when the last lease ends.
//
// Frozen (a full sync runs), the set of readable chunks stays exactly what a snapshot taken after
// freeze(true) reports: reserve(), commit() (the page goes back), remove() and clear() refuse, so
// no ADMIT or EVICT arises that the sync's controller would drop. Reads and leases go on.
// remove_or_defer() is for removals that must happen anyway (a move's source giving up what the
// destination now holds): while frozen the chunk stays readable, and freeze(false) removes it.
//
// Thread-safe. The event callback runs under the store's lock, in order: it must not call back
// into the store (it hands events to the worker agent's batcher).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/gpu/chunk_pool.hpp"

namespace kvnode::node {

using ChunkHash = std::int64_t;

struct StoreEvent {
  enum class Kind { kAdmit, kEvict } kind;
  ChunkHash hash;
};

struct StoreCounters {
  std::size_t chunks = 0;    // readable
  std::size_t reserved = 0;  // being written
  std::size_t pinned = 0;    // readable and pinned
  std::size_t capacity = 0;  // pages in the pool
  std::uint64_t admitted = 0;
  std::uint64_t evicted = 0;  // by LRU pressure, remove() and clear()
  std::uint64_t evicted_for_space = 0;
};

class ChunkStore;

// A reader's hold on one readable chunk's page. Move-only; the store must outlive it.
class Lease {
 public:
  Lease(Lease&& o) noexcept
      : store_(std::exchange(o.store_, nullptr)), hash_(o.hash_), page_(o.page_) {}
  Lease& operator=(Lease&&) = delete;
  ~Lease();
  ChunkHash hash() const { return hash_; }
  gpu::PageId page() const { return page_; }

 private:
  friend class ChunkStore;
  Lease(ChunkStore* s, ChunkHash h, gpu::PageId p) : store_(s), hash_(h), page_(p) {}
  ChunkStore* store_;
  ChunkHash hash_;
  gpu::PageId page_;
};

class ChunkStore {
 public:
  using EventSink = std::function<void(const StoreEvent&)>;

  ChunkStore(gpu::ChunkPool& pool, std::string location, EventSink on_event);
  ChunkStore(const ChunkStore&) = delete;
  ChunkStore& operator=(const ChunkStore&) = delete;

  const std::string& location() const { return location_; }
  gpu::ChunkPool& pool() { return pool_; }

  // A page to write `hash` into. Errors: kRefused (the chunk is already readable or being
  // written), kNoRoom (every page is pinned, leased or being written), kFrozen. With `evict_up_to`
  // (a tick()), only chunks stamped at or before it are evicted for space: a writer of many chunks
  // (a local put over several rounds) takes tick() when it begins, so its own chunks, stamped
  // later, never make room for its later ones; when nothing older is left the pool counts as full.
  static constexpr std::uint64_t kAnyAge = UINT64_MAX;
  Result<gpu::PageId> reserve(ChunkHash hash, std::uint64_t evict_up_to = kAnyAge);
  // Up to hashes.size() pages at once, all or nothing (a move's destination).
  Result<std::vector<gpu::PageId>> reserve(std::span<const ChunkHash> hashes);
  Status commit(
      ChunkHash hash);         // readable from now on: ADMIT. kNotFound, kFrozen (page given back)
  void abort(ChunkHash hash);  // the write failed: the page goes back, no event

  bool contains(ChunkHash hash) const;
  // Admission order: each commit (and refresh) stamps its chunk with the next tick; tick() is
  // the latest stamp given (never 0).
  std::uint64_t tick() const;
  // A readable chunk a writer found already there: stamped now and most recently used, so the
  // rest of that writer's chunks cannot evict it. False when not readable.
  bool refresh(ChunkHash hash);
  // How many of `hashes`, from the first, are readable. With a pin id, those are pinned under
  // it (LMCache's lookup(pin=True)); unpin(id) releases them.
  std::size_t leading(std::span<const ChunkHash> hashes, const std::string& pin_id = "");
  void unpin(const std::string& pin_id);
  // Holds for reading: the leading readable chunks of `hashes` (stops at the first miss).
  std::vector<Lease> lease_leading(std::span<const ChunkHash> hashes);
  std::optional<Lease> lease(ChunkHash hash);

  // Stops `hash` being readable (EVICT); false when absent, pinned or frozen.
  bool remove(ChunkHash hash);
  enum class Removal { kDone, kWhenThawed, kRefused };  // refused: absent or pinned
  Removal remove_or_defer(ChunkHash hash);
  // Removes every readable, unpinned chunk (EVICT each); returns how many. kFrozen while frozen
  // (decided under the store's lock, so no sync starts between the check and the removals).
  Result<std::size_t> clear();
  // Every readable chunk, oldest first (full sync).
  std::vector<ChunkHash> snapshot() const;
  void freeze(bool on);
  bool frozen() const;
  static constexpr const char* kFrozenText = "frozen: a full sync is running";
  StoreCounters counters() const;

 private:
  friend class Lease;
  enum class State { kWriting, kReadable, kDoomed };  // doomed: removed, leases outstanding
  struct Entry {
    gpu::PageId page;
    State state = State::kWriting;
    std::uint32_t pins = 0;
    std::uint32_t leases = 0;
    std::uint64_t stamp = 0;             // the tick it became readable (or was refreshed) at
    std::list<ChunkHash>::iterator lru;  // valid while readable
  };

  Result<gpu::PageId> take_page(std::uint64_t evict_up_to);  // free, or won by evicting (lock held)
  void drop(ChunkHash hash, Entry& e);  // readable -> gone or doomed (lock held)
  void release_lease(ChunkHash hash);
  void emit(StoreEvent::Kind kind, ChunkHash hash);

  gpu::ChunkPool& pool_;
  std::string location_;
  EventSink on_event_;
  mutable std::mutex mutex_;
  std::unordered_map<ChunkHash, Entry> entries_;
  std::list<ChunkHash> lru_;  // readable chunks, least recently used first
  std::unordered_map<std::string, std::vector<ChunkHash>> pins_;
  StoreCounters counters_;
  bool frozen_ = false;
  std::uint64_t tick_ = 1;
  std::vector<ChunkHash> remove_when_thawed_;
};

}  // namespace kvnode::node
