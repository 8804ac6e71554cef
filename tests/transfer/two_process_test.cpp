// The transfer plane between two real processes on loopback: this test's plane and
// transfer_test_peer's, over tcp (active messages move the bytes) and over UCX's default
// transports (shared memory and cma: one-sided RMA). Destinations are poisoned first and every
// byte is checked; then the faults: a peer killed mid-transfer and restarted, a stopped peer
// against a deadline, pages outside the peer's pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>
#include <thread>

#include "kvnode/transfer/plane.hpp"
#include "pattern.hpp"
#include "support/child_process.hpp"
#include "support/must.hpp"

namespace kvnode::transfer {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::must;

struct Transport {
  const char* name;
  const char* tls;  // nullptr: UCX's choice (shared memory between processes on one host)
  Protocol expected;
};

// A transfer_test_peer process and the url it listens at.
class Peer {
 public:
  Peer(std::size_t page_bytes, std::size_t pages, std::uint32_t seed, std::uint16_t port = 0)
      : file_(::testing::TempDir() + "kvnode_peer_" + std::to_string(getpid()) + "_" +
              std::to_string(seed) + "_" + std::to_string(counter_++)) {
    std::remove(file_.c_str());
    child_.emplace(std::vector<std::string>{TRANSFER_TEST_PEER_PATH, file_,
                                            std::to_string(page_bytes), std::to_string(pages),
                                            std::to_string(port), std::to_string(seed)});
    for (auto until = Clock::now() + 20s; Clock::now() < until; std::this_thread::sleep_for(5ms)) {
      std::ifstream in(file_);
      if (in >> url_) return;
      if (!child_->running()) break;
    }
    ADD_FAILURE() << "the peer did not start: " << child_->describe_exit() << " "
                  << child_->output();
  }
  ~Peer() { std::remove(file_.c_str()); }
  const std::string& url() const { return url_; }
  std::uint16_t port() const {
    return static_cast<std::uint16_t>(std::stoi(url_.substr(url_.rfind(':') + 1)));
  }
  void kill() { child_.reset(); }
  void signal(int sig) { child_->signal(sig); }
  std::string output() const { return child_ ? child_->output() : ""; }

 private:
  static inline int counter_ = 0;
  std::string file_;
  std::string url_;
  std::optional<test::ChildProcess> child_;
};

class TwoProcesses : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    // Both processes read UCX_* from the environment: set before either creates a context.
    if (GetParam().tls) {
      setenv("UCX_TLS", GetParam().tls, 1);
      setenv("UCX_NET_DEVICES", "lo", 1);
    } else {
      unsetenv("UCX_TLS");
      unsetenv("UCX_NET_DEVICES");
    }
  }
  void TearDown() override {
    unsetenv("UCX_TLS");
    unsetenv("UCX_NET_DEVICES");
  }

  void make_local(std::size_t page_bytes, std::size_t pages) {
    gpu::PoolOptions o;
    o.page_bytes = page_bytes;
    o.pages = pages;
    pool_.emplace(must(gpu::ChunkPool::create(o)));
    plane_ = must(TransferPlane::start(PlaneOptions{}, *pool_));
  }
  void poison() { std::memset(pool_->region().data(), 0xEE, pool_->region().size()); }
  // Distinct random pages: `n` of `range`.
  std::vector<gpu::PageId> pick(std::size_t n, std::size_t range) {
    std::vector<gpu::PageId> all(range);
    std::iota(all.begin(), all.end(), 0u);
    std::shuffle(all.begin(), all.end(), rng_);
    all.resize(n);
    return all;
  }
  // Every byte of each pulled chunk equals the peer's pattern for its remote page.
  void expect_pulled(const std::vector<PageCopy>& pages, const TransferResult& r,
                     std::uint32_t seed) {
    for (std::size_t i = 0; i < pages.size(); ++i) {
      if (!r.done.at(i)) continue;
      const std::size_t bad = test::check_pattern(pool_->page(pages[i].local), pool_->page_bytes(),
                                                  seed, pages[i].remote);
      ASSERT_EQ(bad, pool_->page_bytes())
          << "chunk " << i << " (remote page " << pages[i].remote << " -> local " << pages[i].local
          << ") differs at byte " << bad;
    }
  }

  std::optional<gpu::ChunkPool> pool_;
  std::unique_ptr<TransferPlane> plane_;
  std::mt19937 rng_{20261203};
};

