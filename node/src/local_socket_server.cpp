#include "local_socket_server.hpp"

#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "kvnode/client/kv_wire.hpp"
#include "kvnode/client/local_framing.hpp"
#include "kvnode/client/local_protocol.hpp"
#include "kvnode/common/log_throttle.hpp"
#include "kvnode/common/unique_fd.hpp"

namespace kvnode::node::local {
namespace {

using Clock = std::chrono::steady_clock;
using client::protocol::FrameReader;

constexpr std::uint64_t kListenerTag = 0;  // epoll tags; connections count from 1
constexpr std::uint64_t kWakeTag = ~std::uint64_t{0};
constexpr int kBacklog = 128;

// One client connection: a frame being read, or a request with the service, or a reply being
// written; never two of these at once.
struct Connection {
  UniqueFd fd;
  FrameReader reader{};
  std::vector<UniqueFd> fds{};  // passed with the frame being read
  std::array<std::byte, client::protocol::kFrameHeaderBytes> header{};
  std::vector<std::byte> reply{};
  std::size_t sent = 0;          // of header and reply
  bool writing = false;          // a reply is being written
  bool waiting = false;          // the service holds its request (a deferred reply)
  std::uint32_t events = 0;      // registered with epoll now
  Clock::time_point progress{};  // the last byte in or out
  Clock::time_point reply_by{};  // writing: the whole reply must be read by then
  int pid = 0;  // the peer's, as the kernel said at accept (SO_PEERCRED); 0: unknown
};

// A deferred reply, or (none) a connection to cut.
struct Posted {
  ConnectionId id = 0;
  std::optional<std::vector<std::byte>> reply{};
};

Error os_error(ErrorCode code, const std::string& what) {
  return make_error(code, what + ": " + std::strerror(errno));
}

// What a connection over the cap is told before it is closed: one whole reply frame.
std::vector<std::byte> refusal_frame(std::size_t max_connections) {
  const std::vector<std::byte> body = client::protocol::encode(client::protocol::failure(
      make_error(ErrorCode::kRefused, "over max_connections " + std::to_string(max_connections))));
  const auto header = client::protocol::frame_header(static_cast<std::uint32_t>(body.size()));
  // Sized once and copied into (GCC 12 warns, wrongly, on a vector insert after the header).
  std::vector<std::byte> frame(header.size() + body.size());
  std::memcpy(frame.data(), header.data(), header.size());
  std::memcpy(frame.data() + header.size(), body.data(), body.size());
  return frame;
}

}  // namespace

struct LocalSocketServer::Impl {
  SocketServerOptions options;
  UniqueFd listener;
  UniqueFd epoll;
  EventFd wake;
  ino_t inode = 0;  // of the socket file bound here
  dev_t device = 0;
  SocketServerHandlers handlers;
  std::unordered_map<ConnectionId, Connection> connections;
  ConnectionId next_id = 1;
  bool accept_paused = false;  // out of descriptors: resumed at the next tick
  LogThrottle accept_warnings{std::chrono::seconds(10)};
  std::uint64_t refusals_logged = 0;
  const std::vector<std::byte> refusal;
  std::mutex posted_mutex;
  std::vector<Posted> posted;
  mutable std::mutex waiting_mutex;  // the executor asks is_waiting() from its thread
  std::unordered_set<ConnectionId> waiting_ids;
  std::atomic<bool> stopping{false};
  std::atomic<std::uint64_t> accepted{0}, refused{0}, cut{0}, open{0}, dropped{0};
  std::thread thread;

  Impl(SocketServerOptions o, UniqueFd l, UniqueFd e, EventFd w)
      : options(std::move(o)),
        listener(std::move(l)),
        epoll(std::move(e)),
        wake(std::move(w)),
        refusal(refusal_frame(options.max_connections)) {}

  ~Impl() { stop(); }

