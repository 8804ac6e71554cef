// Many small copies as one batch: how the node gathers an engine's paged KV blocks into a chunk
// and scatters them back. A batch is a list of segments (source, destination, bytes). The host
// copier runs them with memcpy at once (host KV and host or pinned pools: CPU engines, tests,
// CI). The CUDA copier runs a batch as one kernel on its own stream (cudaMemcpyAsync per segment
// is launch-bound: 512 copies of 64 KiB reach 10 GB/s on an H200), reading and writing any memory
// the device can address: device memory, memory mapped from another process through CUDA IPC,
// pinned host memory, host memory registered with CUDA. Copies queued on one copier land in order.
//
// Events cross processes as CUDA IPC event handles: the engine records one after its KV writes
// and the copier's stream waits on it; the copier records another once a batch lands, which the
// engine waits on instead of blocking. One thread at a time per copier.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <span>

#include "kvnode/common/result.hpp"

namespace kvnode::gpu {

inline constexpr std::size_t kIpcHandleBytes = 64;  // cudaIpcMemHandle_t, cudaIpcEventHandle_t
using IpcHandle = std::array<std::byte, kIpcHandleBytes>;

struct CopySegment {
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;
  std::size_t bytes = 0;
};

class SegmentCopier {
 public:
  virtual ~SegmentCopier() = default;
  // The copies queued after this wait until `event` (an interprocess event another process
  // recorded, as cudaIpcGetEventHandle gives it) has completed. kInvalid on the host copier.
  virtual Status wait(const IpcHandle& event) = 0;
  // Queues the segments (all of them, in one launch on CUDA). The list may be reused once this
  // returns; the memory it names must stay until synchronize() returns.
  virtual Status copy(std::span<const CopySegment> segments) = 0;
  // Records `event` (an interprocess event of another process) once every copy queued so far
  // has landed. kInvalid on the host copier.
  virtual Status record(const IpcHandle& event) = 0;
  // Returns once every queued copy has landed; the first error (naming the CUDA call) otherwise.
  // The CUDA copier waits at most a minute (kDeadline: an event its copies wait for was never
  // recorded). After any failure there (a kernel fault leaves the process's CUDA context unusable)
  // it is out of service: every later call fails with kInternal saying why, and the memory its
  // copies touched must be treated as still in use.
  virtual Status synchronize() = 0;
  virtual bool on_device() const = 0;
  virtual const char* name() const = 0;  // "memcpy", "cuda kernel"
};

std::unique_ptr<SegmentCopier> make_host_segment_copier();
// On `device`'s own non-blocking stream. An error (naming the CUDA call, or "built without
// CUDA") where there is no GPU.
Result<std::unique_ptr<SegmentCopier>> make_cuda_segment_copier(int device);

}  // namespace kvnode::gpu
