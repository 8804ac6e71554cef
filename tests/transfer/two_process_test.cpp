// Two real processes on loopback: this test and transfer_test_peer, over tcp and over UCX's
// default transports (shared memory, cma). Handshake at the peer's listener, connect to the
// worker address from its descriptor, read and write its pool, then kill it mid-session.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <thread>

#include "kvnode/transfer/descriptor.hpp"
#include "kvnode/transfer/listener.hpp"
#include "support/must.hpp"
#include "support/child_process.hpp"

namespace kvnode::transfer {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using test::must;

struct Transport {
  const char* name;
  const char* tls;  // nullptr: UCX's choice
};

class TwoProcesses : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    // Both processes read UCX_* from the environment: set it before either creates a context.
    if (GetParam().tls) {
      setenv("UCX_TLS", GetParam().tls, 1);
      setenv("UCX_NET_DEVICES", "lo", 1);
    } else {
      unsetenv("UCX_TLS");
      unsetenv("UCX_NET_DEVICES");
    }
    port_file_ = ::testing::TempDir() + "transfer_peer_port_" + GetParam().name;
    std::remove(port_file_.c_str());
    peer_.emplace(std::vector<std::string>{TRANSFER_TEST_PEER_PATH, port_file_});
    for (auto until = Clock::now() + 20s; Clock::now() < until; std::this_thread::sleep_for(10ms)) {
      std::ifstream in(port_file_);
      if (in >> port_) return;
      ASSERT_TRUE(peer_->running()) << "peer " << peer_->describe_exit() << ": " << peer_->output();
    }
    FAIL() << "the peer did not start listening: " << peer_->output();
  }
  void TearDown() override {
    unsetenv("UCX_TLS");
    unsetenv("UCX_NET_DEVICES");
    std::remove(port_file_.c_str());
  }

  std::string port_file_;
  std::optional<test::ChildProcess> peer_;
  std::uint16_t port_ = 0;
};

TEST_P(TwoProcesses, ReadWriteThenSurviveThePeersDeath) {
  const ucx::Context context = must(ucx::Context::create());
  const ucx::Worker worker = must(ucx::Worker::create(context));
  PeerDescriptor mine;
  mine.node = "test";
  mine.worker_address = must(worker.address());
  mine.rkey = {std::byte{1}};
  mine.base = 4096;
  mine.page_bytes = 1;
  mine.pages = 1;
  const PeerDescriptor peer = must(decode_descriptor(
      must(handshake(worker, "127.0.0.1", port_, encode(mine), Clock::now() + 10s))));
  ASSERT_EQ(peer.pages, 4u);
  ASSERT_EQ(peer.page_bytes, 256u << 10);
  const ucx::Endpoint ep = must(ucx::Endpoint::connect(worker, peer.worker_address));
  const ucx::RemoteKey rkey = must(ucx::RemoteKey::unpack(ep, peer.rkey));
  const std::size_t n = peer.page_bytes;
  auto remote = [&](std::uint32_t page) { return peer.base + page * peer.page_bytes; };

  std::vector<std::byte> buf(n, std::byte{0xEE});  // poisoned
  const ucx::Registration reg = must(ucx::Registration::map(context, buf.data(), buf.size()));
  ASSERT_TRUE(ucx::get(worker, ep, buf.data(), n, remote(2), rkey, Clock::now() + 10s));
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_EQ(buf[i], static_cast<std::byte>((2 * 31 + i) & 0xff)) << "byte " << i;

  std::vector<std::byte> data(n);
  std::mt19937 rng(42);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  const ucx::Registration data_reg = must(ucx::Registration::map(context, data.data(), n));
  ASSERT_TRUE(ucx::put(worker, ep, data.data(), n, remote(1), rkey, Clock::now() + 10s));
  std::fill(buf.begin(), buf.end(), std::byte{0xEE});
  ASSERT_TRUE(ucx::get(worker, ep, buf.data(), n, remote(1), rkey, Clock::now() + 10s));
  EXPECT_EQ(buf, data);

  peer_->stop(SIGKILL, 5s);  // the remote node dies
  const auto start = Clock::now();
  Status s;
  for (int i = 0; i < 20 && s; ++i)
    s = ucx::put(worker, ep, data.data(), n, remote(1), rkey, Clock::now() + 1s);
  EXPECT_FALSE(s) << "writing to a dead process cannot keep succeeding";
  EXPECT_LT(Clock::now() - start, 25s);
  // This side keeps working: a fresh handshake to the dead port fails cleanly.
  EXPECT_FALSE(handshake(worker, "127.0.0.1", port_, encode(mine), Clock::now() + 2s));
}

INSTANTIATE_TEST_SUITE_P(Transports, TwoProcesses,
                         ::testing::Values(Transport{"tcp", "tcp"}, Transport{"default", nullptr}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Descriptor, RoundTripAndHostileInput) {
  PeerDescriptor d;
  d.node = "10.0.0.5:5555";
  d.worker_address = {std::byte{1}, std::byte{2}};
  d.rkey = {std::byte{3}};
  d.base = 1 << 20;
  d.page_bytes = 32 << 20;
  d.pages = 100;
  const PeerDescriptor back = must(decode_descriptor(encode(d)));
  EXPECT_EQ(back.node, d.node);
  EXPECT_EQ(back.worker_address, d.worker_address);
  EXPECT_EQ(back.rkey, d.rkey);
  EXPECT_EQ(back.base, d.base);
  EXPECT_EQ(back.page_bytes, d.page_bytes);
  EXPECT_EQ(back.pages, d.pages);

  auto error_of = [](const ucx::Bytes& b) {
    const auto r = decode_descriptor(b);
    return r ? std::string("accepted") : r.error().message;
  };
  EXPECT_NE(error_of({}).find("not msgpack"), std::string::npos);
  EXPECT_NE(error_of({std::byte{0x90}}).find("expected a map"), std::string::npos);
  PeerDescriptor bad = d;
  bad.rkey.clear();
  EXPECT_EQ(error_of(encode(bad)), "descriptor.rkey: empty");
  bad = d;
  bad.base = ~0ull - 10;
  EXPECT_NE(error_of(encode(bad)).find("wraps"), std::string::npos);
  // A bin header claiming 4 GiB with 3 bytes behind it: no allocation, an error.
  const ucx::Bytes lying{std::byte{0x81}, std::byte{0xa4}, std::byte{'r'}, std::byte{'k'},
                         std::byte{'e'},  std::byte{'y'},  std::byte{0xc6}, std::byte{0xff},
                         std::byte{0xff}, std::byte{0xff}, std::byte{0xff}, std::byte{1}};
  EXPECT_NE(error_of(lying), "accepted");
}

}  // namespace
}  // namespace kvnode::transfer
