// Orchestrator -> controller messages (OrchMsg) and their replies (protocol reference §2.4);
// the HTTP API maps onto these.
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

// ---- Orchestrator -> controller (OrchMsg), and their replies ----

struct QueryInstMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "QueryInstMsg";
  std::string event_id;
  std::string ip;

  static constexpr auto fields() {
    return std::tuple{required("event_id", &QueryInstMsg::event_id),
                      required("ip", &QueryInstMsg::ip)};
  }
  friend bool operator==(const QueryInstMsg&, const QueryInstMsg&) = default;
};

struct QueryInstRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "QueryInstRetMsg";
  std::string event_id;
  std::optional<std::string> instance_id;

  static constexpr auto fields() {
    return std::tuple{required("event_id", &QueryInstRetMsg::event_id),
                      required("instance_id", &QueryInstRetMsg::instance_id)};
  }
  friend bool operator==(const QueryInstRetMsg&, const QueryInstRetMsg&) = default;
};

struct LookupMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "LookupMsg";
  std::string event_id;
  std::vector<std::int64_t> tokens;

  static constexpr auto fields() {
    return std::tuple{required("event_id", &LookupMsg::event_id),
                      required("tokens", &LookupMsg::tokens)};
  }
  friend bool operator==(const LookupMsg&, const LookupMsg&) = default;
};

struct LookupRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "LookupRetMsg";
  std::string event_id;
  Dict<std::string, LookupLayout> layout_info;

  static constexpr auto fields() {
    return std::tuple{required("event_id", &LookupRetMsg::event_id),
                      required("layout_info", &LookupRetMsg::layout_info)};
  }
  friend bool operator==(const LookupRetMsg&, const LookupRetMsg&) = default;
};

struct ClearMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "ClearMsg";
  std::string event_id;
  std::string instance_id;
  std::string location;

  static constexpr auto fields() {
    return std::tuple{required("event_id", &ClearMsg::event_id),
                      required("instance_id", &ClearMsg::instance_id),
                      required("location", &ClearMsg::location)};
  }
  friend bool operator==(const ClearMsg&, const ClearMsg&) = default;
};

// The controller's reply to a fan-out operation: the orchestrator's event id and the tokens
// processed.
template <TagName kName>
struct TokensRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = kName.view();
  std::string event_id;
  std::int64_t num_tokens = 0;

  static constexpr auto fields() {
    return std::tuple{required("event_id", &TokensRetMsg::event_id),
                      required("num_tokens", &TokensRetMsg::num_tokens)};
  }
  friend bool operator==(const TokensRetMsg&, const TokensRetMsg&) = default;
};
using ClearRetMsg = TokensRetMsg<"ClearRetMsg">;
using PinRetMsg = TokensRetMsg<"PinRetMsg">;
using CompressRetMsg = TokensRetMsg<"CompressRetMsg">;
using DecompressRetMsg = TokensRetMsg<"DecompressRetMsg">;
using MoveRetMsg = TokensRetMsg<"MoveRetMsg">;

struct PinMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "PinMsg";
  std::string event_id;
  std::string instance_id;
  std::string location;
  std::vector<std::int64_t> tokens;

  static constexpr auto fields() {
    return std::tuple{required("event_id", &PinMsg::event_id),
                      required("instance_id", &PinMsg::instance_id),
                      required("location", &PinMsg::location), required("tokens", &PinMsg::tokens)};
  }
  friend bool operator==(const PinMsg&, const PinMsg&) = default;
};

// Compress or decompress an instance's KV at a location (fanned out as CodecWorkerMsg).
template <TagName kName>
struct CodecMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = kName.view();
  std::string event_id;
  std::string instance_id;
  std::string method;
  std::string location;
  std::optional<std::vector<std::int64_t>> tokens;

  static constexpr auto fields() {
    return std::tuple{
        required("event_id", &CodecMsg::event_id), required("instance_id", &CodecMsg::instance_id),
        required("method", &CodecMsg::method), required("location", &CodecMsg::location),
        defaulted("tokens", &CodecMsg::tokens)};
  }
  friend bool operator==(const CodecMsg&, const CodecMsg&) = default;
};
using CompressMsg = CodecMsg<"CompressMsg">;
using DecompressMsg = CodecMsg<"DecompressMsg">;

struct MoveMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "MoveMsg";
  std::string event_id;
  Position old_position;
  Position new_position;
  std::optional<std::vector<std::int64_t>> tokens;
  std::optional<bool> copy = false;

  static constexpr auto fields() {
    return std::tuple{required("event_id", &MoveMsg::event_id),
                      required("old_position", &MoveMsg::old_position),
                      required("new_position", &MoveMsg::new_position),
                      defaulted("tokens", &MoveMsg::tokens), defaulted("copy", &MoveMsg::copy)};
  }
  friend bool operator==(const MoveMsg&, const MoveMsg&) = default;
};

struct HealthMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "HealthMsg";
  std::string event_id;
  std::string instance_id;

  static constexpr auto fields() {
    return std::tuple{required("event_id", &HealthMsg::event_id),
                      required("instance_id", &HealthMsg::instance_id)};
  }
  friend bool operator==(const HealthMsg&, const HealthMsg&) = default;
};

struct HealthRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "HealthRetMsg";
  std::string event_id;
  Dict<std::int64_t, std::int64_t> error_codes;

  static constexpr auto fields() {
    return std::tuple{required("event_id", &HealthRetMsg::event_id),
                      required("error_codes", &HealthRetMsg::error_codes)};
  }
  friend bool operator==(const HealthRetMsg&, const HealthRetMsg&) = default;
};

struct CheckFinishMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "CheckFinishMsg";
  std::string event_id;

  static constexpr auto fields() {
    return std::tuple{required("event_id", &CheckFinishMsg::event_id)};
  }
  friend bool operator==(const CheckFinishMsg&, const CheckFinishMsg&) = default;
};

struct CheckFinishRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "CheckFinishRetMsg";
  std::string status;

  static constexpr auto fields() {
    return std::tuple{required("status", &CheckFinishRetMsg::status)};
  }
  friend bool operator==(const CheckFinishRetMsg&, const CheckFinishRetMsg&) = default;
};

struct QueryWorkerInfoMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "QueryWorkerInfoMsg";
  std::string event_id;
  std::string instance_id;
  std::optional<std::vector<std::int64_t>> worker_ids;

  static constexpr auto fields() {
    return std::tuple{required("event_id", &QueryWorkerInfoMsg::event_id),
                      required("instance_id", &QueryWorkerInfoMsg::instance_id),
                      required("worker_ids", &QueryWorkerInfoMsg::worker_ids)};
  }
  friend bool operator==(const QueryWorkerInfoMsg&, const QueryWorkerInfoMsg&) = default;
};

struct QueryWorkerInfoRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "QueryWorkerInfoRetMsg";
  std::string event_id;
  std::vector<WorkerInfo> worker_infos;

  static constexpr auto fields() {
    return std::tuple{required("event_id", &QueryWorkerInfoRetMsg::event_id),
                      required("worker_infos", &QueryWorkerInfoRetMsg::worker_infos)};
  }
  friend bool operator==(const QueryWorkerInfoRetMsg&, const QueryWorkerInfoRetMsg&) = default;
};

}  // namespace kvnode::wire