TEST_P(TwoProcesses, PullAndPushMoveEveryByteOfScatteredChunks) {
  for (const std::size_t page_bytes :
       {std::size_t{4} << 10, std::size_t{256} << 10, std::size_t{2} << 20}) {
    SCOPED_TRACE("page bytes " + std::to_string(page_bytes));
    constexpr std::size_t kPages = 72;
    Peer peer(page_bytes, 2 * kPages, 7);  // pulls read [0, kPages), pushes write the rest
    make_local(page_bytes, 2 * kPages);
    for (const std::size_t n : {1, 7, 64}) {
      SCOPED_TRACE(std::to_string(n) + " chunks");
      poison();
      const auto remote = pick(n, kPages);
      const auto local = pick(n, kPages);
      std::vector<PageCopy> pages;
      for (std::size_t i = 0; i < n; ++i) pages.push_back({local[i], remote[i]});
      const TransferResult r = plane_->pull(peer.url(), pages).get();
      ASSERT_TRUE(r.ok()) << to_string(r.failure) << ": " << r.message;
      EXPECT_EQ(std::count(r.done.begin(), r.done.end(), 1), static_cast<long>(n));
      EXPECT_EQ(r.stats.bytes, n * page_bytes);
      EXPECT_EQ(r.stats.protocol, GetParam().expected) << r.stats.transport;
      expect_pulled(pages, r, 7);

      // Push fresh bytes to other remote pages, then pull them back into poisoned pages.
      std::vector<PageCopy> out, back;
      auto targets = pick(n, kPages);
      for (auto& t : targets) t += kPages;
      for (std::size_t i = 0; i < n; ++i) {
        test::fill_pattern(pool_->page(local[i]), page_bytes, 99, static_cast<std::uint32_t>(i));
        out.push_back({local[i], targets[i]});
        back.push_back({static_cast<gpu::PageId>(kPages + i), targets[i]});
      }
      const TransferResult w = plane_->push(peer.url(), out).get();
      ASSERT_TRUE(w.ok()) << to_string(w.failure) << ": " << w.message;
      const TransferResult b = plane_->pull(peer.url(), back).get();
      ASSERT_TRUE(b.ok()) << b.message;
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(test::check_pattern(pool_->page(back[i].local), page_bytes, 99,
                                      static_cast<std::uint32_t>(i)),
                  page_bytes)
            << "pushed chunk " << i << " did not arrive whole";
    }
  }
}

TEST_P(TwoProcesses, AdjacentPagesCoalesceIntoOneOperation) {
  Peer peer(64 << 10, 64, 3);
  make_local(64 << 10, 64);
  std::vector<PageCopy> pages;
  for (gpu::PageId p = 0; p < 64; ++p) pages.push_back({p, p});
  std::shuffle(pages.begin(), pages.end(), rng_);  // order does not matter
  poison();
  const TransferResult r = plane_->pull(peer.url(), pages).get();
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(r.stats.ops, 1u);
  EXPECT_EQ(r.stats.chunks, 64u);
  EXPECT_FALSE(r.stats.transport.empty());
  expect_pulled(pages, r, 3);
  const PlaneCounters c = plane_->counters();
  EXPECT_EQ(c.transfers_ok, 1u);
  EXPECT_EQ(c.bytes_pulled, 64u * (64 << 10));
  EXPECT_EQ(c.sessions_opened, 1u);
}

TEST_P(TwoProcesses, ConcurrentTransfersToTwoPeers) {
  Peer a(256 << 10, 32, 11);
  Peer b(256 << 10, 32, 12);
  make_local(256 << 10, 64);
  poison();
  std::vector<PageCopy> from_a, from_b;
  for (gpu::PageId p = 0; p < 32; ++p) {
    from_a.push_back({p, 31 - p});
    from_b.push_back({32 + p, p});
  }
  std::vector<std::future<TransferResult>> pending;
  for (int i = 0; i < 4; ++i) {  // overlapping batches, same pages: identical bytes either way
    pending.push_back(plane_->pull(a.url(), from_a));
    pending.push_back(plane_->pull(b.url(), from_b));
  }
  for (std::size_t i = 0; i < pending.size(); ++i) {
    const TransferResult r = pending[i].get();
    ASSERT_TRUE(r.ok()) << r.message;
  }
  expect_pulled(from_a, plane_->pull(a.url(), from_a).get(), 11);
  expect_pulled(from_b, plane_->pull(b.url(), from_b).get(), 12);
  EXPECT_EQ(plane_->counters().sessions_opened, 2u);
}

