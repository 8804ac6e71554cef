// The first contact at peer_init_url: a listener progressed by its own thread, a peer
// handshaking with it, then the data path connected (over real UCX) to the worker address it
// learned; and what the listener does with clients that are not peers.
#include "listener.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "support/must.hpp"
#include "support/tcp_client.hpp"
#include "ucx_handles.hpp"

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
  auto listener = must(Listener::bind("127.0.0.1", 0, server_address));
  ASSERT_NE(listener->port(), 0);
  std::atomic<bool> stop{false};
  std::thread progress([&] {  // the server's worker too: over tcp, UCX emulates the put with it
    while (!stop) {
      listener->progress();
      server_worker.progress();
    }
  });

  const ucx::Context ctx = must(ucx::Context::create(loopback_tcp()));
  const ucx::Worker worker = must(ucx::Worker::create(ctx));
  for (int round = 0; round < 2; ++round) {  // a second handshake works the same
    const auto answer = handshake("127.0.0.1", listener->port(),
                                  text("peer-" + std::to_string(round)), Clock::now() + 10s);
    ASSERT_TRUE(answer) << answer.error().message;
    EXPECT_EQ(*answer, server_address);
  }
  {
    const ucx::Endpoint ep = must(ucx::Endpoint::connect(worker, server_address));
    const ucx::RemoteKey key = must(ucx::RemoteKey::unpack(ep, rkey));
    std::vector<std::byte> data(4096);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 7);
    const Status s =
        ucx::put(worker, ep, data.data(), data.size(),
                 reinterpret_cast<std::uint64_t>(target.data()), key, Clock::now() + 10s);
    ASSERT_TRUE(s) << s.error().message;
    EXPECT_EQ(target, data);
  }
  stop = true;
  progress.join();
  EXPECT_EQ(listener->handshakes(), 2u);
}

TEST(Listener, NobodyListeningAndBadAddressesAreErrors) {
  // A port that was just free: nothing answers, and the deadline bounds the wait.
  std::uint16_t port = 0;
  {
    auto probe = must(Listener::bind("127.0.0.1", 0, ucx::Bytes{}));
    port = probe->port();
  }
  const auto start = Clock::now();
  const auto none = handshake("127.0.0.1", port, text("hi"), Clock::now() + 2s);
  EXPECT_FALSE(none);
  EXPECT_LT(Clock::now() - start, 10s);
  const auto bad = handshake("not-an-ip", 1234, text("hi"), Clock::now() + 1s);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("not-an-ip"), std::string::npos);
  const auto bound = Listener::bind("999.1.1.1", 0, ucx::Bytes{});
  ASSERT_FALSE(bound);
}

TEST(Listener, APortInUseSaysSo) {
  auto first = must(Listener::bind("127.0.0.1", 0, ucx::Bytes{}));
  const auto second = Listener::bind("127.0.0.1", first->port(), ucx::Bytes{});
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().message,
            "cannot listen at 127.0.0.1:" + std::to_string(first->port()) + ": port in use");
}

// A listener progressed by its own thread; its counters are read once it has stopped.
class Served {
 public:
  explicit Served(ListenerLimits limits = {}) {
    ListenerHooks hooks;
    hooks.answer = [](const LinkBytes&, LinkId) { return ListenerAnswer{text("welcome"), true}; };
    listener_ = must(Listener::bind("127.0.0.1", 0, std::move(hooks), limits));
    thread_ = std::thread([this] {
      while (!stop_) {
        listener_->progress();
        pollfd p{listener_->event_fd(), POLLIN, 0};  // sleep until there is work
        (void)::poll(&p, 1, 20);
      }
    });
  }
  ~Served() { stop(); }
  ListenerCounters stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return listener_->counters();
  }
  std::uint16_t port() const { return listener_->port(); }

 private:
  std::unique_ptr<Listener> listener_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

int connect_to(std::uint16_t port) {
  const int fd = test::connect_loopback(port);
  EXPECT_GE(fd, 0) << std::strerror(errno);
  return fd;
}

// True when the listener closed the connection (end of stream or reset) before `patience`.
bool closed_by_peer(int fd, Clock::duration patience = 10s) {
  for (const auto until = Clock::now() + patience; Clock::now() < until;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[256];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return true;
  }
  return false;
}

