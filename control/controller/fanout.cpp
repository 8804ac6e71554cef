// The fan-out executor (fanout.hpp says why DEALERs and request ids). One thread owns every ZMQ
// socket, because ZMQ sockets are not thread-safe; call() and forget() hand it commands through a
// locked queue and wake it with an eventfd, which zmq::poll watches next to the DEALERs. An
// eventfd needs no socket shared between threads and no lock around a send, unlike an inproc pair.
#include "kvnode/controller/fanout.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <variant>

#include "thread_name.hpp"

namespace kvnode::controller {
namespace {

using Clock = std::chrono::steady_clock;
using Results = std::vector<Result<std::string>>;

// Requests queued per worker before sends fail at once. A hung worker fills its queue within a
// few calls' worth of traffic; failing fast beyond that beats piling up stale commands that a
// worker coming back would still execute (and a full queue that no call awaits any more is
// discarded: needs_new_socket()).
constexpr int kSendHwm = 256;
// Reconnect quickly to a worker that restarts, but back off (to 1 s) from one that stays down.
constexpr int kReconnectIvlMs = 100;
constexpr int kReconnectIvlMaxMs = 1000;
// ZMTP heartbeats drop a connection whose peer vanished without a TCP reset (host lost), so the
// DEALER reconnects and queues instead of writing into a dead kernel buffer.
constexpr int kHeartbeatIvlMs = 10'000;
constexpr int kHeartbeatTimeoutMs = 30'000;
// Upper bound on one poll, so late-reply bookkeeping runs even without traffic.
constexpr std::chrono::milliseconds kMaxPollWait{100};
// Replies read from one socket per wake-up, so one chatty worker cannot starve the others.
constexpr int kMaxRepliesPerWake = 1024;
constexpr std::size_t kIdSize = sizeof(std::uint64_t);
constexpr std::size_t kMaxInFlightTracked = 65536;  // request ids remembered per worker socket
// Longer deadlines (and late-reply windows) are cut to this, so "wait forever"
// (milliseconds::max()) cannot overflow the clock's nanosecond time_point.
constexpr std::chrono::milliseconds kLongestDeadline = std::chrono::hours(24 * 365);

// Owns a non-blocking eventfd: callers signal() from any thread; the executor polls and drains.
class WakeFd {
 public:
  WakeFd() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "fan-out eventfd");
  }
  ~WakeFd() { ::close(fd_); }
  WakeFd(const WakeFd&) = delete;
  WakeFd& operator=(const WakeFd&) = delete;

  int fd() const noexcept { return fd_; }
  // A failed write means the counter is saturated, i.e. a wake-up is already pending.
  void signal() noexcept {
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto written = ::write(fd_, &one, sizeof one);
  }
  // One read resets the counter.
  void drain() noexcept {
    std::uint64_t count = 0;
    [[maybe_unused]] const auto read = ::read(fd_, &count, sizeof count);
  }

 private:
  int fd_;
};

struct CallCmd {
  std::vector<FanOutTarget> targets;
  Clock::time_point deadline;
  std::chrono::milliseconds budget;  // the caller's deadline, for error messages
  LateReplyFn on_late;
  std::promise<Results> promise;
};
struct ForgetCmd {
  std::string worker_key;
};
using Command = std::variant<CallCmd, ForgetCmd>;

void fail_call(CallCmd& cmd, const std::string& why) {
  Results results;
  results.reserve(cmd.targets.size());
  for (std::size_t i = 0; i < cmd.targets.size(); ++i) results.emplace_back(make_error(why));
  cmd.promise.set_value(std::move(results));
}

// What callers and the executor share: the command queue and the counters.
struct Shared {
  std::mutex mutex;
  std::deque<Command> queue;  // guarded by mutex
  bool stopping = false;      // guarded by mutex; once set, call() fails at once
  std::string stop_reason;    // guarded by mutex
  WakeFd wake;
  std::atomic<std::uint64_t> requests{0};
  std::atomic<std::uint64_t> timeouts{0};
  std::atomic<std::uint64_t> late_replies{0};
  std::atomic<std::uint64_t> open_sockets{0};
  std::atomic<std::uint64_t> dropped_replies{0};
};

