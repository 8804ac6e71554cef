// Shareable chunk memory and its export and import (region_share.hpp) on real memory and real
// processes: a shareable host region mapped twice in one process, a memfd passed to a forked
// child over a Unix socket (SCM_RIGHTS) both ways, an exporter killed under its importer's
// mapping, the imports refused before any mapping, and no descriptor or mapping left behind.
// The pinned and device kinds need a GPU (the device kind a second process: CUDA IPC handles do
// not open in the process that made them) and skip without one.
#include "kvnode/gpu/region_share.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

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

constexpr std::size_t kBytes = (3u << 20) + 123;  // a region that is not whole pages
constexpr int kTimeoutMs = 30000;                 // a peer process that hangs fails the test

bool have_gpu() {
  return !probe_cuda().devices.empty();
}

RegionOptions shareable_host() {
  RegionOptions o;
  o.shareable = true;
  return o;
}

std::byte pattern_byte(std::size_t i, unsigned seed) {
  return static_cast<std::byte>((i * 131 + seed * 7 + (i >> 12)) & 0xff);
}

void fill(std::byte* p, std::size_t n, unsigned seed) {
  for (std::size_t i = 0; i < n; ++i) p[i] = pattern_byte(i, seed);
}

// The first offset that does not hold the pattern; n when all do.
std::size_t first_mismatch(const std::byte* p, std::size_t n, unsigned seed) {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != pattern_byte(i, seed)) return i;
  return n;
}

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  fill(v.data(), n, seed);
  return v;
}

std::size_t open_fds() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd"))
    ++n;
  return n;
}

// Mappings of kvnode's pool memfds in this process (/proc/self/maps names them).
std::size_t pool_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::size_t n = 0;
  for (std::string line; std::getline(maps, line);)
    if (line.find("memfd:kvnode-pool") != std::string::npos) ++n;
  return n;
}

// --- An export across a Unix socket: its fields as bytes, its memfd as SCM_RIGHTS -------------

struct WireExport {
  MemoryKind kind = MemoryKind::kHost;
  std::uint64_t bytes = 0;
  std::uint64_t mapped = 0;
};

bool send_export(int sock, const RegionExport& e) {
  WireExport wire{e.kind, e.bytes, e.mapped};
  iovec iov{&wire, sizeof wire};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  const int fd = e.fd.get();
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return ::sendmsg(sock, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof wire);
}

// Waits at most kTimeoutMs; false on a timeout, a closed socket or a message without its fd.
bool receive_export(int sock, RegionExport& out) {
  pollfd pfd{sock, POLLIN, 0};
  if (::poll(&pfd, 1, kTimeoutMs) <= 0) return false;
  WireExport wire;
  iovec iov{&wire, sizeof wire};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  if (::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) != static_cast<ssize_t>(sizeof wire)) return false;
  const cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) return false;
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  out.kind = wire.kind;
  out.bytes = wire.bytes;
  out.mapped = wire.mapped;
  out.fd.reset(fd);
  return true;
}

struct SocketPair {
  UniqueFd parent, child;
};

SocketPair socket_pair() {
  int sv[2] = {-1, -1};
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  return {UniqueFd(sv[0]), UniqueFd(sv[1])};
}

// Runs `body` in a forked child, which exits with what it returns (never back into gtest).
template <class Body>
pid_t fork_child(Body body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  return pid;
}

int wait_child(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

// --- One process --------------------------------------------------------------------------

TEST(RegionShare, ShareableHostRegionIsBackedByASealedMemfd) {
  Result<MemoryRegion> region = MemoryRegion::allocate(kBytes, shareable_host());
  ASSERT_TRUE(region) << region.error().message;
  EXPECT_EQ(region->kind(), MemoryKind::kHost);
  EXPECT_EQ(region->size(), kBytes);
  ASSERT_GE(region->share_fd(), 0);
  EXPECT_NE(::fcntl(region->share_fd(), F_GETFD) & FD_CLOEXEC, 0);
  const int seals = ::fcntl(region->share_fd(), F_GET_SEALS);
  EXPECT_NE(seals & F_SEAL_SHRINK, 0) << "a peer could shrink it under another's mapping";
  EXPECT_NE(seals & F_SEAL_SEAL, 0);
  fill(region->data(), kBytes, 1);
  EXPECT_EQ(first_mismatch(region->data(), kBytes, 1), kBytes);
}

TEST(RegionShare, HugePagesAreReportedAsShmemAllowsThem) {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string line;
  const bool allowed = std::getline(in, line) && line.find("[never]") == std::string::npos &&
                       line.find("[deny]") == std::string::npos;
  Result<MemoryRegion> region = MemoryRegion::allocate(8u << 20, shareable_host());
  ASSERT_TRUE(region) << region.error().message;
  EXPECT_EQ(region->huge_pages(), allowed) << "shmem_enabled: " << line;
}

TEST(RegionShare, NotShareableRegionsHaveNoMemfd) {
  Result<MemoryRegion> region = MemoryRegion::allocate(kBytes);
  ASSERT_TRUE(region) << region.error().message;
  EXPECT_EQ(region->share_fd(), -1);
  Result<RegionExport> e = export_region(*region);
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code, ErrorCode::kInvalid) << e.error().message;
}

