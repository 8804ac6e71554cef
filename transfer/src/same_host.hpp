// Same-host moves (PlaneOptions::same_host): which copy two pools on one host allow, a peer's
// pool mapped here, and the thread that maps it. The dialling side maps the peer's pool once a
// session is open (pool_share.hpp fetches it, region_share.hpp maps it) and, from then on, the
// session copies its transfers' runs itself (session_initiator.cpp) instead of posting UCX
// operations; until the mapping is ready, and whenever it cannot be made, UCX carries them.
// Private to transfer/src.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "kvnode/common/result.hpp"
#include "kvnode/gpu/chunk_pool.hpp"
#include "kvnode/gpu/copy_engine.hpp"
#include "kvnode/gpu/region_share.hpp"
#include "pool_share.hpp"

namespace kvnode::transfer {

enum class SameHostCopy : std::uint8_t {
  kNone,         // not between these two pools: UCX moves them
  kHostThreads,  // both pools in host memory: the plane's parallel memcpy
  kCuda,         // a device pool on either side: cudaMemcpyAsync on our pool's device
};

struct SameHostDecision {
  SameHostCopy copy = SameHostCopy::kNone;
  gpu::ImportOptions import;  // how to map the peer's pool for that copy
  std::string why;            // kNone: why not, for the log
};

// `cuda_device`: the device our CUDA copy engine runs on, -1 when we have none (a host pool, or
// no GPU). Host and pinned pools copy with threads; a device pool on either side needs our CUDA
// engine (peer host memory is then registered with CUDA so the copies are DMA).
SameHostDecision decide_same_host(gpu::MemoryKind local, gpu::MemoryKind remote, int cuda_device);

// A peer's pool mapped here and the engine that copies with it. Shared by the session that uses
// it and, through it, the copies in flight; unmapped when the last goes.
struct PeerMapping {
  gpu::MappedRegion region;
  gpu::CopyEngine* engine = nullptr;  // the plane's; outlives every mapping
  std::string transport;              // "memfd" or "cuda-ipc", as TransferStats reports it
  std::byte* page(gpu::PageId p, std::size_t page_bytes) const {
    return region.data() + static_cast<std::size_t>(p) * page_bytes;
  }
};

struct MapRequest {
  std::string peer;  // the url dialled
  std::uint64_t instance = 0;
  std::string share;
  ShareToken token{};
  gpu::MemoryKind kind = gpu::MemoryKind::kHost;  // the descriptor's: the export must agree
  std::size_t pool_bytes = 0;  // page_bytes x pages from the descriptor: the export must cover it
  SameHostDecision decision;
};

struct MapResult {
  std::string peer;
  std::uint64_t instance = 0;
  // Or why not: kPeerLost (no socket to reach), kRefused (nothing to copy with), ...
  Result<std::shared_ptr<const PeerMapping>> mapping = make_error(ErrorCode::kInternal, "unset");
};

// One thread fetches and maps peers' pools away from the progress thread (a fetch waits on the
// peer; populating a large mapping takes seconds) and hands each result to `done`, on its thread.
class SameHostMapper {
 public:
  SameHostMapper(std::function<void(MapResult)> done, gpu::CopyEngine* host_engine,
                 gpu::CopyEngine* cuda_engine);
  ~SameHostMapper();  // drops requests not started, waits for the one being mapped
  SameHostMapper(const SameHostMapper&) = delete;
  SameHostMapper& operator=(const SameHostMapper&) = delete;

  // Queued unless the same peer and instance is already queued.
  void request(MapRequest r);

 private:
  void run();
  Result<std::shared_ptr<const PeerMapping>> map(const MapRequest& r) const;

  std::function<void(MapResult)> done_;
  gpu::CopyEngine* host_engine_;
  gpu::CopyEngine* cuda_engine_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<MapRequest> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kvnode::transfer
