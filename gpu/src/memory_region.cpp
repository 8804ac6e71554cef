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

namespace kvnode::gpu {
namespace {

constexpr std::size_t kHugePage = 2u << 20;

// "always [madvise] never": THP helps unless the administrator turned it off.
bool thp_available() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  return std::getline(in, line) && line.find("[never]") == std::string::npos;
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
      detail::cuda_host_free(p);
      break;
    case MemoryKind::kDevice:
      detail::cuda_device_free(p, device);
      break;
  }
}

Result<MemoryRegion> MemoryRegion::allocate(std::size_t bytes, const RegionOptions& options) {
  if (bytes == 0) return make_error("cannot allocate an empty memory region");
  if (options.kind == MemoryKind::kPinnedHost || options.kind == MemoryKind::kDevice) {
    if (!options.shared_name.empty())
      return make_error("only host memory can be shared memory (" + options.shared_name + ")");
    Result<void*> p = options.kind == MemoryKind::kPinnedHost
                          ? detail::cuda_host_alloc(bytes)
                          : detail::cuda_device_alloc(bytes, options.device);
    if (!p) return std::move(p).error();
    return MemoryRegion(
        std::unique_ptr<void, Release>(*p, Release{options.kind, 0, options.device, {}}), bytes);
  }
  // Host: a private anonymous mapping, rounded to whole huge pages when asking for them so the
  // kernel can back all of it with them.
  const bool huge = options.huge_pages && bytes >= kHugePage && thp_available();
  const std::size_t page = huge ? kHugePage : 4096;
  if (bytes > SIZE_MAX - page) return make_error("memory region too large");
  const std::size_t mapped = (bytes + page - 1) / page * page;
  void* p = MAP_FAILED;
  if (options.shared_name.empty()) {
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
  MemoryRegion region(
      std::unique_ptr<void, Release>(p, Release{MemoryKind::kHost, mapped, 0, options.shared_name}),
      bytes);
  if (huge) region.huge_pages_ = madvise(p, mapped, MADV_HUGEPAGE) == 0;
  // mlock faults every page in now (no page faults mid-transfer) and keeps them resident; it
  // fails under a small RLIMIT_MEMLOCK, which locked() reports.
  if (options.lock) region.locked_ = mlock(p, mapped) == 0;
  // Without the lock (RLIMIT_MEMLOCK too small), fault every page in now anyway: a first touch
  // inside a transfer costs far more (measured on these VMs: cma into fresh pages ran at a tenth
  // of its speed). MADV_POPULATE_WRITE keeps the huge pages asked for above (Linux 5.14+).
  if (!region.locked_) {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
    if (madvise(p, mapped, MADV_POPULATE_WRITE) != 0)
      for (std::size_t at = 0; at < mapped; at += 4096) static_cast<volatile char*>(p)[at] = 0;
  }
  return region;
}

}  // namespace kvnode::gpu