// A reply frame set [id, "", body]; id 0 (never issued) marks a malformed one.
struct Reply {
  std::uint64_t id = 0;
  std::string body;
};

// Reads one whole message; nullopt when none is waiting.
std::optional<Reply> receive(zmq::socket_t& socket) {
  zmq::message_t frame;
  if (!socket.recv(frame, zmq::recv_flags::dontwait)) return std::nullopt;
  std::array<zmq::message_t, 3> parts;
  std::size_t count = 0;
  for (;;) {
    const bool more = frame.more();
    if (count < parts.size()) parts[count] = std::move(frame);
    ++count;
    if (!more) break;
    // The remaining frames of a message arrive together with its first one.
    if (!socket.recv(frame, zmq::recv_flags::dontwait)) break;
  }
  Reply reply;
  if (count != 3 || parts[0].size() != kIdSize || parts[1].size() != 0) return reply;
  std::memcpy(&reply.id, parts[0].data(), kIdSize);
  reply.body = parts[2].to_string();
  return reply;
}

// Everything the executor thread owns. Destroying it closes the sockets on that thread.
class Executor {
 public:
  Executor(zmq::context_t& ctx, const FanOutOptions& options, Shared& shared)
      : ctx_(ctx),
        late_window_(
            std::clamp(options.late_reply_window, std::chrono::milliseconds{0}, kLongestDeadline)),
        max_late_(options.max_late_pending),
        io_affinity_(options.io_affinity),
        max_reply_bytes_(options.max_reply_bytes),
        shared_(shared) {}

  void run() {
    std::string why = "controller shutting down";
    try {
      loop();
    } catch (const std::exception& e) {
      why = std::string("fan-out executor failed: ") + e.what();
    }
    fail_all(why);
  }

 private:
  struct Conn {
    zmq::socket_t socket;
    std::string endpoint;
    std::uint64_t serial;  // unique per socket ever opened, unlike its address
    // Ids of the requests sent and not yet known to be read by the worker. REP answers in order,
    // so a reply to id k means every earlier request on this socket left the queue, answered or
    // lost: the count cannot creep up with requests that are never answered.
    std::deque<std::uint64_t> in_flight;
  };
  struct Call {
    std::vector<std::optional<Result<std::string>>> results;
    std::vector<std::uint64_t> request_ids;  // 0 once the slot is settled
    std::vector<std::string> endpoints;
    std::size_t missing = 0;
    Clock::time_point deadline;
    std::chrono::milliseconds budget{0};
    std::shared_ptr<const LateReplyFn> on_late;  // shared with late_ entries; null when none
    std::promise<Results> promise;
  };
  struct Pending {
    std::uint64_t call_id;
    std::size_t index;
    const Conn* conn;  // a reply counts only on the socket its request left by
  };
  struct Late {
    std::shared_ptr<const LateReplyFn> on_late;
    std::size_t index;
    std::uint64_t conn_serial;  // only the socket the request left by may answer it
  };
  struct LateOrder {
    Clock::time_point expiry;
    std::uint64_t request_id;
  };

  void loop() {
    for (;;) {
      std::deque<Command> batch;
      {
        std::lock_guard lock(shared_.mutex);
        if (shared_.stopping) return;
        batch.swap(shared_.queue);
      }
      for (auto& cmd : batch) {
        if (auto* call = std::get_if<CallCmd>(&cmd)) {
          start(std::move(*call));
        } else {
          const auto& key = std::get<ForgetCmd>(cmd).worker_key;
          drop(key, "worker " + key + " was forgotten before it replied");
        }
      }
      const auto now = Clock::now();
      expire_calls(now);
      expire_late(now);
      poll_once();
    }
  }

