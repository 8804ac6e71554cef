#include "kvnode/gpu/memory_region.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "cuda_memory.hpp"
#include "fault_in.hpp"
#include "kvnode/gpu/region_share.hpp"

namespace kvnode::gpu {
namespace {

constexpr std::size_t kHugePage = 2u << 20;
constexpr std::size_t kSmallPage = 4096;

// "always [madvise] never": THP helps unless the administrator turned it off.
bool thp_available() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  return std::getline(in, line) && line.find("[never]") == std::string::npos;
}

// A memfd of `bytes` mapped shared, for a region that region_share.hpp hands to a peer. Sealed
// at its size, and against further seals, so no process holding it can shrink it under another
// one's mapping (which would fault there with SIGBUS) or forbid its writable mappings.
Result<void*> map_memfd(std::size_t bytes, UniqueFd& fd) {
  UniqueFd memfd(memfd_create("kvnode-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!memfd)
    return make_error(ErrorCode::kIo, std::string("memfd_create: ") + std::strerror(errno));
  if (ftruncate(memfd.get(), static_cast<off_t>(bytes)) != 0 ||
      fcntl(memfd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return make_error(ErrorCode::kIo,
                      "a memfd of " + std::to_string(bytes) + " bytes: " + std::strerror(errno));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0);
  if (p == MAP_FAILED)
    return make_error(ErrorCode::kIo, "mmap of a memfd of " + std::to_string(bytes) +
                                          " bytes: " + std::strerror(errno));
  fd = std::move(memfd);
  return p;
}

}  // namespace

std::string_view to_string(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kPinnedHost:
      return "pinned";
    case MemoryKind::kDevice:
      return "device";
  }
  return "?";
}

Result<MemoryKind> parse_memory_kind(std::string_view name) {
  for (MemoryKind k : {MemoryKind::kHost, MemoryKind::kPinnedHost, MemoryKind::kDevice})
    if (to_string(k) == name) return k;
  return make_error("unknown memory kind '" + std::string(name) + "' (host, pinned or device)");
}

void MemoryRegion::Release::operator()(void* p) const {
  switch (kind) {
    case MemoryKind::kHost:
      munmap(p, mapped);  // drops the mlock too
      if (!shm_name.empty()) shm_unlink(shm_name.c_str());
      break;
    case MemoryKind::kPinnedHost:
      if (registered) {
        detail::cuda_host_unregister(p);
        munmap(p, mapped);
      } else {
        detail::cuda_host_free(p);
      }
      break;
    case MemoryKind::kDevice:
      detail::cuda_device_free(p, device);
      break;
  }
}

Result<MemoryRegion> MemoryRegion::allocate(std::size_t bytes, const RegionOptions& options) {
  if (bytes == 0) return make_error("cannot allocate an empty memory region");
  if (options.shareable && !options.shared_name.empty())
    return make_error(ErrorCode::kInvalid,
                      "a region is shareable (a memfd) or named shared memory (" +
                          options.shared_name + "), not both");
  if (options.kind != MemoryKind::kHost && !options.shared_name.empty())
    return make_error("only host memory can be shared memory (" + options.shared_name + ")");
  if (options.kind == MemoryKind::kDevice ||
      (options.kind == MemoryKind::kPinnedHost && !options.shareable)) {
    Result<void*> p = options.kind == MemoryKind::kPinnedHost
                          ? detail::cuda_host_alloc(bytes)
                          : detail::cuda_device_alloc(bytes, options.device);
    if (!p) return std::move(p).error();
    return MemoryRegion(
        std::unique_ptr<void, Release>(*p, Release{options.kind, 0, options.device, {}}), bytes);
  }
  // Host, or pinned and shareable: a mapping rounded to whole huge pages when asking for them so
  // the kernel can back all of it with them. Private and anonymous, a named shm object, or a
  // memfd (shareable; whose huge pages follow the shmem switch).
  const bool huge = options.huge_pages && bytes >= kHugePage &&
                    (options.shareable ? shmem_huge_pages_available() : thp_available());
  const std::size_t page = huge ? kHugePage : kSmallPage;
  if (bytes > SIZE_MAX - page) return make_error("memory region too large");
  const std::size_t mapped = (bytes + page - 1) / page * page;
  void* p = MAP_FAILED;
  UniqueFd memfd;
  if (options.shareable) {
    Result<void*> m = map_memfd(mapped, memfd);
    if (!m) return std::move(m).error();
    p = *m;
  } else if (options.shared_name.empty()) {
    p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  } else {
    const std::string& name = options.shared_name;
    if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
        name.size() > 250)
      return make_error("shared memory name '" + name + "' must be '/' and a file name");
    // A previous owner that died left its object behind; this process owns the name now.
    shm_unlink(name.c_str());
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return make_error("shm_open " + name + ": " + std::strerror(errno));
    if (ftruncate(fd, static_cast<off_t>(mapped)) == 0)
      // Populated now: where mlock is refused (RLIMIT_MEMLOCK) pages would otherwise fault in
      // during the first transfers into them (measured: 3x slower first moves).
      p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    const int err = errno;
    close(fd);  // the mapping keeps the object alive
    if (p == MAP_FAILED) {
      shm_unlink(name.c_str());
      return make_error("shared memory " + name + " of " + std::to_string(mapped) +
                        " bytes: " + std::strerror(err));
    }
  }
  if (p == MAP_FAILED)
    return make_error("mmap of " + std::to_string(mapped) +
                      " bytes failed: " + std::strerror(errno));
  const bool advised = huge && madvise(p, mapped, MADV_HUGEPAGE) == 0;
  if (options.kind == MemoryKind::kPinnedHost) {
    // Pinned in place. Pinning faults every page in (after the advice above, so huge where
    // shmem allows), and fails before any is touched where CUDA is missing.
    if (Status s = detail::cuda_host_register(p, mapped); !s) {
      munmap(p, mapped);
      return s.error();
    }
    MemoryRegion region(std::unique_ptr<void, Release>(
                            p, Release{MemoryKind::kPinnedHost, mapped, options.device, {}, true}),
                        bytes);
    region.share_fd_ = std::move(memfd);
    region.huge_pages_ = advised;
    return region;
  }
  MemoryRegion region(
      std::unique_ptr<void, Release>(p, Release{MemoryKind::kHost, mapped, 0, options.shared_name}),
      bytes);
  region.share_fd_ = std::move(memfd);
  region.huge_pages_ = advised;
  // Every page faulted in writable now (no page faults mid-transfer), then locked resident (mlock
  // fails under a small RLIMIT_MEMLOCK, which locked() reports). Written first: mlock alone maps
  // shmem pages for reading, and the first store into each then takes a fault (measured: KV
  // stores into such fresh pages ran at half the rate of stores into pages written once).
  if (Status s = fault_in(p, mapped); !s) return wrap_error("a host region: ", s.error());
  if (options.lock) region.locked_ = mlock(p, mapped) == 0;
  return region;
}

}  // namespace kvnode::gpu
