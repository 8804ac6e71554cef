// The fan-out executor: sends one request to each of several workers' REP sockets at once and
// collects the replies, each within a deadline. LMCache uses a REQ socket per worker without
// timeouts, so one dead worker hangs the call forever (defect D3). Here one thread owns a DEALER
// per worker; every request carries an id frame that REP echoes back ([id, "", payload] ->
// [id, "", reply]), so a reply that arrives after its deadline is recognised and never taken for
// the answer to a later request, and no socket ever needs recreating.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "kvnode/common/result.hpp"

namespace kvnode::controller {

struct FanOutTarget {
  std::string worker_key;  // identifies the worker's socket, e.g. "inst-A/0#3" (3 = generation)
  std::string endpoint;    // "tcp://ip:port"
  std::string payload;     // one encoded ControlMsg
};

// Called on the executor thread when a reply arrives after its deadline (index into the
// targets); lets the caller record that a timed-out move did finish after all.
using LateReplyFn = std::function<void(std::size_t index, std::string reply)>;

struct FanOutStats {
  std::uint64_t requests = 0;      // per-worker requests sent
  std::uint64_t timeouts = 0;      // per-worker requests that missed their deadline
  std::uint64_t late_replies = 0;  // replies that arrived after their deadline
  std::uint64_t open_sockets = 0;
  std::uint64_t dropped_replies = 0;  // replies with an unknown request id or a malformed shape
};

struct FanOutOptions {
  std::chrono::milliseconds late_reply_window{std::chrono::minutes(10)};  // how long to wait
  std::size_t max_late_pending = 10000;  // timed-out requests remembered for late replies
  // ZMQ_AFFINITY of the worker sockets: which of the context's I/O threads serve them (0: any),
  // so the controller keeps them off the thread that reads ingest.
  std::uint64_t io_affinity = 0;
  // ZMQ_MAXMSGSIZE of the worker sockets. Worker replies are a few hundred bytes; anyone can
  // register a "worker", so a bigger frame closes that connection (its request then fails at its
  // deadline) before anything is allocated for it.
  std::int64_t max_reply_bytes = std::int64_t{64} << 20;
};

class FanOut {
 public:
  FanOut(zmq::context_t& ctx, FanOutOptions options = {});
  ~FanOut();  // stops the thread; pending calls complete with "controller shutting down"
  FanOut(const FanOut&) = delete;
  FanOut& operator=(const FanOut&) = delete;

  // Sends every target's payload concurrently. The future becomes ready when each worker has
  // answered or the deadline has passed; results are in target order: the reply's bytes, or an
  // Error, such as ErrorCode::kDeadline "no reply from tcp://10.0.0.5:8500 within 30000 ms".
  std::future<std::vector<Result<std::string>>> call(std::vector<FanOutTarget> targets,
                                                     std::chrono::milliseconds deadline,
                                                     LateReplyFn on_late = {});

  // Closes the socket of a worker that left (deregistered, reaped or re-registered) and fails
  // the calls still waiting on it. Queued without waking the executor: it is taken within one
  // poll (100 ms at most) and always before a later call to that worker, which queues behind
  // it. A heartbeat from a moved worker then costs no thread wake-up.
  void forget(const std::string& worker_key);

  FanOutStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvnode::controller
