// Asynchronous copies between chunk memory and host staging memory. Device chunk pools move
// through a pinned host staging ring when UCX cannot touch GPU memory (Debian's UCX has no
// CUDA): the CUDA engine queues cudaMemcpyAsync on a stream of its own and records an event per
// copy, so the transfer plane's thread polls completions instead of blocking. The host engine
// (memcpy, complete at once) stands in for it where there is no GPU, so the staging path of the
// plane runs in CI exactly as it does on a GPU host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "kvnode/common/result.hpp"

namespace kvnode::gpu {

class CopyEngine {
 public:
  using Ticket = std::uint64_t;
  virtual ~CopyEngine() = default;
  // Starts copying. `src` and `dst` stay valid until done() is true or cancel() returned (the
  // host engine needs neither once copy() returns).
  virtual Result<Ticket> copy(void* dst, const void* src, std::size_t bytes) = 0;
  // True once the copy has landed (the ticket is then forgotten); an error if it failed.
  virtual Result<bool> done(Ticket ticket) = 0;
  // Gives up on a copy: what has not started never runs, and this returns once nothing of the
  // copy touches memory any more (its destination bytes are then undefined; the ticket is
  // forgotten). A finished or unknown ticket returns at once.
  virtual void cancel(Ticket ticket) = 0;
  // cancel() of several copies at once: none of them starts anything more while this waits for
  // what is running (one at a time, a cancel could wait while the next copy's pieces start).
  virtual void cancel(std::span<const Ticket> tickets) {
    for (Ticket t : tickets) cancel(t);
  }
  virtual const char* name() const = 0;
};

std::unique_ptr<CopyEngine> make_host_copy_engine();
// On `device`'s own non-blocking stream. An error (naming the CUDA call) without a GPU.
Result<std::unique_ptr<CopyEngine>> make_cuda_copy_engine(int device);

}  // namespace kvnode::gpu
