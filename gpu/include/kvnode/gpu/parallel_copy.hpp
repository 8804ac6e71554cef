// Copies between host mappings with several threads: one thread's memcpy does not reach a
// host's memory bandwidth (on a 16-core host, one thread gets 7.5-10 GB/s of far more). Each
// copy is cut into pieces that the threads take in order; a ticket is done once all its pieces
// landed. The transfer plane uses it for same-host moves between two mapped pools: on_landed
// wakes its progress thread, so the thread sleeps while copies run instead of polling.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "kvnode/common/result.hpp"
#include "kvnode/gpu/copy_engine.hpp"

namespace kvnode::gpu {

struct ParallelCopyOptions {
  std::size_t threads = 0;             // 0: default_copy_threads()
  std::size_t piece_bytes = 4u << 20;  // a copy is cut into pieces of this size (last shorter)
  // Called on a copy thread once a ticket's last piece landed (or it failed): must not block.
  std::function<void()> on_landed;
};

// Half the hardware threads, at least 1 and at most 8: memory bandwidth, not cores, bounds a
// copy, and the other half keeps serving.
std::size_t default_copy_threads();

// An error (kInvalid) for piece_bytes 0 or threads above 64; kInternal if a thread cannot start.
Result<std::unique_ptr<CopyEngine>> make_parallel_copy_engine(const ParallelCopyOptions& options);

}  // namespace kvnode::gpu