  void start(CallCmd cmd) {
    const auto call_id = next_call_id_++;
    const auto n = cmd.targets.size();
    // Registered before sending: a send may settle earlier slots of this very call (drop()).
    Call& call = calls_[call_id];
    call.results.resize(n);
    call.request_ids.assign(n, 0);
    call.endpoints.reserve(n);
    for (const auto& target : cmd.targets) call.endpoints.push_back(target.endpoint);
    call.missing = n;
    call.deadline = cmd.deadline;
    call.budget = cmd.budget;
    if (cmd.on_late) call.on_late = std::make_shared<const LateReplyFn>(std::move(cmd.on_late));
    call.promise = std::move(cmd.promise);
    deadlines_.emplace(call.deadline, call_id);
    for (std::size_t i = 0; i < n; ++i) {
      auto sent = send(cmd.targets[i], call_id, i);
      // The call cannot complete while slot i is open, so `call` is still valid here; settling
      // the last open slot completes it, and the loop ends there.
      if (sent) {
        call.request_ids[i] = *sent;
      } else {
        settle(call_id, i, std::move(sent).error());
      }
    }
  }

  // Sends [id, "", payload] without blocking; the id on success.
  Result<std::uint64_t> send(const FanOutTarget& target, std::uint64_t call_id, std::size_t index) {
    auto conn = connection(target.worker_key, target.endpoint);
    if (!conn) return std::move(conn).error();
    const auto id = next_request_id_++;
    try {
      bool queued = try_send(**conn, id, target.payload);
      if (!queued) {
        // Reading ZMQ_EVENTS processes the commands that tell the writer what its pipe has sent.
        (void)(*conn)->socket.get(zmq::sockopt::events);
        queued = try_send(**conn, id, target.payload);
      }
      if (!queued) {
        if (!needs_new_socket(**conn)) {
          return make_error("send queue to " + target.endpoint + " is full (" +
                            std::to_string(kSendHwm) + " requests waiting)");
        }
        // Only the no-pipe case can have requests pending; they fail with this reason.
        drop(target.worker_key, "connection to " + target.endpoint +
                                    " closed by a protocol error (e.g. a reply over " +
                                    std::to_string(max_reply_bytes_) + " bytes)");
        conn = connection(target.worker_key, target.endpoint);
        if (!conn) return std::move(conn).error();
        if (!try_send(**conn, id, target.payload)) {
          return make_error("cannot queue a request to " + target.endpoint);
        }
      }
    } catch (const zmq::error_t& e) {
      // A half-sent message would corrupt the next one, so the socket goes.
      const std::string why = "cannot send to " + target.endpoint + ": " + e.what();
      drop(target.worker_key, why);
      return make_error(why);
    }
    auto& in_flight = (*conn)->in_flight;
    in_flight.push_back(id);  // ids only grow, so the deque stays sorted
    // A worker that reads and never answers would grow it forever; the oldest go, and since the
    // bound is far above kSendHwm / 2 the count still never looks smaller than the queue.
    if (in_flight.size() > kMaxInFlightTracked) in_flight.pop_front();
    pending_.emplace(id, Pending{call_id, index, *conn});
    shared_.requests.fetch_add(1, std::memory_order_relaxed);
    return id;
  }

  // Whether a socket that refused a request should be replaced rather than called full. The
  // queue holds only unanswered requests, and ZMQ's writer learns what left it in steps of half the
  // HWM, so with at most kSendHwm / 2 unanswered the queue cannot look full: the connection has no
  // pipe. ZMQ ends a connecting socket's pipe for good after a protocol error (a reply over
  // max_reply_bytes, a peer that is not ZMTP); a new socket reconnects. A queue full of requests
  // nobody waits for any more is replaced too: its commands are stale, and a pipe that died with
  // them in it would look full forever. Only a refused send asks, so the scan of pending_ stays off
  // the common path.
  bool needs_new_socket(const Conn& c) const {
    if (c.in_flight.size() <= static_cast<std::size_t>(kSendHwm / 2)) return true;
    return std::none_of(pending_.begin(), pending_.end(),
                        [&c](const auto& entry) { return entry.second.conn == &c; });
  }

