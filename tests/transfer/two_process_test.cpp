// The transfer plane between two real processes on loopback: this test's plane and
// transfer_test_peer's, over tcp (active messages move the bytes), over UCX's default transports
// (shared memory and cma: one-sided RMA) and same-host (both pools shareable: this process maps
// the peer's pool and copies itself, transport "memfd"). Destinations are poisoned first and
// every byte is checked; then the faults: a peer killed mid-transfer and restarted, a stopped
// peer against a deadline, pages outside the peer's pool. SameHostTwoProcesses adds the faults
// of the mapped path: a peer killed under a push into its pool, a peer restarted on its port,
// and the descriptors sessions leave behind.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <thread>

#include "kvnode/transfer/plane.hpp"
#include "pattern.hpp"
#include "support/child_process.hpp"
#include "support/eventually.hpp"
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
  bool same_host;  // both planes offer their pools: moves copy through the mapped peer pool
};

// A transfer_test_peer process and the url it listens at; `same_host`: it offers its pool.
class Peer {
 public:
  Peer(std::size_t page_bytes, std::size_t pages, std::uint32_t seed, bool same_host,
       std::uint16_t port = 0)
      : file_(::testing::TempDir() + "kvnode_peer_" + std::to_string(getpid()) + "_" +
              std::to_string(seed) + "_" + std::to_string(counter_++)) {
    std::remove(file_.c_str());
    std::vector<std::string> argv{TRANSFER_TEST_PEER_PATH,    file_,
                                  std::to_string(page_bytes), std::to_string(pages),
                                  std::to_string(port),       std::to_string(seed)};
    if (same_host) argv.emplace_back("same-host");
    child_.emplace(argv);
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
  void kill() { child_.reset(); }  // SIGTERM: its plane closes its sessions
  void kill_now() {                // SIGKILL: nothing closes but what the kernel closes
    child_->signal(SIGKILL);
    child_.reset();
  }
  void signal(int sig) { child_->signal(sig); }
  std::string output() const { return child_ ? child_->output() : ""; }

 private:
  static inline int counter_ = 0;
  std::string file_;
  std::string url_;
  std::optional<test::ChildProcess> child_;
};

gpu::ChunkPool local_pool(std::size_t page_bytes, std::size_t pages, bool shareable) {
  gpu::PoolOptions o;
  o.page_bytes = page_bytes;
  o.pages = pages;
  o.region.shareable = shareable;
  return must(gpu::ChunkPool::create(o));
}

PlaneOptions plane_options(bool same_host) {
  PlaneOptions o;
  if (same_host) o.same_host = SameHost::kAuto;
  return o;
}

// Pulls `pages` until the session copies through the peer's mapped pool (the mapping is made
// off the progress thread after the session opens; UCX carries what comes before), for at most
// 10 s, or until a pull fails. Returns the last pull.
TransferResult pull_until_mapped(TransferPlane& plane, const std::string& peer,
                                 const std::vector<PageCopy>& pages) {
  TransferResult r;
  for (auto until = Clock::now() + 10s; Clock::now() < until; std::this_thread::sleep_for(5ms)) {
    r = plane.pull(peer, pages).get();
    if (!r.ok() || r.stats.transport == "memfd") break;
  }
  return r;
}

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

