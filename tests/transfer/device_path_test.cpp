// GPUDirect when UCX can do it (issue 23): the decision of how a pool reaches UCX, every branch of
// it pure and run here; what this host's UCX reports (Debian's: host memory, no CUDA); and the
// plane on a device pool, both settings, where a GPU is present (elsewhere it says why it
// skipped). On a host whose UCX registers CUDA the same plane test takes the GPUDirect branch.
#include "kvnode/transfer/device_path.hpp"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <ucp/api/ucp.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kvnode/gpu/copy_engine.hpp"
#include "kvnode/gpu/device_probe.hpp"
#include "kvnode/transfer/plane.hpp"
#include "kvnode/transfer/ucx_probe.hpp"
#include "pattern.hpp"
#include "support/must.hpp"
#include "ucx_handles.hpp"

namespace kvnode::transfer {
namespace {

using gpu::MemoryKind;
using test::must;

constexpr std::uint64_t kHostAndCuda = kUcxMemoryHost | kUcxMemoryCuda;
constexpr std::uint64_t kRocm = std::uint64_t{1} << 3;  // UCS_MEMORY_TYPE_ROCM

// ---- The decision -----------------------------------------------------------------------------

TEST(DevicePath, HostMemoryIsRegisteredAsItIsWhateverUcxOrTheSetting) {
  for (MemoryKind kind : {MemoryKind::kHost, MemoryKind::kPinnedHost})
    for (std::uint64_t types : {std::uint64_t{0}, kUcxMemoryHost, kHostAndCuda})
      for (GpuDirect setting : {GpuDirect::kAuto, GpuDirect::kOff}) {
        EXPECT_EQ(choose_pool_path(kind, types, setting),
                  (PoolPathChoice{PoolPath::kAsIs, PathReason::kHostMemory}))
            << gpu::to_string(kind) << " " << types << " " << to_string(setting);
      }
}

TEST(DevicePath, ADevicePoolTakesGpuDirectWhereUcxRegistersCuda) {
  const PoolPathChoice direct{PoolPath::kGpuDirect, PathReason::kUcxHasCuda};
  EXPECT_EQ(choose_pool_path(MemoryKind::kDevice, kHostAndCuda, GpuDirect::kAuto), direct);
  EXPECT_EQ(choose_pool_path(MemoryKind::kDevice, kHostAndCuda | kRocm, GpuDirect::kAuto), direct);
  EXPECT_EQ(choose_pool_path(MemoryKind::kDevice, kUcxMemoryCuda, GpuDirect::kAuto), direct);
}

TEST(DevicePath, ADevicePoolIsStagedWhereUcxRegistersNoCuda) {
  const PoolPathChoice staged{PoolPath::kStaged, PathReason::kUcxNoCuda};
  EXPECT_EQ(choose_pool_path(MemoryKind::kDevice, kUcxMemoryHost, GpuDirect::kAuto), staged);
  EXPECT_EQ(choose_pool_path(MemoryKind::kDevice, kUcxMemoryHost | kRocm, GpuDirect::kAuto),
            staged);
}

TEST(DevicePath, ADevicePoolIsStagedWhenUcxSaidNothing) {
  EXPECT_EQ(choose_pool_path(MemoryKind::kDevice, 0, GpuDirect::kAuto),
            (PoolPathChoice{PoolPath::kStaged, PathReason::kUcxSaidNone}));
}

TEST(DevicePath, OffStagesADevicePoolEvenWhereUcxRegistersCuda) {
  const PoolPathChoice off{PoolPath::kStaged, PathReason::kOperatorOff};
  for (std::uint64_t types : {std::uint64_t{0}, kUcxMemoryHost, kHostAndCuda}) {
    EXPECT_EQ(choose_pool_path(MemoryKind::kDevice, types, GpuDirect::kOff), off) << types;
  }
}

TEST(DevicePath, TheLogLineSaysThePathAndWhy) {
  auto text = [](MemoryKind kind, std::uint64_t types, GpuDirect setting) {
    return describe(choose_pool_path(kind, types, setting), types);
  };
  EXPECT_EQ(text(MemoryKind::kDevice, kHostAndCuda, GpuDirect::kAuto),
            "GPUDirect through UCX (memory types: host, cuda)");
  EXPECT_EQ(text(MemoryKind::kDevice, kUcxMemoryHost, GpuDirect::kAuto),
            "staged through pinned memory (this UCX registers host memory only)");
  EXPECT_EQ(text(MemoryKind::kDevice, kUcxMemoryHost | kRocm, GpuDirect::kAuto),
            "staged through pinned memory (this UCX registers no CUDA memory; memory types: host, "
            "rocm)");
  EXPECT_EQ(text(MemoryKind::kDevice, 0, GpuDirect::kAuto),
            "staged through pinned memory (UCX did not report the memory types it registers)");
  EXPECT_EQ(text(MemoryKind::kDevice, kHostAndCuda, GpuDirect::kOff),
            "staged through pinned memory (gpudirect is off; UCX's memory types: host, cuda)");
  EXPECT_EQ(text(MemoryKind::kPinnedHost, kUcxMemoryHost, GpuDirect::kAuto),
            "registered with UCX as it is (memory types: host)");
  EXPECT_EQ(describe({PoolPath::kStaged, PathReason::kUcxRefusedPool}, kHostAndCuda),
            "staged through pinned memory (UCX could not register the device pool; memory types: "
            "host, cuda)");
  EXPECT_STREQ(to_string(PoolPath::kGpuDirect), "gpudirect");
  EXPECT_STREQ(to_string(PoolPath::kStaged), "staged");
  EXPECT_STREQ(to_string(PoolPath::kAsIs), "as-is");
}

TEST(DevicePath, TheSettingParsesAutoAndOffOnly) {
  EXPECT_EQ(must(parse_gpudirect("auto")), GpuDirect::kAuto);
  EXPECT_EQ(must(parse_gpudirect("off")), GpuDirect::kOff);
  const Result<GpuDirect> bad = parse_gpudirect("on");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalid);
  EXPECT_STREQ(to_string(GpuDirect::kOff), "off");
  EXPECT_STREQ(to_string(GpuDirect::kAuto), "auto");
}

// ---- This host's UCX --------------------------------------------------------------------------

// Whether UCX has its CUDA transport module (libuct_cuda.so, next to its other modules in
// <libdir>/ucx/): only then may it report CUDA memory.
bool ucx_has_cuda_module() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ucp_get_version_string), &info) == 0 || !info.dli_fname)
    return true;  // unknown: assume it may
  const auto dir = std::filesystem::path(info.dli_fname).parent_path() / "ucx";
  return std::filesystem::exists(dir / "libuct_cuda.so") ||
         std::filesystem::exists(dir / "libuct_cuda.so.0");
}