TEST(RegionShare, ShareableAndSharedNameIsAnError) {
  RegionOptions o = shareable_host();
  o.shared_name = "/kvnode-region-share-test";
  Result<MemoryRegion> region = MemoryRegion::allocate(kBytes, o);
  ASSERT_FALSE(region);
  EXPECT_EQ(region.error().code, ErrorCode::kInvalid) << region.error().message;
}

TEST(RegionShare, WritesThroughOneMappingAreReadThroughTheOther) {
  for (const bool populate : {true, false}) {
    Result<MemoryRegion> region = MemoryRegion::allocate(kBytes, shareable_host());
    ASSERT_TRUE(region) << region.error().message;
    Result<RegionExport> e = export_region(*region);
    ASSERT_TRUE(e) << e.error().message;
    EXPECT_EQ(e->kind, MemoryKind::kHost);
    EXPECT_EQ(e->bytes, kBytes);
    EXPECT_GE(e->mapped, kBytes);
    EXPECT_EQ(e->mapped % 4096, 0u);
    ASSERT_TRUE(e->fd);
    EXPECT_NE(e->fd.get(), region->share_fd()) << "the export must own a duplicate";
    ImportOptions options;
    options.populate = populate;
    Result<MappedRegion> mapped = MappedRegion::import(std::move(*e), options);
    ASSERT_TRUE(mapped) << mapped.error().message;
    EXPECT_NE(mapped->data(), region->data());
    EXPECT_EQ(mapped->size(), kBytes);
    EXPECT_EQ(mapped->kind(), MemoryKind::kHost);
    EXPECT_FALSE(mapped->device_memory());
    EXPECT_FALSE(mapped->cuda_registered());
    fill(region->data(), kBytes, 2);
    EXPECT_EQ(first_mismatch(mapped->data(), kBytes, 2), kBytes) << "populate " << populate;
    fill(mapped->data(), kBytes, 3);
    EXPECT_EQ(first_mismatch(region->data(), kBytes, 3), kBytes) << "populate " << populate;
  }
}

TEST(RegionShare, MappingOutlivesTheExportingRegion) {
  Result<MappedRegion> mapped = make_error("not imported");
  {
    Result<MemoryRegion> region = MemoryRegion::allocate(kBytes, shareable_host());
    ASSERT_TRUE(region) << region.error().message;
    fill(region->data(), kBytes, 4);
    Result<RegionExport> e = export_region(*region);
    ASSERT_TRUE(e) << e.error().message;
    mapped = MappedRegion::import(std::move(*e), {});
    ASSERT_TRUE(mapped) << mapped.error().message;
  }
  EXPECT_EQ(first_mismatch(mapped->data(), kBytes, 4), kBytes);
  fill(mapped->data(), kBytes, 5);
  EXPECT_EQ(first_mismatch(mapped->data(), kBytes, 5), kBytes);
}

// --- Refusals, before any mapping ----------------------------------------------------------

TEST(RegionShare, ImportRefusesAMappingPastTheMemfdsEnd) {
  Result<MemoryRegion> region = MemoryRegion::allocate(kBytes, shareable_host());
  ASSERT_TRUE(region) << region.error().message;
  Result<RegionExport> e = export_region(*region);
  ASSERT_TRUE(e) << e.error().message;
  const std::size_t before = pool_mappings();
  e->mapped += 4096;
  Result<MappedRegion> mapped = MappedRegion::import(std::move(*e), {});
  ASSERT_FALSE(mapped);
  EXPECT_EQ(mapped.error().code, ErrorCode::kInvalid) << mapped.error().message;
  EXPECT_EQ(pool_mappings(), before) << "a refused import mapped the memfd";
}