  bool same_host() const { return GetParam().same_host; }
  void make_local(std::size_t page_bytes, std::size_t pages) {
    pool_.emplace(local_pool(page_bytes, pages, same_host()));
    plane_ = must(TransferPlane::start(plane_options(same_host()), *pool_));
  }
  // Same-host: waits (pulling page 0 into page 0) until moves with `url` copy through its
  // mapped pool, so what the test then does runs on that path, and keeps the counters as they
  // are then in warmed_: what the test counts, it counts from there. Nothing for the other
  // transports (warmed_ stays zero: their first transfer still opens the session).
  void warm_up(const std::string& url) {
    if (!same_host()) return;
    const TransferResult r = pull_until_mapped(*plane_, url, {{0, 0}});
    ASSERT_TRUE(r.ok()) << to_string(r.failure) << ": " << r.message;
    ASSERT_EQ(r.stats.transport, "memfd") << "the peer's pool was not mapped within 10 s";
    warmed_ = plane_->counters();
  }
  // Same-host, once warmed up: every transfer copies through the mapping.
  void expect_transport(const TransferResult& r) {
    if (same_host()) {
      EXPECT_EQ(r.stats.transport, "memfd");
    }
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
  PlaneCounters warmed_;
  std::mt19937 rng_{20261203};
};

TEST_P(TwoProcesses, PullAndPushMoveEveryByteOfScatteredChunks) {
  for (const std::size_t page_bytes :
       {std::size_t{4} << 10, std::size_t{256} << 10, std::size_t{2} << 20}) {
    SCOPED_TRACE("page bytes " + std::to_string(page_bytes));
    constexpr std::size_t kPages = 72;
    Peer peer(page_bytes, 2 * kPages, 7, same_host());  // pulls read [0, kPages), pushes the rest
    make_local(page_bytes, 2 * kPages);
    ASSERT_NO_FATAL_FAILURE(warm_up(peer.url()));
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
      expect_transport(r);
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
      expect_transport(w);
      const TransferResult b = plane_->pull(peer.url(), back).get();
      ASSERT_TRUE(b.ok()) << b.message;
      expect_transport(b);
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(test::check_pattern(pool_->page(back[i].local), page_bytes, 99,
                                      static_cast<std::uint32_t>(i)),
                  page_bytes)
            << "pushed chunk " << i << " did not arrive whole";
    }
  }
}

TEST_P(TwoProcesses, AdjacentPagesCoalesceIntoOneOperation) {
  Peer peer(64 << 10, 64, 3, same_host());
  make_local(64 << 10, 64);
  ASSERT_NO_FATAL_FAILURE(warm_up(peer.url()));
  std::vector<PageCopy> pages;
  for (gpu::PageId p = 0; p < 64; ++p) pages.push_back({p, p});
  std::shuffle(pages.begin(), pages.end(), rng_);  // order does not matter
  poison();
  const TransferResult r = plane_->pull(peer.url(), pages).get();
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(r.stats.ops, 1u);  // one UCX operation, or one copy through the mapping
  EXPECT_EQ(r.stats.chunks, 64u);
  EXPECT_FALSE(r.stats.transport.empty());
  expect_transport(r);
  expect_pulled(pages, r, 3);
  const PlaneCounters c = plane_->counters();
  EXPECT_EQ(c.transfers_ok - warmed_.transfers_ok, 1u);
  EXPECT_EQ(c.bytes_pulled - warmed_.bytes_pulled, 64u * (64 << 10));
  EXPECT_EQ(c.sessions_opened, 1u);  // the warm-up's session, where there was one, carried it
  EXPECT_EQ(c.bytes_same_host - warmed_.bytes_same_host, same_host() ? 64u * (64 << 10) : 0u);
}

TEST_P(TwoProcesses, ConcurrentTransfersToTwoPeers) {
  Peer a(256 << 10, 32, 11, same_host());
  Peer b(256 << 10, 32, 12, same_host());
  make_local(256 << 10, 64);
  ASSERT_NO_FATAL_FAILURE(warm_up(a.url()));
  ASSERT_NO_FATAL_FAILURE(warm_up(b.url()));
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
    expect_transport(r);
  }
  expect_pulled(from_a, plane_->pull(a.url(), from_a).get(), 11);
  expect_pulled(from_b, plane_->pull(b.url(), from_b).get(), 12);
  EXPECT_EQ(plane_->counters().sessions_opened, 2u);
}

