#include "listener.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace kvnode::transfer {
namespace {

using Clock = std::chrono::steady_clock;
constexpr LinkId kSocketKey = 0;  // link ids start at 1
constexpr int kBacklog = 128;
constexpr int kAcceptsPerProgress = 64;  // then the plane's other work gets a turn
// Clients waiting for their hello hold at most this share of the process's descriptors, so a
// flood on the transfer port cannot starve the rest of the node (ZeroMQ, HTTP, UCX) of them.
constexpr rlim_t kPendingShareOfDescriptors = 4;

std::size_t pending_cap(std::size_t wanted) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return wanted;
  return std::max<std::size_t>(
      1, std::min<std::size_t>(wanted, limit.rlim_cur / kPendingShareOfDescriptors));
}

UniqueFd open_reserve() {
  return UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
}

}  // namespace

Listener::Listener(Epoll epoll, UniqueFd socket, ListenerHooks hooks, ListenerLimits limits)
    : epoll_(std::move(epoll)),
      socket_(std::move(socket)),
      reserve_(open_reserve()),
      hooks_(std::move(hooks)),
      limits_(limits),
      next_log_(Clock::now()) {}

Listener::~Listener() = default;

Result<std::unique_ptr<Listener>> Listener::bind(const std::string& host, std::uint16_t port,
                                                 LinkBytes descriptor) {
  ListenerHooks hooks;
  hooks.answer = [d = std::move(descriptor)](const LinkBytes&, LinkId) {
    return ListenerAnswer{d, true};
  };
  return bind(host, port, std::move(hooks));
}

Result<std::unique_ptr<Listener>> Listener::bind(const std::string& host, std::uint16_t port,
                                                 ListenerHooks hooks, ListenerLimits limits) {
  const std::string where = "cannot listen at " + host + ":" + std::to_string(port) + ": ";
  Result<SocketAddress> addr = parse_address(host, port);
  if (!addr) return make_error("listener: " + addr.error().message);
  UniqueFd fd(::socket(addr->storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return make_error(where + std::strerror(errno));
  // A restarted node gets its port back while old connections sit in TIME_WAIT; a port another
  // socket listens on stays refused (no SO_REUSEPORT: nobody shares it).
  const int one = 1;
  (void)setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr->storage), addr->length) != 0) {
    const int e = errno;
    return make_error(where + (e == EADDRINUSE ? std::string("port in use") : std::strerror(e)));
  }
  if (::listen(fd.get(), kBacklog) != 0) return make_error(where + std::strerror(errno));
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0)
    return make_error(where + std::strerror(errno));
  Result<Epoll> epoll = Epoll::create();
  if (!epoll) return make_error(where + epoll.error().message);
  epoll->add(fd.get(), EPOLLIN, kSocketKey);
  limits.max_pending = pending_cap(limits.max_pending);
  std::unique_ptr<Listener> self(
      new Listener(std::move(epoll).value(), std::move(fd), std::move(hooks), limits));
  self->port_ =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  return self;
}

std::size_t Listener::pending() const {
  std::size_t n = 0;
  for (const auto& [id, c] : conns_) n += c.answered ? 0 : 1;
  return n;
}

unsigned Listener::progress() {
  unsigned n = 0;
  const auto now = Clock::now();
  // The reserve is lost when another thread took its number before it was reopened: get it back.
  if (!reserve_.valid()) reserve_ = open_reserve();
  if (paused_ && now >= resume_at_) {
    paused_ = false;
    epoll_.add(socket_.get(), EPOLLIN, kSocketKey);
  }
  for (const LinkId key : epoll_.ready()) n += key == kSocketKey ? accept_all() : serve(key);
  // Hellos that did not come in time.
  std::vector<LinkId> late;
  for (const auto& [id, c] : conns_)
    if (!c.answered && now > c.deadline) late.push_back(id);
  for (const LinkId id : late) {
    note_drop("no hello within " + std::to_string(limits_.hello_timeout.count()) + " ms");
    close(id, false, {});
  }
  log_now_and_then();
  return n + static_cast<unsigned>(late.size());
}

