// The transfer plane in one process: two planes over each transport and each protocol, a hostile
// initiator speaking the plane's wire directly, a hostile listener handing out a bad rkey or a
// foreign chunk size, cancellation and shutdown. Plus the pure parts: run coalescing, lane parsing.
#include "kvnode/transfer/plane.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "am_messages.hpp"
#include "descriptor.hpp"
#include "kvnode/gpu/copy_engine.hpp"
#include "kvnode/gpu/device_probe.hpp"
#include "lanes.hpp"
#include "listener.hpp"
#include "pattern.hpp"
#include "runs.hpp"
#include "support/must.hpp"

namespace kvnode::transfer {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::must;

gpu::ChunkPool make_pool(std::size_t page_bytes, std::size_t pages, std::uint32_t seed) {
  gpu::PoolOptions o;
  o.page_bytes = page_bytes;
  o.pages = pages;
  gpu::ChunkPool pool = must(gpu::ChunkPool::create(o));
  for (gpu::PageId p = 0; p < pages; ++p) test::fill_pattern(pool.page(p), page_bytes, seed, p);
  return pool;
}

// ---- Runs and lanes ---------------------------------------------------------------------------

TEST(Runs, AdjacentPairsMergeWhateverTheOrder) {
  const Plan plan = must(plan_runs({{5, 12}, {3, 10}, {4, 11}, {9, 2}, {20, 3}}, 32, 32, true));
  ASSERT_EQ(plan.runs.size(), 3u);  // remote 2, 3 are not adjacent locally (9, 20)
  EXPECT_EQ(plan.runs[0].local, 9u);
  EXPECT_EQ(plan.runs[0].count, 1u);
  EXPECT_EQ(plan.runs[2].count, 3u);
  const Plan merged = must(plan_runs({{5, 12}, {3, 10}, {4, 11}}, 32, 32, true));
  ASSERT_EQ(merged.runs.size(), 1u);
  EXPECT_EQ(merged.runs[0].local, 3u);
  EXPECT_EQ(merged.runs[0].remote, 10u);
  EXPECT_EQ(merged.runs[0].count, 3u);
  EXPECT_EQ(merged.chunk_order, (std::vector<std::uint32_t>{1, 2, 0}));
}

TEST(Runs, RefusesBadRequestsByName) {
  auto error_of = [](const std::vector<PageCopy>& p, bool pull) {
    const auto r = plan_runs(p, 8, 4, pull);
    return r ? std::string("accepted") : r.error().message;
  };
  EXPECT_EQ(error_of({}, true), "no pages to move");
  EXPECT_NE(error_of({{8, 0}}, true).find("local page 8 is outside"), std::string::npos);
  EXPECT_NE(error_of({{0, 4}}, true).find("remote page 4 is outside the peer's pool of 4"),
            std::string::npos);
  EXPECT_NE(error_of({{1, 0}, {1, 2}}, true).find("local page 1 is written twice"),
            std::string::npos);
  EXPECT_NE(error_of({{1, 0}, {2, 0}}, false).find("remote page 0 is written twice"),
            std::string::npos);
  EXPECT_EQ(error_of({{1, 0}, {2, 0}}, true), "accepted");  // reading one page twice is fine
}

TEST(Lanes, ReadsTheTransportsUcxChose) {
  const EndpointLanes shm = parse_lanes(
      "#                 lane[0]:  3:sysv/memory.0 md[2]           -> md[2]/sysv/sysdev[255] am "
      "am_bw#0\n"
      "#                 lane[1]:  4:posix/memory.0 md[3]          -> md[3]/posix/sysdev[255]\n"
      "#                 lane[2]:  5:cma/memory.0 md[4]            -> md[4]/cma/sysdev[255] "
      "rma_bw#0\n");
  EXPECT_EQ(shm.am_bw, "sysv");
  EXPECT_EQ(shm.rma_bw, "cma");
  EXPECT_TRUE(rma_is_native(shm));
  const EndpointLanes tcp = parse_lanes(
      "#                 lane[0]:  2:tcp/lo.0 md[1]                -> md[1]/tcp/sysdev[255] am "
      "am_bw#0 keepalive wireup\n"
      "#                  rma_bw: mds rndv_rkey_size 9\n");
  EXPECT_EQ(tcp.am_bw, "tcp");
  EXPECT_EQ(tcp.rma_bw, "");
  EXPECT_FALSE(rma_is_native(tcp));
  EXPECT_EQ(parse_lanes("garbage\nlane[: nothing").am_bw, "");
}

TEST(Lanes, APackedRkeyMustHoldWhatItsHeaderAnnounces) {
  auto bytes = [](std::initializer_list<int> v) {
    ucx::Bytes b;
    for (int x : v) b.push_back(static_cast<std::byte>(x));
    return b;
  };
  EXPECT_FALSE(check_packed_rkey(bytes({1, 2})));
  // md map with two bits, one record of 2 bytes, then nothing: the second record is missing.
  EXPECT_FALSE(check_packed_rkey(bytes({3, 0, 0, 0, 0, 0, 0, 0, 0, 2, 7, 7})));
  EXPECT_FALSE(check_packed_rkey(bytes({1, 0, 0, 0, 0, 0, 0, 0, 0, 200, 1})));  // runs past the end
  EXPECT_TRUE(check_packed_rkey(bytes({1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 7, 7})));
  const ucx::Context ctx = must(ucx::Context::create());
  std::vector<std::byte> buffer(4096);
  const ucx::Registration reg = must(ucx::Registration::map(ctx, buffer.data(), buffer.size()));
  EXPECT_TRUE(check_packed_rkey(must(reg.packed_rkey())));  // what UCX really packs
}

// ---- Two planes in one process ----------------------------------------------------------------

struct Setup {
  const char* name;
  const char* tls;       // nullptr: UCX's default (shared memory within a host)
  Protocol protocol;     // asked for
  Protocol expected;     // used
  bool stage_a = false;  // A's pool goes through a staging ring (memcpy standing in for CUDA)
  bool stage_b = false;
};

class TwoPlanes : public ::testing::TestWithParam<Setup> {
 protected:
  PlaneOptions options() const {
    PlaneOptions o;
    if (GetParam().tls) {
      o.tls = GetParam().tls;
      o.net_devices = "lo";
    }
    o.protocol = GetParam().protocol;
    return o;
  }
  bool staged() const { return GetParam().stage_a || GetParam().stage_b; }
};

TEST_P(TwoPlanes, PullPushAndTheWriteNotice) {
  constexpr std::size_t kPageBytes = 128 << 10;
  gpu::ChunkPool a_pool = make_pool(kPageBytes, 16, 1);
  gpu::ChunkPool b_pool = make_pool(kPageBytes, 16, 2);
  std::mutex mutex;
  std::vector<gpu::PageId> written;
  std::string writer;
  PlaneOptions a_options = options();
  a_options.stage_through_host = GetParam().stage_a;
  PlaneOptions b_options = options();
  b_options.stage_through_host = GetParam().stage_b;
  b_options.on_written = [&](const std::string& peer, const std::vector<gpu::PageId>& pages) {
    std::lock_guard lock(mutex);
    writer = peer;
    written.insert(written.end(), pages.begin(), pages.end());
  };
  auto a = must(TransferPlane::start(a_options, a_pool));
  auto b = must(TransferPlane::start(b_options, b_pool));

  std::memset(a_pool.region().data(), 0xEE, a_pool.region().size());
  const std::vector<PageCopy> pull = {{0, 5}, {1, 6}, {2, 7}, {9, 1}};
  const TransferResult r = a->pull(b->url(), pull).get();
  ASSERT_TRUE(r.ok()) << to_string(r.failure) << ": " << r.message;
  EXPECT_EQ(r.stats.protocol, GetParam().expected);
  // 2 runs (1 page each when staged); AM sends them as one request message.
  EXPECT_EQ(r.stats.ops, GetParam().expected == Protocol::kRma ? 2u : 1u);
  for (const PageCopy& p : pull)
    EXPECT_EQ(test::check_pattern(a_pool.page(p.local), kPageBytes, 2, p.remote), kPageBytes);
  // B counts what it served, whichever way it went: a one-sided get never reaches B's plane, so
  // A tells it afterwards (the notice may trail A's completion by a moment).
  auto served_reaches = [&](std::uint64_t bytes) {
    for (auto until = Clock::now() + 5s; Clock::now() < until; std::this_thread::sleep_for(1ms))
      if (b->counters().bytes_served >= bytes) break;
    return b->counters().bytes_served;
  };
  EXPECT_EQ(served_reaches(pull.size() * kPageBytes), pull.size() * kPageBytes);

  for (gpu::PageId p = 0; p < 4; ++p) test::fill_pattern(a_pool.page(p), kPageBytes, 77, p);
  const TransferResult w = a->push(b->url(), {{0, 12}, {1, 13}, {2, 3}, {3, 0}}).get();
  ASSERT_TRUE(w.ok()) << to_string(w.failure) << ": " << w.message;
  // Done means in place: B's pool holds the bytes now, not eventually.
  EXPECT_EQ(test::check_pattern(b_pool.page(12), kPageBytes, 77, 0), kPageBytes);
  EXPECT_EQ(test::check_pattern(b_pool.page(13), kPageBytes, 77, 1), kPageBytes);
  EXPECT_EQ(test::check_pattern(b_pool.page(3), kPageBytes, 77, 2), kPageBytes);
  EXPECT_EQ(test::check_pattern(b_pool.page(0), kPageBytes, 77, 3), kPageBytes);
  // B hears which pages were written, by whom (the notice may trail the ack by a moment).
  for (auto until = Clock::now() + 5s; Clock::now() < until; std::this_thread::sleep_for(1ms)) {
    std::lock_guard lock(mutex);
    if (written.size() >= 4) break;
  }
  std::lock_guard lock(mutex);
  EXPECT_EQ(std::set<gpu::PageId>(written.begin(), written.end()),
            (std::set<gpu::PageId>{0, 3, 12, 13}));
  EXPECT_EQ(writer, a->url());
  EXPECT_EQ(served_reaches(8 * kPageBytes), 8 * kPageBytes);
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, TwoPlanes,
    ::testing::Values(
        Setup{"tcp_am", "tcp", Protocol::kActiveMessage, Protocol::kActiveMessage},
        Setup{"tcp_rma", "tcp", Protocol::kRma, Protocol::kRma},
        Setup{"shm_am", nullptr, Protocol::kActiveMessage, Protocol::kActiveMessage},
        Setup{"shm_rma", nullptr, Protocol::kRma, Protocol::kRma},
        Setup{"shm_auto", nullptr, Protocol::kAuto, Protocol::kRma},
        // Staging rings, as device pools use them, on either side or both.
        Setup{"tcp_staged_both", "tcp", Protocol::kAuto, Protocol::kActiveMessage, true, true},
        Setup{"shm_staged_initiator", nullptr, Protocol::kAuto, Protocol::kActiveMessage, true,
              false},
        Setup{"shm_staged_server", nullptr, Protocol::kRma, Protocol::kActiveMessage, false, true}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Ask, SmallRequestsBetweenNodesGetTheirAnswers) {
  gpu::ChunkPool a_pool = make_pool(4096, 4, 1);
  gpu::ChunkPool b_pool = make_pool(4096, 4, 2);
  for (const char* tls : {"tcp", static_cast<const char*>(nullptr)}) {
    SCOPED_TRACE(tls ? tls : "default");
    PlaneOptions o;
    if (tls) {
      o.tls = tls;
      o.net_devices = "lo";
    }
    auto silent = must(TransferPlane::start(o, a_pool));  // answers no asks
    PlaneOptions b_options = o;
    b_options.on_ask = [](const std::string& peer,
                          const std::vector<std::byte>& req) -> Result<std::vector<std::byte>> {
      if (req.size() == 1) return make_error(ErrorCode::kFrozen, "one byte is not a question");
      if (req.size() == 3) std::this_thread::sleep_for(700ms);  // past the asker's deadline
      std::vector<std::byte> out(req.rbegin(), req.rend());
      for (char c : peer) out.push_back(static_cast<std::byte>(c));
      return out;
    };
    auto b = must(TransferPlane::start(b_options, b_pool));
    std::vector<std::byte> question((8 << 10) - 64);  // the answer adds the asker's url
    for (std::size_t i = 0; i < question.size(); ++i) question[i] = static_cast<std::byte>(i * 13);
    const std::vector<std::byte> answer = must(silent->ask(b->url(), question).get());
    ASSERT_EQ(answer.size(), question.size() + silent->url().size());
    EXPECT_TRUE(std::equal(question.rbegin(), question.rend(), answer.begin()));
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(answer.data()) + question.size(),
                          silent->url().size()),
              silent->url());
    auto failed = silent->ask(b->url(), {std::byte{1}}).get();
    ASSERT_FALSE(failed);
    EXPECT_NE(failed.error().message.find("one byte is not a question"), std::string::npos);
    EXPECT_EQ(failed.error().code, ErrorCode::kFrozen) << "the handler's code is carried over";
    failed = b->ask(silent->url(), {std::byte{1}, std::byte{2}}).get();
    ASSERT_FALSE(failed);
    EXPECT_NE(failed.error().message.find("answers no asks"), std::string::npos);
    EXPECT_EQ(failed.error().code, ErrorCode::kRefused);
    failed = silent->ask(b->url(), std::vector<std::byte>((8 << 10) + 1)).get();
    ASSERT_FALSE(failed);
    EXPECT_NE(failed.error().message.find("8 KiB"), std::string::npos);
    EXPECT_EQ(failed.error().code, ErrorCode::kInvalid);
    failed = silent->ask("127.0.0.1", {std::byte{1}, std::byte{2}}).get();
    ASSERT_FALSE(failed) << "not a url";
    EXPECT_EQ(failed.error().code, ErrorCode::kInvalid) << failed.error().message;
    TransferOptions quick;
    quick.deadline = 500ms;
    failed = silent->ask("127.0.0.1:1", {std::byte{1}, std::byte{2}}, quick).get();
    ASSERT_FALSE(failed) << "nobody listens on port 1";
    EXPECT_EQ(failed.error().code, ErrorCode::kPeerLost) << failed.error().message;
    quick.deadline = 300ms;
    failed = silent->ask(b->url(), std::vector<std::byte>(3), quick).get();
    ASSERT_FALSE(failed) << "answered after 700 ms";
    EXPECT_EQ(failed.error().code, ErrorCode::kDeadline) << failed.error().message;
  }
}

