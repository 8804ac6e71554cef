// The pool share socket over real abstract Unix sockets and real memfds: the memfd arrives as the
// same file, only a client with the token is served, hostile or silent clients are closed without
// stopping the server, a hostile server cannot hand the client a bad export, nothing leaks.
#include "pool_share.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "support/eventually.hpp"
#include "support/must.hpp"

namespace kvnode::transfer {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::eventually;
using test::must;

constexpr std::size_t kPoolBytes = 3 * 4096 + 100;
constexpr std::size_t kMapped = 4 * 4096;
constexpr auto kTimeout = 5000ms;  // for fetches expected to succeed

// A memfd standing in for a shareable host pool, mapped here as its owner would.
class Memfd {
 public:
  Memfd() : fd_(::memfd_create("pool-share-test", MFD_CLOEXEC)) {
    if (!fd_ || ::ftruncate(fd_.get(), kMapped) != 0) throw std::runtime_error("memfd");
    void* p = ::mmap(nullptr, kMapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap");
    data_ = static_cast<std::byte*>(p);
  }
  ~Memfd() { ::munmap(data_, kMapped); }
  Memfd(const Memfd&) = delete;
  Memfd& operator=(const Memfd&) = delete;

  gpu::RegionExport share() const {
    gpu::RegionExport e;
    e.kind = gpu::MemoryKind::kHost;
    e.bytes = kPoolBytes;
    e.mapped = kMapped;
    e.fd = UniqueFd(::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0));
    return e;
  }
  int fd() const { return fd_.get(); }
  std::byte* data() const { return data_; }

 private:
  UniqueFd fd_;
  std::byte* data_ = nullptr;
};

std::size_t open_descriptors() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

std::pair<sockaddr_un, socklen_t> address_of(const std::string& name) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  return {a, static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())};
}

// A plain blocking client socket, for clients that misbehave on purpose.
UniqueFd connect_raw(const std::string& name) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const auto [a, len] = address_of(name);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a), len) != 0)
    throw std::runtime_error(std::string("connect: ") + std::strerror(errno));
  return fd;
}

// True when the peer closes the socket without sending a byte, within `patience`.
bool closed_without_answer(int fd, std::chrono::milliseconds patience = 5000ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(patience.count())) != 1) return false;
  char c = 0;
  return ::recv(fd, &c, 1, 0) == 0;
}

std::vector<std::byte> request(const ShareToken& token, std::uint16_t version = kShareVersion) {
  std::vector<std::byte> r(24);
  std::memcpy(r.data(), "KVPS", 4);
  r[4] = std::byte(version & 0xff);
  r[5] = std::byte(version >> 8);
  std::memcpy(r.data() + 8, token.data(), token.size());
  return r;
}

void send_all(int fd, const std::vector<std::byte>& bytes) {
  ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
}

TEST(PoolShare, HostExportArrivesAsTheSameMemfd) {
  Memfd pool;
  auto server = must(PoolShareServer::start(pool.share()));
  EXPECT_EQ(server->name().rfind("kvnode-pool-", 0), 0u);
  EXPECT_EQ(server->name().size(), 12u + 32u);

  gpu::RegionExport got = must(fetch_pool_share(server->name(), server->token(), kTimeout));
  EXPECT_EQ(got.kind, gpu::MemoryKind::kHost);
  EXPECT_EQ(got.bytes, kPoolBytes);
  EXPECT_EQ(got.mapped, kMapped);
  ASSERT_TRUE(got.fd.valid());
  EXPECT_NE(got.fd.get(), pool.fd());
  struct stat mine {};
  struct stat theirs {};
  ASSERT_EQ(::fstat(pool.fd(), &mine), 0);
  ASSERT_EQ(::fstat(got.fd.get(), &theirs), 0);
  EXPECT_EQ(mine.st_ino, theirs.st_ino);
  EXPECT_EQ(mine.st_dev, theirs.st_dev);
  EXPECT_NE(::fcntl(got.fd.get(), F_GETFD) & FD_CLOEXEC, 0);

  void* p = ::mmap(nullptr, kMapped, PROT_READ, MAP_SHARED, got.fd.get(), 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(pool.data() + 4096, 0x5a, 100);
  EXPECT_EQ(std::memcmp(static_cast<std::byte*>(p) + 4096, pool.data() + 4096, 100), 0);
  ::munmap(p, kMapped);
  EXPECT_TRUE(eventually([&] { return server->served() == 1; }));
  EXPECT_EQ(server->refused(), 0u);
}

TEST(PoolShare, DeviceExportCarriesTheIpcHandleAndNoDescriptor) {
  gpu::RegionExport e;
  e.kind = gpu::MemoryKind::kDevice;
  e.bytes = 1ull << 33;  // above 32 bits: the frame carries u64
  e.device = 3;
  for (std::size_t i = 0; i < e.ipc.size(); ++i) e.ipc[i] = std::byte(0xff - i);
  const gpu::IpcHandle ipc = e.ipc;
  auto server = must(PoolShareServer::start(std::move(e)));
  const gpu::RegionExport got = must(fetch_pool_share(server->name(), server->token(), kTimeout));
  EXPECT_EQ(got.kind, gpu::MemoryKind::kDevice);
  EXPECT_EQ(got.bytes, 1ull << 33);
  EXPECT_EQ(got.device, 3);
  EXPECT_EQ(got.ipc, ipc);
  EXPECT_FALSE(got.fd.valid());
}

TEST(PoolShare, HostExportWithoutItsMemfdIsNotServed) {
  gpu::RegionExport e;
  e.kind = gpu::MemoryKind::kPinnedHost;
  e.bytes = 4096;
  const auto r = PoolShareServer::start(std::move(e));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kInvalid);
}