  // False when ZMQ would block; once the first frame is queued, ZMQ accepts the rest.
  static bool try_send(Conn& c, std::uint64_t id, const std::string& payload) {
    if (!c.socket.send(zmq::const_buffer(&id, kIdSize),
                       zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
      return false;
    }
    (void)c.socket.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
    (void)c.socket.send(zmq::buffer(payload), zmq::send_flags::none);
    return true;
  }

  // The worker's DEALER, created and connected on first use.
  Result<Conn*> connection(const std::string& key, const std::string& endpoint) {
    if (auto it = conns_.find(key); it != conns_.end()) {
      if (it->second.endpoint == endpoint) return &it->second;
      // Replies to requests in flight would come back on the old connection only.
      drop(key, "worker " + key + " moved from " + it->second.endpoint + " to " + endpoint);
    }
    try {
      zmq::socket_t socket(ctx_, zmq::socket_type::dealer);
      socket.set(zmq::sockopt::linger, 0);
      if (io_affinity_) socket.set(zmq::sockopt::affinity, io_affinity_);
      socket.set(zmq::sockopt::maxmsgsize, max_reply_bytes_);
      socket.set(zmq::sockopt::sndhwm, kSendHwm);
      socket.set(zmq::sockopt::reconnect_ivl, kReconnectIvlMs);
      socket.set(zmq::sockopt::reconnect_ivl_max, kReconnectIvlMaxMs);
      socket.set(zmq::sockopt::heartbeat_ivl, kHeartbeatIvlMs);
      socket.set(zmq::sockopt::heartbeat_timeout, kHeartbeatTimeoutMs);
      socket.connect(endpoint);  // no ZMQ_IMMEDIATE: requests queue until the worker is up
      auto [it, inserted] =
          conns_.emplace(key, Conn{std::move(socket), endpoint, next_conn_serial_++, {}});
      poll_dirty_ = true;
      shared_.open_sockets.store(conns_.size(), std::memory_order_relaxed);
      return &it->second;
    } catch (const zmq::error_t& e) {
      return make_error("cannot connect to " + endpoint + ": " + e.what());
    }
  }

  // Closes a worker's socket; its requests can never be answered now, so they fail at once.
  void drop(const std::string& key, const std::string& why) {
    const auto it = conns_.find(key);
    if (it == conns_.end()) return;
    const Conn* conn = &it->second;
    for (auto p = pending_.begin(); p != pending_.end();) {
      if (p->second.conn != conn) {
        ++p;
        continue;
      }
      const auto pending = p->second;
      p = pending_.erase(p);
      settle(pending.call_id, pending.index, make_error(why));
    }
    conns_.erase(it);
    poll_dirty_ = true;
    shared_.open_sockets.store(conns_.size(), std::memory_order_relaxed);
  }

  void settle(std::uint64_t call_id, std::size_t index, Result<std::string> result) {
    const auto it = calls_.find(call_id);
    if (it == calls_.end()) return;
    Call& call = it->second;
    call.results[index] = std::move(result);
    call.request_ids[index] = 0;
    if (--call.missing == 0) complete(it);
  }

  void complete(std::unordered_map<std::uint64_t, Call>::iterator it) {
    Call& call = it->second;
    Results results;
    results.reserve(call.results.size());
    for (auto& r : call.results) results.push_back(std::move(*r));
    deadlines_.erase({call.deadline, it->first});
    call.promise.set_value(std::move(results));
    calls_.erase(it);
  }

  void expire_calls(Clock::time_point now) {
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      const auto it = calls_.find(deadlines_.begin()->second);
      Call& call = it->second;
      for (std::size_t i = 0; i < call.request_ids.size(); ++i) {
        const auto id = call.request_ids[i];
        if (id == 0) continue;
        const auto p = pending_.find(id);
        remember_late(id, call.on_late, i, p->second.conn->serial, now);
        pending_.erase(p);
        shared_.timeouts.fetch_add(1, std::memory_order_relaxed);
        call.results[i] = make_error("no reply from " + call.endpoints[i] + " within " +
                                     std::to_string(call.budget.count()) + " ms");
      }
      call.missing = 0;
      complete(it);
    }
  }

