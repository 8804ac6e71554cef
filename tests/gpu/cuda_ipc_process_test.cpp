// CUDA IPC across a process boundary, as between an engine and the node: a child process (this
// test binary again, running CudaIpcChild) plays the engine. It exports a cudaMalloc allocation
// and two interprocess events; the parent (the node) maps the allocation, waits on the first
// event, gathers half of the child's buffer and scatters into the other half with the CUDA
// copier, and records the second event, on which the child waits before checking its memory.
// Skipped without a GPU (the handles cannot be opened in the process that made them).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gpu/segment_plan.hpp"
#include "gpu/self_child.hpp"
#include "kvnode/gpu/cuda_ipc.hpp"
#include "kvnode/gpu/device_probe.hpp"

namespace kvnode::gpu {
namespace {

using test::kFromParentFd;
using test::kToParentFd;
using test::read_all;
using test::SelfChild;
using test::spawn_self_child;
using test::write_all;

constexpr const char* kChildEnv = "KVNODE_IPC_CHILD_FDS";
constexpr std::size_t kHalf = (1 << 20) + 48;  // the copied halves, after kOffset
constexpr std::size_t kOffset = 4096 + 16;     // the exported tensor's offset in its allocation
constexpr unsigned kGatherSeed = 21;           // the child's first half
constexpr unsigned kScatterSeed = 22;          // what the parent writes into the second half

struct Exported {
  IpcHandle memory{};
  std::uint64_t bytes = 0;   // the allocation's
  std::uint64_t offset = 0;  // of the tensor in it
  IpcHandle written{};       // recorded by the child once its bytes are in place
  IpcHandle copied{};        // recorded by the parent once its copies landed
};

// The engine's side; runs only when the parent test started this binary with kChildEnv set.
TEST(CudaIpcChild, ExportsMemoryAndEventsToTheParent) {
  const char* fds = std::getenv(kChildEnv);
  if (fds == nullptr) GTEST_SKIP() << "runs only as the child of CudaIpcProcess";
  Result<DeviceBuffer> buffer = DeviceBuffer::allocate(kOffset + 2 * kHalf, 0);
  ASSERT_TRUE(buffer) << buffer.error().message;
  std::byte* tensor = buffer->data() + kOffset;
  const std::vector<std::byte> first = test::pattern(kHalf, kGatherSeed);
  ASSERT_TRUE(cuda_copy(tensor, first.data(), kHalf));
  ASSERT_TRUE(cuda_fill(tensor + kHalf, 0, kHalf));
  Result<IpcEvent> written = IpcEvent::create(0), copied = IpcEvent::create(0);
  ASSERT_TRUE(written && copied);
  ASSERT_TRUE(written->record_on_default_stream());
  Result<DeviceExport> e = export_device_memory(tensor);
  ASSERT_TRUE(e) << e.error().message;
  Exported out;
  out.memory = e->handle;
  out.bytes = e->bytes;
  out.offset = e->offset;
  out.written = written->handle();
  out.copied = copied->handle();
  ASSERT_TRUE(write_all(kToParentFd, &out, sizeof out));
  char done = 0;
  ASSERT_TRUE(read_all(kFromParentFd, &done, 1, 120000));  // the parent unmapped the buffer
  ASSERT_TRUE(copied->synchronize());
  std::vector<std::byte> second(kHalf);
  ASSERT_TRUE(cuda_copy(second.data(), tensor + kHalf, kHalf));
  const char ok = second == test::pattern(kHalf, kScatterSeed) ? 1 : 0;
  EXPECT_EQ(ok, 1) << "the parent's scatter did not land in the child's memory";
  ASSERT_TRUE(write_all(kToParentFd, &ok, 1));
}

TEST(CudaIpcProcess, CopierGathersAndScattersAnotherProcessesMemoryOrderedByEvents) {
  if (probe_cuda().devices.empty()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().note;
  Result<SelfChild> child = spawn_self_child("CudaIpcChild.*", kChildEnv);
  ASSERT_TRUE(child) << child.error().message;
  Exported in;
  const bool got = read_all(child->from_child.get(), &in, sizeof in, 120000);
  if (!got) ::kill(child->pid, SIGKILL);  // hung; reaped by ~Child
  ASSERT_TRUE(got) << "the child sent no handles";
  EXPECT_EQ(in.offset, kOffset);
  {
    Result<ImportedDeviceMemory> imported = ImportedDeviceMemory::open_ipc(in.memory, in.bytes, 0);
    ASSERT_TRUE(imported) << imported.error().message;
    std::byte* remote = imported->data() + in.offset;
    Result<DeviceBuffer> local = DeviceBuffer::allocate(2 * kHalf, 0);
    ASSERT_TRUE(local) << local.error().message;
    const std::vector<std::byte> scatter = test::pattern(kHalf, kScatterSeed);
    ASSERT_TRUE(cuda_copy(local->data() + kHalf, scatter.data(), kHalf));
    // Gather the child's first half in uneven segments; scatter into its second half whole.
    std::vector<CopySegment> segments;
    for (std::size_t at = 0; at < kHalf; at += 7000)
      segments.push_back(
          {remote + at, local->data() + at, std::min<std::size_t>(7000, kHalf - at)});
    segments.push_back({local->data() + kHalf, remote + kHalf, kHalf});
    Result<std::unique_ptr<SegmentCopier>> copier = make_cuda_segment_copier(0);
    ASSERT_TRUE(copier) << copier.error().message;
    const Status waited = (*copier)->wait(in.written);
    ASSERT_TRUE(waited) << waited.error().message;
    ASSERT_TRUE((*copier)->copy(segments));
    const Status recorded = (*copier)->record(in.copied);
    ASSERT_TRUE(recorded) << recorded.error().message;
    ASSERT_TRUE((*copier)->synchronize());
    std::vector<std::byte> gathered(kHalf);
    ASSERT_TRUE(cuda_copy(gathered.data(), local->data(), kHalf));
    EXPECT_TRUE(gathered == test::pattern(kHalf, kGatherSeed));
  }  // unmapped before the child frees its buffer
  const char done = 1;
  ASSERT_TRUE(write_all(child->to_child.get(), &done, 1));
  char ok = 0;
  EXPECT_TRUE(read_all(child->from_child.get(), &ok, 1, 120000));
  EXPECT_EQ(ok, 1) << "the child did not see the scattered bytes";
  const int status = child->wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

}  // namespace
}  // namespace kvnode::gpu