TEST(Staging, MoreChunksThanSlotsWaitTheirTurn) {
  constexpr std::size_t kPageBytes = 64 << 10;
  gpu::ChunkPool a_pool = make_pool(kPageBytes, 48, 1);
  gpu::ChunkPool b_pool = make_pool(kPageBytes, 96, 2);
  for (const char* tls : {"tcp", static_cast<const char*>(nullptr)}) {
    SCOPED_TRACE(tls ? tls : "default");
    PlaneOptions o;
    if (tls) {
      o.tls = tls;
      o.net_devices = "lo";
    }
    o.stage_through_host = true;
    o.staging_slots = 2;
    auto a = must(TransferPlane::start(o, a_pool));
    auto b = must(TransferPlane::start(o, b_pool));
    std::memset(a_pool.region().data(), 0xEE, a_pool.region().size());
    std::vector<PageCopy> pull;
    for (gpu::PageId p = 0; p < 48; ++p) pull.push_back({p, 95 - p});
    const TransferResult r = a->pull(b->url(), pull).get();
    ASSERT_TRUE(r.ok()) << r.message;
    for (const PageCopy& p : pull)
      ASSERT_EQ(test::check_pattern(a_pool.page(p.local), kPageBytes, 2, p.remote), kPageBytes);
    std::vector<PageCopy> push;
    for (gpu::PageId p = 0; p < 48; ++p) {
      test::fill_pattern(a_pool.page(p), kPageBytes, 5, p);
      push.push_back({p, p});
    }
    const TransferResult w = a->push(b->url(), push).get();
    ASSERT_TRUE(w.ok()) << w.message;
    for (gpu::PageId p = 0; p < 48; ++p)
      ASSERT_EQ(test::check_pattern(b_pool.page(p), kPageBytes, 5, p), kPageBytes);
    EXPECT_EQ(w.stats.ops, 48u);          // one page per run through a slot
    for (gpu::PageId p = 0; p < 96; ++p)  // restore B's pattern for the next transport
      test::fill_pattern(b_pool.page(p), kPageBytes, 2, p);
  }
}

