// One contiguous block of chunk memory of a given kind, owned RAII: host memory (mmap, huge pages
// and mlock when the host allows, both best effort and reported), pinned host memory
// (cudaHostAlloc) or device memory (cudaMalloc). The CUDA kinds need a build with the CUDA runtime
// and a driver with a GPU at run time; without them allocate() says so and nothing else breaks.
// Host memory may be a named POSIX shared-memory object instead (shared_name), so a client
// process on the same host can map the pool and read or write chunks without a copy through a
// socket; the object is owner-only (0600) and unlinked when the region is released.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "kvnode/common/result.hpp"
#include "kvnode/common/unique_fd.hpp"

namespace kvnode::gpu {

enum class MemoryKind { kHost, kPinnedHost, kDevice };

std::string_view to_string(MemoryKind kind);  // "host", "pinned", "device"
Result<MemoryKind> parse_memory_kind(std::string_view name);

struct RegionOptions {
  MemoryKind kind = MemoryKind::kHost;
  int device = 0;           // CUDA device of kDevice memory
  bool huge_pages = true;   // kHost: ask for transparent huge pages
  bool lock = true;         // kHost: mlock, so the pages never swap; best effort
  std::string shared_name;  // kHost: "/name" of a POSIX shm object to map; "" = anonymous
  // kHost and kPinnedHost: backed by a memfd (kPinnedHost then pinned with cudaHostRegister in
  // place of cudaHostAlloc) so region_share.hpp can hand it to a peer on this host. Huge pages
  // then need shmem THP (/sys/kernel/mm/transparent_hugepage/shmem_enabled: advise or always).
  bool shareable = false;
};

class MemoryRegion {
 public:
  static Result<MemoryRegion> allocate(std::size_t bytes, const RegionOptions& options = {});

  MemoryRegion(MemoryRegion&&) noexcept = default;
  MemoryRegion& operator=(MemoryRegion&&) noexcept = default;

  std::byte* data() const { return static_cast<std::byte*>(memory_.get()); }
  std::size_t size() const { return bytes_; }
  MemoryKind kind() const { return memory_.get_deleter().kind; }
  int device() const { return memory_.get_deleter().device; }
  bool locked() const { return locked_; }          // kHost: mlock succeeded
  bool huge_pages() const { return huge_pages_; }  // kHost: THP asked for and not disabled
  // The memfd behind a shareable host or pinned region; -1 otherwise.
  int share_fd() const { return share_fd_.get(); }
  const std::string& shared_name() const {
    return memory_.get_deleter().shm_name;
  }  // "" unless shared

 private:
  struct Release {
    MemoryKind kind = MemoryKind::kHost;
    std::size_t mapped = 0;  // kHost: length of the mapping
    int device = 0;
    std::string shm_name;  // kHost shared: unlinked on release
    // kPinnedHost shareable: a memfd mapping of `mapped` bytes pinned with cudaHostRegister
    // (unregistered, then unmapped), not cudaHostAlloc memory.
    bool registered = false;
    void operator()(void* p) const;
  };
  MemoryRegion(std::unique_ptr<void, Release> memory, std::size_t bytes)
      : memory_(std::move(memory)), bytes_(bytes) {}

  std::unique_ptr<void, Release> memory_;
  UniqueFd share_fd_;  // the memfd of a shareable region (the mapping alone keeps it alive)
  std::size_t bytes_ = 0;
  bool locked_ = false;
  bool huge_pages_ = false;
};

}  // namespace kvnode::gpu