  void remember_late(std::uint64_t id, const std::shared_ptr<const LateReplyFn>& on_late,
                     std::size_t index, std::uint64_t conn_serial, Clock::time_point now) {
    late_.emplace(id, Late{on_late, index, conn_serial});
    late_order_.push_back({now + late_window_, id});
    while (late_order_.size() > max_late_) forget_oldest_late();
  }

  // late_order_ is in expiry order, since every entry waits the same window.
  void expire_late(Clock::time_point now) {
    while (!late_order_.empty() && late_order_.front().expiry <= now) forget_oldest_late();
  }

  void forget_oldest_late() {
    late_.erase(late_order_.front().request_id);
    late_order_.pop_front();
  }

  void on_reply(Conn& conn, Reply reply) {
    // Only an id sent on this socket says how far the worker has read; another is ignored.
    auto& in_flight = conn.in_flight;
    if (std::binary_search(in_flight.begin(), in_flight.end(), reply.id)) {
      while (!in_flight.empty() && in_flight.front() <= reply.id) in_flight.pop_front();
    }
    if (auto p = pending_.find(reply.id); p != pending_.end() && p->second.conn == &conn) {
      const auto pending = p->second;
      pending_.erase(p);
      settle(pending.call_id, pending.index, std::move(reply.body));
      return;
    }
    if (auto l = late_.find(reply.id); l != late_.end() && l->second.conn_serial == conn.serial) {
      const auto late = std::move(l->second);
      late_.erase(l);
      shared_.late_replies.fetch_add(1, std::memory_order_relaxed);
      if (late.on_late) notify_late(*late.on_late, late.index, std::move(reply.body));
      return;
    }
    shared_.dropped_replies.fetch_add(1, std::memory_order_relaxed);
  }

  // The callback is the caller's code; its failure must not take the executor down.
  static void notify_late(const LateReplyFn& fn, std::size_t index, std::string body) noexcept {
    try {
      fn(index, std::move(body));
    } catch (...) {
    }
  }

  void poll_once() {
    if (poll_dirty_) rebuild_poll_items();
    try {
      zmq::poll(items_.data(), items_.size(), poll_wait());
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) return;
      throw;
    }
    if (items_[0].revents & ZMQ_POLLIN) shared_.wake.drain();
    for (std::size_t i = 1; i < items_.size(); ++i) {
      if (!(items_[i].revents & ZMQ_POLLIN)) continue;
      Conn& conn = *item_conns_[i - 1];
      for (int n = 0; n < kMaxRepliesPerWake; ++n) {
        auto reply = receive(conn.socket);
        if (!reply) break;
        on_reply(conn, std::move(*reply));
      }
    }
  }

  // Item 0 is the wake-up eventfd, item i the DEALER item_conns_[i - 1].
  void rebuild_poll_items() {
    items_.clear();
    item_conns_.clear();
    items_.push_back({nullptr, shared_.wake.fd(), ZMQ_POLLIN, 0});
    for (auto& [key, conn] : conns_) {
      items_.push_back({conn.socket.handle(), 0, ZMQ_POLLIN, 0});
      item_conns_.push_back(&conn);
    }
    poll_dirty_ = false;
  }

  std::chrono::milliseconds poll_wait() const {
    if (deadlines_.empty()) return kMaxPollWait;
    // Round up: waking just before a deadline would only spin until it passes.
    const auto until =
        std::chrono::ceil<std::chrono::milliseconds>(deadlines_.begin()->first - Clock::now());
    return std::clamp(until, std::chrono::milliseconds{0}, kMaxPollWait);
  }

  // Refuses further calls and completes every outstanding one with `why`.
  void fail_all(const std::string& why) {
    std::deque<Command> queued;
    {
      std::lock_guard lock(shared_.mutex);
      shared_.stopping = true;
      shared_.stop_reason = why;
      queued.swap(shared_.queue);
    }
    for (auto& cmd : queued) {
      if (auto* call = std::get_if<CallCmd>(&cmd)) fail_call(*call, why);
    }
    for (auto& [id, call] : calls_) {
      Results results;
      results.reserve(call.results.size());
      for (auto& r : call.results) results.push_back(r ? std::move(*r) : make_error(why));
      call.promise.set_value(std::move(results));
    }
    calls_.clear();
    deadlines_.clear();
    pending_.clear();
  }

  zmq::context_t& ctx_;
  const std::chrono::milliseconds late_window_;
  const std::size_t max_late_;
  const std::uint64_t io_affinity_;
  const std::int64_t max_reply_bytes_;
  Shared& shared_;
  std::uint64_t next_call_id_ = 1;
  std::uint64_t next_conn_serial_ = 1;
  std::uint64_t next_request_id_ = 1;            // 0 marks a malformed reply, so ids start at 1
  std::unordered_map<std::string, Conn> conns_;  // node-based: Conn addresses stay valid
  std::unordered_map<std::uint64_t, Call> calls_;
  std::set<std::pair<Clock::time_point, std::uint64_t>> deadlines_;  // (deadline, call id)
  std::unordered_map<std::uint64_t, Pending> pending_;               // by request id
  std::unordered_map<std::uint64_t, Late> late_;                     // by request id
  std::deque<LateOrder> late_order_;  // may name ids already answered; bounded all the same
  std::vector<zmq_pollitem_t> items_;
  std::vector<Conn*> item_conns_;
  bool poll_dirty_ = true;
};

}  // namespace