// A device pool (cudaMalloc) moving through the pinned staging ring, and a pinned pool
// registered directly. Runs where a GPU is present; elsewhere it says why it skipped.
TEST(DevicePool, PullAndPushThroughThePinnedStagingRing) {
  const gpu::CudaProbe cuda = gpu::probe_cuda();
  if (cuda.devices.empty()) GTEST_SKIP() << "needs a CUDA GPU: " << cuda.note;
  constexpr std::size_t kPageBytes = 2 << 20;
  gpu::PoolOptions device;
  device.page_bytes = kPageBytes;
  device.pages = 16;
  device.region.kind = gpu::MemoryKind::kDevice;
  gpu::ChunkPool gpu_pool = must(gpu::ChunkPool::create(device));
  gpu::PoolOptions pinned = device;
  pinned.region.kind = gpu::MemoryKind::kPinnedHost;
  gpu::ChunkPool pinned_pool = must(gpu::ChunkPool::create(pinned));
  for (gpu::PageId p = 0; p < 16; ++p) test::fill_pattern(pinned_pool.page(p), kPageBytes, 8, p);
  auto on_gpu = must(TransferPlane::start(PlaneOptions{}, gpu_pool));
  auto host = must(TransferPlane::start(PlaneOptions{}, pinned_pool));
  std::vector<PageCopy> pages;
  for (gpu::PageId p = 0; p < 16; ++p) pages.push_back({p, 15 - p});
  const TransferResult r = on_gpu->pull(host->url(), pages).get();
  ASSERT_TRUE(r.ok()) << r.message;
  auto engine = must(gpu::make_cuda_copy_engine(gpu_pool.region().device()));
  std::vector<std::byte> back(kPageBytes);
  auto read_back = [&](gpu::PageId p) {
    const auto ticket = must(engine->copy(back.data(), gpu_pool.page(p), kPageBytes));
    while (!must(engine->done(ticket))) {
    }
  };
  for (const PageCopy& p : pages) {
    read_back(p.local);
    ASSERT_EQ(test::check_pattern(back.data(), kPageBytes, 8, p.remote), kPageBytes);
  }
  std::vector<PageCopy> home;  // device pages back into other pinned pages, reversed again
  for (gpu::PageId p = 0; p < 8; ++p) home.push_back({p, p});
  const TransferResult w = on_gpu->push(host->url(), home).get();
  ASSERT_TRUE(w.ok()) << w.message;
  for (gpu::PageId p = 0; p < 8; ++p)
    EXPECT_EQ(test::check_pattern(pinned_pool.page(p), kPageBytes, 8, 15 - p), kPageBytes);
}