  void stop() {
    stopping = true;
    wake.signal();
    if (thread.joinable()) thread.join();
    connections.clear();  // no on_close: the service drops every hold as it stops
    open = 0;
    {
      std::lock_guard lock(waiting_mutex);
      waiting_ids.clear();
    }
    // Remove the socket file unless a newer node bound the path since; before the listener
    // closes, so a client never finds a file nobody listens on.
    struct stat now {};
    if (inode != 0 && ::stat(options.path.c_str(), &now) == 0 && now.st_ino == inode &&
        now.st_dev == device)
      ::unlink(options.path.c_str());
    inode = 0;
    listener.reset();
  }

  bool watch(std::uint64_t tag, int fd, std::uint32_t events, int op) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = tag;
    if (::epoll_ctl(epoll.get(), op, fd, &ev) == 0) return true;
    spdlog::warn("local socket: epoll_ctl: {}", std::strerror(errno));
    return false;
  }

  void set_waiting(ConnectionId id, Connection& c, bool waiting) {
    if (c.waiting == waiting) return;
    c.waiting = waiting;
    std::lock_guard lock(waiting_mutex);
    if (waiting) {
      waiting_ids.insert(id);
    } else {
      waiting_ids.erase(id);
    }
  }

  // Reading when idle, writing while a reply is out, nothing while the service holds a request
  // (epoll still reports a hang-up then: the connection closes, its reply is dropped). A
  // connection epoll cannot watch any more would never be served nor cut: it is closed.
  void update_events(ConnectionId id, Connection& c) {
    const std::uint32_t wanted = c.writing ? EPOLLOUT : c.waiting ? 0u : EPOLLIN;
    if (wanted == c.events) return;
    c.events = wanted;
    if (!watch(id, c.fd.get(), wanted, EPOLL_CTL_MOD)) close(id);
  }

  // Every connection ends here (closing the descriptor leaves the epoll set).
  void close(ConnectionId id) {
    auto it = connections.find(id);
    if (it == connections.end()) return;
    if (it->second.waiting) {
      std::lock_guard lock(waiting_mutex);
      waiting_ids.erase(id);
    }
    connections.erase(it);
    --open;
    if (handlers.on_close) handlers.on_close(id);
  }