TEST_P(TwoProcesses, APeerKilledMidTransferFailsItInTimeAndTheSurvivorReconnects) {
  constexpr std::size_t kPageBytes = 1 << 20;
  auto peer = std::make_unique<Peer>(kPageBytes, 64, 5);
  const std::uint16_t port = peer->port();
  make_local(kPageBytes, 64);
  std::vector<PageCopy> pages;
  for (gpu::PageId p = 0; p < 64; ++p) pages.push_back({p, 63 - p});  // 64 runs
  ASSERT_TRUE(plane_->pull(peer->url(), pages).get().ok());           // the session is up

  // Keep transfers in flight back to back; kill the peer under them.
  constexpr auto kDeadline = 5s;
  std::atomic<bool> killed{false};
  Clock::time_point killed_at;
  std::thread killer([&] {
    std::this_thread::sleep_for(30ms);
    killed_at = Clock::now();
    peer->kill();
    killed = true;
  });
  TransferResult failed;
  Clock::time_point failed_at;
  for (int i = 0; i < 10000; ++i) {
    poison();
    TransferOptions o;
    o.deadline = kDeadline;
    TransferResult r = plane_->pull(peer ? peer->url() : "", pages, o).get();
    expect_pulled(pages, r, 5);  // whatever is marked done is whole
    if (!r.ok()) {
      failed = std::move(r);
      failed_at = Clock::now();
      break;
    }
  }
  killer.join();
  ASSERT_TRUE(killed);
  ASSERT_FALSE(failed.ok()) << "no transfer failed after the peer died";
  EXPECT_TRUE(failed.failure == Failure::kPeerLost || failed.failure == Failure::kConnect ||
              failed.failure == Failure::kTimeout)
      << to_string(failed.failure) << ": " << failed.message;
  EXPECT_LT(failed_at - killed_at, kDeadline + 1s);

  // A later transfer to the dead peer fails to connect; once it restarts (same port), it works.
  TransferOptions quick;
  quick.deadline = 2s;
  const std::string url = "127.0.0.1:" + std::to_string(port);
  const TransferResult dead = plane_->pull(url, pages, quick).get();
  EXPECT_FALSE(dead.ok());
  peer = std::make_unique<Peer>(kPageBytes, 64, 6, port);
  ASSERT_EQ(peer->url(), url);
  poison();
  const TransferResult again = plane_->pull(url, pages).get();
  ASSERT_TRUE(again.ok()) << to_string(again.failure) << ": " << again.message;
  expect_pulled(pages, again, 6);  // the new incarnation's bytes, through a new session
}

TEST_P(TwoProcesses, AStoppedPeerMissesTheDeadlineAndIsReachedAfterItResumes) {
  Peer peer(64 << 10, 8, 9);
  make_local(64 << 10, 8);
  peer.signal(SIGSTOP);
  TransferOptions o;
  o.deadline = 300ms;
  const auto t0 = Clock::now();
  const TransferResult r = plane_->pull(peer.url(), {{0, 0}, {1, 1}}, o).get();
  const auto took = Clock::now() - t0;
  peer.signal(SIGCONT);
  EXPECT_EQ(r.failure, Failure::kTimeout) << r.message;
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 2s);
  EXPECT_EQ(std::count(r.done.begin(), r.done.end(), 1), 0);
  poison();
  const TransferResult ok = plane_->pull(peer.url(), {{0, 0}, {1, 1}}).get();
  ASSERT_TRUE(ok.ok()) << ok.message << "\npeer: " << peer.output();
  expect_pulled({{0, 0}, {1, 1}}, ok, 9);
}

TEST_P(TwoProcesses, PagesOutsideEitherPoolAreRefusedAndTheSessionStaysUp) {
  Peer peer(64 << 10, 8, 4);
  make_local(64 << 10, 8);
  const TransferResult remote = plane_->pull(peer.url(), {{0, 0}, {1, 8}}).get();
  EXPECT_EQ(remote.failure, Failure::kInvalid);
  EXPECT_NE(remote.message.find("remote page 8 is outside the peer's pool of 8"), std::string::npos)
      << remote.message;
  const TransferResult local = plane_->push(peer.url(), {{9, 0}}).get();
  EXPECT_EQ(local.failure, Failure::kInvalid);
  EXPECT_NE(local.message.find("local page 9"), std::string::npos) << local.message;
  const TransferResult twice = plane_->pull(peer.url(), {{0, 0}, {0, 1}}).get();
  EXPECT_EQ(twice.failure, Failure::kInvalid);
  EXPECT_NE(twice.message.find("written twice"), std::string::npos) << twice.message;
  const TransferResult fine = plane_->pull(peer.url(), {{0, 0}}).get();
  EXPECT_TRUE(fine.ok()) << fine.message;
  EXPECT_EQ(plane_->counters().sessions_reset, 0u);
}

INSTANTIATE_TEST_SUITE_P(Transports, TwoProcesses,
                         ::testing::Values(Transport{"tcp", "tcp", Protocol::kActiveMessage},
                                           Transport{"shm", nullptr, Protocol::kRma}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kvnode::transfer