// ---- Hostile peers ----------------------------------------------------------------------------

ucx::ContextOptions loopback_tcp() {
  ucx::ContextOptions o;
  o.tls = "tcp";
  o.net_devices = "lo";
  return o;
}

PlaneOptions plane_over_tcp() {
  PlaneOptions o;
  o.tls = "tcp";
  o.net_devices = "lo";
  return o;
}

struct Answer {
  bool received = false;
  am::RunHeader header;
  std::size_t length = 0;
  std::string text;
};

ucs_status_t record_answer(void* arg, const void* header, std::size_t header_length, void* data,
                           std::size_t length, const ucp_am_recv_param_t* p) {
  auto* a = static_cast<Answer*>(arg);
  if (auto h = am::read<am::RunHeader>(header, header_length)) a->header = *h;
  if (header_length == 0) a->header = {};
  a->length = length;
  if (!(p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) && length < 4096)
    a->text.assign(static_cast<const char*>(data), length);
  a->received = true;
  return UCS_OK;  // a rendezvous is dropped: the length is what the test checks
}

void set_handler(const ucx::Worker& w, unsigned id, Answer* answer) {
  ASSERT_TRUE(w.set_am_handler(id, &record_answer, answer));
}

TEST(HostilePeer, RequestsOutsideThePoolAreRejectedAndAnswered) {
  constexpr std::size_t kPageBytes = 64 << 10;
  gpu::ChunkPool pool = make_pool(kPageBytes, 8, 3);
  auto plane = must(TransferPlane::start(plane_over_tcp(), pool));
  const auto port =
      static_cast<std::uint16_t>(std::stoi(plane->url().substr(plane->url().rfind(':') + 1)));

  // A client speaking the plane's wire by hand.
  const ucx::Context ctx = must(ucx::Context::create(loopback_tcp()));
  const ucx::Worker worker = must(ucx::Worker::create(ctx));
  std::vector<std::byte> mine(kPageBytes);
  const ucx::Registration reg = must(ucx::Registration::map(ctx, mine.data(), mine.size()));
  PeerDescriptor hello;
  hello.node = "hostile";
  hello.worker_address = must(worker.address());
  hello.rkey = must(reg.packed_rkey());
  hello.base = reinterpret_cast<std::uint64_t>(mine.data());
  hello.page_bytes = kPageBytes;
  hello.pages = 1;
  // Dial by hand and keep the control link open: the plane ends a session whose link goes away.
  ControlLink control = must(ControlLink::dial("127.0.0.1", port, encode(hello)));
  std::optional<ucx::Bytes> welcome_bytes;
  for (auto until = Clock::now() + 10s; !welcome_bytes && Clock::now() < until;) {
    ASSERT_TRUE(control.pump());
    welcome_bytes = control.take_frame();
  }
  ASSERT_TRUE(welcome_bytes);
  const PeerDescriptor server = must(decode_descriptor(*welcome_bytes));
  const ucx::Endpoint ep = must(ucx::Endpoint::connect(worker, server.worker_address));
  Answer reject, ack, data;
  set_handler(worker, am::kPullReject, &reject);
  set_handler(worker, am::kPushAck, &ack);
  set_handler(worker, am::kPullData, &data);
  auto send = [&](unsigned id, const void* header, std::size_t hl, const void* body,
                  std::size_t bl) {
    ucp_request_param_t param{};
    const Status sent = worker.wait(ucp_am_send_nbx(ep.get(), id, header, hl, body, bl, &param),
                                    Clock::now() + 10s, "send");
    ASSERT_TRUE(sent) << "am " << id << ": " << sent.error().message;
  };
  auto wait_for = [&](Answer& a) {
    for (auto until = Clock::now() + 10s; !a.received && Clock::now() < until;) worker.progress();
    return a.received;
  };

  const am::PullRequest request{42, 1};
  const am::RunRequest outside{0, 7, 2};  // pages 7 and 8 of an 8-page pool
  send(am::kPullRequest, &request, sizeof(request), &outside, sizeof(outside));
  ASSERT_TRUE(wait_for(reject));
  EXPECT_EQ(reject.header.transfer, 42u);
  EXPECT_EQ(reject.header.code, am::RunCode::kOutOfPool);
  EXPECT_NE(reject.text.find("outside this pool of 8"), std::string::npos) << reject.text;

  const am::PushHeader push{43, {0, 100, 1}};
  send(am::kPushData, &push, sizeof(push), mine.data(), kPageBytes);
  ASSERT_TRUE(wait_for(ack));
  EXPECT_EQ(ack.header.transfer, 43u);
  EXPECT_EQ(ack.header.code, am::RunCode::kOutOfPool);
  const am::PushHeader short_push{44, {0, 1, 1}};  // in the pool, but half a page of bytes
  ack = {};
  send(am::kPushData, &short_push, sizeof(short_push), mine.data(), kPageBytes / 2);
  ASSERT_TRUE(wait_for(ack));
  EXPECT_EQ(ack.header.code, am::RunCode::kBadLength);
  EXPECT_EQ(test::check_pattern(pool.page(1), kPageBytes, 3, 1), kPageBytes)
      << "page 1 was touched";

  send(am::kPullRequest, &request, 3, nullptr, 0);  // a truncated header: dropped, counted
  const am::RunRequest inside{0, 2, 1};
  send(am::kPullRequest, &request, sizeof(request), &inside, sizeof(inside));
  ASSERT_TRUE(wait_for(data));  // the plane still serves
  EXPECT_EQ(data.length, kPageBytes);
  EXPECT_GE(plane->counters().requests_rejected, 4u);
}