unsigned Listener::accept_all() {
  unsigned n = 0;
  for (int i = 0; i < kAcceptsPerProgress; ++i) {
    UniqueFd fd(::accept4(socket_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      const int error = errno;
      if (error == EMFILE || error == ENFILE) {
        if (out_of_descriptors()) break;
        ++n;
        continue;
      }
      // EAGAIN: nothing left; ECONNABORTED and the like: that client is gone already.
      if (error == EAGAIN || error == EWOULDBLOCK) break;
      continue;
    }
    ++n;
    ++counters_.accepted;
    if (pending() >= limits_.max_pending) {
      ++counters_.refused;
      continue;  // closed here: a flood of silent connections holds at most max_pending
    }
    tune_link_socket(fd.get());
    const LinkId id = next_id_++;
    Conn& c =
        conns_.emplace(id, Conn{ControlLink(std::move(fd)), Clock::now() + limits_.hello_timeout})
            .first->second;
    epoll_.add(c.link.fd(), c.link.events(), id);
    n += serve(id);  // the hello is often there already
  }
  return n;
}

bool Listener::out_of_descriptors() {
  // accept() fails so whether or not a client waits. The reserve descriptor, freed for a moment,
  // takes a waiting one off the backlog to close it, so the client hears at once instead of
  // hanging, and the listening socket stops being readable instead of spinning the thread.
  bool refused = false;
  if (reserve_.valid()) {
    reserve_.reset();
    refused = UniqueFd(::accept4(socket_.get(), nullptr, nullptr, SOCK_CLOEXEC)).valid();
    reserve_ = open_reserve();
  }
  if (refused) {
    ++counters_.out_of_descriptors;
    ++counters_.refused;
  }
  if (reserve_.valid()) return !refused;
  // No reserve to spend (something else took the descriptor): stop watching the socket a while.
  paused_ = true;
  resume_at_ = Clock::now() + limits_.accept_pause;
  epoll_.remove(socket_.get());
  return true;
}

unsigned Listener::serve(LinkId id) {
  const auto it = conns_.find(id);
  if (it == conns_.end()) return 0;
  Conn& c = it->second;
  const Status pumped = c.link.pump();
  if (!c.answered) {
    if (std::optional<LinkBytes> hello = c.link.take_frame()) {
      ListenerAnswer a = hooks_.answer(*hello, id);
      c.link.send(a.body);
      c.answered = true;
      c.closing = !a.keep;
      ++counters_.handshakes;
      if (Status sent = c.link.pump(); !sent) {
        close(id, a.keep, sent.error().message);
        return 1;
      }
    } else if (!pumped) {
      note_drop(pumped.error().message);
      close(id, false, {});
      return 1;
    }
  } else if (!pumped) {
    close(id, !c.closing, pumped.error().message);
    return 1;
  }
  if (c.closing && !c.link.wants_write())
    close(id, false, {});
  else
    epoll_.modify(c.link.fd(), c.link.events(), id);
  return 1;
}

void Listener::close(LinkId id, bool report, const std::string& why) {
  const auto it = conns_.find(id);
  if (it == conns_.end()) return;
  epoll_.remove(it->second.link.fd());
  conns_.erase(it);
  if (report && hooks_.lost) hooks_.lost(id, why);
}

void Listener::drop(LinkId link) {
  close(link, false, {});
}

void Listener::note_drop(const std::string& why) {
  ++counters_.dropped;
  last_drop_ = why;
}

void Listener::log_now_and_then() {
  const bool news = counters_.dropped != logged_.dropped || counters_.refused != logged_.refused;
  if (!news || Clock::now() < next_log_) return;
  if (counters_.dropped != logged_.dropped)
    spdlog::warn("transfer listener: closed {} connection(s) that were not kvnode peers (last: {})",
                 counters_.dropped - logged_.dropped, last_drop_);
  if (counters_.out_of_descriptors != logged_.out_of_descriptors)
    spdlog::warn(
        "transfer listener: out of file descriptors: refused {} connection(s); raise "
        "the open-files limit (ulimit -n)",
        counters_.out_of_descriptors - logged_.out_of_descriptors);
  else if (counters_.refused != logged_.refused)
    spdlog::warn(
        "transfer listener: refused {} connection(s): {} were already waiting for "
        "their hello",
        counters_.refused - logged_.refused, limits_.max_pending);
  logged_ = counters_;
  next_log_ = Clock::now() + limits_.log_interval;
}

Result<LinkBytes> handshake(const std::string& host, std::uint16_t port,
                            const LinkBytes& descriptor, Clock::time_point deadline) {
  const std::string where = "handshake with " + host + ":" + std::to_string(port) + ": ";
  Result<ControlLink> link = ControlLink::dial(host, port, descriptor);
  if (!link) return make_error(where + link.error().message);
  for (;;) {
    const Status pumped = link->pump();
    if (std::optional<LinkBytes> answer = link->take_frame()) return std::move(*answer);
    if (!pumped) return make_error(where + pumped.error().message);
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return make_error(where + "no answer before the deadline");
    pollfd p{link->fd(), static_cast<short>(POLLIN | (link->wants_write() ? POLLOUT : 0)), 0};
    (void)::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 100)));
  }
}

}  // namespace kvnode::transfer