TEST(PoolShare, WrongTokenIsRefusedAndCounted) {
  Memfd pool;
  auto server = must(PoolShareServer::start(pool.share()));
  ShareToken wrong = server->token();
  wrong[15] ^= std::byte{1};
  const auto r = fetch_pool_share(server->name(), wrong, kTimeout);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kRefused);
  EXPECT_TRUE(eventually([&] { return server->refused() == 1; }));
  EXPECT_EQ(server->served(), 0u);
  EXPECT_TRUE(fetch_pool_share(server->name(), server->token(), kTimeout).ok());
  EXPECT_TRUE(eventually([&] { return server->served() == 1; }));
  EXPECT_EQ(server->refused(), 1u);
}

TEST(PoolShare, SilentClientIsClosedAfterItsDeadlineAndOthersAreServed) {
  Memfd pool;
  auto server = must(PoolShareServer::start(pool.share()));
  UniqueFd silent = connect_raw(server->name());
  // Queued behind the silent one: served once its second is up, well within the timeout.
  const auto start = Clock::now();
  EXPECT_TRUE(fetch_pool_share(server->name(), server->token(), kTimeout).ok());
  EXPECT_TRUE(closed_without_answer(silent.get()));
  EXPECT_LT(Clock::now() - start, 4s);
  EXPECT_TRUE(eventually([&] { return server->refused() == 1 && server->served() == 1; }));
}

TEST(PoolShare, JunkIsRefusedAndServingGoesOn) {
  Memfd pool;
  auto server = must(PoolShareServer::start(pool.share()));
  std::mt19937 rng(7);
  std::vector<std::byte> random(24);
  for (auto& b : random) b = std::byte(rng() & 0xff);
  std::vector<std::byte> zeroed_magic = request(server->token());
  zeroed_magic[0] = std::byte{0};
  std::vector<std::byte> reserved = request(server->token());
  reserved[6] = std::byte{1};
  std::vector<std::byte> short_frame = request(server->token());
  short_frame.resize(10);  // then closed
  const std::vector<std::vector<std::byte>> junk = {random, request(server->token(), 2),
                                                    zeroed_magic, reserved, short_frame};
  for (const auto& frame : junk) {
    UniqueFd c = connect_raw(server->name());
    send_all(c.get(), frame);
    if (frame.size() < 24) ::shutdown(c.get(), SHUT_WR);
    EXPECT_TRUE(closed_without_answer(c.get())) << "frame of " << frame.size() << " bytes";
  }
  EXPECT_TRUE(eventually([&] { return server->refused() == junk.size(); }));
  EXPECT_TRUE(fetch_pool_share(server->name(), server->token(), kTimeout).ok());
  EXPECT_TRUE(eventually([&] { return server->served() == 1; }));
}

TEST(PoolShare, UnknownNameIsPeerLost) {
  const auto r = fetch_pool_share("kvnode-pool-nobody-listens-here", ShareToken{}, kTimeout);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kPeerLost);
}

// A socket of our own that takes connections (the backlog does) and never answers.
class MuteServer {
 public:
  MuteServer() : name_("kvnode-pool-test-mute-" + std::to_string(::getpid())) {
    fd_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    const auto [a, len] = address_of(name_);
    if (::bind(fd_.get(), reinterpret_cast<const sockaddr*>(&a), len) != 0 ||
        ::listen(fd_.get(), 4) != 0)
      throw std::runtime_error("mute server");
  }
  const std::string& name() const { return name_; }
  int fd() const { return fd_.get(); }

 private:
  std::string name_;
  UniqueFd fd_;
};

TEST(PoolShare, SilentServerEndsInDeadline) {
  MuteServer mute;
  const auto start = Clock::now();
  const auto r = fetch_pool_share(mute.name(), ShareToken{}, 200ms);
  const auto took = Clock::now() - start;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kDeadline);
  EXPECT_GE(took, 200ms);
  EXPECT_LT(took, 1000ms);
}