TEST(UcxMemoryTypes, UcxReportsHostMemoryAndCudaOnlyWithItsCudaModule) {
  const ucx::Context context = must(ucx::Context::create());
  const std::uint64_t types = must(context.memory_types());
  EXPECT_TRUE(types & kUcxMemoryHost) << types;
  if (!ucx_has_cuda_module()) {
    EXPECT_FALSE(types & kUcxMemoryCuda) << "UCX without libuct_cuda reports CUDA: " << types;
  }
  std::string names;
  for (const std::string& name : ucx_memory_type_names(types)) names += " " + name;
  std::printf("UCX %s memory types: 0x%llx (%s )\n", ucp_get_version_string(),
              static_cast<unsigned long long>(types), names.c_str());
  const UcxProbe probe = probe_ucx();  // what kvctl doctor prints: the same bitmap
  EXPECT_EQ(probe.memory_type_mask, types) << probe.note;
  EXPECT_EQ(probe.memory_types, ucx_memory_type_names(types));
}

TEST(UcxMemoryTypes, DebiansUcxHasNoCudaModuleSoReportsHostOnly) {
  if (ucx_has_cuda_module()) GTEST_SKIP() << "this UCX has its CUDA module (a CUDA-capable UCX)";
  const ucx::Context context = must(ucx::Context::create());
  const std::uint64_t types = must(context.memory_types());
  EXPECT_TRUE(types & kUcxMemoryHost);
  EXPECT_FALSE(types & kUcxMemoryCuda);
  EXPECT_EQ(choose_pool_path(MemoryKind::kDevice, types, GpuDirect::kAuto).path, PoolPath::kStaged);
}

// ---- The plane --------------------------------------------------------------------------------