std::size_t open_descriptors() {
  return static_cast<std::size_t>(std::distance(
      std::filesystem::directory_iterator("/proc/self/fd"), std::filesystem::directory_iterator()));
}

TEST(Listener, JunkIsClosedAtOnceAndLeavesNoDescriptorBehind) {
  Served served;
  const std::size_t before = open_descriptors();
  std::mt19937 random(7);
  std::vector<std::byte> junk(4096);
  for (std::byte& b : junk) b = static_cast<std::byte>(random());
  constexpr int kClients = 100;
  for (int i = 0; i < kClients; ++i) {
    const int fd = connect_to(served.port());
    ASSERT_EQ(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(junk.size()));
    EXPECT_TRUE(closed_by_peer(fd, 5s)) << "client " << i << " was left open";
    ::close(fd);
  }
  // A header announcing more than a descriptor can be, and a foreign version: closed unread.
  for (const LinkBytes& header : {frame_header(kMaxDescriptorBytes + 1), frame_header(4, 99)}) {
    const int fd = connect_to(served.port());
    ASSERT_EQ(::send(fd, header.data(), header.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(header.size()));
    EXPECT_TRUE(closed_by_peer(fd, 5s));
    ::close(fd);
  }
  // A peer still gets its answer, and the listener holds nothing for the clients that left.
  const auto answer = handshake("127.0.0.1", served.port(), text("hi"), Clock::now() + 10s);
  ASSERT_TRUE(answer) << answer.error().message;
  EXPECT_EQ(*answer, text("welcome"));
  EXPECT_LE(open_descriptors(), before + 1);  // + 1: the handshake's link may still be closing
  const ListenerCounters c = served.stop();
  EXPECT_EQ(c.dropped, kClients + 2u);
  EXPECT_EQ(c.handshakes, 1u);
}

TEST(Listener, SilentClientsTimeOutAndAreCapped) {
  ListenerLimits limits;
  limits.max_pending = 4;
  limits.hello_timeout = 3s;  // long enough for ten connects on a loaded host
  Served served(limits);
  std::vector<int> fds;
  for (int i = 0; i < 10; ++i) fds.push_back(connect_to(served.port()));
  // Four wait for their hello until the timeout; the others are closed as they come (a slow
  // host may time some of the four out early, which lets a later one wait in its place).
  for (int fd : fds) EXPECT_TRUE(closed_by_peer(fd, 20s));
  for (int fd : fds) ::close(fd);
  const auto answer = handshake("127.0.0.1", served.port(), text("hi"), Clock::now() + 10s);
  ASSERT_TRUE(answer) << answer.error().message;
  const ListenerCounters c = served.stop();
  EXPECT_GE(c.refused, 1u);  // 0 without the cap
  EXPECT_GE(c.dropped, 4u);
  EXPECT_EQ(c.refused + c.dropped, 10u);
}

// Both ends of a link use tcp keepalive, so a peer host that vanishes (no FIN) ends the session
// on the accepting side too, not only on the dialing one.
TEST(Listener, AcceptedLinksUseKeepalive) {
  Served served;
  ControlLink link = must(ControlLink::dial("127.0.0.1", served.port(), text("hi")));
  std::optional<LinkBytes> welcome;
  for (auto until = Clock::now() + 10s; !welcome && Clock::now() < until;) {
    ASSERT_TRUE(link.pump());
    welcome = link.take_frame();
    pollfd p{link.fd(), POLLIN, 0};
    (void)::poll(&p, 1, 20);
  }
  ASSERT_TRUE(welcome);
  // The accepted socket lives in this process: find it by its local port.
  int keepalive = -1;
  int idle = -1;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(entry.path().filename().string());
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    int listening = 0;
    socklen_t ol = sizeof(listening);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0 ||
        local.sin_family != AF_INET || ntohs(local.sin_port) != served.port() ||
        ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ol) != 0 || listening)
      continue;
    ol = sizeof(keepalive);
    ASSERT_EQ(::getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &keepalive, &ol), 0);
    ol = sizeof(idle);
    ASSERT_EQ(::getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, &ol), 0);
  }
  EXPECT_EQ(keepalive, 1) << "the accepted link has no keepalive";
  EXPECT_EQ(idle, 5);
  int dialer = 0;
  socklen_t ol = sizeof(dialer);
  ASSERT_EQ(::getsockopt(link.fd(), SOL_SOCKET, SO_KEEPALIVE, &dialer, &ol), 0);
  EXPECT_EQ(dialer, 1);
}