// A server that answers one client with `frame` and `fds`, for answers a real one never gives.
Result<gpu::RegionExport> fetch_forged(const std::vector<std::byte>& frame,
                                       const std::vector<int>& fds) {
  MuteServer fake;
  std::thread answer([&] {
    UniqueFd c(::accept4(fake.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    std::array<std::byte, 24> req{};
    if (::recv(c.get(), req.data(), req.size(), MSG_WAITALL) != 24) return;
    iovec iov{const_cast<std::byte*>(frame.data()), frame.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
    if (!fds.empty()) {
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
      cmsghdr* h = CMSG_FIRSTHDR(&msg);
      h->cmsg_level = SOL_SOCKET;
      h->cmsg_type = SCM_RIGHTS;
      h->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(h), fds.data(), sizeof(int) * fds.size());
    }
    (void)::sendmsg(c.get(), &msg, MSG_NOSIGNAL);
  });
  auto r = fetch_pool_share(fake.name(), ShareToken{}, kTimeout);
  answer.join();
  return r;
}

std::vector<std::byte> answer(std::uint8_t kind, std::uint16_t version = kShareVersion) {
  std::vector<std::byte> a(92);
  std::memcpy(a.data(), "KVPA", 4);
  a[4] = std::byte(version & 0xff);
  a[5] = std::byte(version >> 8);
  a[6] = std::byte(kind);
  a[8] = std::byte{0xff};  // device -1, little-endian
  a[9] = a[10] = a[11] = std::byte{0xff};
  a[12] = std::byte{0x10};  // bytes 0x10 + 0x20 << 8
  a[13] = std::byte{0x20};
  a[21] = std::byte{0x30};  // mapped 0x3000
  return a;
}

TEST(PoolShare, ForgedAnswersAreRejectedWithoutLeaks) {
  Memfd pool;
  const int a = pool.fd();
  const std::size_t before = open_descriptors();
  auto code = [](const Result<gpu::RegionExport>& r) {
    return r ? std::string("accepted") : std::string(to_string(r.error().code));
  };
  EXPECT_EQ(code(fetch_forged(answer(0), {a, a})), "invalid");  // two descriptors
  EXPECT_EQ(code(fetch_forged(answer(0), {})), "invalid");      // host kind, no memfd
  EXPECT_EQ(code(fetch_forged(answer(1), {})), "invalid");      // pinned kind, no memfd
  EXPECT_EQ(code(fetch_forged(answer(2), {a})), "invalid");     // device kind with one
  EXPECT_EQ(code(fetch_forged(answer(3), {a})), "invalid");     // no such kind
  EXPECT_EQ(code(fetch_forged(answer(0, 2), {a})), "invalid");  // another version
  std::vector<std::byte> magic = answer(0);
  magic[3] = std::byte{'X'};
  EXPECT_EQ(code(fetch_forged(magic, {a})), "invalid");
  std::vector<std::byte> cut = answer(0);
  cut.resize(50);
  EXPECT_EQ(code(fetch_forged(cut, {a})), "refused");  // closed before a whole answer
  EXPECT_EQ(open_descriptors(), before);

  const gpu::RegionExport got = must(fetch_forged(answer(1), {a}));
  EXPECT_EQ(got.kind, gpu::MemoryKind::kPinnedHost);
  EXPECT_EQ(got.device, -1);
  EXPECT_EQ(got.bytes, 0x2010u);
  EXPECT_EQ(got.mapped, 0x3000u);
  EXPECT_TRUE(got.fd.valid());
}

TEST(PoolShare, DestructorDoesNotWaitForASilentClient) {
  Memfd pool;
  auto server = must(PoolShareServer::start(pool.share()));
  UniqueFd silent = connect_raw(server->name());
  std::this_thread::sleep_for(100ms);  // let the server start waiting on it
  const auto start = Clock::now();
  server.reset();
  EXPECT_LT(Clock::now() - start, 700ms);  // well before the client's second is up
  EXPECT_TRUE(closed_without_answer(silent.get(), 1000ms));
}

TEST(PoolShare, NoDescriptorLeaks) {
  Memfd pool;
  const std::size_t before = open_descriptors();
  {
    auto server = must(PoolShareServer::start(pool.share()));
    for (int i = 0; i < 100; ++i) {
      const gpu::RegionExport got =
          must(fetch_pool_share(server->name(), server->token(), kTimeout));
      ASSERT_TRUE(got.fd.valid());
    }
    EXPECT_FALSE(fetch_pool_share(server->name(), ShareToken{}, kTimeout).ok());
    EXPECT_TRUE(eventually([&] { return server->served() == 100 && server->refused() == 1; }));
  }
  EXPECT_EQ(open_descriptors(), before);
}

TEST(PoolShare, ForkedChildFetchesAndWrites) {
  Memfd pool;
  auto server = must(PoolShareServer::start(pool.share()));
  const std::string name = server->name();
  const ShareToken token = server->token();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only async-signal-safe-enough work here, and _exit: the test runner must not run twice.
    auto got = fetch_pool_share(name, token, kTimeout);
    if (!got) ::_exit(2);
    void* p = ::mmap(nullptr, kMapped, PROT_READ | PROT_WRITE, MAP_SHARED, got->fd.get(), 0);
    if (p == MAP_FAILED) ::_exit(3);
    std::memset(static_cast<char*>(p) + kPoolBytes - 64, 0xa7, 64);
    ::_exit(0);
  }
  int status = -1;
  const bool exited = eventually([&] { return ::waitpid(child, &status, WNOHANG) == child; });
  if (!exited) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
  }
  ASSERT_TRUE(exited);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  for (std::size_t i = kPoolBytes - 64; i < kPoolBytes; ++i)
    ASSERT_EQ(pool.data()[i], std::byte{0xa7}) << "at " << i;
  EXPECT_TRUE(eventually([&] { return server->served() == 1; }));
}

