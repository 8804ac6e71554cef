#include "pool_share.hpp"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

namespace kvnode::transfer {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kBacklog = 16;
constexpr auto kClientDeadline = std::chrono::seconds(1);        // to send the request
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);  // out of descriptors
constexpr auto kConnectRetry = std::chrono::milliseconds(10);    // backlog full
constexpr std::size_t kRequestBytes = 4 + 2 + 2 + sizeof(ShareToken);
constexpr std::size_t kAnswerBytes = 4 + 2 + 1 + 1 + 4 + 8 + 8 + gpu::kIpcHandleBytes;
static_assert(sizeof(std::size_t) == 8, "frames carry sizes as u64");
using Request = std::array<std::byte, kRequestBytes>;
using Answer = std::array<std::byte, kAnswerBytes>;

// Integers go byte by byte, least significant first, so the frames read the same on any host.
template <class U>
void put(std::byte* at, U v) {
  for (std::size_t i = 0; i < sizeof(U); ++i) at[i] = static_cast<std::byte>(v >> (8 * i));
}
template <class U>
U get(const std::byte* at) {
  U v = 0;
  for (std::size_t i = 0; i < sizeof(U); ++i)
    v |= static_cast<U>(std::to_integer<U>(at[i]) << (8 * i));
  return v;
}

// Every byte is looked at, so the time taken says nothing about how much of a guess was right.
bool same_token(const std::byte* a, const ShareToken& b) {
  unsigned diff = 0;
  for (std::size_t i = 0; i < b.size(); ++i) diff |= std::to_integer<unsigned>(a[i] ^ b[i]);
  return diff == 0;
}

// An abstract address: the leading NUL, then the name, no trailing NUL (it would be part of it).
Result<std::pair<sockaddr_un, socklen_t>> abstract_address(const std::string& name) {
  sockaddr_un addr{};
  if (name.empty() || name.size() + 1 > sizeof(addr.sun_path))
    return make_error(ErrorCode::kInvalid, "pool share name of " + std::to_string(name.size()) +
                                               " bytes does not fit a socket address");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  return std::pair{addr, static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())};
}

// Our own user, or root: another user's process must not get our memory, nor give us its own.
bool trusted_peer(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  return cred.uid == ::geteuid() || cred.uid == 0;
}

enum class Wait { kReady, kTimeout, kStopped, kFailed };

// Polls `fd` for `events` until `deadline`; `stop` (an eventfd, or -1) ends the wait early.
Wait wait_for(int fd, short events, Clock::time_point deadline, int stop = -1) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return Wait::kTimeout;
    pollfd fds[2] = {{fd, events, 0}, {stop, POLLIN, 0}};
    const auto ms = static_cast<int>(std::min<std::int64_t>(left.count(), INT_MAX));
    const int n = ::poll(fds, stop >= 0 ? 2 : 1, ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Wait::kFailed;
    if (stop >= 0 && fds[1].revents != 0) return Wait::kStopped;
    if (fds[0].revents != 0) return Wait::kReady;  // errors and hang-ups show in the next call
  }
}

// Reads the whole answer and any descriptors sent with it (owned at once, so none leaks).
Status read_answer(int fd, Answer& a, std::vector<UniqueFd>& fds, Clock::time_point deadline) {
  std::size_t got = 0;
  while (got < a.size()) {
    const Wait w = wait_for(fd, POLLIN, deadline);
    if (w == Wait::kTimeout)
      return make_error(ErrorCode::kDeadline, "pool share: no answer in time");
    if (w == Wait::kFailed) return make_error(ErrorCode::kIo, "pool share: poll failed");
    iovec iov{a.data() + got, a.size() - got};
    union {
      cmsghdr align;
      char buf[CMSG_SPACE(sizeof(int))];
    } control{};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    const ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0 && errno != ECONNRESET)
      return make_error(ErrorCode::kIo,
                        std::string("pool share: recvmsg: ") + std::strerror(errno));
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n > 0 && c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int one = -1;
        std::memcpy(&one, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.emplace_back(one);
      }
    }
    if (n <= 0) return make_error(ErrorCode::kRefused, "pool share: closed without an answer");
    // The kernel drops descriptors that did not fit: there were more than the one we take.
    if ((msg.msg_flags & MSG_CTRUNC) != 0)
      return make_error(ErrorCode::kInvalid, "pool share: more than one descriptor");
    got += static_cast<std::size_t>(n);
  }
  return {};
}

Answer answer_frame(const gpu::RegionExport& what) {
  Answer a{};
  std::memcpy(a.data(), "KVPA", 4);
  put<std::uint16_t>(a.data() + 4, kShareVersion);
  a[6] = static_cast<std::byte>(what.kind);
  put<std::uint32_t>(a.data() + 8, static_cast<std::uint32_t>(what.device));
  put<std::uint64_t>(a.data() + 12, what.bytes);
  put<std::uint64_t>(a.data() + 20, what.mapped);
  std::memcpy(a.data() + 28, what.ipc.data(), what.ipc.size());
  return a;
}

}  // namespace

