// The node's chunk memory: one MemoryRegion split into fixed-size pages, one page per KV chunk.
// The region is registered with the transfer plane once, so moving a chunk never registers
// memory. Pages are handed out and returned in O(1) (a free stack); returning a page twice or one
// that was never handed out is an error, not a corrupted free list. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/gpu/kv_shape.hpp"
#include "kvnode/gpu/memory_region.hpp"

namespace kvnode::gpu {

using PageId = std::uint32_t;

struct PoolOptions {
  std::size_t page_bytes = 0;  // one chunk; see page_bytes_for() to derive it from a KV shape
  std::size_t pages = 0;
  RegionOptions region;
};

// The page size for a KV shape's chunks (chunk_bytes(shape)).
Result<std::size_t> page_bytes_for(const KvShape& shape);

class ChunkPool {
 public:
  static Result<ChunkPool> create(const PoolOptions& options);

  ChunkPool(ChunkPool&& other) noexcept;
  ChunkPool& operator=(ChunkPool&&) = delete;

  // A free page, or nullopt when every page is in use.
  std::optional<PageId> allocate();
  // Up to n pages at once, all or nothing: empty when fewer than n are free.
  std::vector<PageId> allocate(std::size_t n);
  Status release(PageId page);

  // Address of a page; nullptr when the id is outside the pool.
  std::byte* page(PageId page) const;
  // Copies host bytes into a page and a page out to host memory, whatever the pool's memory
  // (cudaMemcpy for device pools, memcpy otherwise): how local clients' staged chunks reach a
  // device pool. `bytes` at most a page; an error for a page outside the pool or a CUDA failure.
  Status write(PageId page, std::span<const std::byte> bytes);
  Status read(PageId page, std::span<std::byte> out) const;
  // Whether pages [first, first + count) all lie in the pool (peers' requests are checked so).
  bool contains(PageId first, std::size_t count) const;

  std::size_t page_bytes() const { return page_bytes_; }
  std::size_t page_count() const { return page_count_; }
  std::size_t free_pages() const;
  const MemoryRegion& region() const { return region_; }

 private:
  ChunkPool(MemoryRegion region, std::size_t page_bytes, std::size_t pages);
  PageId pop_lowest();  // mutex_ held, free_ not empty

  MemoryRegion region_;
  std::size_t page_bytes_;
  std::size_t page_count_;
  mutable std::mutex mutex_;
  std::vector<PageId> free_;  // free pages, a min-heap (lowest first)
  std::vector<bool> in_use_;
};

}  // namespace kvnode::gpu
