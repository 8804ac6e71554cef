// The first contact at peer_init_url over real UCX: a listener progressed by its own thread, a
// peer handshaking with it, then the data path connected to the worker address it learned.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "kvnode/transfer/listener.hpp"
#include "support/must.hpp"

namespace kvnode::transfer {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using test::must;

ucx::ContextOptions loopback_tcp() {
  ucx::ContextOptions o;
  o.net_devices = "lo";  // sockaddr endpoints are tcp; keep them on loopback
  return o;
}

ucx::Bytes text(const std::string& s) {
  ucx::Bytes b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

TEST(Listener, HandshakeSwapsDescriptorsAndTheWorkerAddressCarriesData) {
  const ucx::Context server_ctx = must(ucx::Context::create(loopback_tcp()));
  const ucx::Worker server_worker = must(ucx::Worker::create(server_ctx));
  // The server's descriptor is its worker address: what the plane will send (plus rkeys).
  const ucx::Bytes server_address = must(server_worker.address());
  std::vector<std::byte> target(4096, std::byte{0xEE});
  const ucx::Registration reg =
      must(ucx::Registration::map(server_ctx, target.data(), target.size()));
  const ucx::Bytes rkey = must(reg.packed_rkey());
  auto listener = must(Listener::bind(server_worker, "127.0.0.1", 0, server_address));
  ASSERT_NE(listener->port(), 0);
  std::atomic<bool> stop{false};
  std::thread progress([&] {
    while (!stop) listener->progress();
  });

  const ucx::Context ctx = must(ucx::Context::create(loopback_tcp()));
  const ucx::Worker worker = must(ucx::Worker::create(ctx));
  for (int round = 0; round < 2; ++round) {  // a second handshake works the same
    const auto answer =
        handshake(worker, "127.0.0.1", listener->port(), text("peer-" + std::to_string(round)),
                  Clock::now() + 10s);
    ASSERT_TRUE(answer) << answer.error().message;
    EXPECT_EQ(*answer, server_address);
  }
  {
    const ucx::Endpoint ep = must(ucx::Endpoint::connect(worker, server_address));
    const ucx::RemoteKey key = must(ucx::RemoteKey::unpack(ep, rkey));
    std::vector<std::byte> data(4096);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 7);
    const Status s = ucx::put(worker, ep, data.data(), data.size(),
                              reinterpret_cast<std::uint64_t>(target.data()), key, Clock::now() + 10s);
    ASSERT_TRUE(s) << s.error().message;
    EXPECT_EQ(target, data);
  }
  stop = true;
  progress.join();
  EXPECT_EQ(listener->handshakes(), 2u);
}

TEST(Listener, NobodyListeningAndBadAddressesAreErrors) {
  const ucx::Context ctx = must(ucx::Context::create(loopback_tcp()));
  const ucx::Worker worker = must(ucx::Worker::create(ctx));
  // A port that was just free: nothing answers, and the deadline bounds the wait.
  std::uint16_t port = 0;
  {
    auto probe = must(Listener::bind(worker, "127.0.0.1", 0, ucx::Bytes{}));
    port = probe->port();
  }
  const auto start = Clock::now();
  const auto none = handshake(worker, "127.0.0.1", port, text("hi"), Clock::now() + 2s);
  EXPECT_FALSE(none);
  EXPECT_LT(Clock::now() - start, 10s);
  const auto bad = handshake(worker, "not-an-ip", 1234, text("hi"), Clock::now() + 1s);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("not-an-ip"), std::string::npos);
  const auto bound = Listener::bind(worker, "999.1.1.1", 0, ucx::Bytes{});
  ASSERT_FALSE(bound);
}

}  // namespace
}  // namespace kvnode::transfer