struct PoolShareServer::State {
  State(gpu::RegionExport w, EventFd e) : what(std::move(w)), stop(std::move(e)) {}
  gpu::RegionExport what;
  std::string name;
  ShareToken token{};
  UniqueFd listener;
  EventFd stop;
  std::atomic<std::uint64_t> served{0};
  std::atomic<std::uint64_t> refused{0};
  std::thread thread;
};

namespace {

// How one client ended: served, refused (and why, for the log), or cut short by a stop.
struct Served {
  enum class Outcome { kServed, kRefused, kStopping };
  Outcome outcome;
  const char* why = "";
};
Served refused(const char* why) {
  return {Served::Outcome::kRefused, why};
}

// One client: its request within the deadline, then the answer. A stop ends the wait at once.
Served serve_one(PoolShareServer::State& s, int fd) {
  if (!trusted_peer(fd)) return refused("another user");
  Request req{};
  std::size_t got = 0;
  const auto deadline = Clock::now() + kClientDeadline;
  while (got < req.size()) {
    const Wait w = wait_for(fd, POLLIN, deadline, s.stop.fd());
    if (w == Wait::kStopped) return {Served::Outcome::kStopping, ""};
    if (w != Wait::kReady) return refused("no request in time");
    const ssize_t n = ::recv(fd, req.data() + got, req.size() - got, MSG_DONTWAIT);
    if (n == 0) return refused("closed before a whole request");
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) return refused("read failed");
    got += static_cast<std::size_t>(n);
  }
  if (std::memcmp(req.data(), "KVPS", 4) != 0 ||
      get<std::uint16_t>(req.data() + 4) != kShareVersion ||
      get<std::uint16_t>(req.data() + 6) != 0)
    return refused("not a version 1 request");
  if (!same_token(req.data() + 8, s.token)) return refused("wrong token");

  Answer a = answer_frame(s.what);
  iovec iov{a.data(), a.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  union {
    cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } control{};
  if (s.what.kind != gpu::MemoryKind::kDevice) {
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    const int share = s.what.fd.get();
    std::memcpy(CMSG_DATA(c), &share, sizeof(share));
  }
  // A fresh socket's buffer holds the whole frame: a short send means the client is gone.
  const ssize_t sent = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (sent != static_cast<ssize_t>(a.size())) return refused("answer not sent");
  return {Served::Outcome::kServed, ""};
}

void serve(PoolShareServer::State& s) {
  const int stop = s.stop.fd();
  for (;;) {
    const Wait w = wait_for(s.listener.get(), POLLIN, Clock::time_point::max(), stop);
    if (w == Wait::kStopped) return;
    UniqueFd client;
    if (w == Wait::kReady)
      client.reset(::accept4(s.listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!client) {
      const int e = errno;
      if (w == Wait::kReady && (e == EAGAIN || e == EINTR || e == ECONNABORTED)) continue;
      // Out of descriptors (EMFILE, ENFILE) or memory: the client stays queued and the listener
      // readable, so retrying at once would spin; wait a little (a stop still ends it).
      spdlog::debug("pool share {}: accept: {}", s.name, std::strerror(e));
      if (wait_for(stop, POLLIN, Clock::now() + kAcceptBackoff) == Wait::kReady) return;
      continue;
    }
    const Served r = serve_one(s, client.get());
    if (r.outcome == Served::Outcome::kServed) {
      s.served.fetch_add(1, std::memory_order_relaxed);
    } else if (r.outcome == Served::Outcome::kRefused) {
      s.refused.fetch_add(1, std::memory_order_relaxed);
      spdlog::debug("pool share {}: refused a client: {}", s.name, r.why);
    }
  }
}

}  // namespace

Result<std::unique_ptr<PoolShareServer>> PoolShareServer::start(gpu::RegionExport what) {
  if (what.kind != gpu::MemoryKind::kDevice && !what.fd)
    return make_error(ErrorCode::kInvalid, "pool share: a host export without its memfd");
  Result<EventFd> stop = EventFd::create();
  if (!stop) return std::move(stop).error();
  auto s = std::make_unique<State>(std::move(what), std::move(stop).value());
  const auto failed = [](const char* call) {
    return make_error(ErrorCode::kIo,
                      std::string("pool share: ") + call + ": " + std::strerror(errno));
  };
  // Up to 256 bytes, getrandom returns them all (it may only wait, once, for the entropy pool).
  std::array<std::uint8_t, 16> id{};
  if (::getrandom(id.data(), id.size(), 0) != static_cast<ssize_t>(id.size()) ||
      ::getrandom(s->token.data(), s->token.size(), 0) != static_cast<ssize_t>(s->token.size()))
    return failed("getrandom");
  static constexpr char kHex[] = "0123456789abcdef";
  s->name = kShareNamePrefix;
  for (const std::uint8_t b : id) s->name += {kHex[b >> 4], kHex[b & 0xf]};
  const auto addr = abstract_address(s->name);
  if (!addr) return addr.error();
  s->listener.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s->listener) return failed("socket");
  if (::bind(s->listener.get(), reinterpret_cast<const sockaddr*>(&addr->first), addr->second) != 0)
    return failed("bind");
  if (::listen(s->listener.get(), kBacklog) != 0) return failed("listen");
  try {
    s->thread = std::thread(serve, std::ref(*s));
  } catch (const std::system_error& e) {
    return make_error(ErrorCode::kIo, std::string("pool share: no thread: ") + e.what());
  }
  return std::unique_ptr<PoolShareServer>(new PoolShareServer(std::move(s)));
}

