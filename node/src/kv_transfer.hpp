// store and load of an engine's registered KV cache, by block table: the node gathers each
// chunk's blocks into a pool page (store) or scatters a stored chunk back into blocks (load),
// all of a request's copies as one batch: memcpy for host KV into host or pinned pools, the CUDA
// copy kernel when the KV or the pool is on a GPU (device pointers of the registration and the
// pool; no host bounce). Runs on the local service's KV executor, one job at a time.
//
// What it guarantees: a stored chunk is committed (ADMIT) only after its copy landed, and no
// chunk is committed when the batch failed; a store never evicts its own chunks (the store's
// tick when it began bounds eviction) and stops at the first chunk with no room; chunks being
// loaded are leased, so no eviction or move frees their pages mid-copy. With a done event the
// caller hears at once that the copies are queued (and the node records the event when they
// land); commits and lease releases still wait for the copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kv_registration.hpp"
#include "kvnode/common/result.hpp"
#include "kvnode/gpu/segment_copy.hpp"
#include "kvnode/node/engine.hpp"
#include "kvnode/node/peer_moves.hpp"

namespace kvnode::node::local {

enum class KvJobKind : std::uint8_t { kStore, kLoad };

struct KvJob {
  KvJobKind kind = KvJobKind::kStore;
  std::shared_ptr<KvRegistration> registration{};
  std::vector<ChunkHash> hashes{};
  std::size_t total_tokens = 0;  // the tokens the chunks cover (the last chunk may be unfull)
  std::vector<std::uint32_t> block_ids{};
  bool retrieve = false;  // load: pull missing chunks from a peer first
  std::optional<gpu::IpcHandle> wait_event{}, done_event{};
};

struct KvOutcome {
  std::size_t chunks = 0;  // leading chunks stored or loaded
  std::size_t tokens = 0;  // the tokens they cover
  std::size_t pulled = 0;
  std::string peer{};
};

// Checks a job before it is queued: token counts against chunks, the block table covers every
// token, each block id needed is below num_blocks (errors name block_ids[i]).
Status check_job(const KvJob& job, std::size_t chunk_size);

class KvTransfers {
 public:
  // `moves`/`locate` may be null/empty: then load(retrieve) loads what is local only.
  KvTransfers(Engine& engine, PeerMoves* moves, Locate locate);
  ~KvTransfers();
  KvTransfers(const KvTransfers&) = delete;
  KvTransfers& operator=(const KvTransfers&) = delete;

  // Runs the job to its end. `queued` is called (once) when the job has a done event, as soon
  // as its copies are queued; the return value is then what it was told.
  Result<KvOutcome> run(const KvJob& job, const std::function<void(const KvOutcome&)>& queued);

 private:
  Result<KvOutcome> store(const KvJob& job, const std::function<void(const KvOutcome&)>& queued);
  Result<KvOutcome> load(const KvJob& job, const std::function<void(const KvOutcome&)>& queued);
  // The copier of a store (store) or load between r's memory and the pool.
  Result<gpu::SegmentCopier*> copier_for(const KvRegistration& r, bool store);
  Result<std::byte*> kernel_page(gpu::PageId page);
  // Queues the batch (waiting for the job's event first, recording its done event after).
  Status copy(gpu::SegmentCopier& copier, const KvJob& job,
              const std::vector<gpu::CopySegment>& segments);

  Engine& engine_;
  PeerMoves* moves_;
  Locate locate_;
  std::unique_ptr<gpu::SegmentCopier> host_copier_;
  std::unique_ptr<gpu::SegmentCopier> cuda_copier_;  // made at the first job that needs it
  std::byte* pool_kernel_base_ = nullptr;            // the pool's base as kernels address it
  std::vector<Lease> quarantine_;  // pages of loads whose copies never landed: never freed
};

}  // namespace kvnode::node::local
