// One contiguous block of chunk memory of a given kind, owned RAII: host memory (mmap, huge pages
// and mlock when the host allows, both best effort and reported), pinned host memory
// (cudaHostAlloc) or device memory (cudaMalloc). The CUDA kinds need a build with the CUDA runtime
// and a driver with a GPU at run time; without them allocate() says so and nothing else breaks.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "kvnode/common/result.hpp"

namespace kvnode::gpu {

enum class MemoryKind { kHost, kPinnedHost, kDevice };

std::string_view to_string(MemoryKind kind);               // "host", "pinned", "device"
Result<MemoryKind> parse_memory_kind(std::string_view name);

struct RegionOptions {
  MemoryKind kind = MemoryKind::kHost;
  int device = 0;           // CUDA device of kDevice memory
  bool huge_pages = true;   // kHost: ask for transparent huge pages
  bool lock = true;         // kHost: mlock, so the pages never swap; best effort
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

 private:
  struct Release {
    MemoryKind kind = MemoryKind::kHost;
    std::size_t mapped = 0;  // kHost: length of the mapping
    int device = 0;
    void operator()(void* p) const;
  };
  MemoryRegion(std::unique_ptr<void, Release> memory, std::size_t bytes)
      : memory_(std::move(memory)), bytes_(bytes) {}

  std::unique_ptr<void, Release> memory_;
  std::size_t bytes_ = 0;
  bool locked_ = false;
  bool huge_pages_ = false;
};

}  // namespace kvnode::gpu
