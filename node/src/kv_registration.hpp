// An engine's KV cache as this node mapped it (register_kv): every allocation mapped once (a
// host memfd with mmap, CUDA memory through its IPC handle or VMM fd), the layout rebuilt over
// the mapped bases and checked against the pool (a chunk of the layout is exactly one page).
// Owns every mapping: destroying it unmaps and closes all of them. A registration is shared by
// the jobs that use it, so a client that disconnects mid-store has its mappings closed once the
// store ends, never under it.
//
// Two views of the same layout: host_layout() addresses host memory for memcpy (host KV), and
// kernel_layout() addresses what the CUDA copy kernel reads and writes (device memory, host
// memory registered with CUDA) when the copies go through the GPU.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "kvnode/client/kv_layout.hpp"
#include "kvnode/client/kv_wire.hpp"
#include "kvnode/common/result.hpp"
#include "kvnode/common/unique_fd.hpp"
#include "kvnode/gpu/memory_region.hpp"
#include "kvnode/gpu/segment_copy.hpp"

namespace kvnode::node::local {

struct KvPoolFacts {
  gpu::MemoryKind pool_kind = gpu::MemoryKind::kHost;
  int device = 0;              // the pool's CUDA device
  std::size_t page_bytes = 0;  // one chunk
  std::size_t chunk_size = 0;  // tokens per chunk
};

class KvRegistration {
 public:
  // Consumes `fds` in order (one per memfd or VMM allocation; a count that does not match is an
  // error). Errors name the allocation or the layout field.
  // `pid`: the connected engine's, for kHostProcess allocations (its own memory, copied with
  // process_vm_readv/writev: every allocation of the registration of that kind, or none).
  static Result<std::shared_ptr<KvRegistration>> map(const client::KvWireLayout& wire,
                                                     std::vector<UniqueFd> fds,
                                                     const KvPoolFacts& pool, int pid = 0);
  ~KvRegistration();
  KvRegistration(const KvRegistration&) = delete;
  KvRegistration& operator=(const KvRegistration&) = delete;

  // The copies go through the CUDA kernel (device KV, or a device pool): kernel_layout() then.
  bool uses_gpu() const { return uses_gpu_; }
  const client::KvLayout& host_layout() const { return host_layout_; }
  const client::KvLayout& kernel_layout() const { return kernel_layout_; }
  std::size_t mapped_bytes() const { return mapped_bytes_; }
  std::size_t mapped_host_bytes() const;  // of it, host memfds mapped by this node
  // The engine process whose own memory this is (kHostProcess), else 0; then host_layout()
  // holds its addresses (never dereferenced here) and the copies are process_copier()'s.
  int engine_pid() const;
  gpu::SegmentCopier* process_copier(bool store) const;
  // Faults the host mappings in (writable), so the first store or load does not pay for it: on
  // a fresh 4 KiB-page mapping of a large cache they ran 2-6x slower. Seconds for tens of GiB:
  // the local service runs it on the KV executor, ahead of the registration's first copies.
  void populate() const;

  struct Mappings;

 private:
  KvRegistration();
  std::unique_ptr<Mappings> maps_;
  bool uses_gpu_ = false;
  client::KvLayout host_layout_{};
  client::KvLayout kernel_layout_{};
  std::size_t mapped_bytes_ = 0;
};

}  // namespace kvnode::node::local
