// zmtp::Server: accept, read, parse, answer and close, all in the polling thread. See the header
// for why this is not libzmq's socket.
#include "kvnode/zmtp/server.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kvnode/common/log_throttle.hpp"
#include "kvnode/common/unique_fd.hpp"

namespace kvnode::zmtp {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kBacklog = 1024;
constexpr std::size_t kEventsPerWait = 64;
constexpr std::size_t kAcceptsPerWake = 64;
constexpr std::size_t kFirstBuffer = 64 << 10;          // a connection's buffer once it sends
constexpr std::size_t kShrinkAbove = 4 * kFirstBuffer;  // given back when empty after a big frame
// Bytes read from one connection per poll() before the next one's turn.
constexpr std::size_t kReadBudget = 1 << 20;
// Replies a peer has not read: past this, the connection is not read until it takes them.
constexpr std::size_t kMaxUnsent = 4 << 20;
constexpr std::size_t kCompactSentAbove = 64 << 10;
constexpr auto kSweepPeriod = std::chrono::seconds(1);         // handshake deadline resolution
constexpr auto kAcceptPause = std::chrono::milliseconds(100);  // after EMFILE
constexpr auto kLogPeriod = std::chrono::seconds(10);

std::string peer_name(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    ::inet_ntop(AF_INET, &v4.sin_addr, host, sizeof host);
    port = ntohs(v4.sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    ::inet_ntop(AF_INET6, &v6.sin6_addr, host, sizeof host);
    port = ntohs(v6.sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

struct Connection {
  Connection(UniqueFd f, SocketType type, std::uint64_t max_frame, std::string who)
      : fd(std::move(f)), reader(type, max_frame), peer(std::move(who)), since(Clock::now()) {}
  UniqueFd fd;
  Reader reader;
  std::string peer;
  Clock::time_point since;
  std::unique_ptr<char[]> buffer;  // bytes read and not yet parsed
  std::size_t capacity = 0, length = 0;
  std::vector<std::string> parts;  // a message's frames before its last (copied: the buffer moves)
  std::size_t part_bytes = 0;
  std::string out;  // what the socket has not taken yet: handshake, PONGs, replies
  std::size_t out_sent = 0;
  std::uint32_t events = EPOLLIN;
  std::optional<std::string> broken;  // why the message sink refused the connection
  std::string_view held() const { return {buffer.get(), length}; }
  std::size_t unsent() const { return out.size() - out_sent; }
};

// A frame with its header: short (one size byte) below 256 bytes, else long.
void append_frame(std::string& out, std::string_view body, bool more) {
  const bool is_long = body.size() > 255;
  out.push_back(static_cast<char>((more ? 0x01 : 0) | (is_long ? 0x02 : 0)));
  if (is_long) {
    for (int i = 7; i >= 0; --i)
      out.push_back(static_cast<char>((static_cast<std::uint64_t>(body.size()) >> (8 * i)) & 0xFF));
  } else {
    out.push_back(static_cast<char>(body.size()));
  }
  out.append(body);
}

// Gathers a connection's frames into messages for the handler and queues its replies.
class MessageSink final : public FrameSink {
 public:
  MessageSink(Connection& c, SocketType type, MessageHandler& handler, std::uint64_t max_message,
              std::vector<std::string_view>& views)
      : c_(c), type_(type), handler_(handler), max_message_(max_message), views_(views) {}

  void frame(std::string_view body, bool more) override {
    if (c_.broken) return;
    if (more) {
      if (c_.parts.size() >= kMaxParts || c_.part_bytes + body.size() > max_message_) {
        c_.broken = "a message of more than " + std::to_string(kMaxParts) + " frames or " +
                    std::to_string(max_message_) + " bytes";
        return;
      }
      c_.parts.emplace_back(body);
      c_.part_bytes += body.size();
      return;
    }
    views_.clear();
    for (const std::string& p : c_.parts) views_.emplace_back(p);
    views_.push_back(body);
    std::optional<std::string> reply = handler_.message(views_);
    c_.parts.clear();
    c_.part_bytes = 0;
    ++messages;
    if (type_ == SocketType::kRouter && reply) {
      append_frame(c_.out, "", true);  // the delimiter a REQ peer needs
      append_frame(c_.out, *reply, false);
    }
  }
  std::size_t messages = 0;

 private:
  static constexpr std::size_t kMaxParts = 64;
  Connection& c_;
  SocketType type_;
  MessageHandler& handler_;
  std::uint64_t max_message_;
  std::vector<std::string_view>& views_;
};

}  // namespace

struct Server::Impl {
  Impl(SocketType t, const ServerLimits& l, UniqueFd ep)
      : type(t), limits(l), epoll(std::move(ep)) {}

  SocketType type;
  ServerLimits limits;
  UniqueFd epoll;
  std::vector<UniqueFd> listeners;
  std::unordered_map<int, std::unique_ptr<Connection>> connections;
  std::size_t buffered = 0;  // capacity of every connection's buffer
  ServerStats stats;
  LogThrottle refusals{kLogPeriod}, descriptors{kLogPeriod};
  Clock::time_point next_sweep = Clock::now() + kSweepPeriod;
  std::optional<Clock::time_point> accept_paused_until;
  std::vector<std::string_view> views;  // a message's frames for the handler, reused

  bool is_listener(int fd) const {
    return std::any_of(listeners.begin(), listeners.end(),
                       [fd](const UniqueFd& l) { return l.get() == fd; });
  }

  void watch_listeners(std::uint32_t events) {
    for (const UniqueFd& l : listeners) {
      epoll_event ev{};
      ev.events = events;
      ev.data.fd = l.get();
      ::epoll_ctl(epoll.get(), EPOLL_CTL_MOD, l.get(), &ev);
    }
  }

  void close(int fd) {
    auto it = connections.find(fd);
    if (it == connections.end()) return;
    buffered -= it->second->capacity;
    ::epoll_ctl(epoll.get(), EPOLL_CTL_DEL, fd, nullptr);
    connections.erase(it);  // UniqueFd closes it
  }

  void refuse(const Connection& c, const std::string& why) {
    ++stats.refused;
    if (const std::size_t n = refusals.pass(Clock::now()); n > 0)
      spdlog::warn("{}: closed the connection from {}: {}{}", to_string(type), c.peer, why,
                   n > 1 ? " (and " + std::to_string(n - 1) + " more refused since)" : "");
    close(c.fd.get());
  }

  void accept_from(int listener) {
    for (std::size_t i = 0; i < kAcceptsPerWake; ++i) {
      sockaddr_storage addr{};
      socklen_t len = sizeof addr;
      UniqueFd fd(::accept4(listener, reinterpret_cast<sockaddr*>(&addr), &len,
                            SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!fd) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Leave the connection queued and stop watching the listeners a moment (else epoll
          // wakes at once, forever).
          if (descriptors.pass(Clock::now()) > 0)
            spdlog::warn("{}: cannot accept connections: {} ({} open)", to_string(type),
                         std::strerror(errno), connections.size());
          accept_paused_until = Clock::now() + kAcceptPause;
          watch_listeners(0);
        }
        return;
      }
      const std::string peer = peer_name(addr);
      if (connections.size() >= limits.max_connections) {
        ++stats.refused;
        if (const std::size_t n = refusals.pass(Clock::now()); n > 0)
          spdlog::warn("{}: closed the connection from {}: {} connections open, the limit",
                       to_string(type), peer, connections.size());
        continue;
      }
      if (type == SocketType::kRouter) {  // replies are small and wanted at once
        const int on = 1;
        ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
      }
      // Our greeting goes at once; a fresh socket's buffer always takes 64 bytes.
      const auto g = greeting();
      if (::send(fd.get(), g.data(), g.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
          static_cast<ssize_t>(g.size()))
        continue;
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = fd.get();
      if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd.get(), &ev) != 0) continue;
      ++stats.accepted;
      const int key = fd.get();
      connections.emplace(
          key, std::make_unique<Connection>(std::move(fd), type, limits.max_frame_bytes, peer));
    }
  }

  // Reads while replies are taken, writes while replies wait.
  void watch(Connection& c) {
    const std::uint32_t want =
        (c.unsent() < kMaxUnsent ? EPOLLIN : 0u) | (c.unsent() > 0 ? EPOLLOUT : 0u);
    if (want == c.events) return;
    epoll_event ev{};
    ev.events = want;
    ev.data.fd = c.fd.get();
    ::epoll_ctl(epoll.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
    c.events = want;
  }

  // Hands the socket what waits; false when the connection is gone.
  bool flush(Connection& c) {
    while (c.unsent() > 0) {
      const ssize_t n =
          ::send(c.fd.get(), c.out.data() + c.out_sent, c.unsent(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.out_sent += static_cast<std::size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        break;
      } else {
        ++stats.closed_by_peer;
        close(c.fd.get());
        return false;
      }
    }
    if (c.unsent() == 0) {
      c.out.clear();
      c.out_sent = 0;
    } else if (c.out_sent > kCompactSentAbove) {
      c.out.erase(0, c.out_sent);
      c.out_sent = 0;
    }
    watch(c);
    return true;
  }

  // Makes room for the unit being received; false when the limit on buffered bytes forbids it.
  bool make_room(Connection& c) {
    const std::uint64_t wanted = c.reader.wanted(c.held());
    std::size_t target = std::max<std::size_t>(kFirstBuffer, static_cast<std::size_t>(wanted));
    if (c.capacity >= target && c.capacity > c.length) return true;
    target = std::max(target, std::min<std::size_t>(2 * c.capacity, target + c.capacity));
    if (buffered - c.capacity + target > limits.max_buffered_bytes) return false;
    auto grown = std::make_unique_for_overwrite<char[]>(target);
    if (c.length > 0) std::memcpy(grown.get(), c.buffer.get(), c.length);
    buffered = buffered - c.capacity + target;
    c.buffer = std::move(grown);
    c.capacity = target;
    return true;
  }

  // Reads until the socket is drained or its replies back up (true) or the budget is spent
  // (false). The connection may be gone when it returns.
  bool read_from(Connection& c, MessageHandler& handler, Polled& polled) {
    std::size_t budget = kReadBudget;
    MessageSink sink(c, type, handler, limits.max_frame_bytes, views);
    while (c.unsent() < kMaxUnsent) {
      if (budget == 0) return false;
      if (!make_room(c)) {
        refuse(c, "its frame would pass the buffer limit of " +
                      std::to_string(limits.max_buffered_bytes >> 20) + " MiB");
        return true;
      }
      const std::size_t free = c.capacity - c.length;
      const ssize_t n = ::recv(c.fd.get(), c.buffer.get() + c.length, free, MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n <= 0) {
        ++stats.closed_by_peer;
        close(c.fd.get());
        return true;
      }
      c.length += static_cast<std::size_t>(n);
      polled.bytes += static_cast<std::size_t>(n);
      budget -= std::min(budget, static_cast<std::size_t>(n));
      const std::size_t before = sink.messages;
      Result<std::size_t> used = c.reader.consume(c.held(), c.out, sink);
      polled.messages += sink.messages - before;
      if (!used || c.broken) {
        refuse(c, used ? *c.broken : used.error().message);
        return true;
      }
      c.length -= *used;
      if (c.length > 0 && *used > 0) std::memmove(c.buffer.get(), c.buffer.get() + *used, c.length);
      if (!flush(c)) return true;
      if (static_cast<std::size_t>(n) < free) break;  // the socket is drained
    }
    if (c.length == 0 && c.capacity > kShrinkAbove) {
      buffered -= c.capacity;
      c.buffer.reset();
      c.capacity = 0;
    }
    return true;
  }

  void sweep(Clock::time_point now) {
    next_sweep = now + kSweepPeriod;
    std::vector<Connection*> late;
    for (auto& [fd, c] : connections)
      if (c->reader.phase() != Reader::Phase::kTraffic && now - c->since > limits.handshake_timeout)
        late.push_back(c.get());
    for (Connection* c : late) refuse(*c, "no ZMTP handshake in time");
  }

  // Watches the listeners again once the pause after running out of descriptors is over.
  void resume_accepting(Clock::time_point now) {
    if (!accept_paused_until || now < *accept_paused_until) return;
    accept_paused_until.reset();
    watch_listeners(EPOLLIN);
  }
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;

Result<std::unique_ptr<Server>> Server::create(SocketType type, const ServerLimits& limits) {
  UniqueFd ep(::epoll_create1(EPOLL_CLOEXEC));
  if (!ep) return make_error(ErrorCode::kIo, std::string("epoll_create1: ") + std::strerror(errno));
  return std::make_unique<Server>(std::make_unique<Impl>(type, limits, std::move(ep)));
}

Result<int> Server::listen(const std::string& host, int port) {
  const bool any = host.empty() || host == "*";
  addrinfo hints{};
  hints.ai_family = host.find(':') != std::string::npos ? AF_INET6 : AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(any ? nullptr : host.c_str(), service.c_str(), &hints, &found);
      rc != 0)
    return make_error(ErrorCode::kInvalid, "cannot resolve '" + host + "': " + ::gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, ::freeaddrinfo);
  UniqueFd fd(::socket(found->ai_family, found->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return make_error(ErrorCode::kIo, std::string("socket: ") + std::strerror(errno));
  const int on = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  if (::bind(fd.get(), found->ai_addr, found->ai_addrlen) != 0 || ::listen(fd.get(), kBacklog) != 0)
    return make_error(ErrorCode::kIo, std::strerror(errno));
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(bound).sin6_port
                                        : reinterpret_cast<sockaddr_in&>(bound).sin_port);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd.get();
  if (::epoll_ctl(impl_->epoll.get(), EPOLL_CTL_ADD, fd.get(), &ev) != 0)
    return make_error(ErrorCode::kIo, std::string("epoll_ctl: ") + std::strerror(errno));
  impl_->listeners.push_back(std::move(fd));
  return bound_port;
}

Server::Polled Server::poll(std::chrono::milliseconds wait, MessageHandler& handler) {
  Impl& s = *impl_;
  std::array<epoll_event, kEventsPerWait> events{};
  const int n = ::epoll_wait(s.epoll.get(), events.data(), static_cast<int>(events.size()),
                             static_cast<int>(wait.count()));
  Polled polled;
  for (int i = 0; i < n; ++i) {
    const epoll_event& ev = events[static_cast<std::size_t>(i)];
    if (s.is_listener(ev.data.fd)) {
      s.accept_from(ev.data.fd);
      continue;
    }
    auto it = s.connections.find(ev.data.fd);
    if (it == s.connections.end()) continue;
    Connection& c = *it->second;
    if ((ev.events & EPOLLOUT) && !s.flush(c)) continue;
    if ((ev.events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && c.unsent() < kMaxUnsent &&
        !s.read_from(c, handler, polled))
      polled.drained = false;
  }
  if (n == static_cast<int>(events.size())) polled.drained = false;  // more may be ready
  const auto now = Clock::now();
  s.resume_accepting(now);
  if (now >= s.next_sweep) s.sweep(now);
  return polled;
}

std::size_t Server::connections() const {
  return impl_->connections.size();
}
const ServerStats& Server::stats() const {
  return impl_->stats;
}

}  // namespace kvnode::zmtp
