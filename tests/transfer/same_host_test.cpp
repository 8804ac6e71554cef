// Which copy two pools on one host allow (same_host.hpp): every pair of memory kinds, with and
// without a CUDA copy engine on our side.
#include "same_host.hpp"

#include <gtest/gtest.h>

namespace kvnode::transfer {
namespace {

using gpu::MemoryKind;

TEST(SameHostDecision, HostMemoryOnBothSidesCopiesWithThreadsAndNeedsNoGpu) {
  for (MemoryKind local : {MemoryKind::kHost, MemoryKind::kPinnedHost})
    for (MemoryKind remote : {MemoryKind::kHost, MemoryKind::kPinnedHost})
      for (int device : {-1, 0}) {
        const SameHostDecision d = decide_same_host(local, remote, device);
        EXPECT_EQ(d.copy, SameHostCopy::kHostThreads);
        EXPECT_EQ(d.import.device, -1) << "host pools are mapped without CUDA";
        EXPECT_FALSE(d.import.register_with_cuda);
        EXPECT_TRUE(d.import.populate);
      }
}

TEST(SameHostDecision, ADevicePoolOnEitherSideNeedsOurCudaEngine) {
  const SameHostDecision none = decide_same_host(MemoryKind::kHost, MemoryKind::kDevice, -1);
  EXPECT_EQ(none.copy, SameHostCopy::kNone);
  EXPECT_NE(none.why.find("a host pool here and a device pool there"), std::string::npos)
      << none.why;
  EXPECT_EQ(decide_same_host(MemoryKind::kDevice, MemoryKind::kHost, -1).copy, SameHostCopy::kNone);

  const SameHostDecision d2d = decide_same_host(MemoryKind::kDevice, MemoryKind::kDevice, 1);
  EXPECT_EQ(d2d.copy, SameHostCopy::kCuda);
  EXPECT_EQ(d2d.import.device, 1) << "the peer's allocation opens on our device";
  EXPECT_FALSE(d2d.import.register_with_cuda);

  // The peer's host memory is registered with CUDA here, so the copies are DMA.
  for (MemoryKind remote : {MemoryKind::kHost, MemoryKind::kPinnedHost}) {
    const SameHostDecision d = decide_same_host(MemoryKind::kDevice, remote, 0);
    EXPECT_EQ(d.copy, SameHostCopy::kCuda);
    EXPECT_TRUE(d.import.register_with_cuda);
    EXPECT_EQ(d.import.device, 0);
  }
  // A pinned pool with a CUDA engine reaches a peer's device pool.
  EXPECT_EQ(decide_same_host(MemoryKind::kPinnedHost, MemoryKind::kDevice, 0).copy,
            SameHostCopy::kCuda);
}

}  // namespace
}  // namespace kvnode::transfer
