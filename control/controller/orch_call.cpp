#include "orch_call.hpp"

#include <future>
#include <mutex>
#include <optional>

namespace kvnode::controller {

namespace {

// Shared between the caller and the late-reply callback, which FanOut may run after the call
// returned (even after the orchestrator is gone: the log is only weakly held).
struct CallState {
  std::mutex mutex;
  std::string event_id;
  std::string operation;
  std::string expected_tag;
  std::chrono::milliseconds deadline{0};
  std::vector<WorkerLabel> labels;
  // What each worker answered, counting late replies: the picture the record reflects.
  std::vector<std::optional<WorkerOutcome>> outcomes;
  bool finalized = false;
  EventLog::Ticket ticket = 0;
  std::weak_ptr<EventLog> events;

  // Re-judges once every outcome is known; called with mutex held.
  void publish_locked() {
    std::vector<WorkerOutcome> all;
    all.reserve(outcomes.size());
    for (const auto& o : outcomes) all.push_back(*o);
    if (auto log = events.lock())
      log->update(event_id, ticket, record_of(operation, judge(labels, all)));
  }

  void on_late(std::size_t index, std::string reply) {
    std::lock_guard lock(mutex);
    if (index >= outcomes.size()) return;
    outcomes[index] =
        interpret_tokens_reply(Result<std::string>(std::move(reply)), expected_tag, deadline);
    if (finalized) publish_locked();
  }
};

}  // namespace

EventRecord record_of(const std::string& operation, const Verdict& verdict) {
  EventRecord r;
  r.operation = operation;
  if (verdict.ok) {
    r.state = EventRecord::State::kDone;
    r.num_tokens = verdict.num_tokens;
  } else {
    r.state = EventRecord::State::kFailed;
    r.reason = verdict.error;
  }
  return r;
}

Verdict run_tokens_call(FanOut& fanout, const std::shared_ptr<EventLog>& events, Metrics& metrics,
                        std::chrono::milliseconds deadline, TokensCall call) {
  auto state = std::make_shared<CallState>();
  state->event_id = call.event_id;
  state->operation = call.operation;
  state->expected_tag = call.expected_tag;
  state->deadline = deadline;
  state->labels = call.labels;
  state->outcomes.resize(call.targets.size());
  state->events = events;
  EventRecord pending;
  pending.operation = call.operation;
  state->ticket = events->put(call.event_id, std::move(pending));

  const std::size_t n = call.targets.size();
  std::vector<Result<std::string>> replies;
  try {
    replies = fanout
                  .call(std::move(call.targets), deadline,
                        [state](std::size_t index, std::string reply) {
                          state->on_late(index, std::move(reply));
                        })
                  .get();
  } catch (const std::future_error&) {
    // The executor went away without answering (shutdown): treat as no replies.
  }
  while (replies.size() < n) replies.emplace_back(Error{"controller shutting down"});

  std::vector<WorkerOutcome> answered;
  answered.reserve(n);
  for (const auto& reply : replies) {
    if (!reply.ok() && is_deadline_error(reply.error()))
      metrics.fanout_timeouts.fetch_add(1, std::memory_order_relaxed);
    answered.push_back(interpret_tokens_reply(reply, call.expected_tag, deadline));
  }
  Verdict verdict = judge(call.labels, answered);

  std::lock_guard lock(state->mutex);
  // A late reply that slipped in before we got here is newer than the deadline error.
  for (std::size_t i = 0; i < n; ++i)
    if (!state->outcomes[i]) state->outcomes[i] = answered[i];
  state->finalized = true;
  state->publish_locked();
  return verdict;
}

}  // namespace kvnode::controller