TEST(PlanePoolPath, AHostPoolIsRegisteredAsItIs) {
  gpu::PoolOptions o;
  o.page_bytes = 64 << 10;
  o.pages = 4;
  const gpu::ChunkPool pool = must(gpu::ChunkPool::create(o));
  const auto plane = must(TransferPlane::start(PlaneOptions{}, pool));
  EXPECT_EQ(plane->pool_path(), (PoolPathChoice{PoolPath::kAsIs, PathReason::kHostMemory}));
  EXPECT_TRUE(plane->ucx_memory_types() & kUcxMemoryHost);
}

// A device pool's path as the plane decides it, and a pull and a push through it against a
// pinned pool, with each setting: here (Debian's UCX) both stage; with a CUDA-capable UCX, auto
// is GPUDirect (or staged after UCX refused the registration, which the log says).
class DevicePoolPath : public ::testing::TestWithParam<GpuDirect> {};

TEST_P(DevicePoolPath, ADevicePoolTakesThePathTheDecisionNamesAndMovesEveryByte) {
  const gpu::CudaProbe cuda = gpu::probe_cuda();
  if (cuda.devices.empty()) GTEST_SKIP() << "needs a CUDA GPU: " << cuda.note;
  constexpr std::size_t kPageBytes = 2 << 20;
  constexpr gpu::PageId kPages = 8;
  gpu::PoolOptions device;
  device.page_bytes = kPageBytes;
  device.pages = kPages;
  device.region.kind = MemoryKind::kDevice;
  const gpu::ChunkPool gpu_pool = must(gpu::ChunkPool::create(device));
  gpu::PoolOptions pinned = device;
  pinned.region.kind = MemoryKind::kPinnedHost;
  const gpu::ChunkPool pinned_pool = must(gpu::ChunkPool::create(pinned));
  for (gpu::PageId p = 0; p < kPages; ++p)
    test::fill_pattern(pinned_pool.page(p), kPageBytes, 9, p);

  PlaneOptions options;
  options.gpudirect = GetParam();
  const auto on_gpu = must(TransferPlane::start(options, gpu_pool));
  const auto host = must(TransferPlane::start(PlaneOptions{}, pinned_pool));
  const std::uint64_t types = on_gpu->ucx_memory_types();
  const PoolPathChoice decided = choose_pool_path(MemoryKind::kDevice, types, GetParam());
  const PoolPathChoice taken = on_gpu->pool_path();
  std::printf("device pool, gpudirect %s: %s\n", to_string(GetParam()),
              describe(taken, types).c_str());
  if (decided.path == PoolPath::kGpuDirect && taken.reason == PathReason::kUcxRefusedPool) {
    EXPECT_EQ(taken.path, PoolPath::kStaged);
  } else {
    EXPECT_EQ(taken, decided);
  }
  if (!(types & kUcxMemoryCuda) || GetParam() == GpuDirect::kOff) {
    EXPECT_EQ(taken.path, PoolPath::kStaged);
  }

  std::vector<PageCopy> pages;
  for (gpu::PageId p = 0; p < kPages; ++p) pages.push_back({p, kPages - 1 - p});
  const TransferResult pulled = on_gpu->pull(host->url(), pages).get();
  ASSERT_TRUE(pulled.ok()) << pulled.message;
  auto engine = must(gpu::make_cuda_copy_engine(gpu_pool.region().device()));
  std::vector<std::byte> back(kPageBytes);
  for (const PageCopy& p : pages) {
    const auto ticket = must(engine->copy(back.data(), gpu_pool.page(p.local), kPageBytes));
    while (!must(engine->done(ticket))) {
    }
    ASSERT_EQ(test::check_pattern(back.data(), kPageBytes, 9, p.remote), kPageBytes);
  }
  for (gpu::PageId p = 0; p < kPages; ++p)  // poison, then push the device pages back
    std::memset(pinned_pool.page(p), 0, kPageBytes);
  const TransferResult pushed = on_gpu->push(host->url(), pages).get();
  ASSERT_TRUE(pushed.ok()) << pushed.message;
  for (gpu::PageId p = 0; p < kPages; ++p) {
    EXPECT_EQ(test::check_pattern(pinned_pool.page(p), kPageBytes, 9, p), kPageBytes);
  }
}

INSTANTIATE_TEST_SUITE_P(Settings, DevicePoolPath,
                         ::testing::Values(GpuDirect::kAuto, GpuDirect::kOff),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace kvnode::transfer
