// UCX handles over real transports in one process: two contexts and workers stand for two peers,
// connected by worker address as the plane connects them. Parametrised over tcp on loopback and
// UCX's default choice; the endpoints ask for peer error handling, with which UCX 1.13 leaves
// out its shared-memory transports, so both run over tcp here (the plane's tests cover shared
// memory). Destination memory is poisoned first and every byte is checked. The peer's worker is
// progressed by its own thread, as a remote node would be.
#include "ucx_handles.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "kvnode/gpu/chunk_pool.hpp"
#include "support/must.hpp"

namespace kvnode::transfer::ucx {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using test::must;

struct Transport {
  const char* name;
  std::optional<std::string> tls, net_devices;
};

ContextOptions options_for(const Transport& t) {
  ContextOptions o;
  o.tls = t.tls;
  o.net_devices = t.net_devices;
  return o;
}

// A peer: a context, a worker progressed by a thread, and a registered chunk pool.
struct Peer {
  explicit Peer(const Transport& t)
      : context(must(Context::create(options_for(t)))),
        worker(must(Worker::create(context))),
        pool(must(gpu::ChunkPool::create(pool_options()))),
        registration(must(Registration::map(context, pool.region().data(), pool.region().size()))) {
  }
  ~Peer() { stop(); }

  static gpu::PoolOptions pool_options() {
    gpu::PoolOptions o;
    o.page_bytes = 1 << 20;
    o.pages = 8;
    return o;
  }
  void start() {
    progress = std::thread([this] {
      while (!stopping.load(std::memory_order_relaxed)) worker.progress();
    });
  }
  void stop() {
    stopping = true;
    if (progress.joinable()) progress.join();
  }

  Context context;
  Worker worker;
  gpu::ChunkPool pool;
  Registration registration;
  std::thread progress;
  std::atomic<bool> stopping{false};
};

class UcxHandles : public ::testing::TestWithParam<Transport> {};

std::vector<std::byte> random_bytes(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

TEST_P(UcxHandles, PutAndGetMoveEveryByteOfAPage) {
  Peer server(GetParam());
  const Bytes server_address = must(server.worker.address());
  const Bytes rkey_bytes = must(server.registration.packed_rkey());
  std::memset(server.pool.page(3), 0xEE, server.pool.page_bytes());  // poison
  server.start();

  const Context context = must(Context::create(options_for(GetParam())));
  const Worker worker = must(Worker::create(context));
  const Endpoint ep = must(Endpoint::connect(worker, server_address));
  const RemoteKey rkey = must(RemoteKey::unpack(ep, rkey_bytes));
  const std::size_t n = server.pool.page_bytes();
  const auto remote = [&](gpu::PageId p) {
    return reinterpret_cast<std::uint64_t>(server.pool.page(p));
  };

  std::vector<std::byte> data = random_bytes(n, 7);
  const Registration local = must(Registration::map(context, data.data(), data.size()));
  const Status put_status = put(worker, ep, data.data(), n, remote(3), rkey, Clock::now() + 10s);
  ASSERT_TRUE(put_status) << put_status.error().message;
  // put returned after a flush: the bytes are in the server's page now.
  EXPECT_EQ(std::memcmp(server.pool.page(3), data.data(), n), 0);

  std::vector<std::byte> back(n, std::byte{0x11});
  const Registration back_reg = must(Registration::map(context, back.data(), back.size()));
  const Status get_status = get(worker, ep, back.data(), n, remote(3), rkey, Clock::now() + 10s);
  ASSERT_TRUE(get_status) << get_status.error().message;
  EXPECT_EQ(back, data);
  server.stop();
}

TEST_P(UcxHandles, ADeadPeerFailsTheOperationWithinTheDeadline) {
  std::optional<Peer> server(std::in_place, GetParam());
  const Bytes server_address = must(server->worker.address());
  const Bytes rkey_bytes = must(server->registration.packed_rkey());
  const std::uint64_t remote = reinterpret_cast<std::uint64_t>(server->pool.page(0));
  server->start();

  const Context context = must(Context::create(options_for(GetParam())));
  const Worker worker = must(Worker::create(context));
  const Endpoint ep = must(Endpoint::connect(worker, server_address));
  const RemoteKey rkey = must(RemoteKey::unpack(ep, rkey_bytes));
  std::vector<std::byte> data = random_bytes(64 << 10, 3);
  ASSERT_TRUE(put(worker, ep, data.data(), data.size(), remote, rkey, Clock::now() + 10s));

  server.reset();  // the peer's worker, memory and context are gone
  const auto start = Clock::now();
  Status s;
  for (int i = 0; i < 20 && s; ++i)  // some transports notice only on a later operation
    s = put(worker, ep, data.data(), data.size(), remote, rkey, Clock::now() + 1s);
  EXPECT_FALSE(s) << "writing to a destroyed peer cannot succeed every time";
  EXPECT_LT(Clock::now() - start, 25s);
}

TEST(UcxHandlesErrors, BadInputIsAnErrorNotACrash) {
  const Context context = must(Context::create());
  const Worker worker = must(Worker::create(context));
  const auto empty = Endpoint::connect(worker, Bytes{});
  ASSERT_FALSE(empty);
  EXPECT_NE(empty.error().message.find("empty"), std::string::npos);
  ContextOptions bogus;
  bogus.tls = "no-such-transport";
  const auto ctx = Context::create(bogus);
  ASSERT_FALSE(ctx);
  EXPECT_NE(ctx.error().message.find("ucp_"), std::string::npos) << ctx.error().message;
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxHandles,
                         ::testing::Values(Transport{"tcp", "tcp", "lo"},
                                           Transport{"default", std::nullopt, std::nullopt}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kvnode::transfer::ucx
