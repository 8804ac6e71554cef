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
#include "kvnode/gpu/cuda_ipc.hpp"
#include "kvnode/gpu/device_probe.hpp"

extern char** environ;

namespace kvnode::gpu {
namespace {

constexpr const char* kChildEnv = "KVNODE_IPC_CHILD_FDS";
constexpr int kToParentFd = 100;  // where the child finds its ends of the two pipes
constexpr int kFromParentFd = 101;
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

bool write_all(int fd, const void* p, std::size_t n) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, b, n);
    if (w <= 0) return false;
    b += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

// Reads n bytes, giving up after `timeout_ms` without any (a hung child fails the test).
bool read_all(int fd, void* p, std::size_t n, int timeout_ms) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, timeout_ms) <= 0) return false;
    const ssize_t r = ::read(fd, b, n);
    if (r <= 0) return false;
    b += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

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

// The child process and the parent's ends of its pipes.
struct Child {
  pid_t pid = -1;
  UniqueFd from_child, to_child;
  Child() = default;
  Child(Child&& o) noexcept
      : pid(std::exchange(o.pid, -1)),
        from_child(std::move(o.from_child)),
        to_child(std::move(o.to_child)) {}
  Child& operator=(Child&&) = delete;
  // A test that failed half-way: closing the pipe ends the child's wait; reap it.
  ~Child() {
    to_child.reset();
    if (pid > 0) ::waitpid(pid, nullptr, 0);
  }
  int wait() {
    int status = 0;
    ::waitpid(std::exchange(pid, -1), &status, 0);
    return status;
  }
};

Result<Child> spawn_child() {
  int up[2], down[2];
  if (::pipe2(up, O_CLOEXEC) != 0) return make_error(ErrorCode::kIo, "pipe2 failed");
  const UniqueFd child_up(up[1]);
  Child child;
  child.from_child.reset(up[0]);
  if (::pipe2(down, O_CLOEXEC) != 0) return make_error(ErrorCode::kIo, "pipe2 failed");
  const UniqueFd child_down(down[0]);
  child.to_child.reset(down[1]);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, child_up.get(), kToParentFd);
  posix_spawn_file_actions_adddup2(&actions, child_down.get(), kFromParentFd);
  posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);  // keep ctest's log
  std::string filter = "--gtest_filter=CudaIpcChild.*";
  std::string exe = "/proc/self/exe";
  std::vector<char*> argv{exe.data(), filter.data(), nullptr};
  std::string marker = std::string(kChildEnv) + "=1";
  std::vector<char*> env{marker.data()};
  for (char** e = environ; *e != nullptr; ++e)  // GTEST_OUTPUT would overwrite the parent's
    if (std::strncmp(*e, "GTEST_", 6) != 0) env.push_back(*e);
  env.push_back(nullptr);
  const int rc = posix_spawn(&child.pid, exe.c_str(), &actions, nullptr, argv.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    child.pid = -1;
    return make_error(ErrorCode::kIo, std::string("posix_spawn: ") + std::strerror(rc));
  }
  return child;
}

TEST(CudaIpcProcess, CopierGathersAndScattersAnotherProcessesMemoryOrderedByEvents) {
  if (probe_cuda().devices.empty()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().note;
  Result<Child> child = spawn_child();
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
