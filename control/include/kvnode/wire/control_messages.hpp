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

struct ClearWorkerRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "ClearWorkerRetMsg";
  std::int64_t num_tokens = 0;

  static constexpr auto fields() {
    return std::tuple{required("num_tokens", &ClearWorkerRetMsg::num_tokens)};
  }
  friend bool operator==(const ClearWorkerRetMsg&, const ClearWorkerRetMsg&) = default;
};

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

struct PinWorkerRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "PinWorkerRetMsg";
  std::int64_t num_tokens = 0;

  static constexpr auto fields() {
    return std::tuple{required("num_tokens", &PinWorkerRetMsg::num_tokens)};
  }
  friend bool operator==(const PinWorkerRetMsg&, const PinWorkerRetMsg&) = default;
};

struct CompressWorkerMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "CompressWorkerMsg";
  std::string worker_event_id;
  std::string method;
  std::string location;
  std::optional<std::vector<std::int64_t>> tokens;

  static constexpr auto fields() {
    return std::tuple{required("worker_event_id", &CompressWorkerMsg::worker_event_id),
                      required("method", &CompressWorkerMsg::method),
                      required("location", &CompressWorkerMsg::location),
                      defaulted("tokens", &CompressWorkerMsg::tokens)};
  }
  friend bool operator==(const CompressWorkerMsg&, const CompressWorkerMsg&) = default;
};

struct CompressWorkerRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "CompressWorkerRetMsg";
  std::int64_t num_tokens = 0;

  static constexpr auto fields() {
    return std::tuple{required("num_tokens", &CompressWorkerRetMsg::num_tokens)};
  }
  friend bool operator==(const CompressWorkerRetMsg&, const CompressWorkerRetMsg&) = default;
};

struct DecompressWorkerMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "DecompressWorkerMsg";
  std::string worker_event_id;
  std::string method;
  std::string location;
  std::optional<std::vector<std::int64_t>> tokens;

  static constexpr auto fields() {
    return std::tuple{required("worker_event_id", &DecompressWorkerMsg::worker_event_id),
                      required("method", &DecompressWorkerMsg::method),
                      required("location", &DecompressWorkerMsg::location),
                      defaulted("tokens", &DecompressWorkerMsg::tokens)};
  }
  friend bool operator==(const DecompressWorkerMsg&, const DecompressWorkerMsg&) = default;
};

struct DecompressWorkerRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "DecompressWorkerRetMsg";
  std::int64_t num_tokens = 0;

  static constexpr auto fields() {
    return std::tuple{required("num_tokens", &DecompressWorkerRetMsg::num_tokens)};
  }
  friend bool operator==(const DecompressWorkerRetMsg&, const DecompressWorkerRetMsg&) = default;
};

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

struct MoveWorkerRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "MoveWorkerRetMsg";
  std::int64_t num_tokens = 0;

  static constexpr auto fields() {
    return std::tuple{required("num_tokens", &MoveWorkerRetMsg::num_tokens)};
  }
  friend bool operator==(const MoveWorkerRetMsg&, const MoveWorkerRetMsg&) = default;
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