  void run() {
    auto next_tick = Clock::now() + options.tick;
    std::array<epoll_event, 64> events{};
    while (!stopping) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(next_tick - Clock::now());
      const int n = ::epoll_wait(epoll.get(), events.data(), static_cast<int>(events.size()),
                                 static_cast<int>(std::max<std::int64_t>(0, left.count())));
      if (n < 0 && errno != EINTR) {
        spdlog::error("local socket: epoll_wait: {}", std::strerror(errno));
        std::this_thread::sleep_for(options.tick);
      }
      for (int i = 0; i < n; ++i) {
        const std::uint64_t tag = events[static_cast<std::size_t>(i)].data.u64;
        const std::uint32_t what = events[static_cast<std::size_t>(i)].events;
        if (tag == kListenerTag) {
          accept_all();
        } else if (tag == kWakeTag) {
          wake.drain();
          deliver_posted();
        } else {
          on_connection(tag, what);
        }
      }
      if (const auto now = Clock::now(); now >= next_tick) {
        next_tick = now + options.tick;
        on_tick(now);
      }
    }
  }

  void on_tick(Clock::time_point now) {
    if (handlers.on_tick) handlers.on_tick();
    std::vector<ConnectionId> stalled;
    for (const auto& [id, c] : connections) {
      const char* why = nullptr;
      if ((c.reader.mid_frame() || c.writing) && now - c.progress > options.stall_timeout)
        why = c.writing ? "stalled reading its reply" : "stalled mid-request";
      else if (c.writing && now > c.reply_by)
        why = "had not read its whole reply";
      if (!why) continue;
      spdlog::warn("local socket: a client {} for over {} ms; cut", why,
                   options.stall_timeout.count());
      stalled.push_back(id);
    }
    for (ConnectionId id : stalled) {
      ++cut;
      close(id);
    }
    if (accept_paused) {
      accept_paused = false;
      watch(kListenerTag, listener.get(), EPOLLIN, EPOLL_CTL_MOD);
    }
    if (const std::uint64_t r = refused; r != refusals_logged) {
      spdlog::warn("local socket: {} connections refused in all, over the cap of {}", r,
                   options.max_connections);
      refusals_logged = r;
    }
  }

  void accept_all() {
    for (;;) {
      UniqueFd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!fd) {
        const int err = errno;
        if (err == EINTR || err == ECONNABORTED) continue;
        if (err == EAGAIN || err == EWOULDBLOCK) return;
        // Out of descriptors or memory: the pending connection stays in the backlog; pause
        // accepting for a tick instead of spinning on a listener that stays readable.
        // Once per period, with what was kept quiet: out of descriptors, this would else log
        // every tick for as long as the backlog holds a connection.
        if (const std::size_t times = accept_warnings.pass(Clock::now()); times > 0)
          spdlog::warn("local socket: accept: {} ({} times since the last warning); pausing",
                       std::strerror(err), times);
        accept_paused = true;
        watch(kListenerTag, listener.get(), 0, EPOLL_CTL_MOD);
        return;
      }
      if (connections.size() >= options.max_connections) {
        // Told why, then closed: the client's call fails with kRefused. A new socket's buffer is
        // empty, so the frame fits; if it does not, the client sees the connection closed.
        ++refused;
        [[maybe_unused]] const ssize_t told =
            ::send(fd.get(), refusal.data(), refusal.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        continue;
      }
      const ConnectionId id = next_id++;
      if (!watch(id, fd.get(), EPOLLIN, EPOLL_CTL_ADD)) continue;  // never served: closed now
      Connection& c = connections[id];
      ucred cred{};
      socklen_t cred_len = sizeof cred;
      if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) == 0) c.pid = cred.pid;
      c.fd = std::move(fd);
      c.events = EPOLLIN;
      c.progress = Clock::now();
      ++accepted;
      ++open;
    }
  }

  void on_connection(ConnectionId id, std::uint32_t what) {
    auto it = connections.find(id);
    if (it == connections.end()) return;
    Connection& c = it->second;
    const bool reading = c.events == EPOLLIN;
    if ((what & (EPOLLERR | EPOLLHUP)) && !(reading && (what & EPOLLIN))) {
      close(id);  // a request still in the socket is read first; its reply then finds it closed
      return;
    }
    if (c.writing && (what & EPOLLOUT)) {
      write_some(id, c);
    } else if (reading && (what & EPOLLIN)) {
      read_some(id, c);
    }
  }

  // Reads until the socket is empty or a frame is whole (one request at a time).
  void read_some(ConnectionId id, Connection& c) {
    for (;;) {
      const std::span<std::byte> space = c.reader.space();
      iovec part{space.data(), space.size()};
      alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * client::kMaxKvFds)> control;
      msghdr msg{};
      msg.msg_iov = &part;
      msg.msg_iovlen = 1;
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
      const ssize_t n = ::recvmsg(c.fd.get(), &msg, MSG_CMSG_CLOEXEC);
      if (n == 0) return close(id);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) close(id);
        return;
      }
      if (!take_fds(c, msg)) {
        spdlog::warn("local socket: a client passed more than {} descriptors with one request; cut",
                     client::kMaxKvFds);
        ++cut;
        return close(id);
      }
      c.progress = Clock::now();
      switch (c.reader.advance(static_cast<std::size_t>(n))) {
        case FrameReader::Progress::kMore:
          continue;
        case FrameReader::Progress::kTooLarge:
          spdlog::warn("local socket: a client declared a {} byte message (limit {}); cut",
                       c.reader.declared(), client::protocol::kMaxMessageBytes);
          ++cut;
          return close(id);
        case FrameReader::Progress::kFrame:
          return handle(id, c, c.reader.take());
      }
    }
  }

  // Adopts the descriptors a recvmsg brought (each owned at once, so none leaks); false when
  // the frame carries too many or the kernel dropped some (MSG_CTRUNC).
  static bool take_fds(Connection& c, msghdr& msg) {
    bool ok = (msg.msg_flags & MSG_CTRUNC) == 0;
    for (cmsghdr* h = CMSG_FIRSTHDR(&msg); h != nullptr; h = CMSG_NXTHDR(&msg, h)) {
      if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t count = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
        c.fds.emplace_back(fd);
      }
    }
    return ok && c.fds.size() <= client::kMaxKvFds;
  }

  void handle(ConnectionId id, Connection& c, std::vector<std::byte> request) {
    // Waiting from before the service sees the request: a job it hands its executor may ask
    // is_waiting() before on_request returns.
    set_waiting(id, c, true);
    std::optional<std::vector<std::byte>> reply;
    try {
      reply = handlers.on_request(id, std::move(request), std::exchange(c.fds, {}));
    } catch (const std::exception& e) {  // bad_alloc on a large reply: this client only
      spdlog::error("local socket: a request failed: {}; closing its connection", e.what());
      return close(id);
    } catch (...) {
      spdlog::error("local socket: a request failed (an unknown exception); closing it");
      return close(id);
    }
    if (!reply) return update_events(id, c);
    start_reply(id, c, std::move(*reply));
  }

  void start_reply(ConnectionId id, Connection& c, std::vector<std::byte> reply) {
    if (reply.size() > client::protocol::kMaxMessageBytes) {
      spdlog::error("local socket: a reply of {} bytes is over the limit; closing", reply.size());
      return close(id);
    }
    c.header = client::protocol::frame_header(static_cast<std::uint32_t>(reply.size()));
    c.reply = std::move(reply);
    c.sent = 0;
    c.writing = true;
    set_waiting(id, c, false);
    c.progress = Clock::now();
    c.reply_by = c.progress + options.stall_timeout;
    write_some(id, c);
  }

  void write_some(ConnectionId id, Connection& c) {
    const std::size_t total = c.header.size() + c.reply.size();
    while (c.sent < total) {
      std::array<iovec, 2> parts{};
      std::size_t count = 0;
      if (c.sent < c.header.size())
        parts[count++] = {c.header.data() + c.sent, c.header.size() - c.sent};
      const std::size_t body_sent = c.sent < c.header.size() ? 0 : c.sent - c.header.size();
      if (body_sent < c.reply.size())
        parts[count++] = {c.reply.data() + body_sent, c.reply.size() - body_sent};
      msghdr msg{};
      msg.msg_iov = parts.data();
      msg.msg_iovlen = count;
      const ssize_t n = ::sendmsg(c.fd.get(), &msg, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return update_events(id, c);
        return close(id);  // the client left: its reply is dropped
      }
      c.sent += static_cast<std::size_t>(n);
      c.progress = Clock::now();
    }
    c.writing = false;
    c.reply = {};
    update_events(id, c);
  }

  void deliver_posted() {
    std::vector<Posted> ready;
    {
      std::lock_guard lock(posted_mutex);
      ready.swap(posted);
    }
    for (Posted& p : ready) {
      auto it = connections.find(p.id);
      if (it == connections.end() || !it->second.waiting) {
        ++dropped;  // its client left meanwhile
        continue;
      }
      if (!p.reply) {
        ++cut;
        close(p.id);
        continue;
      }
      start_reply(p.id, it->second, std::move(*p.reply));
    }
  }
};

