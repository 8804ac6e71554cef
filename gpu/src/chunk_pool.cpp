#include "kvnode/gpu/chunk_pool.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "cuda_memory.hpp"

namespace kvnode::gpu {

Result<std::size_t> page_bytes_for(const KvShape& shape) {
  return chunk_bytes(shape);
}

Result<ChunkPool> ChunkPool::create(const PoolOptions& options) {
  if (options.page_bytes == 0) return make_error("chunk pool: page_bytes must be > 0");
  if (options.pages == 0) return make_error("chunk pool: pages must be > 0");
  if (options.pages > std::numeric_limits<PageId>::max())
    return make_error("chunk pool: at most " + std::to_string(std::numeric_limits<PageId>::max()) +
                      " pages");
  if (options.page_bytes > std::numeric_limits<std::size_t>::max() / options.pages)
    return make_error("chunk pool: page_bytes x pages overflows");
  Result<MemoryRegion> region =
      MemoryRegion::allocate(options.page_bytes * options.pages, options.region);
  if (!region)
    return make_error("chunk pool of " + std::to_string(options.pages) + " x " +
                      std::to_string(options.page_bytes) + " bytes: " + region.error().message);
  return ChunkPool(std::move(region).value(), options.page_bytes, options.pages);
}

ChunkPool::ChunkPool(MemoryRegion region, std::size_t page_bytes, std::size_t pages)
    : region_(std::move(region)), page_bytes_(page_bytes), page_count_(pages), in_use_(pages) {
  // Lowest free page first (a min-heap): pages reserved one after another for a move or a put
  // are adjacent whenever the pool has such room, and the transfer plane then sends them as one
  // run instead of one per chunk (a LIFO list handed them out in reverse after every eviction).
  free_.reserve(pages);
  for (std::size_t i = 0; i < pages; ++i)
    free_.push_back(static_cast<PageId>(i));  // sorted: a heap
}

PageId ChunkPool::pop_lowest() {
  std::pop_heap(free_.begin(), free_.end(), std::greater<>{});
  const PageId page = free_.back();
  free_.pop_back();
  in_use_[page] = true;
  return page;
}

ChunkPool::ChunkPool(ChunkPool&& other) noexcept
    : region_(std::move(other.region_)),
      page_bytes_(other.page_bytes_),
      page_count_(other.page_count_),
      free_(std::move(other.free_)),
      in_use_(std::move(other.in_use_)) {
  other.page_count_ = 0;
}

std::optional<PageId> ChunkPool::allocate() {
  std::lock_guard lock(mutex_);
  if (free_.empty()) return std::nullopt;
  return pop_lowest();
}

std::vector<PageId> ChunkPool::allocate(std::size_t n) {
  std::lock_guard lock(mutex_);
  if (n > free_.size()) return {};
  std::vector<PageId> pages;
  pages.reserve(n);
  while (pages.size() < n) pages.push_back(pop_lowest());
  return pages;
}

Status ChunkPool::release(PageId page) {
  std::lock_guard lock(mutex_);
  if (page >= page_count_)
    return make_error("chunk pool: page " + std::to_string(page) + " is outside the pool (" +
                      std::to_string(page_count_) + " pages)");
  if (!in_use_[page])
    return make_error("chunk pool: page " + std::to_string(page) + " is not in use");
  in_use_[page] = false;
  free_.push_back(page);
  std::push_heap(free_.begin(), free_.end(), std::greater<>{});
  return {};
}

std::byte* ChunkPool::page(PageId page) const {
  return page < page_count_ ? region_.data() + static_cast<std::size_t>(page) * page_bytes_
                            : nullptr;
}

namespace {

// Bounds of a copy into or out of one page.
Status check_page_copy(const ChunkPool& pool, PageId page, std::size_t bytes) {
  if (page >= pool.page_count())
    return make_error(ErrorCode::kInvalid, "chunk pool: page " + std::to_string(page) +
                                               " is outside the pool (" +
                                               std::to_string(pool.page_count()) + " pages)");
  if (bytes > pool.page_bytes())
    return make_error(ErrorCode::kInvalid, "chunk pool: " + std::to_string(bytes) +
                                               " bytes do not fit a page of " +
                                               std::to_string(pool.page_bytes()));
  return {};
}

}  // namespace

Status ChunkPool::write(PageId page, std::span<const std::byte> bytes) {
  if (Status s = check_page_copy(*this, page, bytes.size()); !s) return s;
  if (bytes.empty()) return {};
  std::byte* dst = this->page(page);
  if (region_.kind() == MemoryKind::kDevice)
    return detail::cuda_memcpy(dst, bytes.data(), bytes.size(), region_.device());
  std::memcpy(dst, bytes.data(), bytes.size());
  return {};
}

Status ChunkPool::read(PageId page, std::span<std::byte> out) const {
  if (Status s = check_page_copy(*this, page, out.size()); !s) return s;
  if (out.empty()) return {};
  const std::byte* src = this->page(page);
  if (region_.kind() == MemoryKind::kDevice)
    return detail::cuda_memcpy(out.data(), src, out.size(), region_.device());
  std::memcpy(out.data(), src, out.size());
  return {};
}

bool ChunkPool::contains(PageId first, std::size_t count) const {
  return count <= page_count_ && first <= page_count_ - count;
}

std::size_t ChunkPool::free_pages() const {
  std::lock_guard lock(mutex_);
  return free_.size();
}

}  // namespace kvnode::gpu
