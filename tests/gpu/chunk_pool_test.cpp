// The chunk pool over real host memory: O(1) pages that never overlap, exhaustion, all-or-nothing
// batches, misuse reported as errors, and the CUDA kinds (skipped, with the reason, without a GPU).
#include "kvnode/gpu/chunk_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <thread>

#include "kvnode/gpu/device_probe.hpp"

namespace kvnode::gpu {
namespace {

PoolOptions options(std::size_t page_bytes, std::size_t pages,
                    MemoryKind kind = MemoryKind::kHost) {
  PoolOptions o;
  o.page_bytes = page_bytes;
  o.pages = pages;
  o.region.kind = kind;
  return o;
}

ChunkPool make_pool(std::size_t page_bytes, std::size_t pages) {
  auto pool = ChunkPool::create(options(page_bytes, pages));
  if (!pool) throw std::runtime_error(pool.error().message);
  return std::move(pool).value();
}

TEST(ChunkPool, PagesAreDistinctWritableAndInsideTheRegion) {
  ChunkPool pool = make_pool(64 << 10, 16);
  EXPECT_EQ(pool.page_count(), 16u);
  EXPECT_EQ(pool.free_pages(), 16u);
  EXPECT_GE(pool.region().size(), 16u * (64 << 10));
  std::set<PageId> seen;
  for (int i = 0; i < 16; ++i) {
    const auto p = pool.allocate();
    ASSERT_TRUE(p);
    EXPECT_TRUE(seen.insert(*p).second);
    std::memset(pool.page(*p), static_cast<int>(*p), pool.page_bytes());  // faults if out of bounds
  }
  EXPECT_FALSE(pool.allocate()) << "exhausted";
  EXPECT_EQ(pool.free_pages(), 0u);
  // Each page kept its own bytes: no two pages overlap.
  for (PageId p : seen) {
    const std::byte* b = pool.page(p);
    EXPECT_EQ(b[0], static_cast<std::byte>(p));
    EXPECT_EQ(b[pool.page_bytes() - 1], static_cast<std::byte>(p));
    EXPECT_EQ(b, pool.region().data() + p * pool.page_bytes());
  }
  ASSERT_TRUE(pool.release(3));
  EXPECT_EQ(pool.allocate(), std::optional<PageId>(3));
}

// Pages reserved one after another must be adjacent where the pool has room: the transfer plane
// sends adjacent pages as one run. Freed in order, they come back lowest first, not reversed.
TEST(ChunkPool, TheLowestFreePageComesFirst) {
  ChunkPool pool = make_pool(4096, 8);
  std::vector<PageId> first;
  for (int i = 0; i < 8; ++i) first.push_back(pool.allocate().value());
  EXPECT_EQ(first, (std::vector<PageId>{0, 1, 2, 3, 4, 5, 6, 7}));
  for (PageId p : {2, 3, 4, 5}) ASSERT_TRUE(pool.release(p));  // a move's chunks leave in order
  std::vector<PageId> again;
  for (int i = 0; i < 4; ++i) again.push_back(pool.allocate().value());
  EXPECT_EQ(again, (std::vector<PageId>{2, 3, 4, 5}));
  for (PageId p : {7, 1, 5, 3}) ASSERT_TRUE(pool.release(p));
  EXPECT_EQ(pool.allocate(3), (std::vector<PageId>{1, 3, 5}));
  EXPECT_EQ(pool.allocate(), std::optional<PageId>(7));
}

TEST(ChunkPool, BatchesAreAllOrNothing) {
  ChunkPool pool = make_pool(4096, 10);
  EXPECT_EQ(pool.allocate(7).size(), 7u);
  EXPECT_TRUE(pool.allocate(4).empty());
  EXPECT_EQ(pool.free_pages(), 3u);
  EXPECT_EQ(pool.allocate(3).size(), 3u);
}

TEST(ChunkPool, MisuseIsAnErrorNotACorruptFreeList) {
  ChunkPool pool = make_pool(4096, 4);
  const auto p = pool.allocate();
  ASSERT_TRUE(p);
  ASSERT_TRUE(pool.release(*p));
  const Status twice = pool.release(*p);
  ASSERT_FALSE(twice);
  EXPECT_NE(twice.error().message.find("not in use"), std::string::npos);
  const Status outside = pool.release(4);
  ASSERT_FALSE(outside);
  EXPECT_NE(outside.error().message.find("outside the pool"), std::string::npos);
  EXPECT_EQ(pool.free_pages(), 4u);
  EXPECT_EQ(pool.page(4), nullptr);
  EXPECT_TRUE(pool.contains(0, 4));
  EXPECT_TRUE(pool.contains(3, 1));
  EXPECT_FALSE(pool.contains(3, 2));
  EXPECT_FALSE(pool.contains(0xFFFFFFFF, 2));  // no wrap-around
  EXPECT_FALSE(pool.contains(0, 5));
}

TEST(ChunkPool, BadOptionsAreRejectedBeforeAllocating) {
  EXPECT_FALSE(ChunkPool::create(options(0, 4)));
  EXPECT_FALSE(ChunkPool::create(options(4096, 0)));
  const auto huge = ChunkPool::create(options(SIZE_MAX / 2, 4));
  ASSERT_FALSE(huge);
  EXPECT_NE(huge.error().message.find("overflows"), std::string::npos);
  const auto kind = parse_memory_kind("gpu");
  ASSERT_FALSE(kind);
  EXPECT_NE(kind.error().message.find("host, pinned or device"), std::string::npos);
}

TEST(ChunkPool, ConcurrentAllocateAndReleaseKeepEveryPageOnce) {
  ChunkPool pool = make_pool(4096, 64);
  auto churn = [&] {
    for (int i = 0; i < 20000; ++i)
      if (auto p = pool.allocate()) {
        ASSERT_TRUE(pool.release(*p));
      }
  };
  std::thread a(churn), b(churn);
  a.join();
  b.join();
  EXPECT_EQ(pool.free_pages(), 64u);
  EXPECT_EQ(pool.allocate(64).size(), 64u);
}

TEST(MemoryRegion, HostMemoryReportsHugePagesAndLocking) {
  auto r = MemoryRegion::allocate(4 << 20, RegionOptions{});
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->kind(), MemoryKind::kHost);
  EXPECT_EQ(r->size(), 4u << 20);
  std::memset(r->data(), 0xAB, r->size());
  // Either outcome is legal (THP off, small RLIMIT_MEMLOCK); the region works regardless.
  RecordProperty("huge_pages", r->huge_pages() ? "yes" : "no");
  RecordProperty("locked", r->locked() ? "yes" : "no");
  RegionOptions plain_options;
  plain_options.huge_pages = false;
  plain_options.lock = false;
  auto plain = MemoryRegion::allocate(8192, plain_options);
  ASSERT_TRUE(plain);
  EXPECT_FALSE(plain->huge_pages());
  EXPECT_FALSE(plain->locked());
  EXPECT_FALSE(MemoryRegion::allocate(0));
}

TEST(ChunkPool, HostPagesAreWrittenAndReadWhole) {
  ChunkPool pool = make_pool(4096, 4);
  std::vector<std::byte> bytes(4096);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 7);
  ASSERT_TRUE(pool.write(1, bytes));
  EXPECT_EQ(std::memcmp(pool.page(1), bytes.data(), bytes.size()), 0);
  std::vector<std::byte> out(4096);
  ASSERT_TRUE(pool.read(1, out));
  EXPECT_EQ(out, bytes);
  // A shorter write leaves the rest of the page; a shorter read reads the page's start.
  ASSERT_TRUE(pool.write(1, std::span<const std::byte>(bytes).first(10)));
  std::vector<std::byte> head(16);
  ASSERT_TRUE(pool.read(1, head));
  EXPECT_TRUE(std::equal(head.begin(), head.end(), bytes.begin()));
  EXPECT_TRUE(pool.write(3, {}));
}

