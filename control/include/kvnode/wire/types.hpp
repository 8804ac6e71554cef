// Nested types of the LMCache controller protocol: KV op events, worker info, tuples and the
// heartbeat command union (tag key "command_type"). Integers are int64 except chunk hashes,
// which carry msgpack's whole range as ChunkHash.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <variant>
#include <vector>

#include "kvnode/wire/any_value.hpp"
#include "kvnode/wire/schema.hpp"
#include "kvnode/wire/wide_int.hpp"

namespace kvnode::wire {

// ---- Nested types ----

enum class OpType : std::uint8_t { kAdmit, kEvict };  // on the wire by value: "admit", "evict"

// One admit or evict inside a BatchedKVOperationMsg (an untagged map).
struct KVOpEvent {
  OpType op_type = OpType::kAdmit;
  ChunkHash key;
  std::int64_t seq_num = 0;

  static constexpr auto fields() {
    return std::tuple{required("op_type", &KVOpEvent::op_type), required("key", &KVOpEvent::key),
                      required("seq_num", &KVOpEvent::seq_num)};
  }
  friend bool operator==(const KVOpEvent&, const KVOpEvent&) = default;
};

// A registered worker as the controller reports it (an untagged map).
struct WorkerInfo {
  std::string instance_id;
  std::int64_t worker_id = 0;
  std::string ip;
  std::int64_t port = 0;
  std::optional<std::string> peer_init_url;
  double registration_time = 0.0;    // epoch seconds
  double last_heartbeat_time = 0.0;  // epoch seconds

  static constexpr auto fields() {
    return std::tuple{required("instance_id", &WorkerInfo::instance_id),
                      required("worker_id", &WorkerInfo::worker_id),
                      required("ip", &WorkerInfo::ip),
                      required("port", &WorkerInfo::port),
                      required("peer_init_url", &WorkerInfo::peer_init_url),
                      required("registration_time", &WorkerInfo::registration_time),
                      required("last_heartbeat_time", &WorkerInfo::last_heartbeat_time)};
  }
  friend bool operator==(const WorkerInfo&, const WorkerInfo&) = default;
};

// Structs with kTuple travel as fixed-length arrays (Python tuples), in fields() order.

// tuple[str, str]: (instance_id or peer_init_url, location).
struct Position {
  static constexpr bool kTuple = true;
  std::string target;
  std::string location;

  static constexpr auto fields() {
    return std::tuple{required("target", &Position::target),
                      required("location", &Position::location)};
  }
  friend bool operator==(const Position&, const Position&) = default;
};

// One BatchedP2PLookupRetMsg entry; ("", "", 0, "") is the no-hit sentinel.
struct P2PLayout {
  static constexpr bool kTuple = true;
  std::string instance_id;
  std::string location;
  std::int64_t num_hit_chunks = 0;
  std::string peer_init_url;

  static constexpr auto fields() {
    return std::tuple{required("instance_id", &P2PLayout::instance_id),
                      required("location", &P2PLayout::location),
                      required("num_hit_chunks", &P2PLayout::num_hit_chunks),
                      required("peer_init_url", &P2PLayout::peer_init_url)};
  }
  friend bool operator==(const P2PLayout&, const P2PLayout&) = default;
};

// LookupRetMsg value: (location, end token of the matched prefix).
struct LookupLayout {
  static constexpr bool kTuple = true;
  std::string location;
  std::int64_t end_token = 0;

  static constexpr auto fields() {
    return std::tuple{required("location", &LookupLayout::location),
                      required("end_token", &LookupLayout::end_token)};
  }
  friend bool operator==(const LookupLayout&, const LookupLayout&) = default;
};

// ---- Heartbeat commands (only inside HeartbeatRetMsg.commands) ----

// A heartbeat command; HeartbeatCommand (the base class) decodes but a worker cannot execute it.
template <TagName kName>
struct Command {
  static constexpr std::string_view kTagKey = "command_type";
  static constexpr std::string_view kTag = kName.view();
  std::optional<std::string> reason;  // controller_restart, worker_re_registered, sync_failed_retry
  std::optional<Dict<std::string, AnyValue>> args;

  static constexpr auto fields() {
    return std::tuple{defaulted("reason", &Command::reason), defaulted("args", &Command::args)};
  }
  friend bool operator==(const Command&, const Command&) = default;
};
using FullSyncCommand = Command<"full_sync">;
using HeartbeatCommand = Command<"HeartbeatCommand">;

using AnyCommand = std::variant<FullSyncCommand, HeartbeatCommand>;

}  // namespace kvnode::wire