Result<std::unique_ptr<LocalSocketServer>> LocalSocketServer::listen(
    const SocketServerOptions& options) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (options.path.empty() || options.path.size() >= sizeof(addr.sun_path))
    return make_error(ErrorCode::kInvalid,
                      "local socket path '" + options.path + "': empty or over " +
                          std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  // A socket file left by a node that died is replaced (the instance lock keeps a live node from
  // being here); any other file at the path is someone's data: refuse.
  bool stale = false;  // replaced by the rename below
  if (struct stat st{}; ::lstat(options.path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return make_error(ErrorCode::kInvalid,
                        "local socket " + options.path + ": the path exists and is not a socket");
    stale = true;
  }
  // Bound and listening under a temporary name, then renamed into place: a client that sees the
  // file can connect at once (bound at the final path, it could meet a socket not listening yet
  // and be told "nothing listens": the node seemed gone while it was starting).
  const std::string temp = options.path + "." + std::to_string(::getpid()) + ".tmp";
  const std::string& bound = temp.size() < sizeof(addr.sun_path) ? temp : options.path;
  std::memcpy(addr.sun_path, bound.c_str(), bound.size() + 1);
  ::unlink(temp.c_str());  // left by a node with this pid that died starting
  if (stale && bound == options.path && ::unlink(options.path.c_str()) != 0)
    return os_error(ErrorCode::kIo, "local socket " + options.path + ": removing the stale one");
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return os_error(ErrorCode::kIo, "local socket: socket");
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return os_error(ErrorCode::kIo, "local socket " + options.path + ": bind");
  // Owner only, like the staging region: chunks are the engine's data.
  struct stat st {};
  if (::chmod(bound.c_str(), 0600) != 0 || ::stat(bound.c_str(), &st) != 0 ||
      ::listen(fd.get(), kBacklog) != 0 ||
      (bound != options.path && ::rename(bound.c_str(), options.path.c_str()) != 0)) {
    Error e = os_error(ErrorCode::kIo, "local socket " + options.path);
    ::unlink(bound.c_str());
    return e;
  }
  UniqueFd epoll(::epoll_create1(EPOLL_CLOEXEC));
  Result<EventFd> wake = EventFd::create();
  if (!epoll || !wake) {
    ::unlink(options.path.c_str());
    return make_error(ErrorCode::kIo, "local socket: out of descriptors for epoll or eventfd");
  }
  auto impl =
      std::make_unique<Impl>(options, std::move(fd), std::move(epoll), std::move(wake).value());
  impl->inode = st.st_ino;
  impl->device = st.st_dev;
  if (!impl->watch(kListenerTag, impl->listener.get(), EPOLLIN, EPOLL_CTL_ADD) ||
      !impl->watch(kWakeTag, impl->wake.fd(), EPOLLIN, EPOLL_CTL_ADD))
    return make_error(ErrorCode::kIo, "local socket: epoll_ctl failed (logged)");  // ~Impl unlinks
  return std::unique_ptr<LocalSocketServer>(new LocalSocketServer(std::move(impl)));
}

Status LocalSocketServer::serve(SocketServerHandlers handlers) {
  if (impl_->thread.joinable()) return make_error(ErrorCode::kInternal, "serve() called twice");
  impl_->handlers = std::move(handlers);
  Impl* raw = impl_.get();
  impl_->thread = std::thread([raw] { raw->run(); });
  return {};
}

LocalSocketServer::LocalSocketServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LocalSocketServer::~LocalSocketServer() = default;

void LocalSocketServer::stop() {
  impl_->stop();
}

void LocalSocketServer::post(ConnectionId connection, std::vector<std::byte> reply) {
  {
    std::lock_guard lock(impl_->posted_mutex);
    impl_->posted.push_back({connection, std::move(reply)});
  }
  impl_->wake.signal();
}

void LocalSocketServer::cut(ConnectionId connection) {
  {
    std::lock_guard lock(impl_->posted_mutex);
    impl_->posted.push_back({connection, std::nullopt});
  }
  impl_->wake.signal();
}

bool LocalSocketServer::is_waiting(ConnectionId connection) const {
  std::lock_guard lock(impl_->waiting_mutex);
  return impl_->waiting_ids.count(connection) > 0;
}

int LocalSocketServer::peer_pid(ConnectionId connection) const {
  const auto it = impl_->connections.find(connection);
  return it == impl_->connections.end() ? 0 : it->second.pid;
}

SocketServerCounters LocalSocketServer::counters() const {
  return {impl_->accepted, impl_->refused, impl_->cut, impl_->open, impl_->dropped};
}

}  // namespace kvnode::node::local
