// Controller -> worker control messages over REQ -> REP and their replies (protocol
// reference §2.3). Each reply carries num_tokens (HealthWorkerRetMsg: error_code).
// Field order in fields() is the wire order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "kvnode/wire/types.hpp"

namespace kvnode::wire {

// ---- Controller -> worker over REQ -> REP (ControlMsg), and their replies ----

struct ClearWorkerMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "ClearWorkerMsg";
  std::string worker_event_id;
  std::string location;

  static constexpr auto fields() {
    return std::tuple{required("worker_event_id", &ClearWorkerMsg::worker_event_id),
                      required("location", &ClearWorkerMsg::location)};
  }
  friend bool operator==(const ClearWorkerMsg&, const ClearWorkerMsg&) = default;
};

// A worker's reply to a control request: the tokens it processed.
template <TagName kName>
struct WorkerTokensRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = kName.view();
  std::int64_t num_tokens = 0;

  static constexpr auto fields() {
    return std::tuple{required("num_tokens", &WorkerTokensRetMsg::num_tokens)};
  }
  friend bool operator==(const WorkerTokensRetMsg&, const WorkerTokensRetMsg&) = default;
};
using ClearWorkerRetMsg = WorkerTokensRetMsg<"ClearWorkerRetMsg">;
using PinWorkerRetMsg = WorkerTokensRetMsg<"PinWorkerRetMsg">;
using CompressWorkerRetMsg = WorkerTokensRetMsg<"CompressWorkerRetMsg">;
using DecompressWorkerRetMsg = WorkerTokensRetMsg<"DecompressWorkerRetMsg">;
using MoveWorkerRetMsg = WorkerTokensRetMsg<"MoveWorkerRetMsg">;

struct PinWorkerMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "PinWorkerMsg";
  std::string worker_event_id;
  std::string location;
  std::vector<std::int64_t> tokens;

  static constexpr auto fields() {
    return std::tuple{required("worker_event_id", &PinWorkerMsg::worker_event_id),
                      required("location", &PinWorkerMsg::location),
                      required("tokens", &PinWorkerMsg::tokens)};
  }
  friend bool operator==(const PinWorkerMsg&, const PinWorkerMsg&) = default;
};

// Re-encode the pinned prefix of `tokens` in place with `method` (only "cachegen" upstream).
template <TagName kName>
struct CodecWorkerMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = kName.view();
  std::string worker_event_id;
  std::string method;
  std::string location;
  std::optional<std::vector<std::int64_t>> tokens;

  static constexpr auto fields() {
    return std::tuple{required("worker_event_id", &CodecWorkerMsg::worker_event_id),
                      required("method", &CodecWorkerMsg::method),
                      required("location", &CodecWorkerMsg::location),
                      defaulted("tokens", &CodecWorkerMsg::tokens)};
  }
  friend bool operator==(const CodecWorkerMsg&, const CodecWorkerMsg&) = default;
};
using CompressWorkerMsg = CodecWorkerMsg<"CompressWorkerMsg">;
using DecompressWorkerMsg = CodecWorkerMsg<"DecompressWorkerMsg">;

struct MoveWorkerMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "MoveWorkerMsg";
  std::string worker_event_id;
  std::string old_position;
  Position new_position;
  std::optional<std::vector<std::int64_t>> tokens;
  std::optional<bool> copy = true;

  static constexpr auto fields() {
    return std::tuple{required("worker_event_id", &MoveWorkerMsg::worker_event_id),
                      required("old_position", &MoveWorkerMsg::old_position),
                      required("new_position", &MoveWorkerMsg::new_position),
                      defaulted("tokens", &MoveWorkerMsg::tokens),
                      defaulted("copy", &MoveWorkerMsg::copy)};
  }
  friend bool operator==(const MoveWorkerMsg&, const MoveWorkerMsg&) = default;
};

struct HealthWorkerMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "HealthWorkerMsg";
  std::string worker_event_id;

  static constexpr auto fields() {
    return std::tuple{required("worker_event_id", &HealthWorkerMsg::worker_event_id)};
  }
  friend bool operator==(const HealthWorkerMsg&, const HealthWorkerMsg&) = default;
};

struct HealthWorkerRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "HealthWorkerRetMsg";
  std::int64_t error_code = 0;

  static constexpr auto fields() {
    return std::tuple{required("error_code", &HealthWorkerRetMsg::error_code)};
  }
  friend bool operator==(const HealthWorkerRetMsg&, const HealthWorkerRetMsg&) = default;
};

struct CheckFinishWorkerMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "CheckFinishWorkerMsg";
  std::string worker_event_id;

  static constexpr auto fields() {
    return std::tuple{required("worker_event_id", &CheckFinishWorkerMsg::worker_event_id)};
  }
  friend bool operator==(const CheckFinishWorkerMsg&, const CheckFinishWorkerMsg&) = default;
};

struct CheckFinishWorkerRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "CheckFinishWorkerRetMsg";
  std::string status;

  static constexpr auto fields() {
    return std::tuple{required("status", &CheckFinishWorkerRetMsg::status)};
  }
  friend bool operator==(const CheckFinishWorkerRetMsg&, const CheckFinishWorkerRetMsg&) = default;
};

}  // namespace kvnode::wire
