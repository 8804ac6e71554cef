// The batch copy kernel: each block copies whole pieces (grid-stride over them), its threads
// striding over a piece's bytes, 16 bytes at a time where source and destination allow it.
#include "segment_copy_kernel.hpp"

namespace kvnode::gpu::detail {
namespace {

constexpr std::uint64_t kVectorBytes = sizeof(uint4);

__global__ void copy_pieces(const CopyPiece* __restrict__ pieces, std::size_t count) {
  for (std::size_t i = blockIdx.x; i < count; i += gridDim.x) {
    const CopyPiece piece = pieces[i];
    const auto* src = reinterpret_cast<const unsigned char*>(piece.src);
    auto* dst = reinterpret_cast<unsigned char*>(piece.dst);
    std::uint64_t done = 0;
    const auto misaligned =
        (reinterpret_cast<std::uintptr_t>(src) | reinterpret_cast<std::uintptr_t>(dst)) &
        (kVectorBytes - 1);
    if (misaligned == 0) {
      // uint4 loads and stores for the whole 16-byte words; the tail (if any) byte by byte.
      const std::uint64_t words = piece.bytes / kVectorBytes;
      const auto* s = reinterpret_cast<const uint4*>(src);
      auto* d = reinterpret_cast<uint4*>(dst);
      for (std::uint64_t w = threadIdx.x; w < words; w += blockDim.x) d[w] = s[w];
      done = words * kVectorBytes;
    }
    for (std::uint64_t b = done + threadIdx.x; b < piece.bytes; b += blockDim.x) dst[b] = src[b];
  }
}

}  // namespace

cudaError_t launch_piece_copy(const CopyPiece* pieces, std::size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  (void)cudaGetLastError();  // a stale error of an earlier call is not this launch's
  const unsigned blocks = count < kMaxCopyBlocks ? static_cast<unsigned>(count) : kMaxCopyBlocks;
  copy_pieces<<<blocks, kCopyThreadsPerBlock, 0, stream>>>(pieces, count);
  return cudaGetLastError();
}

}  // namespace kvnode::gpu::detail
