// The fan-out executor's insides, private to control/controller: what callers and the executor
// thread share (Shared: the command queue, the wake-up eventfd, the counters) and the executor
// itself, which owns every ZMQ socket (ZMQ sockets are not thread-safe). fanout.cpp is the
// callers' side (FanOut); fanout_requests.cpp sends requests and settles calls;
// fanout_replies.cpp reads replies, enforces deadlines and keeps timed-out requests for late
// replies.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>
#include <zmq.hpp>

#include "kvnode/common/result.hpp"
#include "kvnode/common/unique_fd.hpp"
#include "kvnode/controller/fanout.hpp"

namespace kvnode::controller::fanout_detail {

using Clock = std::chrono::steady_clock;
using Results = std::vector<Result<std::string>>;

// Requests queued per worker before sends fail at once. A hung worker fills its queue within a
// few calls' worth of traffic; failing fast beyond that beats piling up stale commands that a
// worker coming back would still execute (and a full queue that no call awaits any more is
// discarded: needs_new_socket()).
inline constexpr int kSendHwm = 256;
// Reconnect quickly to a worker that restarts, but back off (to 1 s) from one that stays down.
inline constexpr int kReconnectIvlMs = 100;
inline constexpr int kReconnectIvlMaxMs = 1000;
// ZMTP heartbeats drop a connection whose peer vanished without a TCP reset (host lost), so the
// DEALER reconnects and queues instead of writing into a dead kernel buffer.
inline constexpr int kHeartbeatIvlMs = 10'000;
inline constexpr int kHeartbeatTimeoutMs = 30'000;
// Upper bound on one poll, so late-reply bookkeeping runs even without traffic.
inline constexpr std::chrono::milliseconds kMaxPollWait{100};
// Replies read from one socket per wake-up, so one chatty worker cannot starve the others.
inline constexpr int kMaxRepliesPerWake = 1024;
inline constexpr std::size_t kIdSize = sizeof(std::uint64_t);
// Request ids remembered per worker socket.
inline constexpr std::size_t kMaxInFlightTracked = 65536;
// Longer deadlines (and late-reply windows) are cut to this, so "wait forever"
// (milliseconds::max()) cannot overflow the clock's nanosecond time_point.
inline constexpr std::chrono::milliseconds kLongestDeadline = std::chrono::hours(24 * 365);

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

// Completes a call that never reached the executor: every target fails with `why`.
void fail_call(CallCmd& cmd, const std::string& why);

// What callers and the executor share: the command queue and the counters.
struct Shared {
  Shared();  // throws when no eventfd can be made

  std::mutex mutex;
  std::deque<Command> queue;  // guarded by mutex
  bool stopping = false;      // guarded by mutex; once set, call() fails at once
  std::string stop_reason;    // guarded by mutex
  EventFd wake;               // the executor polls it; call() and forget() signal it
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
std::optional<Reply> receive(zmq::socket_t& socket);

// Everything the executor thread owns. Destroying it closes the sockets on that thread.
class Executor {
 public:
  Executor(zmq::context_t& ctx, const FanOutOptions& options, Shared& shared);
  // Serves commands until the callers stop it; then fails every call still open.
  void run();

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

  // Sending and settling (fanout_requests.cpp).
  void loop();
  void start(CallCmd cmd);
  Result<std::uint64_t> send(const FanOutTarget& target, std::uint64_t call_id, std::size_t index);
  bool needs_new_socket(const Conn& c) const;
  static bool try_send(Conn& c, std::uint64_t id, const std::string& payload);
  Result<Conn*> connection(const std::string& key, const std::string& endpoint);
  void drop(const std::string& key, const std::string& why);
  void settle(std::uint64_t call_id, std::size_t index, Result<std::string> result);
  void complete(std::unordered_map<std::uint64_t, Call>::iterator it);
  void fail_all(const std::string& why);

  // Replies, deadlines and late replies (fanout_replies.cpp).
  void expire_calls(Clock::time_point now);
  void remember_late(std::uint64_t id, const std::shared_ptr<const LateReplyFn>& on_late,
                     std::size_t index, std::uint64_t conn_serial, Clock::time_point now);
  void expire_late(Clock::time_point now);
  void forget_oldest_late();
  void on_reply(Conn& conn, Reply reply);
  static void notify_late(const LateReplyFn& fn, std::size_t index, std::string body) noexcept;
  void poll_once();
  void rebuild_poll_items();
  std::chrono::milliseconds poll_wait() const;

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

}  // namespace kvnode::controller::fanout_detail