struct FanOut::Impl {
  Impl(zmq::context_t& ctx, const FanOutOptions& options)
      : thread([this, &ctx, options] {
          name_this_thread("kvc/fanout");
          Executor(ctx, options, shared).run();
        }) {}

  ~Impl() {
    {
      std::lock_guard lock(shared.mutex);
      shared.stopping = true;
      if (shared.stop_reason.empty()) shared.stop_reason = "controller shutting down";
    }
    shared.wake.signal();
    thread.join();
  }

  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  Shared shared;
  std::thread thread;  // declared last: starts once `shared` exists
};

FanOut::FanOut(zmq::context_t& ctx, FanOutOptions options)
    : impl_(std::make_unique<Impl>(ctx, options)) {}

FanOut::~FanOut() = default;

std::future<Results> FanOut::call(std::vector<FanOutTarget> targets,
                                  std::chrono::milliseconds deadline, LateReplyFn on_late) {
  const auto wait = std::clamp(deadline, std::chrono::milliseconds{0}, kLongestDeadline);
  CallCmd cmd{std::move(targets), Clock::now() + wait, deadline, std::move(on_late), {}};
  auto future = cmd.promise.get_future();
  if (cmd.targets.empty()) {
    cmd.promise.set_value({});
    return future;
  }
  std::string refused;
  {
    std::lock_guard lock(impl_->shared.mutex);
    if (!impl_->shared.stopping) {
      impl_->shared.queue.emplace_back(std::move(cmd));
      impl_->shared.wake.signal();
      return future;
    }
    refused = impl_->shared.stop_reason;
  }
  fail_call(cmd, refused);
  return future;
}

void FanOut::forget(const std::string& worker_key) {
  std::lock_guard lock(impl_->shared.mutex);
  if (impl_->shared.stopping) return;
  impl_->shared.queue.emplace_back(ForgetCmd{worker_key});
  impl_->shared.wake.signal();
}

FanOutStats FanOut::stats() const {
  const auto& s = impl_->shared;
  FanOutStats out;
  out.requests = s.requests.load(std::memory_order_relaxed);
  out.timeouts = s.timeouts.load(std::memory_order_relaxed);
  out.late_replies = s.late_replies.load(std::memory_order_relaxed);
  out.open_sockets = s.open_sockets.load(std::memory_order_relaxed);
  out.dropped_replies = s.dropped_replies.load(std::memory_order_relaxed);
  return out;
}

}  // namespace kvnode::controller
