// Same-host moves through the plane: two planes in one process with shareable pools map each
// other's pool once a session opens, and from then on pulls and pushes are copies (transport
// "memfd"), byte-exact, with the write notice and the counters as over UCX; a cancelled copy
// lands nothing after its report. (The faults that need a peer process, a killed or restarted
// peer, are SameHostTwoProcesses in two_process_test.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <future>
#include <optional>
#include <thread>
#include <vector>

#include "kvnode/transfer/plane.hpp"
#include "pattern.hpp"
#include "support/must.hpp"

namespace kvnode::transfer {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::must;

// Pages filled with `seed`'s pattern; without a seed, as allocated.
gpu::ChunkPool shareable_pool(std::size_t page_bytes, std::size_t pages,
                              std::optional<std::uint32_t> seed = std::nullopt) {
  gpu::PoolOptions o;
  o.page_bytes = page_bytes;
  o.pages = pages;
  o.region.shareable = true;
  gpu::ChunkPool pool = must(gpu::ChunkPool::create(o));
  if (seed) {
    for (gpu::PageId p = 0; p < pages; ++p) test::fill_pattern(pool.page(p), page_bytes, *seed, p);
  }
  return pool;
}

PlaneOptions same_host_options() {
  PlaneOptions o;
  o.same_host = SameHost::kAuto;
  o.copy_threads = 2;
  return o;
}

// Pulls until the session copies through the mapping (it is made off the progress thread
// after the session opens; until then UCX carries the transfers).
TransferResult pull_until_mapped(TransferPlane& a, const std::string& b,
                                 const std::vector<PageCopy>& pages) {
  TransferResult r;
  for (auto until = Clock::now() + 10s; Clock::now() < until; std::this_thread::sleep_for(5ms)) {
    r = a.pull(b, pages).get();
    if (!r.ok() || r.stats.transport == "memfd") break;
  }
  return r;
}

TEST(SameHostPlane, PullAndPushCopyThroughTheMappedPoolByteExact) {
  constexpr std::size_t kPageBytes = 1 << 20;
  gpu::ChunkPool a_pool = shareable_pool(kPageBytes, 16, 1);
  gpu::ChunkPool b_pool = shareable_pool(kPageBytes, 16, 2);
  auto a = must(TransferPlane::start(same_host_options(), a_pool));
  auto b = must(TransferPlane::start(same_host_options(), b_pool));
  EXPECT_NE(a->same_host_status().find("pool offered"), std::string::npos) << a->same_host_status();

  const std::vector<PageCopy> pull = {{0, 5}, {1, 6}, {2, 7}, {9, 1}};
  TransferResult r = pull_until_mapped(*a, b->url(), pull);
  ASSERT_TRUE(r.ok()) << to_string(r.failure) << ": " << r.message;
  ASSERT_EQ(r.stats.transport, "memfd");
  EXPECT_EQ(r.stats.ops, 2u) << "adjacent pages coalesce into one copy";
  std::memset(a_pool.region().data(), 0xEE, a_pool.region().size());
  r = a->pull(b->url(), pull).get();
  ASSERT_TRUE(r.ok()) << r.message;
  for (const PageCopy& p : pull)
    EXPECT_EQ(test::check_pattern(a_pool.page(p.local), kPageBytes, 2, p.remote), kPageBytes);
  EXPECT_EQ(test::check_pattern(a_pool.page(3), kPageBytes, 2, 0), 0u) << "page 3 untouched";

  for (gpu::PageId p = 0; p < 4; ++p) test::fill_pattern(a_pool.page(p), kPageBytes, 77, p);
  const TransferResult w = a->push(b->url(), {{0, 12}, {1, 13}, {2, 3}, {3, 0}}).get();
  ASSERT_TRUE(w.ok()) << w.message;
  EXPECT_EQ(w.stats.transport, "memfd");
  EXPECT_EQ(test::check_pattern(b_pool.page(12), kPageBytes, 77, 0), kPageBytes);
  EXPECT_EQ(test::check_pattern(b_pool.page(13), kPageBytes, 77, 1), kPageBytes);
  EXPECT_EQ(test::check_pattern(b_pool.page(3), kPageBytes, 77, 2), kPageBytes);
  EXPECT_EQ(test::check_pattern(b_pool.page(0), kPageBytes, 77, 3), kPageBytes);
  EXPECT_GE(a->counters().bytes_same_host, (pull.size() + 4) * kPageBytes);
  for (auto until = Clock::now() + 5s; Clock::now() < until; std::this_thread::sleep_for(1ms))
    if (b->counters().bytes_served >= (2 * pull.size() + 4) * kPageBytes) break;
  EXPECT_GE(b->counters().bytes_served, (2 * pull.size() + 4) * kPageBytes)
      << "B hears of copies into and out of its pool as of RMA";
}

TEST(SameHostPlane, OffOnEitherSideKeepsUcx) {
  constexpr std::size_t kPageBytes = 64 << 10;
  gpu::ChunkPool a_pool = shareable_pool(kPageBytes, 8, 1);
  gpu::ChunkPool b_pool = shareable_pool(kPageBytes, 8, 2);
  PlaneOptions off;
  off.same_host = SameHost::kOff;
  auto a = must(TransferPlane::start(same_host_options(), a_pool));
  auto b = must(TransferPlane::start(off, b_pool));
  EXPECT_EQ(b->same_host_status(), "off (same_host off)");
  for (int i = 0; i < 20; ++i) {
    const TransferResult r = a->pull(b->url(), {{0, 1}}).get();
    ASSERT_TRUE(r.ok()) << r.message;
    EXPECT_NE(r.stats.transport, "memfd") << "B does not offer its pool";
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(a->counters().bytes_same_host, 0u);
}

// A cancel resets the session, whose destructor cancels its copies and returns once no copy
// thread touches them, before the transfer is reported: from the report on, the local pool does
// not change. One copy thread and a copy per 4 MiB page (64 runs), so the cancel finds most
// pieces still queued.
class SameHostCancel : public ::testing::Test {
 protected:
  static constexpr std::size_t kPageBytes = 4 << 20;
  static constexpr std::size_t kPages = 64;

  SameHostCancel()
      : a_pool_(shareable_pool(kPageBytes, kPages)),
        b_pool_(shareable_pool(kPageBytes, kPages, 2)),
        snapshot_(a_pool_.region().size()) {
    PlaneOptions one_thread = same_host_options();
    one_thread.copy_threads = 1;
    a_ = must(TransferPlane::start(one_thread, a_pool_));
    b_ = must(TransferPlane::start(same_host_options(), b_pool_));
    for (gpu::PageId p = 0; p < kPages; ++p)
      pages_.push_back({p, static_cast<gpu::PageId>(kPages - 1 - p)});
  }

  struct Round {
    TransferResult result;
    std::size_t pages_written = 0;  // local pages the pull wrote any of before its report
  };
  // Maps B's pool again (the last cancel reset the session), poisons A's pool, pulls all of B's
  // pages and cancels at once; checks that nothing lands after the report and that whatever is
  // marked done is whole.
  void cancel_round(Round& out) {
    const TransferResult warm = pull_until_mapped(*a_, b_->url(), {{0, 0}});
    ASSERT_TRUE(warm.ok()) << to_string(warm.failure) << ": " << warm.message;
    ASSERT_EQ(warm.stats.transport, "memfd");
    // Poisoned, so any late piece changes bytes (a repeat of the last round's would not).
    std::memset(a_pool_.region().data(), kPoison, a_pool_.region().size());
    auto reported = std::make_shared<std::promise<TransferResult>>();
    std::future<TransferResult> result = reported->get_future();
    const TransferId id = a_->pull(
        b_->url(), pages_, [reported](TransferResult r) { reported->set_value(std::move(r)); });
    a_->cancel(id);
    ASSERT_EQ(result.wait_for(5s), std::future_status::ready) << "the cancelled pull never ended";
    out.result = result.get();
    const std::byte* pool = a_pool_.region().data();
    std::memcpy(snapshot_.data(), pool, snapshot_.size());
    std::this_thread::sleep_for(50ms);
    if (std::memcmp(snapshot_.data(), pool, snapshot_.size()) != 0) {
      const auto late =
          std::mismatch(snapshot_.begin(), snapshot_.end(), pool).first - snapshot_.begin();
      FAIL() << "byte " << late << " (page " << late / kPageBytes
             << ") changed after the pull was reported " << to_string(out.result.failure);
    }
    for (std::size_t c = 0; c < pages_.size(); ++c) {
      if (out.result.done.at(c)) {
        ASSERT_EQ(
            test::check_pattern(a_pool_.page(pages_[c].local), kPageBytes, 2, pages_[c].remote),
            kPageBytes)
            << "chunk " << c << " is marked done";
      }
    }
    // A page is one piece, copied whole or not at all by the time of the report: its first
    // bytes tell.
    std::array<std::byte, 64> poisoned;
    poisoned.fill(std::byte{kPoison});
    for (gpu::PageId p = 0; p < kPages; ++p)
      out.pages_written += std::memcmp(a_pool_.page(p), poisoned.data(), poisoned.size()) != 0;
    if (out.result.ok()) {  // the copies won the race with the cancel
      EXPECT_EQ(out.result.stats.transport, "memfd");
    } else {
      ASSERT_EQ(out.result.failure, Failure::kCancelled) << out.result.message;
    }
  }

  static constexpr unsigned char kPoison = 0xEE;
  gpu::ChunkPool a_pool_;
  gpu::ChunkPool b_pool_;
  std::vector<std::byte> snapshot_;
  std::unique_ptr<TransferPlane> a_;
  std::unique_ptr<TransferPlane> b_;
  std::vector<PageCopy> pages_;
};

TEST_F(SameHostCancel, ACancelledMappedPullLandsNoByteAfterItsReport) {
  int cancelled = 0;
  for (int i = 0; i < 10; ++i) {
    SCOPED_TRACE("round " + std::to_string(i));
    Round round;
    ASSERT_NO_FATAL_FAILURE(cancel_round(round));
    cancelled += round.result.failure == Failure::kCancelled;
  }
  EXPECT_GE(cancelled, 1) << "no pull was cancelled before its copies ended: nothing was tested";
}

// A cancel stops the copies it finds. Cancelled one ticket at a time, each cancel waited for a
// running piece while the thread took the next ticket's, so the cancel chased the thread through
// the whole queue and about half the rounds copied all 64 pages; now the session cancels all its
// copies at once. How many pages land before the cancel reaches the progress thread depends on
// the machine's load, so each cancelled round must only stop short of the whole pull, and the
// best round must stop within the first quarter.
TEST_F(SameHostCancel, ACancelStopsTheMappedCopiesItFinds) {
  std::size_t fewest = kPages;
  for (int i = 0; i < 10; ++i) {
    SCOPED_TRACE("round " + std::to_string(i));
    Round round;
    ASSERT_NO_FATAL_FAILURE(cancel_round(round));
    if (round.result.failure == Failure::kCancelled) {
      EXPECT_LT(round.pages_written, kPages) << "a cancelled pull copied every page";
      fewest = std::min(fewest, round.pages_written);
    }
  }
  EXPECT_LE(fewest, kPages / 4) << "no cancel stopped the copies early";
}

}  // namespace
}  // namespace kvnode::transfer