TEST(RegionShare, ImportRefusesMalformedExports) {
  Result<MemoryRegion> region = MemoryRegion::allocate(kBytes, shareable_host());
  ASSERT_TRUE(region) << region.error().message;
  auto expect_invalid = [](Result<RegionExport> e, auto&& spoil, const char* what) {
    ASSERT_TRUE(e) << e.error().message;
    spoil(*e);
    Result<MappedRegion> mapped = MappedRegion::import(std::move(*e), {});
    ASSERT_FALSE(mapped) << what;
    EXPECT_EQ(mapped.error().code, ErrorCode::kInvalid) << what << ": " << mapped.error().message;
  };
  const std::size_t before = pool_mappings();
  expect_invalid(
      export_region(*region), [](RegionExport& e) { e.bytes = 0; }, "bytes 0");
  expect_invalid(
      export_region(*region), [](RegionExport& e) { e.bytes = e.mapped + 1; }, "bytes > mapped");
  expect_invalid(
      export_region(*region), [](RegionExport& e) { e.fd.reset(); }, "no fd");
  expect_invalid(
      export_region(*region),
      [](RegionExport& e) {
        e.kind = MemoryKind::kPinnedHost;
        e.fd.reset();
      },
      "pinned without fd");
  expect_invalid(
      export_region(*region),
      [](RegionExport& e) {
        int p[2];
        ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
        ::close(p[1]);
        e.fd.reset(p[0]);
      },
      "a pipe for a memfd");
  // An unsealed memfd of the right size: its exporter could shrink it under our mapping.
  expect_invalid(
      export_region(*region),
      [](RegionExport& e) {
        UniqueFd unsealed(::memfd_create("unsealed", MFD_CLOEXEC));
        ASSERT_TRUE(unsealed);
        ASSERT_EQ(::ftruncate(unsealed.get(), static_cast<off_t>(e.mapped)), 0);
        e.fd = std::move(unsealed);
      },
      "an unsealed memfd");
  expect_invalid(
      export_region(*region), [](RegionExport& e) { e.kind = static_cast<MemoryKind>(17); },
      "an unknown kind");
  EXPECT_EQ(pool_mappings(), before);
}

TEST(RegionShare, DeviceImportWithoutACudaDeviceIsRefused) {
  RegionExport e;
  e.kind = MemoryKind::kDevice;
  e.bytes = 1 << 20;
  e.ipc.fill(std::byte{1});
  Result<MappedRegion> mapped = MappedRegion::import(std::move(e), {});  // device -1
  ASSERT_FALSE(mapped);
  EXPECT_EQ(mapped.error().code, ErrorCode::kRefused) << mapped.error().message;

  RegionExport no_handle;
  no_handle.kind = MemoryKind::kDevice;
  no_handle.bytes = 1 << 20;
  ImportOptions on_device;
  on_device.device = 0;
  mapped = MappedRegion::import(std::move(no_handle), on_device);
  ASSERT_FALSE(mapped);
  EXPECT_EQ(mapped.error().code, ErrorCode::kInvalid) << mapped.error().message;
}

TEST(RegionShare, ExportsAndImportsLeaveNoDescriptorOrMappingBehind) {
  Result<MemoryRegion> region = MemoryRegion::allocate(kBytes, shareable_host());
  ASSERT_TRUE(region) << region.error().message;
  const std::size_t fds = open_fds();
  const std::size_t maps = pool_mappings();
  for (int i = 0; i < 50; ++i) {
    Result<RegionExport> e = export_region(*region);
    ASSERT_TRUE(e) << e.error().message;
    Result<MappedRegion> mapped = MappedRegion::import(std::move(*e), {});
    ASSERT_TRUE(mapped) << mapped.error().message;
    mapped->data()[i] = std::byte{1};
    Result<RegionExport> too_large = export_region(*region);
    ASSERT_TRUE(too_large) << too_large.error().message;
    too_large->mapped += 4096;
    EXPECT_FALSE(MappedRegion::import(std::move(*too_large), {}));
    Result<MemoryRegion> another = MemoryRegion::allocate(64 << 10, shareable_host());
    ASSERT_TRUE(another) << another.error().message;
  }
  EXPECT_EQ(open_fds(), fds);
  EXPECT_EQ(pool_mappings(), maps);
}

// --- Across processes (fork; the memfd travels over a socketpair) --------------------------