// Notices (bytes read, pages written) and requests (pull, push) count only on sessions peers
// opened to this node: a peer this node dialed cannot inflate its served bytes, mark its pages
// written, read or write its pool through that session; they are counted as refused.
TEST(HostilePeer, NoticesAndRequestsOnASessionThisNodeOpenedAreRefused) {
  constexpr std::size_t kPageBytes = 4096;
  gpu::ChunkPool pool = make_pool(kPageBytes, 8, 1);
  std::atomic<std::size_t> written{0};
  PlaneOptions options = plane_over_tcp();
  options.on_written = [&](const std::string&, const std::vector<gpu::PageId>& pages) {
    written += pages.size();
  };
  auto plane = must(TransferPlane::start(options, pool));

  // A fake peer the plane dials: it learns the plane's session worker from the hello.
  const ucx::Context ctx = must(ucx::Context::create(loopback_tcp()));
  const ucx::Worker worker = must(ucx::Worker::create(ctx));
  std::vector<std::byte> mine(kPageBytes);
  const ucx::Registration reg = must(ucx::Registration::map(ctx, mine.data(), mine.size()));
  PeerDescriptor me;
  me.node = "hostile";
  me.worker_address = must(worker.address());
  me.rkey = must(reg.packed_rkey());
  me.base = reinterpret_cast<std::uint64_t>(mine.data());
  me.page_bytes = kPageBytes;
  me.pages = 1;
  std::mutex mutex;
  std::optional<PeerDescriptor> hello;
  ListenerHooks hooks;
  hooks.answer = [&](const LinkBytes& body, LinkId) {
    std::lock_guard lock(mutex);
    hello = must(decode_descriptor(body));
    return ListenerAnswer{encode(me), true};
  };
  auto listener = must(Listener::bind("127.0.0.1", 0, std::move(hooks)));
  std::atomic<bool> stop{false};
  std::thread accepting([&] {
    while (!stop) listener->progress();
  });
  Answer asked, answered;
  set_handler(worker, am::kAsk, &asked);
  set_handler(worker, am::kAnswer, &answered);
  const std::string url = "127.0.0.1:" + std::to_string(listener->port());
  auto open = plane->ask(url, {std::byte{1}}, {std::chrono::milliseconds(20'000)});
  auto wait_for = [&](Answer& a) {
    for (auto until = Clock::now() + 10s; !a.received && Clock::now() < until;) worker.progress();
    return a.received;
  };
  ASSERT_TRUE(wait_for(asked));  // the plane's session is open
  std::optional<PeerDescriptor> plane_session;
  {
    std::lock_guard lock(mutex);
    plane_session = hello;
  }
  ASSERT_TRUE(plane_session);
  const ucx::Endpoint ep = must(ucx::Endpoint::connect(worker, plane_session->worker_address));
  auto send = [&](unsigned id, const void* header, std::size_t hl, const void* body,
                  std::size_t bl) {
    ucp_request_param_t param{};
    const Status sent = worker.wait(ucp_am_send_nbx(ep.get(), id, header, hl, body, bl, &param),
                                    Clock::now() + 10s, "send");
    ASSERT_TRUE(sent) << "am " << id << ": " << sent.error().message;
  };
  const am::PullRequest notice{1, 1};
  const am::RunRequest whole_pool{0, 0, 8};
  for (int i = 0; i < 4; ++i) {
    send(am::kRead, &notice, sizeof(notice), &whole_pool, sizeof(whole_pool));
    send(am::kWritten, &notice, sizeof(notice), &whole_pool, sizeof(whole_pool));
  }
  // Requests only an acceptor serves: a pull of page 2 and a push into page 3 of our pool.
  Answer pulled;
  set_handler(worker, am::kPullData, &pulled);
  const am::PullRequest pull{2, 1};
  const am::RunRequest page_2{0, 2, 1};
  send(am::kPullRequest, &pull, sizeof(pull), &page_2, sizeof(page_2));
  const am::PushHeader push{3, {0, 3, 1}};
  send(am::kPushData, &push, sizeof(push), mine.data(), kPageBytes);
  // Two asks answered after the notices (same endpoint, in order): the plane has handled the
  // notices and folded its counters by the second answer.
  for (std::uint64_t id : {7u, 8u}) {
    answered = {};
    const am::AskHeader ask{id, am::AnswerCode::kAnswered, 0};
    send(am::kAsk, &ask, sizeof(ask), nullptr, 0);
    ASSERT_TRUE(wait_for(answered));
  }
  for (auto until = Clock::now() + 200ms; Clock::now() < until;) worker.progress();
  EXPECT_EQ(plane->counters().bytes_served, 0u);
  EXPECT_EQ(written.load(), 0u);
  EXPECT_FALSE(pulled.received) << "the plane served a pull on a session it opened";
  EXPECT_EQ(test::check_pattern(pool.page(3), kPageBytes, 1, 3), kPageBytes)
      << "page 3 was written";
  EXPECT_GE(plane->counters().requests_rejected, 10u);  // 8 notices, the pull and the push
  plane.reset();
  stop = true;
  accepting.join();
}

// A listener that answers every hello with a fixed descriptor, progressed by its own thread.
class FakePeer {
 public:
  explicit FakePeer(const std::function<PeerDescriptor(const ucx::Worker&)>& describe,
                    bool serve = true)
      : ctx_(must(ucx::Context::create(loopback_tcp()))), worker_(must(ucx::Worker::create(ctx_))) {
    listener_ = must(Listener::bind("127.0.0.1", 0, encode(describe(worker_))));
    if (serve)
      thread_ = std::thread([this] {
        while (!stop_) listener_->progress();
      });
  }
  ~FakePeer() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::string url() const { return "127.0.0.1:" + std::to_string(listener_->port()); }

 private:
  ucx::Context ctx_;
  ucx::Worker worker_;
  std::unique_ptr<Listener> listener_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(HostilePeer, ABadRkeyOrAForeignChunkSizeRefusesTheSession) {
  gpu::ChunkPool pool = make_pool(4096, 4, 1);
  auto plane = must(TransferPlane::start(plane_over_tcp(), pool));
  auto describe = [](std::size_t page_bytes, ucx::Bytes rkey) {
    return [=](const ucx::Worker& w) {
      PeerDescriptor d;
      d.node = "fake";
      d.worker_address = must(w.address());
      d.rkey = rkey;
      d.base = 1 << 20;
      d.page_bytes = page_bytes;
      d.pages = 4;
      return d;
    };
  };
  ucx::Bytes garbage(10, std::byte{0xff});  // announces 64 memory domains, holds none
  FakePeer bad_rkey(describe(4096, garbage));
  TransferResult r = plane->pull(bad_rkey.url(), {{0, 0}}).get();
  EXPECT_EQ(r.failure, Failure::kConnect);
  EXPECT_NE(r.message.find("rkey"), std::string::npos) << r.message;

  FakePeer foreign(describe(8192, garbage));
  r = plane->pull(foreign.url(), {{0, 0}}).get();
  EXPECT_EQ(r.failure, Failure::kConnect);
  EXPECT_NE(r.message.find("not the same chunk size"), std::string::npos) << r.message;

  r = plane->pull("127.0.0.1", {{0, 0}}).get();
  EXPECT_EQ(r.failure, Failure::kInvalid);
  EXPECT_NE(r.message.find("expected host:port"), std::string::npos) << r.message;
}

// Each accepted session costs a UCX worker: past max_sessions a hello is refused with a reason,
// and the peers already in session are served as before.
TEST(Plane, HellosBeyondTheSessionCapAreRefused) {
  gpu::ChunkPool server_pool = make_pool(4096, 4, 1);
  gpu::ChunkPool a_pool = make_pool(4096, 4, 2);
  gpu::ChunkPool b_pool = make_pool(4096, 4, 3);
  PlaneOptions capped = plane_over_tcp();
  capped.max_sessions = 1;
  auto server = must(TransferPlane::start(capped, server_pool));
  auto a = must(TransferPlane::start(plane_over_tcp(), a_pool));
  auto b = must(TransferPlane::start(plane_over_tcp(), b_pool));
  TransferResult r = a->pull(server->url(), {{0, 0}}).get();
  ASSERT_TRUE(r.ok()) << r.message;
  r = b->pull(server->url(), {{0, 1}}).get();
  EXPECT_EQ(r.failure, Failure::kConnect);
  EXPECT_NE(r.message.find("too many sessions"), std::string::npos) << r.message;
  r = a->pull(server->url(), {{1, 2}}).get();
  EXPECT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(test::check_pattern(a_pool.page(1), 4096, 1, 2), 4096u);
}

TEST(Plane, CancelAndShutdownEndEveryTransfer) {
  gpu::ChunkPool pool = make_pool(4096, 4, 1);
  auto plane = must(TransferPlane::start(plane_over_tcp(), pool));
  // A listener nobody progresses: the hello is never answered.
  FakePeer silent(
      [](const ucx::Worker& w) {
        PeerDescriptor d;
        d.worker_address = must(w.address());
        d.rkey = {std::byte{1}};
        d.page_bytes = 4096;
        d.pages = 1;
        return d;
      },
      /*serve=*/false);
  std::promise<TransferResult> first;
  const TransferId id =
      plane->pull(silent.url(), {{0, 0}}, [&](TransferResult r) { first.set_value(std::move(r)); });
  std::this_thread::sleep_for(50ms);
  const auto t0 = Clock::now();
  plane->cancel(id);
  TransferResult r = first.get_future().get();
  EXPECT_EQ(r.failure, Failure::kCancelled) << r.message;
  EXPECT_LT(Clock::now() - t0, 1s);

  auto pending = plane->pull(silent.url(), {{1, 0}});
  std::this_thread::sleep_for(50ms);
  plane.reset();
  r = pending.get();
  EXPECT_EQ(r.failure, Failure::kCancelled) << r.message;
}

}  // namespace
}  // namespace kvnode::transfer
