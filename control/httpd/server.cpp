// kvnode::httpd::Server: httplib parses and answers one request at a time on our connections
// (through its protected process_request); the accept loop, idle connections and limits are
// here. Thread model: one poller (accepts, holds idle connections in epoll, closes those idle too
// long) and a fixed pool of handler threads, each serving one request of a connection that has
// bytes to read and then handing the connection back to the poller. A request with a body holds
// its thread while the body arrives, so such requests get all threads but one (503 beyond,
// answered and drained by the poller): a probe never waits for a slow body.
#include "kvnode/httpd/server.hpp"

#include <fcntl.h>
#include <httplib.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "connection.hpp"
#include "kvnode/common/log_throttle.hpp"
#include "port_holder.hpp"
#include "request_gate.hpp"

namespace kvnode::httpd {
namespace {

constexpr std::uint64_t kListenerId = 0;  // epoll ids; connections count from kFirstConnectionId
constexpr std::uint64_t kWakeId = 1;
constexpr std::uint64_t kFirstConnectionId = 2;
constexpr int kBacklog = 1024;  // httplib listens with 5: a burst of connects would be dropped
constexpr auto kSweepPeriod = std::chrono::milliseconds(200);        // idle-timeout resolution
constexpr auto kAcceptPause = std::chrono::milliseconds(100);        // after EMFILE
constexpr auto kDescriptorWarningPeriod = std::chrono::seconds(10);  // one log line per period
constexpr std::size_t kDrainChunk = 64 << 10;
constexpr auto kDrainTime = std::chrono::seconds(2);  // a refused body is dropped this long at most
constexpr std::size_t kReadChunk = 16 << 10;          // the poller's header reads
constexpr std::size_t kMaxHeaderBytes = 64 << 10;     // request line and headers: 431 beyond
constexpr std::size_t kDescriptorShareDivisor = 2;    // HTTP may use half of ulimit -n
constexpr auto kStopGrace = std::chrono::seconds(2);  // then busy connections are cut

// The soft descriptor limit (the daemons' main() raises it to the hard one first); 0 unknown.
rlim_t descriptor_limit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return 0;
  return r.rlim_cur;
}

void name_thread(const std::string& name) {
  ::pthread_setname_np(::pthread_self(), name.substr(0, 15).c_str());
}

std::string too_many_connections(std::size_t limit) {
  return closing_answer("503 Service Unavailable",
                        "too many connections (limit " + std::to_string(limit) + ")");
}

// A body request beyond the body handler threads' share: retry in a second, on a new connection.
std::string bodies_busy(std::size_t threads) {
  return closing_answer("503 Service Unavailable",
                        "all " + std::to_string(threads) +
                            " handler threads for requests with a body are busy: retry later",
                        "Retry-After: 1\r\n");
}

std::string headers_too_large() {
  return closing_answer("431 Request Header Fields Too Large",
                        "request headers over " + std::to_string(kMaxHeaderBytes >> 10) + " KiB");
}

// Reads what `fd` has without blocking; false when the client closed or the socket failed.
bool read_available(int fd, std::string& buffer) {
  for (;;) {
    const std::size_t had = buffer.size();
    buffer.resize(had + kReadChunk);
    const ssize_t n = ::recv(fd, buffer.data() + had, kReadChunk, MSG_DONTWAIT);
    buffer.resize(had + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
    if (n > 0) {
      if (buffer.size() > kMaxHeaderBytes) return true;  // the caller refuses it
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

}  // namespace

struct Server::Impl {
  std::string name;
  Limits limits;
  Engine engine;
  RequestGate gate;
  std::string refusal;           // the canned 503 for connections over the cap
  std::size_t body_threads = 1;  // body_handler_threads(limits), set by start()
  std::string busy_refusal;      // the canned 503 for a body beyond them

  UniqueFd epoll;
  std::optional<EventFd> wake;  // stop() wakes the poller
  std::thread poller;
  std::vector<std::thread> handlers;
  std::atomic<bool> stopping{false};

  mutable std::mutex mutex;  // connections, ready, next_id
  std::condition_variable ready_cv;
  std::unordered_map<std::uint64_t, std::unique_ptr<Connection>> connections;
  std::deque<Connection*> ready;  // kBusy connections waiting for a handler
  std::size_t bodies_busy = 0;    // kBusy connections holding a body slot (<= body_threads)
  std::uint64_t next_id = kFirstConnectionId;

  std::atomic<std::uint64_t> refused{0}, timed_out{0}, headers_refused{0}, bodies_refused{0};
  LogThrottle descriptor_warnings{kDescriptorWarningPeriod};

  Impl(std::string n, Limits l)
      : name(std::move(n)),
        limits(l),
        gate(engine, limits),
        refusal(too_many_connections(l.max_connections)) {
    engine.set_socket_options([](socket_t s) {
      const int yes = 1;  // TIME_WAIT must not block a restart; sharing the port must fail
      ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    engine.set_payload_max_length(limits.max_body_bytes);
    engine.set_read_timeout(
        std::chrono::duration_cast<std::chrono::seconds>(limits.io_timeout).count(), 0);
    engine.set_write_timeout(
        std::chrono::duration_cast<std::chrono::seconds>(limits.io_timeout).count(), 0);
    // Only for the Keep-Alive header httplib writes; the poller enforces both.
    engine.set_keep_alive_timeout(
        std::chrono::duration_cast<std::chrono::seconds>(limits.idle_timeout).count());
    engine.set_keep_alive_max_count(limits.max_requests_per_connection);
  }

  void epoll_add(int fd, std::uint64_t id, std::uint32_t events, int op = EPOLL_CTL_ADD) {
    epoll_event e{};
    e.events = events;
    e.data.u64 = id;
    ::epoll_ctl(epoll.get(), op, fd, &e);
  }

  void poll_loop();
  void read_headers(Connection& c);
  bool queue_locked(Connection& c, const std::optional<std::size_t>& body);
  void refuse_body(Connection& c, std::size_t body);
  void drain_refused(Connection& c);
  void release_body_slot(Connection& c);
  void accept_all(Clock::time_point& paused_until);
  void sweep_idle();
  void handler_loop();
  void serve(Connection& c);
  void drain(Connection& c, ConnectionStream& stream);
  void give_back(Connection& c);
  void close_connection(Connection& c);
};

void Server::Impl::poll_loop() {
  name_thread(name);
  std::array<epoll_event, 256> events{};
  Clock::time_point paused_until{};
  Clock::time_point next_sweep = Clock::now() + kSweepPeriod;
  while (!stopping) {
    const int n = ::epoll_wait(epoll.get(), events.data(), static_cast<int>(events.size()),
                               static_cast<int>(kSweepPeriod.count()));
    const auto now = Clock::now();
    if (paused_until != Clock::time_point{} && now >= paused_until) {
      paused_until = {};
      epoll_add(engine.listening_socket(), kListenerId, EPOLLIN, EPOLL_CTL_MOD);
    }
    for (int i = 0; i < n; ++i) {
      const std::uint64_t id = events[i].data.u64;
      if (id == kWakeId) continue;
      if (id == kListenerId) {
        accept_all(paused_until);
        continue;
      }
      Connection* c = nullptr;
      {
        std::lock_guard lock(mutex);
        auto it = connections.find(id);
        if (it == connections.end() || it->second->state == Connection::State::kBusy) continue;
        c = it->second.get();  // only this thread touches an idle connection
      }
      try {
        if (c->state == Connection::State::kDraining) {
          drain_refused(*c);
        } else {
          read_headers(*c);
        }
      } catch (const std::exception& e) {  // bad_alloc growing its buffer: drop this one
        spdlog::error("{}: HTTP connection dropped: {}", name, e.what());
        close_connection(*c);
      }
    }
    if (now >= next_sweep) {
      sweep_idle();
      next_sweep = now + kSweepPeriod;
    }
  }
}

// EPOLLONESHOT disarmed `c`: read what came; complete headers go to a handler, partial ones
// wait in epoll until their deadline, and a client that closed or sent too much is dropped.
void Server::Impl::read_headers(Connection& c) {
  const bool open = read_available(c.fd.get(), c.buffer);
  // A client may send its request and shut down its side at once (curl, nc -N): it still gets
  // its answer, and the connection closes after it (the next read finds the end).
  if (!open && !c.has_headers(kMaxHeaderBytes)) return close_connection(c);
  if (c.has_headers(kMaxHeaderBytes)) {
    const std::optional<std::size_t> body = c.announced_body();
    std::unique_lock lock(mutex);
    if (queue_locked(c, body)) return;
    lock.unlock();
    return refuse_body(c, *body);
  }
  if (c.buffer.size() - c.begin > kMaxHeaderBytes) {
    headers_refused.fetch_add(1, std::memory_order_relaxed);
    const std::string answer = headers_too_large();
    (void)::send(c.fd.get(), answer.data(), answer.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    ::shutdown(c.fd.get(), SHUT_WR);
    return close_connection(c);
  }
  if (c.buffered() && c.state == Connection::State::kIdle) {
    c.state = Connection::State::kHeaders;
    c.header_deadline = Clock::now() + limits.header_timeout;
  }
  epoll_add(c.fd.get(), c.id, EPOLLIN | EPOLLRDHUP | EPOLLONESHOT, EPOLL_CTL_MOD);
}

// Hands `c`, whose headers are buffered, to the handlers (mutex held); false when they announce a
// `body` and the body handler threads are all taken: a request without a body then always finds
// a thread, however slowly the bodies being read arrive.
bool Server::Impl::queue_locked(Connection& c, const std::optional<std::size_t>& body) {
  if (body) {
    if (bodies_busy >= body_threads) return false;
    ++bodies_busy;
    c.body_slot = true;
  }
  c.state = Connection::State::kBusy;
  ready.push_back(&c);
  ready_cv.notify_one();
  return true;
}

// A body beyond the share: 503 at once, then its body is read and dropped here (so the client
// reads the answer instead of a reset), without a thread, for kDrainTime at most.
void Server::Impl::refuse_body(Connection& c, std::size_t body) {
  bodies_refused.fetch_add(1, std::memory_order_relaxed);
  (void)::send(c.fd.get(), busy_refusal.data(), busy_refusal.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  ::shutdown(c.fd.get(), SHUT_WR);
  // As a handler drops a refused body: up to twice the body limit (and kDrainTime).
  const std::size_t dropped = std::min(body, 2 * limits.max_body_bytes);
  const std::size_t came = c.buffered_past_headers();
  std::string().swap(c.buffer);
  c.begin = 0;
  if (came >= dropped) return close_connection(c);
  {
    std::lock_guard lock(mutex);
    c.state = Connection::State::kDraining;
    c.drain_left = dropped - came;
    c.drain_deadline = Clock::now() + kDrainTime;
  }
  epoll_add(c.fd.get(), c.id, EPOLLIN | EPOLLRDHUP | EPOLLONESHOT, EPOLL_CTL_MOD);
}

void Server::Impl::drain_refused(Connection& c) {
  if (!c.drop_arrived()) return close_connection(c);
  epoll_add(c.fd.get(), c.id, EPOLLIN | EPOLLRDHUP | EPOLLONESHOT, EPOLL_CTL_MOD);
}

void Server::Impl::release_body_slot(Connection& c) {
  if (!std::exchange(c.body_slot, false)) return;
  std::lock_guard lock(mutex);
  --bodies_busy;
}

void Server::Impl::accept_all(Clock::time_point& paused_until) {
  for (;;) {
    UniqueFd fd(
        ::accept4(engine.listening_socket(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: leave the connection queued, stop polling the listener a moment
        // (else epoll wakes at once, forever) and say so once per period.
        const auto now = Clock::now();
        if (descriptor_warnings.pass(now) > 0) {
          const int error = errno;
          std::size_t open = 0;
          {
            std::lock_guard lock(mutex);
            open = connections.size();
          }
          spdlog::warn("{}: cannot accept HTTP connections: {} ({} open)", name,
                       std::strerror(error), open);
        }
        paused_until = now + kAcceptPause;
        epoll_add(engine.listening_socket(), kListenerId, 0, EPOLL_CTL_MOD);
      }
      return;  // EAGAIN: all accepted
    }
    std::unique_lock lock(mutex);
    if (connections.size() >= limits.max_connections) {
      lock.unlock();
      refused.fetch_add(1, std::memory_order_relaxed);
      // A clear refusal, best effort: the socket buffer takes this small answer at once.
      (void)::send(fd.get(), refusal.data(), refusal.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      ::shutdown(fd.get(), SHUT_WR);
      continue;
    }
    // httplib writes an answer's headers and body apart: with Nagle on, the body waits for the
    // headers' ACK, which a keep-alive client delays (40 ms or more) on every request.
    const int one = 1;
    (void)::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const std::uint64_t id = next_id++;
    auto c = std::make_unique<Connection>(std::move(fd), id);
    c->idle_deadline = Clock::now() + limits.idle_timeout;
    const int raw = c->fd.get();
    connections.emplace(id, std::move(c));
    lock.unlock();
    epoll_add(raw, id, EPOLLIN | EPOLLRDHUP | EPOLLONESHOT);
  }
}

void Server::Impl::sweep_idle() {
  const auto now = Clock::now();
  std::lock_guard lock(mutex);
  for (auto it = connections.begin(); it != connections.end();) {
    Connection& c = *it->second;
    const bool idle_over = c.state == Connection::State::kIdle && now >= c.idle_deadline;
    const bool headers_over = c.state == Connection::State::kHeaders && now >= c.header_deadline;
    const bool drain_over = c.state == Connection::State::kDraining && now >= c.drain_deadline;
    if (idle_over || headers_over || drain_over) {
      if (headers_over) timed_out.fetch_add(1, std::memory_order_relaxed);
      ::epoll_ctl(epoll.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
      it = connections.erase(it);  // closes it
    } else {
      ++it;
    }
  }
}

void Server::Impl::handler_loop() {
  name_thread(name);
  for (;;) {
    Connection* c = nullptr;
    {
      std::unique_lock lock(mutex);
      ready_cv.wait(lock, [&] { return stopping || !ready.empty(); });
      if (ready.empty()) return;  // stopping
      c = ready.front();
      ready.pop_front();
    }
    if (stopping) {
      release_body_slot(*c);
      close_connection(*c);
      continue;
    }
    try {
      serve(*c);
    } catch (const std::exception& e) {  // bad_alloc in httplib or a handler: drop this one
      spdlog::error("{}: HTTP connection dropped: {}", name, e.what());
      release_body_slot(*c);
      close_connection(*c);
    }
  }
}

void Server::Impl::serve(Connection& c) {
  c.deadline = Clock::now() + limits.header_timeout;
  c.timed_out = false;
  c.close_after = false;
  c.refusal_status = 0;
  c.refusal_detail.clear();
  c.unread_body = 0;
  c.declared_body = 0;
  c.body_started = false;
  c.body_read = 0;
  c.body_cap = 0;
  ConnectionStream stream(c, limits.io_timeout);
  const bool last = ++c.requests >= limits.max_requests_per_connection;
  bool client_closes = false;
  bool ok = false;
  {
    // The body budget goes back however the request ends (a handler may throw).
    struct Release {
      RequestGate& gate;
      Connection& c;
      ~Release() { gate.release(c); }
    } release{gate, c};
    ok = gate.process(c, stream, last, client_closes);
  }
  // A body not read to its end would be parsed as the next request.
  const bool body_left = c.body_read < c.declared_body;
  if (body_left && c.unread_body == 0) c.unread_body = c.declared_body - c.body_read;
  drain(c, stream);
  release_body_slot(c);  // before give_back: the next request on `c` may need it
  if (c.timed_out) timed_out.fetch_add(1, std::memory_order_relaxed);
  if (!ok || last || client_closes || c.close_after || body_left || c.timed_out || stopping) {
    close_connection(c);
    return;
  }
  give_back(c);
}

// Reads and drops a refused body (within the body timeout): closing with it unread would reset
// the connection, and a client still sending would never see the answer.
void Server::Impl::drain(Connection& c, ConnectionStream& stream) {
  if (c.unread_body == 0 || c.timed_out) return;
  // Bounded in time and bytes: a client declaring a terabyte loses the answer rather than holding
  // a handler. Up to twice the limit is read, so a body a little over it (the usual mistake) is
  // drained whole and its client hears the 413 instead of a reset.
  c.deadline = Clock::now() + std::min<Clock::duration>(limits.body_timeout, kDrainTime);
  c.unread_body = std::min(c.unread_body, 2 * limits.max_body_bytes);
  std::vector<char> sink(kDrainChunk);
  while (c.unread_body > 0) {
    const ssize_t n = stream.read(sink.data(), std::min(sink.size(), c.unread_body));
    if (n <= 0) return;
    c.unread_body -= static_cast<std::size_t>(n);
  }
}

// Keep-alive: back to the poller, or straight to the queue when the next request is buffered.
void Server::Impl::give_back(Connection& c) {
  c.drop_consumed();
  const std::optional<std::size_t> body =
      c.has_headers(kMaxHeaderBytes) ? c.announced_body() : std::nullopt;
  std::unique_lock lock(mutex);
  if (c.has_headers(kMaxHeaderBytes)) {
    if (queue_locked(c, body)) return;
    lock.unlock();
    return refuse_body(c, *body);
  }
  if (c.buffered()) {  // part of the next request: the poller reads the rest
    c.state = Connection::State::kHeaders;
    c.header_deadline = Clock::now() + limits.header_timeout;
  } else {
    c.state = Connection::State::kIdle;
    c.idle_deadline = Clock::now() + limits.idle_timeout;
  }
  epoll_add(c.fd.get(), c.id, EPOLLIN | EPOLLRDHUP | EPOLLONESHOT, EPOLL_CTL_MOD);
}

void Server::Impl::close_connection(Connection& c) {
  std::lock_guard lock(mutex);
  ::epoll_ctl(epoll.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
  connections.erase(c.id);
}

Server::Server(std::string thread_name, Limits limits)
    : impl_(std::make_unique<Impl>(std::move(thread_name), limits)) {}

Server::~Server() {
  stop();
}

void Server::get(const std::string& path, Handler handler) {
  impl_->gate.route("GET", path, std::move(handler));
}
void Server::post(const std::string& path, Handler handler) {
  impl_->gate.route("POST", path, std::move(handler));
}
httplib::Server& Server::raw() {
  return impl_->engine;
}
void Server::inject_faults(FaultHooks hooks) {
  impl_->gate.inject_faults(std::move(hooks));
}
const Limits& Server::limits() const {
  return impl_->limits;
}

Result<int> Server::start(const std::string& host, int port) {
  Impl& s = *impl_;
  if (s.poller.joinable()) return Error{"HTTP server already started"};
  // Connections past the descriptor limit would leave ZeroMQ and UCX none (ZeroMQ aborts).
  const rlim_t descriptors = descriptor_limit();
  const std::size_t share = static_cast<std::size_t>(descriptors / kDescriptorShareDivisor);
  if (descriptors > 0 && s.limits.max_connections > share) {
    spdlog::warn("{}: HTTP connections limited to {} (half of ulimit -n {}) instead of {}", s.name,
                 share, descriptors, s.limits.max_connections);
    s.limits.max_connections = std::max<std::size_t>(share, 1);
    s.refusal = too_many_connections(s.limits.max_connections);
  }
  // A body's buffer doubles as it arrives and both buffers count while one is copied.
  const std::size_t budget = s.limits.max_bodies_in_flight_bytes;
  const std::size_t peak = peak_body_bytes(s.limits.max_body_bytes);
  if (budget > 0 && budget < peak)
    spdlog::warn(
        "{}: HTTP body budget of {} bytes is under the {} a body at the limit ({}) needs "
        "at its peak: such a body is refused 503 even alone",
        s.name, budget, peak, s.limits.max_body_bytes);
  int bound = -1;
  if (port == 0) {
    bound = s.engine.bind_to_any_port(host);
  } else if (s.engine.bind_to_port(host, port)) {
    bound = port;
  }
  if (bound < 0)
    return Error{"cannot listen for HTTP at " + host + ":" + std::to_string(port) + ": " +
                 bind_failure(host, port)};
  const int listener = s.engine.listening_socket();
  ::listen(listener, kBacklog);  // raises httplib's backlog of 5
  ::fcntl(listener, F_SETFL, ::fcntl(listener, F_GETFL) | O_NONBLOCK);  // accept until EAGAIN
  s.epoll = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
  if (!s.epoll) {
    UniqueFd(s.engine.release_listening_socket());
    return Error{ErrorCode::kIo, std::string("HTTP server: epoll: ") + std::strerror(errno)};
  }
  Result<EventFd> wake = EventFd::create();
  if (!wake) {
    UniqueFd(s.engine.release_listening_socket());
    return wrap_error("HTTP server: ", std::move(wake).error());
  }
  s.wake.emplace(std::move(wake).value());
  s.epoll_add(s.engine.listening_socket(), kListenerId, EPOLLIN);
  s.epoll_add(s.wake->fd(), kWakeId, EPOLLIN);
  s.body_threads = body_handler_threads(s.limits);
  s.busy_refusal = bodies_busy(s.body_threads);
  s.bodies_busy = 0;
  s.stopping = false;
  s.poller = std::thread([&s] { s.poll_loop(); });
  for (std::size_t i = 0; i < s.limits.handler_threads; ++i)
    s.handlers.emplace_back([&s] { s.handler_loop(); });
  return bound;
}

void Server::stop() {
  Impl& s = *impl_;
  if (!s.poller.joinable()) return;
  s.stopping = true;
  s.wake->signal();
  s.poller.join();
  UniqueFd(s.engine.release_listening_socket());
  {
    // Idle connections close now; busy ones when their request is answered.
    std::lock_guard lock(s.mutex);
    for (auto it = s.connections.begin(); it != s.connections.end();) {
      if (it->second->state != Connection::State::kBusy) {
        it = s.connections.erase(it);
      } else {
        ::shutdown(it->second->fd.get(), SHUT_RD);  // a request still arriving ends now
        ++it;
      }
    }
    s.ready_cv.notify_all();
  }
  // A client that does not read its answer must not hold stop(): after a grace, cut the rest.
  const auto grace_end = Clock::now() + kStopGrace;
  for (;;) {
    {
      std::lock_guard lock(s.mutex);
      if (s.connections.empty() || Clock::now() >= grace_end) {
        for (auto& [id, c] : s.connections) ::shutdown(c->fd.get(), SHUT_RDWR);
        break;
      }
    }
    std::this_thread::sleep_for(kSweepPeriod / 4);  // a poll of a few handler threads
  }
  for (auto& t : s.handlers) t.join();
  s.handlers.clear();
  std::lock_guard lock(s.mutex);
  s.connections.clear();
  s.ready.clear();
}

Counters Server::counters() const {
  const Impl& s = *impl_;
  Counters c;
  {
    std::lock_guard lock(s.mutex);
    c.connections_open = s.connections.size();
  }
  c.connections_refused = s.refused.load(std::memory_order_relaxed);
  c.requests_timed_out = s.timed_out.load(std::memory_order_relaxed);
  c.bodies_refused = s.gate.refused() + s.bodies_refused.load(std::memory_order_relaxed);
  c.headers_refused = s.headers_refused.load(std::memory_order_relaxed);
  c.body_bytes_in_flight = s.gate.in_flight();
  return c;
}

}  // namespace kvnode::httpd
