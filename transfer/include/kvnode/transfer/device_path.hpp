// How a chunk pool reaches UCX. A device pool is registered with UCX directly as CUDA memory
// (GPUDirect: RDMA NICs read and write GPU memory, cuda_ipc joins GPUs of one host) when UCX can
// register CUDA memory (a UCX built with CUDA, such as NVIDIA's HPC-X), and is copied through a
// ring of pinned host slots otherwise (Debian's UCX). The choice is a pure function of the
// pool's memory, the memory types UCX reports (ucp_context_query) and the operator's setting, so
// every branch is tested on hosts whose UCX has no CUDA; the plane logs it at start and
// `kvctl doctor` says what a device pool would take on its host.
#pragma once

#include <cstdint>
#include <string>

#include "kvnode/common/result.hpp"
#include "kvnode/gpu/memory_region.hpp"

namespace kvnode::transfer {

// Bits of UCX's memory-type bitmap (ucp_context_attr_t::memory_types: bit n is
// ucs_memory_type_t n). device_path.cpp checks them against UCX's own enum.
inline constexpr std::uint64_t kUcxMemoryHost = std::uint64_t{1} << 0;
inline constexpr std::uint64_t kUcxMemoryCuda = std::uint64_t{1} << 1;

// The operator's say: kAuto takes GPUDirect where UCX can, kOff always stages device pools.
enum class GpuDirect { kAuto, kOff };
Result<GpuDirect> parse_gpudirect(const std::string& text);  // "auto", "off"
const char* to_string(GpuDirect setting);

enum class PoolPath {
  kAsIs,       // host or pinned memory: UCX registers the pool itself
  kGpuDirect,  // a device pool registered with UCX as CUDA memory: no staging copies
  kStaged,     // a device pool moved through pinned host slots (cudaMemcpyAsync)
};

enum class PathReason {
  kHostMemory,   // the pool is host memory (pageable or pinned)
  kUcxHasCuda,   // UCX registers CUDA memory
  kUcxNoCuda,    // UCX's memory types lack CUDA
  kUcxSaidNone,  // UCX reported no memory types (ucp_context_query failed)
  kOperatorOff,  // GpuDirect::kOff
  // The plane's, never choose_pool_path's: UCX said CUDA yet could not register this pool (no
  // GPUDirect driver support, for one), so it was staged after all; the log says what UCX said.
  kUcxRefusedPool,
};

struct PoolPathChoice {
  PoolPath path = PoolPath::kAsIs;
  PathReason reason = PathReason::kHostMemory;
  bool operator==(const PoolPathChoice&) const = default;
};

// Host memory is registered as it is; a device pool takes GPUDirect only when the operator
// allows it (kAuto) and CUDA is among UCX's memory types; otherwise it is staged.
PoolPathChoice choose_pool_path(gpu::MemoryKind pool, std::uint64_t ucx_memory_types,
                                GpuDirect setting);

const char* to_string(PoolPath path);  // "as-is", "gpudirect", "staged"

// The path and why, for the start-up log and kvctl doctor, e.g. "GPUDirect through UCX (memory
// types: host, cuda)" or "staged through pinned memory (this UCX registers host memory only)".
std::string describe(const PoolPathChoice& choice, std::uint64_t ucx_memory_types);

}  // namespace kvnode::transfer
