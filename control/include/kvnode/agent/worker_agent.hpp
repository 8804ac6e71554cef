// The worker agent: what LMCache's worker (lmcache/v1/cache_controller/worker.py) does for a node,
// over the same sockets and messages, without its defects. It registers with the controller and
// keeps trying (with backoff) until the controller answers; heartbeats by default and runs the
// commands that come back; reports admits and evicts in batches (at most 50 ops or 10 ms) with
// per-location sequence numbers from 0; serves the controller's control requests on its worker
// port (LMCache's REP port; a ROUTER here, so REQ and DEALER peers both get replies) and answers
// every one, an ErrorMsg for what it cannot do; de-registers on a clean stop. A request that
// times out recreates its socket, as LMCache does, and the caller gets an error to apply
// LMCache's fallback reply to.
//
// Threads: one serves the worker port, one runs moves (MoveWorkerMsg, seconds to minutes) one at
// a time in arrival order, one batches and pushes events, one registers and heartbeats. A move
// never holds up the worker port: health, clear and pin are answered while it runs, and its reply
// goes out when it ends. Beyond max_queued_moves waiting moves, a move is answered at once with
// an ErrorMsg saying the node is busy with N moves. report() and call() are thread-safe.
// The handlers run on the agent's threads: AgentHandlers::control on two at once (a move on the
// move thread, anything else on the port's thread), so it must be thread-safe (the node's is).
// Stopping: a running move finishes (its handler returns) and is answered before the destructor
// returns; moves still queued never start and are answered with an ErrorMsg.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "kvnode/common/result.hpp"
#include "kvnode/wire/messages.hpp"

namespace kvnode::agent {

struct AgentOptions {
  std::string instance_id;
  std::int64_t worker_id = 0;       // the TP rank
  std::string controller_pull_url;  // host:port, as LMCache configures it (no scheme)
  std::string controller_reply_url;
  std::string ip = "127.0.0.1";  // where the controller reaches this worker's REP port
  int worker_port = 0;           // REP port; 0 picks a free one (see WorkerAgent::port())
  std::optional<std::string> peer_init_url;  // the transfer plane; unset: never a P2P source
  // 0 disables. LMCache's default is off, which leaves a restarted controller blind; ours is on.
  std::chrono::milliseconds heartbeat_period{5000};
  std::chrono::milliseconds request_timeout{30000};  // LMCache's worker_socket_recv_timeout_ms
  std::chrono::milliseconds register_timeout{5000};  // one registration attempt, at most
  std::chrono::milliseconds register_backoff_first{100};
  std::chrono::milliseconds register_backoff_max{5000};
  std::size_t batch_size = 50;                  // kv_msg_batch_size
  std::chrono::milliseconds batch_timeout{10};  // kv_msg_batch_timeout
  // Full sync (protocol reference §3.8), LMCache's defaults.
  std::chrono::milliseconds full_sync_startup_delay{5000};  // random wait in [0, this)
  std::size_t full_sync_batch_size = 2000;
  int full_sync_start_tries = 3;
  std::chrono::milliseconds full_sync_retry_delay{1000};
  std::chrono::milliseconds full_sync_batch_interval{5};
  std::chrono::milliseconds full_sync_poll_interval{5000};  // the longest wait between polls
  int full_sync_max_polls = 60;  // gives up (unfreezes) after this many intervals
  int full_sync_max_resends = 3;
  // Moves that may wait behind the running one. LMCache's controller sends a worker one move at
  // a time; ours lets several callers move at once.
  std::size_t max_queued_moves = 8;
};

struct AgentHandlers {
  // A control request (Clear, Pin, Move, Compress, Decompress, Health, CheckFinish) -> its reply.
  // Unset, or throwing: the controller gets an ErrorMsg saying why. Called for a move on the
  // move thread while other requests are answered on the port's thread: thread-safe.
  std::function<wire::Msg(const wire::Msg& request)> control;
  // The chunk hashes held in LocalCPUBackend, least recently used first: what a full sync sends.
  // Unset: heartbeats asking for a full sync are logged and ignored.
  std::function<std::vector<std::int64_t>()> snapshot;
  // freeze(true) before a full sync snapshots (no stores, no events), freeze(false) after it,
  // whatever happened.
  std::function<void(bool)> freeze;
};

struct AgentCounters {
  std::uint64_t register_attempts = 0;
  std::uint64_t register_failures = 0;  // attempts unanswered, refused or answered wrongly
  std::string last_register_error;      // why the last attempt failed; empty once registered
  std::uint64_t heartbeats = 0;
  std::uint64_t heartbeat_failures = 0;
  std::uint64_t events_sent = 0;
  std::uint64_t events_dropped = 0;    // could not be queued to the controller (it learns of a gap)
  std::uint64_t control_requests = 0;  // answered
  std::uint64_t control_errors = 0;    // answered with an ErrorMsg
  std::uint64_t moves_running = 0;     // 0 or 1
  std::uint64_t moves_queued = 0;      // waiting behind it
  std::uint64_t moves_refused = 0;     // answered "busy": max_queued_moves were waiting
  std::uint64_t full_syncs_started = 0;
  std::uint64_t full_syncs_completed = 0;  // the controller let the worker unfreeze
  bool registered = false;
};

class WorkerAgent {
 public:
  // Binds the REP port, then registers in the background: start() does not wait for the
  // controller (a node may come up first).
  static Result<std::unique_ptr<WorkerAgent>> start(const AgentOptions& options,
                                                    AgentHandlers handlers);
  // Flushes queued events, sends DeRegisterMsg, stops the threads.
  ~WorkerAgent();
  WorkerAgent(const WorkerAgent&) = delete;
  WorkerAgent& operator=(const WorkerAgent&) = delete;

  int port() const;  // the bound REP port
  // Queues an admit or evict of `location` for the next batch.
  void report(const std::string& location, wire::OpType op, std::int64_t chunk_hash);
  // A request on the worker's DEALER (P2P lookup, full sync start/status): the reply, or an error
  // after the request timeout (the socket is then recreated).
  Result<wire::Msg> call(const wire::Msg& request);
  // True once the controller has answered a registration.
  bool registered() const;
  AgentCounters counters() const;

  class Impl;

 private:
  explicit WorkerAgent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvnode::agent
