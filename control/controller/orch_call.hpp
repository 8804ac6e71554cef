// One clear/pin/compress/decompress/move fan-out from start to verdict, with its check_finish
// record: pending while it runs, then done or failed. A worker that missed the deadline may still
// answer; its late reply is judged with the others and updates the record, so an operator can
// see that a long move finished after all (D13).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kvnode/controller/fanout.hpp"
#include "kvnode/controller/metrics.hpp"
#include "orch_events.hpp"
#include "orch_outcome.hpp"

namespace kvnode::controller {

struct TokensCall {
  std::string event_id;
  std::string operation;     // "clear", "pin", ... (EventRecord::operation)
  std::string expected_tag;  // the reply each worker must send, e.g. "ClearWorkerRetMsg"
  std::vector<WorkerLabel> labels;
  std::vector<FanOutTarget> targets;  // same order as labels
};

// Blocks until every worker answered or the deadline passed.
Verdict run_tokens_call(FanOut& fanout, const std::shared_ptr<EventLog>& events, Metrics& metrics,
                        std::chrono::milliseconds deadline, TokensCall call);

EventRecord record_of(const std::string& operation, const Verdict& verdict);

}  // namespace kvnode::controller