TEST_P(TwoProcesses, APeerKilledMidTransferFailsItInTimeAndTheSurvivorReconnects) {
  constexpr std::size_t kPageBytes = 1 << 20;
  auto peer = std::make_unique<Peer>(kPageBytes, 64, 5, same_host());
  const std::uint16_t port = peer->port();
  make_local(kPageBytes, 64);
  ASSERT_NO_FATAL_FAILURE(warm_up(peer->url()));  // same-host: the mapping is in use from here
  std::vector<PageCopy> pages;
  for (gpu::PageId p = 0; p < 64; ++p) pages.push_back({p, 63 - p});  // 64 runs
  const TransferResult up = plane_->pull(peer->url(), pages).get();   // the session is up
  ASSERT_TRUE(up.ok()) << up.message;
  expect_transport(up);

  // Keep transfers in flight back to back; kill the peer under them. Same-host, the pulls read
  // a mapping that outlives the peer (its memfd pages stay while mapped here), so one may still
  // succeed after the kill, with the dead peer's bytes; the failure comes once the session
  // notices the link is gone, and must come as soon.
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
  peer = std::make_unique<Peer>(kPageBytes, 64, 6, same_host(), port);
  ASSERT_EQ(peer->url(), url);
  poison();
  const TransferResult again = plane_->pull(url, pages).get();
  ASSERT_TRUE(again.ok()) << to_string(again.failure) << ": " << again.message;
  expect_pulled(pages, again, 6);  // the new incarnation's bytes, through a new session
}

TEST_P(TwoProcesses, AStoppedPeerMissesTheDeadlineAndIsReachedAfterItResumes) {
  Peer peer(64 << 10, 8, 9, same_host());
  make_local(64 << 10, 8);
  ASSERT_NO_FATAL_FAILURE(warm_up(peer.url()));
  poison();
  peer.signal(SIGSTOP);
  TransferOptions o;
  o.deadline = 300ms;
  const auto t0 = Clock::now();
  const TransferResult r = plane_->pull(peer.url(), {{0, 0}, {1, 1}}, o).get();
  const auto took = Clock::now() - t0;
  peer.signal(SIGCONT);
  if (same_host()) {
    // A mapped pull is this process copying out of the peer's memfd pages, which a stopped
    // process still holds: nothing in it waits on the peer (the read notice waits in the peer's
    // queue until it runs again), so it lands whole and in time.
    ASSERT_TRUE(r.ok()) << to_string(r.failure) << ": " << r.message;
    EXPECT_EQ(r.stats.transport, "memfd");
    EXPECT_LT(took, 300ms);
    expect_pulled({{0, 0}, {1, 1}}, r, 9);
  } else {
    EXPECT_EQ(r.failure, Failure::kTimeout) << r.message;
    EXPECT_GE(took, 300ms);
    EXPECT_LT(took, 2s);
    EXPECT_EQ(std::count(r.done.begin(), r.done.end(), 1), 0);
  }
  poison();
  const TransferResult ok = plane_->pull(peer.url(), {{0, 0}, {1, 1}}).get();
  ASSERT_TRUE(ok.ok()) << ok.message << "\npeer: " << peer.output();
  expect_pulled({{0, 0}, {1, 1}}, ok, 9);
}

TEST_P(TwoProcesses, PagesOutsideEitherPoolAreRefusedAndTheSessionStaysUp) {
  Peer peer(64 << 10, 8, 4, same_host());
  make_local(64 << 10, 8);
  ASSERT_NO_FATAL_FAILURE(warm_up(peer.url()));
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
  expect_transport(fine);
  EXPECT_EQ(plane_->counters().sessions_reset, 0u);
}

INSTANTIATE_TEST_SUITE_P(Transports, TwoProcesses,
                         ::testing::Values(Transport{"tcp", "tcp", Protocol::kActiveMessage, false},
                                           Transport{"shm", nullptr, Protocol::kRma, false},
                                           Transport{"same_host", nullptr, Protocol::kRma, true}),
                         [](const auto& info) { return std::string(info.param.name); });

