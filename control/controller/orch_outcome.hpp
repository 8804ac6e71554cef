// How the orchestrator reads the workers' answers to a fan-out: each answer becomes a token count
// or a failure naming the worker, and the answers of one call are judged together (every worker
// must answer the expected *WorkerRetMsg and all must agree on num_tokens, D12).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kvnode/common/result.hpp"

namespace kvnode::controller {

// Who a fan-out target is, for error texts.
struct WorkerLabel {
  std::string instance_id;
  std::int64_t worker_id = 0;
  std::string endpoint;
};
// "worker 1 of inst-A (tcp://127.0.0.1:5555)"
std::string describe(const WorkerLabel& label);

struct WorkerFailure {
  std::string text;       // without the worker's name
  bool deadline = false;  // no reply within the deadline (HTTP 504 rather than 500)
};
using WorkerOutcome = std::variant<std::int64_t, WorkerFailure>;

// One worker's answer to clear/pin/compress/decompress/move: num_tokens of a reply tagged
// `expected_tag` (e.g. "ClearWorkerRetMsg"), else a failure: the worker's ErrorMsg text, an
// unexpected reply type, an undecodable reply, or the fan-out's error (a missed deadline).
WorkerOutcome interpret_tokens_reply(const Result<std::string>& reply,
                                     std::string_view expected_tag,
                                     std::chrono::milliseconds deadline);

// Health codes beyond the worker's own error_code (0 healthy, -1 memcheck failed). LMCache
// defines the first three; it has no deadline, so -1004 is kvnode's: no reply in time (or none
// at all, e.g. while the controller shuts down).
inline constexpr std::int64_t kHealthWorkerError = -1001;
inline constexpr std::int64_t kHealthUnexpectedReply = -1002;
inline constexpr std::int64_t kHealthUndecodable = -1003;
inline constexpr std::int64_t kHealthNoReply = -1004;
std::int64_t interpret_health_reply(const Result<std::string>& reply);

// The fan-out error means the deadline passed (FanOut gives it ErrorCode::kDeadline).
bool is_deadline_error(const Error& error);

struct Verdict {
  bool ok = false;
  std::int64_t num_tokens = 0;  // when ok: the common value
  std::string error;            // when not ok: names each failing worker
  int http_status = 200;        // 500, or 504 when any failure is a missed deadline
};
// labels[i] answered outcomes[i]; no workers at all is an error too (as upstream, D12).
Verdict judge(const std::vector<WorkerLabel>& labels, const std::vector<WorkerOutcome>& outcomes);

}  // namespace kvnode::controller
