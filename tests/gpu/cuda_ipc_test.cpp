// The CUDA half of the engine KV path within one process: without a GPU every factory answers an
// error naming CUDA; with one, the CUDA copier's batches (device, pinned and registered host
// memory, both directions) match the host copier's, exports name their allocation, interprocess
// events order the copier's stream, VMM allocations round-trip through their fd, and device
// pools read and write pages. Handles crossing a process boundary: cuda_ipc_process_test.cpp.
#include "kvnode/gpu/cuda_ipc.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include "gpu/segment_plan.hpp"
#include "kvnode/gpu/chunk_pool.hpp"
#include "kvnode/gpu/device_probe.hpp"
#include "kvnode/gpu/memory_region.hpp"
#include "kvnode/gpu/segment_copy.hpp"

namespace kvnode::gpu {
namespace {

bool have_gpu() {
  return !probe_cuda().devices.empty();
}

#define SKIP_WITHOUT_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().note

bool names_cuda(const Error& e) {
  return e.message.find("CUDA") != std::string::npos || e.message.find("cuda") != std::string::npos;
}

template <class T>
void expect_cuda_error(const Result<T>& r, const char* what) {
  ASSERT_FALSE(r) << what;
  EXPECT_TRUE(names_cuda(r.error())) << what << ": " << r.error().message;
}

void expect_cuda_error(const Status& s, const char* what) {
  ASSERT_FALSE(s) << what;
  EXPECT_TRUE(names_cuda(s.error())) << what << ": " << s.error().message;
}

TEST(CudaIpc, EveryFactoryIsAClearErrorWithoutAGpu) {
  if (have_gpu()) GTEST_SKIP() << "a GPU is present: see the tests below";
  expect_cuda_error(make_cuda_segment_copier(0), "make_cuda_segment_copier");
  expect_cuda_error(ImportedDeviceMemory::open_ipc(IpcHandle{}, 4096, 0), "open_ipc");
  expect_cuda_error(
      ImportedDeviceMemory::import_vmm(UniqueFd(::open("/dev/null", O_RDONLY)), 4096, 0),
      "import_vmm");
  std::vector<std::byte> host(8192);
  expect_cuda_error(HostRegistration::register_memory(host.data(), host.size(), 0),
                    "register_memory");
  expect_cuda_error(device_pointer_of_pinned(host.data()), "device_pointer_of_pinned");
  expect_cuda_error(export_device_memory(host.data()), "export_device_memory");
  expect_cuda_error(DeviceBuffer::allocate(4096, 0), "DeviceBuffer::allocate");
  expect_cuda_error(VmmAllocation::create(4096, 0), "VmmAllocation::create");
  expect_cuda_error(IpcEvent::create(0), "IpcEvent::create");
  expect_cuda_error(cuda_copy(host.data(), host.data() + 4096, 16), "cuda_copy");
  expect_cuda_error(cuda_fill(host.data(), 0, 16), "cuda_fill");
}

DeviceBuffer device_buffer(std::size_t bytes) {
  Result<DeviceBuffer> b = DeviceBuffer::allocate(bytes, 0);
  if (!b) throw std::runtime_error(b.error().message);
  return std::move(b).value();
}

MemoryRegion pinned_region(std::size_t bytes) {
  RegionOptions o;
  o.kind = MemoryKind::kPinnedHost;
  Result<MemoryRegion> r = MemoryRegion::allocate(bytes, o);
  if (!r) throw std::runtime_error(r.error().message);
  return std::move(r).value();
}

std::unique_ptr<SegmentCopier> cuda_copier() {
  Result<std::unique_ptr<SegmentCopier>> c = make_cuda_segment_copier(0);
  if (!c) throw std::runtime_error(c.error().message);
  return std::move(c).value();
}

// Runs `plan` from src (holding `src_bytes`) to dst (holding `initial`) on the CUDA copier and
// compares dst with what the host copier makes of the same segments. `read_dst` copies dst out.
void expect_like_host(const test::SegmentPlan& plan, const std::vector<std::byte>& src_bytes,
                      const std::vector<std::byte>& initial, const std::byte* src, std::byte* dst,
                      std::byte* dst_host_view) {
  std::vector<std::byte> host_dst = initial;
  ASSERT_TRUE(
      make_host_segment_copier()->copy(test::bind(plan, src_bytes.data(), host_dst.data())));
  const auto copier = cuda_copier();
  EXPECT_TRUE(copier->on_device());
  EXPECT_STREQ(copier->name(), "cuda kernel");
  const Status copied = copier->copy(test::bind(plan, src, dst));
  ASSERT_TRUE(copied) << copied.error().message;
  const Status synced = copier->synchronize();
  ASSERT_TRUE(synced) << synced.error().message;
  std::vector<std::byte> out(plan.dst_bytes);
  ASSERT_TRUE(cuda_copy(out.data(), dst_host_view, out.size()));
  EXPECT_TRUE(out == host_dst);
}

TEST(CudaIpc, CopierGathersDeviceToDeviceLikeTheHostCopier) {
  SKIP_WITHOUT_GPU();
  const test::SegmentPlan plan = test::plan_segments(600, 11);
  const std::vector<std::byte> src_bytes = test::pattern(plan.src_bytes, 3);
  const std::vector<std::byte> initial = test::pattern(plan.dst_bytes, 4);
  DeviceBuffer src = device_buffer(plan.src_bytes), dst = device_buffer(plan.dst_bytes);
  ASSERT_TRUE(cuda_copy(src.data(), src_bytes.data(), src_bytes.size()));
  ASSERT_TRUE(cuda_copy(dst.data(), initial.data(), initial.size()));
  expect_like_host(plan, src_bytes, initial, src.data(), dst.data(), dst.data());
}

TEST(CudaIpc, CopierReadsPinnedAndRegisteredHostMemory) {
  SKIP_WITHOUT_GPU();
  const test::SegmentPlan plan = test::plan_segments(300, 12);
  const std::vector<std::byte> src_bytes = test::pattern(plan.src_bytes, 5);
  const std::vector<std::byte> initial(plan.dst_bytes);
  {  // pinned -> device
    MemoryRegion pinned = pinned_region(plan.src_bytes);
    std::memcpy(pinned.data(), src_bytes.data(), src_bytes.size());
    Result<std::byte*> src = device_pointer_of_pinned(pinned.data());
    ASSERT_TRUE(src) << src.error().message;
    DeviceBuffer dst = device_buffer(plan.dst_bytes);
    ASSERT_TRUE(cuda_fill(dst.data(), 0, dst.size()));
    expect_like_host(plan, src_bytes, initial, *src, dst.data(), dst.data());
  }
  {  // registered host -> device
    std::vector<std::byte> host = src_bytes;
    Result<HostRegistration> reg = HostRegistration::register_memory(host.data(), host.size(), 0);
    ASSERT_TRUE(reg) << reg.error().message;
    DeviceBuffer dst = device_buffer(plan.dst_bytes);
    ASSERT_TRUE(cuda_fill(dst.data(), 0, dst.size()));
    expect_like_host(plan, src_bytes, initial, reg->device_pointer(), dst.data(), dst.data());
  }
}

TEST(CudaIpc, CopierScattersDeviceToPinned) {
  SKIP_WITHOUT_GPU();
  const test::SegmentPlan plan = test::plan_segments(300, 13);
  const std::vector<std::byte> src_bytes = test::pattern(plan.src_bytes, 6);
  const std::vector<std::byte> initial(plan.dst_bytes);
  DeviceBuffer src = device_buffer(plan.src_bytes);
  ASSERT_TRUE(cuda_copy(src.data(), src_bytes.data(), src_bytes.size()));
  MemoryRegion pinned = pinned_region(plan.dst_bytes);
  std::memset(pinned.data(), 0, plan.dst_bytes);
  Result<std::byte*> dst = device_pointer_of_pinned(pinned.data());
  ASSERT_TRUE(dst) << dst.error().message;
  expect_like_host(plan, src_bytes, initial, src.data(), *dst, pinned.data());
}

TEST(CudaIpc, ManyBatchesQueueInOrderAndGrowTheDescriptors) {
  SKIP_WITHOUT_GPU();
  // Ten batches (more than the copier's staging slots) into the same destination, queued without
  // waiting: they land in order, so the last one's bytes remain.
  constexpr std::size_t kBytes = 8 << 20;
  std::vector<DeviceBuffer> sources;
  for (int i = 0; i < 10; ++i) {
    sources.push_back(device_buffer(kBytes));
    ASSERT_TRUE(cuda_fill(sources.back().data(), i + 1, kBytes));
  }
  DeviceBuffer dst = device_buffer(kBytes);
  const auto copier = cuda_copier();
  for (const DeviceBuffer& src : sources)
    ASSERT_TRUE(copier->copy(std::vector<CopySegment>{{src.data(), dst.data(), kBytes}}));
  ASSERT_TRUE(copier->synchronize());
  std::vector<std::byte> out(kBytes);
  ASSERT_TRUE(cuda_copy(out.data(), dst.data(), kBytes));
  EXPECT_TRUE(out == std::vector<std::byte>(kBytes, std::byte{10}));
  // A batch of 16384 pieces: more descriptors than the copier starts with.
  std::vector<CopySegment> many;
  for (std::size_t at = 0; at < kBytes; at += 512)
    many.push_back({sources[2].data() + at, dst.data() + at, 512});
  ASSERT_TRUE(copier->copy(many));
  ASSERT_TRUE(copier->synchronize());
  ASSERT_TRUE(cuda_copy(out.data(), dst.data(), kBytes));
  EXPECT_TRUE(out == std::vector<std::byte>(kBytes, std::byte{3}));
}

TEST(CudaIpc, ExportNamesTheAllocationBaseAndOffset) {
  SKIP_WITHOUT_GPU();
  DeviceBuffer buffer = device_buffer(3 << 20);
  Result<DeviceExport> e = export_device_memory(buffer.data() + 12345);
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->base, buffer.data());
  EXPECT_EQ(e->offset, 12345u);
  EXPECT_GE(e->bytes, buffer.size());
  EXPECT_NE(e->handle, IpcHandle{});
  std::vector<std::byte> host(64);
  EXPECT_FALSE(export_device_memory(host.data())) << "host memory has no IPC handle";
}

TEST(CudaIpc, IpcEventsRecordAndSynchronizeInTheirProcess) {
  SKIP_WITHOUT_GPU();
  Result<IpcEvent> event = IpcEvent::create(0);
  ASSERT_TRUE(event) << event.error().message;
  EXPECT_NE(event->handle(), IpcHandle{});
  ASSERT_TRUE(event->record_on_default_stream());
  ASSERT_TRUE(event->synchronize());
  IpcEvent moved = std::move(event).value();
  EXPECT_TRUE(moved.synchronize());
}

TEST(CudaIpc, VmmAllocationRoundTripsThroughItsFd) {
  SKIP_WITHOUT_GPU();
  Result<VmmAllocation> vmm = VmmAllocation::create((3 << 20) + 5, 0);
  ASSERT_TRUE(vmm) << vmm.error().message;
  ASSERT_GE(vmm->size(), (3u << 20) + 5);
  const std::vector<std::byte> bytes = test::pattern(vmm->size(), 8);
  ASSERT_TRUE(cuda_copy(vmm->data(), bytes.data(), bytes.size()));
  Result<UniqueFd> fd = vmm->export_fd();
  ASSERT_TRUE(fd) << fd.error().message;
  Result<ImportedDeviceMemory> imported =
      ImportedDeviceMemory::import_vmm(std::move(fd).value(), vmm->size(), 0);
  ASSERT_TRUE(imported) << imported.error().message;
  EXPECT_NE(imported->data(), vmm->data());
  EXPECT_EQ(imported->size(), vmm->size());
  // The same memory at a second address: read through it with the copier, write through it.
  DeviceBuffer copy = device_buffer(vmm->size());
  const auto copier = cuda_copier();
  ASSERT_TRUE(copier->copy(std::vector<CopySegment>{{imported->data(), copy.data(), vmm->size()}}));
  ASSERT_TRUE(copier->synchronize());
  std::vector<std::byte> out(vmm->size());
  ASSERT_TRUE(cuda_copy(out.data(), copy.data(), out.size()));
  EXPECT_TRUE(out == bytes);
  ASSERT_TRUE(cuda_fill(imported->data(), 0x33, 4096));
  ASSERT_TRUE(cuda_copy(out.data(), vmm->data(), 4096));
  EXPECT_EQ(out[0], std::byte{0x33});
  EXPECT_EQ(out[4095], std::byte{0x33});
}

TEST(CudaIpc, DevicePoolPagesAreWrittenAndRead) {
  SKIP_WITHOUT_GPU();
  PoolOptions o;
  o.page_bytes = 1 << 20;
  o.pages = 4;
  o.region.kind = MemoryKind::kDevice;
  Result<ChunkPool> pool = ChunkPool::create(o);
  ASSERT_TRUE(pool) << pool.error().message;
  const std::vector<std::byte> bytes = test::pattern(o.page_bytes, 9);
  const Status written = pool->write(2, bytes);
  ASSERT_TRUE(written) << written.error().message;
  std::vector<std::byte> out(o.page_bytes);
  ASSERT_TRUE(pool->read(2, out));
  EXPECT_TRUE(out == bytes);
  EXPECT_FALSE(pool->write(4, bytes)) << "outside the pool";
  std::vector<std::byte> too_long(o.page_bytes + 1);
  EXPECT_FALSE(pool->read(1, too_long)) << "more than a page";
}

}  // namespace
}  // namespace kvnode::gpu
