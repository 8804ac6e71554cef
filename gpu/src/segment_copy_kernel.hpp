// The copy kernel's interface to the host code (segment_copy.cpp): a batch is split on the host
// into pieces of at most kMaxPieceBytes, so one block copies one piece and a long segment spreads
// over many blocks. Shared between g++ and nvcc, so plain types only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kvnode::gpu::detail {

struct CopyPiece {
  const std::byte* src;
  std::byte* dst;
  std::uint64_t bytes;  // at most kMaxPieceBytes
};

inline constexpr std::size_t kMaxPieceBytes = 64 << 10;
inline constexpr unsigned kCopyThreadsPerBlock = 256;
// Enough blocks to fill an H200 (132 SMs x 8 resident blocks of 256 threads); larger batches
// loop over their pieces (grid-stride).
inline constexpr unsigned kMaxCopyBlocks = 1024;

// Queues one kernel on `stream` copying `count` pieces whose descriptors lie in device memory
// (`pieces`); the launch's error (cudaSuccess once queued).
cudaError_t launch_piece_copy(const CopyPiece* pieces, std::size_t count, cudaStream_t stream);

}  // namespace kvnode::gpu::detail