TEST(RegionShareProcess, ChildImportsAndWritesParentReads) {
  Result<MemoryRegion> region = MemoryRegion::allocate(kBytes, shareable_host());
  ASSERT_TRUE(region) << region.error().message;
  fill(region->data(), kBytes, 0);
  SocketPair sockets = socket_pair();
  const pid_t pid = fork_child([&sockets] {
    sockets.parent.reset();
    RegionExport e;
    if (!receive_export(sockets.child.get(), e)) return 2;
    Result<MappedRegion> mapped = MappedRegion::import(std::move(e), {});
    if (!mapped) return 3;
    if (mapped->size() != kBytes || mapped->kind() != MemoryKind::kHost) return 4;
    fill(mapped->data(), kBytes, 6);
    return 0;
  });
  ASSERT_GT(pid, 0);
  sockets.child.reset();
  Result<RegionExport> e = export_region(*region);
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_TRUE(send_export(sockets.parent.get(), *e));
  const int status = wait_child(pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_EQ(first_mismatch(region->data(), kBytes, 6), kBytes);
}

TEST(RegionShareProcess, ExporterKilledAfterTheImportLeavesTheMappingWhole) {
  SocketPair sockets = socket_pair();
  const pid_t pid = fork_child([&sockets] {
    sockets.parent.reset();
    Result<MemoryRegion> region = MemoryRegion::allocate(kBytes, shareable_host());
    if (!region) return 2;
    fill(region->data(), kBytes, 7);
    Result<RegionExport> e = export_region(*region);
    if (!e || !send_export(sockets.child.get(), *e)) return 3;
    char never = 0;  // until killed
    while (::read(sockets.child.get(), &never, 1) != 0) {
    }
    return 4;
  });
  ASSERT_GT(pid, 0);
  sockets.child.reset();
  RegionExport e;
  const bool got = receive_export(sockets.parent.get(), e);
  if (!got) ::kill(pid, SIGKILL);
  ASSERT_TRUE(got) << "the child sent no export";
  Result<MappedRegion> mapped = MappedRegion::import(std::move(e), {});
  ::kill(pid, SIGKILL);
  const int status = wait_child(pid);
  ASSERT_TRUE(mapped) << mapped.error().message;
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child status " << status;
  EXPECT_EQ(first_mismatch(mapped->data(), kBytes, 7), kBytes);
  fill(mapped->data(), kBytes, 8);
  EXPECT_EQ(first_mismatch(mapped->data(), kBytes, 8), kBytes);
}

// --- Pinned memory (a GPU) --------------------------------------------------------------------

TEST(RegionShareCuda, PinnedShareableWithoutAGpuIsAClearError) {
  if (have_gpu())
    GTEST_SKIP() << "a GPU is present: see PinnedShareableRegionIsRegisteredAndMapped";
  const std::size_t fds = open_fds();
  const std::size_t maps = pool_mappings();
  RegionOptions o = shareable_host();
  o.kind = MemoryKind::kPinnedHost;
  Result<MemoryRegion> region = MemoryRegion::allocate(kBytes, o);
  ASSERT_FALSE(region);
  const std::string& m = region.error().message;
  EXPECT_TRUE(m.find("CUDA") != std::string::npos || m.find("cuda") != std::string::npos) << m;
  EXPECT_EQ(open_fds(), fds);
  EXPECT_EQ(pool_mappings(), maps);
}

TEST(RegionShareCuda, PinnedShareableRegionIsRegisteredAndMapped) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().note;
  RegionOptions o = shareable_host();
  o.kind = MemoryKind::kPinnedHost;
  Result<MemoryRegion> region = MemoryRegion::allocate(kBytes, o);
  ASSERT_TRUE(region) << region.error().message;
  EXPECT_EQ(region->kind(), MemoryKind::kPinnedHost);
  ASSERT_GE(region->share_fd(), 0);
  fill(region->data(), kBytes, 9);
  Result<DeviceBuffer> device = DeviceBuffer::allocate(kBytes, 0);
  ASSERT_TRUE(device) << device.error().message;
  std::vector<std::byte> back(kBytes);
  ASSERT_TRUE(cuda_copy(device->data(), region->data(), kBytes));  // pinned in this process
  ASSERT_TRUE(cuda_copy(back.data(), device->data(), kBytes));
  EXPECT_TRUE(back == pattern(kBytes, 9));

  Result<RegionExport> e = export_region(*region);
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->kind, MemoryKind::kPinnedHost);
  ImportOptions options;
  options.device = 0;
  options.register_with_cuda = true;
  Result<MappedRegion> mapped = MappedRegion::import(std::move(*e), options);
  ASSERT_TRUE(mapped) << mapped.error().message;
  EXPECT_TRUE(mapped->cuda_registered());
  EXPECT_FALSE(mapped->device_memory());
  EXPECT_EQ(mapped->kind(), MemoryKind::kPinnedHost);
  const std::vector<std::byte> in = pattern(kBytes, 10);
  ASSERT_TRUE(cuda_copy(device->data(), in.data(), kBytes));
  ASSERT_TRUE(cuda_copy(mapped->data(), device->data(), kBytes));  // into the second mapping
  EXPECT_EQ(first_mismatch(region->data(), kBytes, 10), kBytes);
}