// The mapped path's own faults, against same-host peers (UCX's default transports underneath,
// which carry what comes before a mapping).
class SameHostTwoProcesses : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("UCX_TLS");
    unsetenv("UCX_NET_DEVICES");
  }
  void make_local(std::size_t page_bytes, std::size_t pages, std::size_t copy_threads = 0) {
    pool_.emplace(local_pool(page_bytes, pages, true));
    PlaneOptions o = plane_options(true);
    o.copy_threads = copy_threads;
    plane_ = must(TransferPlane::start(o, *pool_));
  }
  void poison() { std::memset(pool_->region().data(), 0xEE, pool_->region().size()); }
  // Waits until moves with `url` copy through its mapped pool, with `seed`'s bytes.
  void map(const std::string& url, std::uint32_t seed) {
    const TransferResult r = pull_until_mapped(*plane_, url, {{0, 0}});
    ASSERT_TRUE(r.ok()) << to_string(r.failure) << ": " << r.message;
    ASSERT_EQ(r.stats.transport, "memfd") << "the peer's pool was not mapped within 10 s";
    ASSERT_EQ(test::check_pattern(pool_->page(0), pool_->page_bytes(), seed, 0),
              pool_->page_bytes());
  }
  // Waits (5 s at most) until the plane has reset `n` sessions in all.
  bool sessions_reset(std::uint64_t n) {
    return test::eventually([&] { return plane_->counters().sessions_reset >= n; }, 5s);
  }

  std::optional<gpu::ChunkPool> pool_;
  std::unique_ptr<TransferPlane> plane_;
};

TEST_F(SameHostTwoProcesses, APeerKilledUnderAMappedPushFailsItInTimeAndThePlaneServesTheNext) {
  constexpr std::size_t kPageBytes = 4 << 20;
  constexpr std::size_t kPages = 16;  // a 64 MiB push: one copy thread takes a while
  auto peer = std::make_unique<Peer>(kPageBytes, kPages, 21, true);
  make_local(kPageBytes, kPages, 1);
  ASSERT_NO_FATAL_FAILURE(map(peer->url(), 21));
  std::vector<PageCopy> pages;
  for (gpu::PageId p = 0; p < kPages; ++p) {
    test::fill_pattern(pool_->page(p), kPageBytes, 42, p);
    pages.push_back({p, static_cast<gpu::PageId>(kPages - 1 - p)});  // a copy per page
  }

  // Pushes back to back into the peer's mapped pool; SIGKILL it under them. Each reports in
  // time: ok (the copy raced ahead into pages that outlive the peer while mapped here) until
  // the session notices the link is gone, then peer_lost (in flight) or connect (a new
  // session). Nothing here faults on the dead peer's memory.
  std::atomic<bool> killed{false};
  Clock::time_point killed_at;
  std::thread killer([&] {
    std::this_thread::sleep_for(30ms);
    killed_at = Clock::now();
    peer->kill_now();
    killed = true;
  });
  TransferResult failed;
  Clock::time_point failed_at;
  int ok = 0;
  for (int i = 0; i < 10000; ++i) {
    TransferOptions o;
    o.deadline = 5s;
    const auto t0 = Clock::now();
    TransferResult r = plane_->push(peer->url(), pages, o).get();
    EXPECT_LT(Clock::now() - t0, 3s) << "push " << i << ": " << to_string(r.failure);
    if (r.ok()) {
      EXPECT_EQ(r.stats.transport, "memfd");
      ++ok;
      continue;
    }
    failed = std::move(r);
    failed_at = Clock::now();
    break;
  }
  killer.join();
  ASSERT_TRUE(killed);
  EXPECT_GT(ok, 0) << "no mapped push ran before the kill";
  ASSERT_FALSE(failed.ok()) << "no push failed after the peer died";
  EXPECT_TRUE(failed.failure == Failure::kPeerLost || failed.failure == Failure::kConnect)
      << to_string(failed.failure) << ": " << failed.message;
  EXPECT_LT(failed_at - killed_at, 2s) << "a dead link is noticed, not waited out";

  // Another peer: mapped anew, pushes and pulls byte-exact.
  Peer next(kPageBytes, kPages, 22, true);
  poison();
  ASSERT_NO_FATAL_FAILURE(map(next.url(), 22));
  for (gpu::PageId p = 0; p < kPages; ++p) test::fill_pattern(pool_->page(p), kPageBytes, 43, p);
  const TransferResult w = plane_->push(next.url(), pages).get();
  ASSERT_TRUE(w.ok()) << to_string(w.failure) << ": " << w.message;
  EXPECT_EQ(w.stats.transport, "memfd");
  poison();
  std::vector<PageCopy> back;
  for (const PageCopy& p : pages) back.push_back({p.remote, p.remote});
  const TransferResult r = plane_->pull(next.url(), back).get();
  ASSERT_TRUE(r.ok()) << to_string(r.failure) << ": " << r.message;
  for (const PageCopy& p : pages)
    ASSERT_EQ(test::check_pattern(pool_->page(p.remote), kPageBytes, 43, p.local), kPageBytes)
        << "page " << p.local << " pushed to " << p.remote << " did not come back whole";
}