PoolShareServer::PoolShareServer(std::unique_ptr<State> s) : s_(std::move(s)) {}

PoolShareServer::~PoolShareServer() {
  s_->stop.signal();
  if (s_->thread.joinable()) s_->thread.join();
}

const std::string& PoolShareServer::name() const {
  return s_->name;
}
const ShareToken& PoolShareServer::token() const {
  return s_->token;
}
std::uint64_t PoolShareServer::served() const {
  return s_->served.load();
}
std::uint64_t PoolShareServer::refused() const {
  return s_->refused.load();
}

Result<gpu::RegionExport> fetch_pool_share(const std::string& name, const ShareToken& token,
                                           std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const auto addr = abstract_address(name);
  if (!addr) return addr.error();
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd)
    return make_error(ErrorCode::kIo, std::string("pool share: socket: ") + std::strerror(errno));
  // A Unix socket connects at once or not at all; EAGAIN means the backlog is full for now.
  while (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr->first), addr->second) != 0) {
    const int e = errno;
    if (e == ECONNREFUSED || e == ENOENT)
      return make_error(
          ErrorCode::kPeerLost,
          "no pool share socket " + name + " (another network namespace, or the peer is gone)");
    if (e != EAGAIN && e != EINTR)
      return make_error(ErrorCode::kIo, "pool share: connect: " + std::string(std::strerror(e)));
    if (Clock::now() + kConnectRetry >= deadline)
      return make_error(ErrorCode::kDeadline,
                        "pool share " + name + ": backlog full until the deadline");
    std::this_thread::sleep_for(kConnectRetry);
  }
  if (!trusted_peer(fd.get()))
    return make_error(ErrorCode::kRefused, "pool share " + name + " is served by another user");

  Request req{};
  std::memcpy(req.data(), "KVPS", 4);
  put<std::uint16_t>(req.data() + 4, kShareVersion);
  std::memcpy(req.data() + 8, token.data(), token.size());
  // A fresh socket takes the whole request at once; anything else means the server went away.
  if (::send(fd.get(), req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size()))
    return make_error(ErrorCode::kRefused, "pool share " + name + ": closed before the request");

  Answer a{};
  std::vector<UniqueFd> fds;
  if (Status st = read_answer(fd.get(), a, fds, deadline); !st) return st.error();
  const auto bad = [&](const std::string& why) {
    return make_error(ErrorCode::kInvalid, "pool share " + name + ": " + why);
  };
  if (std::memcmp(a.data(), "KVPA", 4) != 0) return bad("not an answer");
  if (get<std::uint16_t>(a.data() + 4) != kShareVersion) return bad("another protocol version");
  const unsigned kind = std::to_integer<unsigned>(a[6]);
  if (kind > static_cast<unsigned>(gpu::MemoryKind::kDevice) || a[7] != std::byte{0})
    return bad("unknown memory kind " + std::to_string(kind));
  gpu::RegionExport out;
  out.kind = static_cast<gpu::MemoryKind>(kind);
  out.device = static_cast<std::int32_t>(get<std::uint32_t>(a.data() + 8));
  out.bytes = get<std::uint64_t>(a.data() + 12);
  out.mapped = get<std::uint64_t>(a.data() + 20);
  std::memcpy(out.ipc.data(), a.data() + 28, out.ipc.size());
  const std::size_t want = out.kind == gpu::MemoryKind::kDevice ? 0 : 1;
  if (fds.size() != want)
    return bad(std::to_string(fds.size()) + " descriptors with a " +
               std::string(gpu::to_string(out.kind)) + " export");
  if (want == 1) out.fd = std::move(fds.front());
  return out;
}

}  // namespace kvnode::transfer