// --- Device memory across a process boundary (a GPU; CUDA forbids fork after init) ---------

constexpr const char* kChildEnv = "KVNODE_REGION_SHARE_CHILD";
constexpr unsigned kChildSeed = 11;   // what the exporting child writes
constexpr unsigned kParentSeed = 12;  // what the importing parent writes back

struct WireDeviceExport {
  IpcHandle ipc{};
  std::uint64_t bytes = 0;
  int device = 0;
};

// The exporting side; runs only as the child RegionShareCuda.DeviceRegionCrossesAProcess starts.
TEST(RegionShareChild, ExportsADeviceRegion) {
  if (std::getenv(kChildEnv) == nullptr) GTEST_SKIP() << "runs only as a RegionShareCuda child";
  RegionOptions o;
  o.kind = MemoryKind::kDevice;
  o.shareable = true;
  Result<MemoryRegion> region = MemoryRegion::allocate(kBytes, o);
  ASSERT_TRUE(region) << region.error().message;
  EXPECT_EQ(region->share_fd(), -1);
  ASSERT_TRUE(cuda_copy(region->data(), pattern(kBytes, kChildSeed).data(), kBytes));
  Result<RegionExport> e = export_region(*region);
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->bytes, kBytes);
  EXPECT_FALSE(e->fd);
  const WireDeviceExport wire{e->ipc, e->bytes, e->device};
  ASSERT_TRUE(write_all(kToParentFd, &wire, sizeof wire));
  char done = 0;
  ASSERT_TRUE(read_all(kFromParentFd, &done, 1, 4 * kTimeoutMs));  // the parent wrote and unmapped
  std::vector<std::byte> back(kBytes);
  ASSERT_TRUE(cuda_copy(back.data(), region->data(), kBytes));
  const char ok = back == pattern(kBytes, kParentSeed) ? 1 : 0;
  ASSERT_TRUE(write_all(kToParentFd, &ok, 1));
}

TEST(RegionShareCuda, DeviceRegionCrossesAProcess) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().note;
  Result<SelfChild> child = spawn_self_child("RegionShareChild.*", kChildEnv);
  ASSERT_TRUE(child) << child.error().message;
  WireDeviceExport wire;
  const bool got = read_all(child->from_child.get(), &wire, sizeof wire, 4 * kTimeoutMs);
  if (!got) ::kill(child->pid, SIGKILL);  // hung or failed; reaped by ~Child
  ASSERT_TRUE(got) << "the child sent no export";
  EXPECT_EQ(wire.bytes, kBytes);
  {
    RegionExport e;
    e.kind = MemoryKind::kDevice;
    e.bytes = wire.bytes;
    e.device = wire.device;
    e.ipc = wire.ipc;
    ImportOptions options;
    options.device = 0;
    Result<MappedRegion> mapped = MappedRegion::import(std::move(e), options);
    ASSERT_TRUE(mapped) << mapped.error().message;
    EXPECT_TRUE(mapped->device_memory());
    EXPECT_FALSE(mapped->cuda_registered());
    EXPECT_EQ(mapped->size(), kBytes);
    std::vector<std::byte> back(kBytes);
    ASSERT_TRUE(cuda_copy(back.data(), mapped->data(), kBytes));
    EXPECT_TRUE(back == pattern(kBytes, kChildSeed));
    ASSERT_TRUE(cuda_copy(mapped->data(), pattern(kBytes, kParentSeed).data(), kBytes));
  }  // closed before the child frees its memory
  const char done = 1;
  ASSERT_TRUE(write_all(child->to_child.get(), &done, 1));
  char ok = 0;
  EXPECT_TRUE(read_all(child->from_child.get(), &ok, 1, 4 * kTimeoutMs));
  EXPECT_EQ(ok, 1) << "the child did not see the parent's bytes";
  const int status = child->wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

}  // namespace
}  // namespace kvnode::gpu