TEST_F(SameHostTwoProcesses, APeerRestartedOnItsPortIsMappedAnewNotReadThroughTheOldMapping) {
  constexpr std::size_t kPageBytes = 64 << 10;
  constexpr std::size_t kPages = 16;
  auto peer = std::make_unique<Peer>(kPageBytes, kPages, 31, true);
  const std::string url = peer->url();
  const std::uint16_t port = peer->port();
  make_local(kPageBytes, kPages);
  ASSERT_NO_FATAL_FAILURE(map(url, 31));
  const std::uint64_t resets = plane_->counters().sessions_reset;
  peer->kill_now();
  // The session (and with it the mapping) ends when the plane sees the link go, not on the
  // next transfer: the new instance below must never be read through the old mapping.
  ASSERT_TRUE(sessions_reset(resets + 1)) << "the dead peer's session was not reset";
  peer = std::make_unique<Peer>(kPageBytes, kPages, 32, true, port);
  ASSERT_EQ(peer->url(), url);

  std::vector<PageCopy> pages;
  for (gpu::PageId p = 0; p < kPages; ++p) pages.push_back({p, p});
  TransferResult r;
  for (auto until = Clock::now() + 10s; Clock::now() < until; std::this_thread::sleep_for(5ms)) {
    poison();
    r = plane_->pull(url, pages).get();
    ASSERT_TRUE(r.ok()) << to_string(r.failure) << ": " << r.message;
    for (const PageCopy& p : pages)
      ASSERT_EQ(test::check_pattern(pool_->page(p.local), kPageBytes, 32, p.remote), kPageBytes)
          << "page " << p.remote << " over " << r.stats.transport
          << " does not hold the new instance's bytes";
    if (r.stats.transport == "memfd") break;
  }
  EXPECT_EQ(r.stats.transport, "memfd") << "the new instance's pool was not mapped within 10 s";
}

std::size_t open_descriptors() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

std::string list_descriptors() {
  std::string out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    out += e.path().filename().string() + " -> " +
           std::filesystem::read_symlink(e.path(), ec).string() + "\n";
  }
  return out;
}

TEST_F(SameHostTwoProcesses, SessionsWithPeersThatComeAndGoLeaveNoDescriptorsBehind) {
  constexpr std::size_t kPageBytes = 64 << 10;
  constexpr std::size_t kPages = 16;
  make_local(kPageBytes, kPages);
  // One round: a same-host peer mapped, chunks moved both ways, the peer killed and its
  // session reset.
  std::uint32_t seed = 40;
  auto round = [&] {
    Peer peer(kPageBytes, kPages, ++seed, true);
    const std::uint64_t resets = plane_->counters().sessions_reset;
    ASSERT_NO_FATAL_FAILURE(map(peer.url(), seed));
    const TransferResult w = plane_->push(peer.url(), {{0, 1}, {2, 3}}).get();
    ASSERT_TRUE(w.ok()) << w.message;
    const TransferResult r = plane_->pull(peer.url(), {{4, 5}, {6, 7}}).get();
    ASSERT_TRUE(r.ok()) << r.message;
    EXPECT_EQ(r.stats.transport, "memfd");
    peer.kill_now();
    ASSERT_TRUE(sessions_reset(resets + 1)) << "the dead peer's session was not reset";
  };
  const std::size_t baseline = open_descriptors();
  const std::string before = list_descriptors();
  for (int i = 0; i < 5; ++i) ASSERT_NO_FATAL_FAILURE(round()) << "round " << i;
  EXPECT_TRUE(test::eventually([&] { return open_descriptors() <= baseline; }, 5s))
      << open_descriptors() << " descriptors open after 5 rounds, " << baseline
      << " before\nbefore:\n"
      << before << "after:\n"
      << list_descriptors();
}

}  // namespace
}  // namespace kvnode::transfer
