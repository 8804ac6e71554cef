// Copy engines and the GPUDirect check: the host stand-in and every no-GPU answer run here; the
// CUDA paths run where a GPU is present and skip with the reason elsewhere.
#include "kvnode/gpu/copy_engine.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kvnode/gpu/device_probe.hpp"
#include "kvnode/gpu/gpudirect.hpp"

namespace kvnode::gpu {
namespace {

TEST(CopyEngine, HostEngineCopiesAndIsDoneAtOnce) {
  auto engine = make_host_copy_engine();
  std::vector<char> a(1 << 20, 'a'), b(1 << 20, 'b');
  Result<CopyEngine::Ticket> t = engine->copy(b.data(), a.data(), a.size());
  ASSERT_TRUE(t);
  Result<bool> done = engine->done(*t);
  ASSERT_TRUE(done);
  EXPECT_TRUE(*done);
  EXPECT_EQ(a, b);
}

TEST(CopyEngine, HostEngineCancelReturnsAtOnce) {
  auto engine = make_host_copy_engine();
  engine->cancel(12345);  // never issued
  std::vector<char> a(1 << 20, 'a'), b(1 << 20, 'b');
  Result<CopyEngine::Ticket> t = engine->copy(b.data(), a.data(), a.size());
  ASSERT_TRUE(t);
  engine->cancel(*t);  // landed already: the bytes stay
  EXPECT_EQ(a, b);
  Result<bool> done = engine->done(*t);
  ASSERT_TRUE(done);
  EXPECT_TRUE(*done);
}

TEST(CopyEngine, CudaEngineWithoutAGpuIsAClearError) {
  const CudaProbe cuda = probe_cuda();
  if (!cuda.devices.empty()) GTEST_SKIP() << "a GPU is present: see CudaEngineRoundTrip";
  Result<std::unique_ptr<CopyEngine>> engine = make_cuda_copy_engine(0);
  ASSERT_FALSE(engine);
  EXPECT_NE(engine.error().message.find(cuda.built_with_cuda ? "cudaSetDevice" : "CUDA Toolkit"),
            std::string::npos)
      << engine.error().message;
}

TEST(CopyEngine, CudaEngineRoundTrip) {
  const CudaProbe cuda = probe_cuda();
  if (cuda.devices.empty()) GTEST_SKIP() << "needs a CUDA GPU: " << cuda.note;
  RegionOptions o;
  o.kind = MemoryKind::kDevice;
  Result<MemoryRegion> device = MemoryRegion::allocate(4 << 20, o);
  ASSERT_TRUE(device) << device.error().message;
  auto engine = std::move(make_cuda_copy_engine(0)).value();
  std::vector<char> in(4 << 20), out(4 << 20, 0);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<char>(i * 7);
  auto wait = [&](CopyEngine::Ticket t) {
    for (;;) {
      Result<bool> d = engine->done(t);
      ASSERT_TRUE(d) << d.error().message;
      if (*d) return;
    }
  };
  wait(std::move(engine->copy(device->data(), in.data(), in.size())).value());
  wait(std::move(engine->copy(out.data(), device->data(), out.size())).value());
  EXPECT_EQ(in, out);
}

TEST(CopyEngine, CudaEngineCancelWaitsForTheCopy) {
  const CudaProbe cuda = probe_cuda();
  if (cuda.devices.empty()) GTEST_SKIP() << "needs a CUDA GPU: " << cuda.note;
  RegionOptions o;
  o.kind = MemoryKind::kDevice;
  Result<MemoryRegion> device = MemoryRegion::allocate(64 << 20, o);
  ASSERT_TRUE(device) << device.error().message;
  auto engine = std::move(make_cuda_copy_engine(0)).value();
  std::vector<char> in(64 << 20, 'c'), out(64 << 20, 0);
  engine->cancel(12345);  // never issued
  Result<CopyEngine::Ticket> up = engine->copy(device->data(), in.data(), in.size());
  ASSERT_TRUE(up) << up.error().message;
  Result<CopyEngine::Ticket> down = engine->copy(out.data(), device->data(), out.size());
  ASSERT_TRUE(down) << down.error().message;
  engine->cancel(*up);
  engine->cancel(*down);  // the stream cannot drop it: cancel returns once it landed
  EXPECT_EQ(in, out);
  for (const CopyEngine::Ticket t : {*up, *down}) {
    Result<bool> done = engine->done(t);
    ASSERT_TRUE(done) << done.error().message;
    EXPECT_TRUE(*done) << "a cancelled ticket is forgotten";
  }
}

TEST(GpuDirect, HostMemoryNeedsNoneAndADeviceRegionGetsAnAnswer) {
  Result<MemoryRegion> host = MemoryRegion::allocate(2 << 20);
  ASSERT_TRUE(host);
  const GpuDirectCheck h = check_gpudirect(*host);
  EXPECT_FALSE(h.supported);
  EXPECT_NE(h.detail.find("host memory"), std::string::npos) << h.detail;

  const CudaProbe cuda = probe_cuda();
  if (cuda.devices.empty()) GTEST_SKIP() << "the device half needs a CUDA GPU: " << cuda.note;
  RegionOptions o;
  o.kind = MemoryKind::kDevice;
  Result<MemoryRegion> device = MemoryRegion::allocate(2 << 20, o);
  ASSERT_TRUE(device) << device.error().message;
  const GpuDirectCheck d = check_gpudirect(*device);
  EXPECT_FALSE(d.detail.empty());  // supported or not, it says which step decided
  std::printf("GPUDirect RDMA: %s (%s)\n", d.supported ? "yes" : "no", d.detail.c_str());
  const GpuDirectCheck missing = check_gpudirect(*device, "no_such_nic");
  EXPECT_FALSE(missing.supported);
}

}  // namespace
}  // namespace kvnode::gpu