TEST(ChunkPool, WritesAndReadsOutsideAPageAreErrors) {
  ChunkPool pool = make_pool(4096, 4);
  std::vector<std::byte> page(4096), more(4097);
  const Status outside = pool.write(4, page);
  ASSERT_FALSE(outside);
  EXPECT_EQ(outside.error().code, ErrorCode::kInvalid);
  EXPECT_NE(outside.error().message.find("outside the pool"), std::string::npos);
  EXPECT_FALSE(pool.read(4, page));
  const Status too_long = pool.write(0, more);
  ASSERT_FALSE(too_long);
  EXPECT_NE(too_long.error().message.find("do not fit"), std::string::npos);
  EXPECT_FALSE(pool.read(0, more));
}

bool have_gpu() {
  return !probe_cuda().devices.empty();
}

TEST(MemoryRegion, CudaKindsFailClearlyWithoutAGpu) {
  if (have_gpu()) GTEST_SKIP() << "a GPU is present: see the GPU tests";
  for (MemoryKind kind : {MemoryKind::kPinnedHost, MemoryKind::kDevice}) {
    RegionOptions o;
    o.kind = kind;
    const auto r = MemoryRegion::allocate(1 << 20, o);
    ASSERT_FALSE(r) << to_string(kind);
    EXPECT_FALSE(r.error().message.empty());
    EXPECT_TRUE(r.error().message.find("CUDA") != std::string::npos ||
                r.error().message.find("cuda") != std::string::npos)
        << r.error().message;
  }
}

TEST(MemoryRegion, PinnedAndDevicePoolsOnAGpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device on this host (" << probe_cuda().note << ")";
  for (MemoryKind kind : {MemoryKind::kPinnedHost, MemoryKind::kDevice}) {
    auto pool = ChunkPool::create(options(2 << 20, 8, kind));
    ASSERT_TRUE(pool) << pool.error().message;
    EXPECT_EQ(pool->region().kind(), kind);
    EXPECT_EQ(pool->allocate(8).size(), 8u);
  }
  RegionOptions pinned_options;
  pinned_options.kind = MemoryKind::kPinnedHost;
  auto pinned = MemoryRegion::allocate(1 << 20, pinned_options);
  ASSERT_TRUE(pinned);
  std::memset(pinned->data(), 0x5A, pinned->size());  // host-addressable
}

}  // namespace
}  // namespace kvnode::gpu
