#include "orch_outcome.hpp"

#include <type_traits>

#include "kvnode/wire/codec.hpp"

namespace kvnode::controller {

std::string describe(const WorkerLabel& label) {
  return "worker " + std::to_string(label.worker_id) + " of " + label.instance_id + " (" +
         label.endpoint + ")";
}

bool is_deadline_error(const Error& error) {
  return error.code == ErrorCode::kDeadline;
}

WorkerOutcome interpret_tokens_reply(const Result<std::string>& reply,
                                     std::string_view expected_tag,
                                     std::chrono::milliseconds deadline) {
  if (!reply.ok()) {
    if (is_deadline_error(reply.error()))
      return WorkerFailure{"no reply within " + std::to_string(deadline.count()) + " ms", true};
    return WorkerFailure{reply.error().message, false};
  }
  auto msg = wire::decode(*reply);
  if (!msg.ok()) return WorkerFailure{"undecodable reply: " + msg.error().message, false};
  // A worker's ErrorMsg carries the real cause; LMCache turns it into "Operation 'x' is not
  // supported." (D12), which helps nobody.
  if (const auto* err = std::get_if<wire::ErrorMsg>(&*msg)) return WorkerFailure{err->error, false};
  const std::string_view tag = wire::tag_of(*msg);
  if (tag != expected_tag)
    return WorkerFailure{
        "unexpected reply " + std::string(tag) + " (expected " + std::string(expected_tag) + ")",
        false};
  return std::visit(
      [](const auto& m) -> WorkerOutcome {
        if constexpr (requires { m.num_tokens; }) {
          return static_cast<std::int64_t>(m.num_tokens);
        } else {
          return WorkerFailure{"reply carries no num_tokens", false};  // unreachable by tag
        }
      },
      *msg);
}

std::int64_t interpret_health_reply(const Result<std::string>& reply) {
  if (!reply.ok()) return kHealthNoReply;
  auto msg = wire::decode(*reply);
  if (!msg.ok()) return kHealthUndecodable;
  if (const auto* ret = std::get_if<wire::HealthWorkerRetMsg>(&*msg)) return ret->error_code;
  if (std::holds_alternative<wire::ErrorMsg>(*msg)) return kHealthWorkerError;
  return kHealthUnexpectedReply;
}

Verdict judge(const std::vector<WorkerLabel>& labels, const std::vector<WorkerOutcome>& outcomes) {
  Verdict v;
  if (outcomes.empty()) {
    v.error = "no workers to call";
    v.http_status = 404;
    return v;
  }
  std::string failures;
  bool any_deadline = false;
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    if (const auto* f = std::get_if<WorkerFailure>(&outcomes[i])) {
      if (!failures.empty()) failures += "; ";
      failures += describe(labels[i]) + ": " + f->text;
      any_deadline = any_deadline || f->deadline;
    }
  }
  if (!failures.empty()) {
    v.error = std::move(failures);
    v.http_status = any_deadline ? 504 : 500;
    return v;
  }
  const std::int64_t first = std::get<std::int64_t>(outcomes.front());
  bool agree = true;
  for (const auto& o : outcomes) agree = agree && std::get<std::int64_t>(o) == first;
  if (!agree) {
    // Ranks of one instance hold the same chunks, so they should process the same prefix;
    // upstream asserts this (500 with an empty message). Say which rank said what instead.
    std::string text = "workers disagree on num_tokens: ";
    for (std::size_t i = 0; i < outcomes.size(); ++i) {
      if (i) text += ", ";
      text += "worker " + std::to_string(labels[i].worker_id) + ": " +
              std::to_string(std::get<std::int64_t>(outcomes[i]));
    }
    v.error = std::move(text);
    v.http_status = 500;
    return v;
  }
  v.ok = true;
  v.num_tokens = first;
  return v;
}

}  // namespace kvnode::controller