// More clients at once than the backlog holds: the extra ones retry their connect and all are
// served in turn.
TEST(PoolShare, ManyClientsAtOnceAreAllServed) {
  Memfd pool;
  auto server = must(PoolShareServer::start(pool.share()));
  constexpr int kClients = 40;
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i)
    clients.emplace_back([&] {
      if (fetch_pool_share(server->name(), server->token(), kTimeout).ok()) ++ok;
    });
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), kClients);
  EXPECT_TRUE(eventually([&] { return server->served() == kClients; }));
}

// Out of descriptors, accept fails while the client stays queued: the server must wait, not spin,
// and serve the client once descriptors are free again. In a child, whose limit we may lower.
TEST(PoolShare, OutOfDescriptorsBacksOffAndRecovers) {
#if defined(__SANITIZE_ADDRESS__)
  // The sanitizer runtimes need descriptors of their own in the forked child (reports,
  // /proc/self/maps) and they are what the test takes away: their failures are not the server's.
  GTEST_SKIP() << "not under ASan: the child's descriptor limit starves the sanitizer runtime";
#endif
  Memfd pool;
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  UniqueFd from_child(pipe_fds[0]);
  UniqueFd to_parent(pipe_fds[1]);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    from_child.reset();
    auto server = PoolShareServer::start(pool.share());
    if (!server) ::_exit(2);
    std::string hello = (*server)->name();
    hello.append(reinterpret_cast<const char*>((*server)->token().data()), sizeof(ShareToken));
    if (::write(to_parent.get(), hello.data(), hello.size()) != ssize_t(hello.size())) ::_exit(3);
    // Fill the table to a lowered limit, then let the parent connect into the backlog.
    rlimit limit{};
    ::getrlimit(RLIMIT_NOFILE, &limit);
    limit.rlim_cur = open_descriptors() + 4;
    if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(4);
    std::vector<UniqueFd> filler;
    for (UniqueFd f; (f = UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC))).valid();)
      filler.push_back(std::move(f));
    if (::write(to_parent.get(), "F", 1) != 1) ::_exit(5);
    std::this_thread::sleep_for(300ms);  // the parent connects meanwhile
    rusage before{};
    rusage after{};
    ::getrusage(RUSAGE_SELF, &before);
    std::this_thread::sleep_for(500ms);
    ::getrusage(RUSAGE_SELF, &after);
    const auto cpu_us = [](const rusage& r) {
      return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1000000 + r.ru_utime.tv_usec +
             r.ru_stime.tv_usec;
    };
    const bool spun = cpu_us(after) - cpu_us(before) > 250000;  // half the time on a core
    filler.clear();
    if (!eventually([&] { return (*server)->served() == 1; })) ::_exit(6);
    ::_exit(spun ? 7 : 0);
  }
  to_parent.reset();
  std::string hello(12 + 32 + sizeof(ShareToken) + 1, '\0');
  std::size_t got = 0;
  while (got < hello.size()) {
    const ssize_t n = ::read(from_child.get(), hello.data() + got, hello.size() - got);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ShareToken token{};
  if (got == hello.size()) {
    std::memcpy(token.data(), hello.data() + 44, token.size());
    const auto r = fetch_pool_share(hello.substr(0, 44), token, 10s);
    EXPECT_TRUE(r.ok()) << r.error().message;
  }
  int status = -1;
  const bool exited = eventually([&] { return ::waitpid(child, &status, WNOHANG) == child; });
  if (!exited) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
  }
  ASSERT_EQ(got, hello.size());
  ASSERT_TRUE(exited);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "7: the server spun while out of descriptors";
}

}  // namespace
}  // namespace kvnode::transfer
