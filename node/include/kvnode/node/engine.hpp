// The node's engine operations over one chunk store, with the protocol reference's semantics
// (§2.3): lookup counts the leading stored chunks of a token sequence and answers in tokens;
// pin is a lookup that pins under the request's event id; clear removes every unpinned chunk;
// health is whether the store's books balance. put()/get() are the local client's data path for
// host pools. The controller's requests reach these through ControlHandler (node/src).
//
// freeze(true) (a full sync running) freezes the store: no chunk arrives or leaves until the sync
// ends (clear is refused), so the keys the sync reports are exactly what the node holds and no
// event is dropped by a controller that is rebuilding the worker's keys.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/keys/chunk_hash.hpp"
#include "kvnode/node/chunk_store.hpp"

namespace kvnode::node {

struct EngineOptions {
  keys::ChunkHashConfig hashing;  // chunk_size, init hash, save_unfull_chunk: as the engine's
};

class Engine {
 public:
  explicit Engine(ChunkStore& store, EngineOptions options = {});

  // The chunk hashes of a token sequence (LMCache's chain).
  Result<std::vector<ChunkHash>> hashes(std::span<const std::int64_t> tokens) const;
  // Tokens covered by the leading stored chunks; with a pin id, those chunks are pinned under it.
  std::size_t lookup_tokens(std::span<const std::int64_t> tokens, const std::string& pin_id = "");

  // Stores one chunk's bytes (exactly a page); readable, and reported, only once all are in.
  // `evict_up_to`: as ChunkStore::reserve (a put of many chunks never evicts its own).
  Status put(ChunkHash hash, std::span<const std::byte> bytes,
             std::uint64_t evict_up_to = ChunkStore::kAnyAge);
  // Copies a stored chunk out; its size, or an error when absent.
  Result<std::size_t> get(ChunkHash hash, std::span<std::byte> out);

  // Removes every readable, unpinned chunk (EVICT each); how many. kFrozen while a full sync
  // runs: its EVICTs would be dropped by the controller rebuilding this worker's keys.
  Result<std::size_t> clear();
  // The store's books balance: readable and reserved chunks fit in the pool.
  bool healthy() const;

  std::size_t chunk_size() const { return options_.hashing.chunk_size; }
  bool save_unfull_chunk() const { return options_.hashing.save_unfull_chunk; }
  const keys::ChunkHashConfig& hashing() const { return options_.hashing; }

  void freeze(bool on) { store_.freeze(on); }
  bool frozen() const { return store_.frozen(); }
  std::vector<std::int64_t> snapshot() const { return store_.snapshot(); }

  // The store's two-phase writes and leases, for the node's services (local clients, peers):
  // Engine is their one door into the ChunkStore; the semantics are ChunkStore's.
  Result<gpu::PageId> reserve(ChunkHash hash, std::uint64_t evict_up_to = ChunkStore::kAnyAge) {
    return store_.reserve(hash, evict_up_to);
  }
  Status commit(ChunkHash hash) { return store_.commit(hash); }
  void abort(ChunkHash hash) { store_.abort(hash); }
  bool contains(ChunkHash hash) const { return store_.contains(hash); }
  bool refresh(ChunkHash hash) { return store_.refresh(hash); }
  std::uint64_t tick() const { return store_.tick(); }
  std::size_t leading(std::span<const ChunkHash> hashes) { return store_.leading(hashes); }
  std::vector<Lease> lease_leading(std::span<const ChunkHash> hashes) {
    return store_.lease_leading(hashes);
  }
  std::optional<Lease> lease(ChunkHash hash) { return store_.lease(hash); }
  ChunkStore::Removal remove_or_defer(ChunkHash hash) { return store_.remove_or_defer(hash); }
  gpu::ChunkPool& pool() { return store_.pool(); }
  const std::string& location() const { return store_.location(); }
  StoreCounters counters() const { return store_.counters(); }

 private:
  ChunkStore& store_;
  EngineOptions options_;
};

}  // namespace kvnode::node
