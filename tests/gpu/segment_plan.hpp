// Batches of copy segments for the segment copier tests: many segments of odd sizes and
// alignments (a few bytes, 16-byte multiples at 16-byte offsets for the kernel's vector path,
// pieces across the 64 KiB split), disjoint destinations, and the bytes a plain loop expects.
#pragma once

#include <cstddef>
#include <random>
#include <vector>

#include "kvnode/gpu/segment_copy.hpp"

namespace kvnode::gpu::test {

struct PlannedSegment {
  std::size_t src = 0;  // offsets into the source and destination buffers
  std::size_t dst = 0;
  std::size_t bytes = 0;
};

struct SegmentPlan {
  std::vector<PlannedSegment> segments;
  std::size_t src_bytes = 0;
  std::size_t dst_bytes = 0;
};

inline SegmentPlan plan_segments(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  auto pick = [&rng](std::size_t lo, std::size_t hi) {
    return std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
  };
  constexpr std::size_t kPiece = 64 << 10;
  SegmentPlan plan;
  plan.src_bytes = 1 << 20;
  std::size_t dst = 0;
  for (std::size_t i = 0; i < count; ++i) {
    PlannedSegment s;
    switch (i % 6) {
      case 0:  // small and odd
        s.bytes = pick(1, 15);
        break;
      case 1:  // 16-byte words at 16-byte offsets: the vector path
        s.bytes = 16 * pick(1, 4096);
        break;
      case 2:  // across the piece split
        s.bytes = pick(kPiece - 3, 3 * kPiece + 7);
        break;
      case 3:  // exactly one or two pieces
        s.bytes = kPiece * pick(1, 2);
        break;
      case 4:  // empty: skipped
        s.bytes = 0;
        break;
      default:
        s.bytes = pick(1, 9000);
    }
    const bool aligned = i % 6 == 1 || i % 6 == 3;
    s.src = pick(0, plan.src_bytes - s.bytes);
    dst += pick(0, 31);
    if (aligned) {
      s.src &= ~std::size_t{15};
      dst = (dst + 15) & ~std::size_t{15};
    }
    s.dst = dst;
    dst += s.bytes;
    plan.segments.push_back(s);
  }
  plan.dst_bytes = dst + 64;
  return plan;
}

inline std::vector<CopySegment> bind(const SegmentPlan& plan, const std::byte* src,
                                     std::byte* dst) {
  std::vector<CopySegment> out;
  for (const PlannedSegment& s : plan.segments) out.push_back({src + s.src, dst + s.dst, s.bytes});
  return out;
}

inline std::vector<std::byte> pattern(std::size_t bytes, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(bytes);
  for (std::byte& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// What the batch must leave in a destination that held `initial`.
inline std::vector<std::byte> expected(const SegmentPlan& plan, const std::vector<std::byte>& src,
                                       std::vector<std::byte> initial) {
  for (const PlannedSegment& s : plan.segments)
    for (std::size_t i = 0; i < s.bytes; ++i) initial[s.dst + i] = src[s.src + i];
  return initial;
}

}  // namespace kvnode::gpu::test