// Out of descriptors: each waiting client is taken off the backlog with the reserve descriptor
// and closed (it hears at once), the listener does not spin, and it serves again afterwards.
// UBSan checks a virtual call's object by reading it through a pipe it opens on the spot; with no
// descriptor left that fails and it reports a false "invalid vptr" on the listener's first log
// line. One logged line beforehand puts the logger's type in UBSan's cache, so no pipe is needed.
void warm_up_logger_before_descriptors_run_out() {
  spdlog::warn("listener test: logger warm-up");
}

TEST(Listener, OutOfDescriptorsRefusesAndRecovers) {
  warm_up_logger_before_descriptors_run_out();
  ListenerLimits limits;
  limits.log_interval = 1h;  // one line for the whole episode
  ListenerHooks hooks;
  hooks.answer = [](const LinkBytes&, LinkId) { return ListenerAnswer{text("welcome"), true}; };
  std::unique_ptr<Listener> listener =
      must(Listener::bind("127.0.0.1", 0, std::move(hooks), limits));
  constexpr int kClients = 5;
  std::vector<int> clients;
  for (int i = 0; i < kClients; ++i)
    clients.push_back(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  // Use up every descriptor this process may open (under a lowered limit, restored after).
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit lowered = saved;
  lowered.rlim_cur = std::min<rlim_t>(saved.rlim_cur, open_descriptors() + 64);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  std::vector<int> filler;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) filler.push_back(fd);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(listener->port());
  for (int fd : clients) EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  for (const auto until = Clock::now() + 10s;
       listener->counters().out_of_descriptors < kClients && Clock::now() < until;)
    listener->progress();
  for (int fd : filler) ::close(fd);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_EQ(listener->counters().out_of_descriptors, static_cast<std::uint64_t>(kClients));
  for (int fd : clients) {
    EXPECT_TRUE(closed_by_peer(fd, 5s));
    ::close(fd);
  }
  std::atomic<bool> stop{false};
  std::thread progress([&] {
    while (!stop) listener->progress();
  });
  const auto answer = handshake("127.0.0.1", listener->port(), text("hi"), Clock::now() + 10s);
  stop = true;
  progress.join();
  EXPECT_TRUE(answer) << answer.error().message;
}

// A reserve descriptor that could not be opened (another thread took the number) is opened
// again once descriptors are free, so the next shortage refuses clients instead of pausing.
TEST(Listener, ALostReserveIsReopened) {
  warm_up_logger_before_descriptors_run_out();
  ListenerLimits limits;
  limits.log_interval = 1h;
  constexpr int kClients = 3;
  std::vector<int> clients;
  for (int i = 0; i < kClients; ++i)
    clients.push_back(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit lowered = saved;
  lowered.rlim_cur = std::min<rlim_t>(saved.rlim_cur, open_descriptors() + 64);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  auto fill = [] {
    std::vector<int> fds;
    for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) fds.push_back(fd);
    return fds;
  };
  auto release = [](std::vector<int>& fds, std::size_t n) {
    for (; n > 0 && !fds.empty(); --n) {
      ::close(fds.back());
      fds.pop_back();
    }
  };
  // Room for the listening socket and the epoll set only: the reserve cannot be opened.
  std::vector<int> filler = fill();
  release(filler, 2);
  ListenerHooks hooks;
  hooks.answer = [](const LinkBytes&, LinkId) { return ListenerAnswer{text("welcome"), true}; };
  Result<std::unique_ptr<Listener>> bound =
      Listener::bind("127.0.0.1", 0, std::move(hooks), limits);
  release(filler, filler.size());
  ASSERT_TRUE(bound) << bound.error().message;
  std::unique_ptr<Listener> listener = std::move(bound).value();
  listener->progress();  // descriptors are free again
  filler = fill();
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(listener->port());
  for (int fd : clients) EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  for (const auto until = Clock::now() + 10s;
       listener->counters().out_of_descriptors < kClients && Clock::now() < until;)
    listener->progress();
  release(filler, filler.size());
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_EQ(listener->counters().out_of_descriptors, static_cast<std::uint64_t>(kClients));
  for (int fd : clients) ::close(fd);
}

}  // namespace
}  // namespace kvnode::transfer
