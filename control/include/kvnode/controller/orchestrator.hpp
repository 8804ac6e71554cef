// The orchestrator calls (protocol reference §2.4, §3.6, §3.9): lookup, query_instance,
// query_worker_info answered from the registry; clear, pin, compress, decompress, move and health
// fanned out to the instance's workers with a deadline. Serves the HTTP API and OrchMsg frames on
// the PULL socket alike. Unlike LMCache: a worker that fails or misses the deadline yields an
// error naming that worker in bounded time (D3); ranks that disagree on num_tokens are reported,
// not asserted (D12); every call is recorded so CheckFinishMsg / POST /check_finish can report
// it by event_id (D13), including a move that finished after its deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "kvnode/controller/fanout.hpp"
#include "kvnode/controller/guarded.hpp"
#include "kvnode/controller/metrics.hpp"
#include "kvnode/controller/registry.hpp"
#include "kvnode/keys/chunk_hash.hpp"
#include "kvnode/wire/messages.hpp"

namespace kvnode::controller {

struct OrchestratorOptions {
  std::chrono::milliseconds fanout_deadline{30000};
  keys::ChunkHashConfig hashing;
  std::size_t max_events = 100000;  // event records kept for check_finish, oldest dropped first
};

// What check_finish reports about an event.
struct EventRecord {
  enum class State { kPending, kDone, kFailed };
  State state = State::kPending;
  std::string operation;  // "clear", "pin", "compress", "decompress", "move", "health"
  std::int64_t num_tokens = 0;
  std::string reason;  // why it failed
};
std::string_view to_string(EventRecord::State state);  // "pending", "done", "failed"

struct OrchReply {
  wire::Msg reply;  // the *RetMsg, or ErrorMsg
  int http_status =
      200;  // 400 bad input, 404 unknown instance/event, 500 worker failure, 504 deadline
  std::optional<EventRecord> event;  // for CheckFinishMsg: the record found
};

class Orchestrator {
 public:
  Orchestrator(Guarded<Registry>& registry, FanOut& fanout, Metrics& metrics,
               OrchestratorOptions options);
  ~Orchestrator();

  // Handles one orchestrator message; anything else gets ErrorMsg with status 400. Thread-safe.
  OrchReply handle(const wire::Msg& request);
  static bool is_orchestrator_msg(const wire::Msg& msg);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvnode::controller
