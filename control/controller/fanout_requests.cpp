// The fan-out executor, sending side: commands in, requests out on each worker's DEALER, and
// calls settled slot by slot (a reply, a failed send, a dropped socket) until each completes.
#include <algorithm>
#include <exception>

#include "fanout_executor.hpp"

namespace kvnode::controller::fanout_detail {

Executor::Executor(zmq::context_t& ctx, const FanOutOptions& options, Shared& shared)
    : ctx_(ctx),
      late_window_(
          std::clamp(options.late_reply_window, std::chrono::milliseconds{0}, kLongestDeadline)),
      max_late_(options.max_late_pending),
      io_affinity_(options.io_affinity),
      max_reply_bytes_(options.max_reply_bytes),
      shared_(shared) {}

void Executor::run() {
  std::string why = "controller shutting down";
  try {
    loop();
  } catch (const std::exception& e) {
    why = std::string("fan-out executor failed: ") + e.what();
  }
  fail_all(why);
}

void Executor::loop() {
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

void Executor::start(CallCmd cmd) {
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
Result<std::uint64_t> Executor::send(const FanOutTarget& target, std::uint64_t call_id,
                                     std::size_t index) {
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
bool Executor::needs_new_socket(const Conn& c) const {
  if (c.in_flight.size() <= static_cast<std::size_t>(kSendHwm / 2)) return true;
  return std::none_of(pending_.begin(), pending_.end(),
                      [&c](const auto& entry) { return entry.second.conn == &c; });
}

// False when ZMQ would block; once the first frame is queued, ZMQ accepts the rest.
bool Executor::try_send(Conn& c, std::uint64_t id, const std::string& payload) {
  if (!c.socket.send(zmq::const_buffer(&id, kIdSize),
                     zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
    return false;
  }
  (void)c.socket.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
  (void)c.socket.send(zmq::buffer(payload), zmq::send_flags::none);
  return true;
}

// The worker's DEALER, created and connected on first use.
Result<Executor::Conn*> Executor::connection(const std::string& key, const std::string& endpoint) {
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
void Executor::drop(const std::string& key, const std::string& why) {
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

void Executor::settle(std::uint64_t call_id, std::size_t index, Result<std::string> result) {
  const auto it = calls_.find(call_id);
  if (it == calls_.end()) return;
  Call& call = it->second;
  call.results[index] = std::move(result);
  call.request_ids[index] = 0;
  if (--call.missing == 0) complete(it);
}

void Executor::complete(std::unordered_map<std::uint64_t, Call>::iterator it) {
  Call& call = it->second;
  Results results;
  results.reserve(call.results.size());
  for (auto& r : call.results) results.push_back(std::move(*r));
  deadlines_.erase({call.deadline, it->first});
  call.promise.set_value(std::move(results));
  calls_.erase(it);
}

// Refuses further calls and completes every outstanding one with `why`.
void Executor::fail_all(const std::string& why) {
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

}  // namespace kvnode::controller::fanout_detail
