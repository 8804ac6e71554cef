// Worker -> controller messages: PUSH -> PULL events (no reply) and DEALER -> ROUTER
// requests with their replies (protocol reference §2.1, §2.2).
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

// ---- Worker -> controller over PUSH -> PULL (no reply) ----

struct DeRegisterMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "DeRegisterMsg";
  std::string instance_id;
  std::int64_t worker_id = 0;
  std::string ip;
  std::int64_t port = 0;

  static constexpr auto fields() {
    return std::tuple{required("instance_id", &DeRegisterMsg::instance_id),
                      required("worker_id", &DeRegisterMsg::worker_id),
                      required("ip", &DeRegisterMsg::ip), required("port", &DeRegisterMsg::port)};
  }
  friend bool operator==(const DeRegisterMsg&, const DeRegisterMsg&) = default;
};

struct BatchedKVOperationMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "BatchedKVOperationMsg";
  std::string instance_id;
  std::int64_t worker_id = 0;
  std::string location;
  std::vector<KVOpEvent> operations;

  static constexpr auto fields() {
    return std::tuple{required("instance_id", &BatchedKVOperationMsg::instance_id),
                      required("worker_id", &BatchedKVOperationMsg::worker_id),
                      required("location", &BatchedKVOperationMsg::location),
                      required("operations", &BatchedKVOperationMsg::operations)};
  }
  friend bool operator==(const BatchedKVOperationMsg&, const BatchedKVOperationMsg&) = default;
};

struct FullSyncBatchMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "FullSyncBatchMsg";
  std::string instance_id;
  std::int64_t worker_id = 0;
  std::string location;
  std::string sync_id;
  std::int64_t batch_id = 0;
  std::vector<ChunkHash> keys;

  static constexpr auto fields() {
    return std::tuple{required("instance_id", &FullSyncBatchMsg::instance_id),
                      required("worker_id", &FullSyncBatchMsg::worker_id),
                      required("location", &FullSyncBatchMsg::location),
                      required("sync_id", &FullSyncBatchMsg::sync_id),
                      required("batch_id", &FullSyncBatchMsg::batch_id),
                      required("keys", &FullSyncBatchMsg::keys)};
  }
  friend bool operator==(const FullSyncBatchMsg&, const FullSyncBatchMsg&) = default;
};

struct FullSyncEndMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "FullSyncEndMsg";
  std::string instance_id;
  std::int64_t worker_id = 0;
  std::string location;
  std::string sync_id;
  std::int64_t actual_total_keys = 0;

  static constexpr auto fields() {
    return std::tuple{required("instance_id", &FullSyncEndMsg::instance_id),
                      required("worker_id", &FullSyncEndMsg::worker_id),
                      required("location", &FullSyncEndMsg::location),
                      required("sync_id", &FullSyncEndMsg::sync_id),
                      required("actual_total_keys", &FullSyncEndMsg::actual_total_keys)};
  }
  friend bool operator==(const FullSyncEndMsg&, const FullSyncEndMsg&) = default;
};

// A single admit or evict (legacy; the controller applies it as a one-op batch).
template <TagName kName>
struct KVOpMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = kName.view();
  std::string instance_id;
  std::int64_t worker_id = 0;
  ChunkHash key;
  std::string location;
  std::int64_t seq_num = 0;

  static constexpr auto fields() {
    return std::tuple{required("instance_id", &KVOpMsg::instance_id),
                      required("worker_id", &KVOpMsg::worker_id), required("key", &KVOpMsg::key),
                      required("location", &KVOpMsg::location),
                      defaulted("seq_num", &KVOpMsg::seq_num)};
  }
  friend bool operator==(const KVOpMsg&, const KVOpMsg&) = default;
};
using KVAdmitMsg = KVOpMsg<"KVAdmitMsg">;
using KVEvictMsg = KVOpMsg<"KVEvictMsg">;

// ---- Worker -> controller over DEALER -> ROUTER, and their replies ----

// Who a worker is and where to reach it: sent to register, and with every heartbeat.
template <TagName kName>
struct WorkerAddressMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = kName.view();
  std::string instance_id;
  std::int64_t worker_id = 0;
  std::string ip;
  std::int64_t port = 0;
  std::optional<std::string> peer_init_url;

  static constexpr auto fields() {
    return std::tuple{required("instance_id", &WorkerAddressMsg::instance_id),
                      required("worker_id", &WorkerAddressMsg::worker_id),
                      required("ip", &WorkerAddressMsg::ip),
                      required("port", &WorkerAddressMsg::port),
                      required("peer_init_url", &WorkerAddressMsg::peer_init_url)};
  }
  friend bool operator==(const WorkerAddressMsg&, const WorkerAddressMsg&) = default;
};
using RegisterMsg = WorkerAddressMsg<"RegisterMsg">;
using HeartbeatMsg = WorkerAddressMsg<"HeartbeatMsg">;

struct RegisterRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "RegisterRetMsg";
  Dict<std::string, std::string> extra_config;

  static constexpr auto fields() {
    return std::tuple{defaulted("extra_config", &RegisterRetMsg::extra_config)};
  }
  friend bool operator==(const RegisterRetMsg&, const RegisterRetMsg&) = default;
};

struct HeartbeatRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "HeartbeatRetMsg";
  std::vector<AnyCommand> commands;

  static constexpr auto fields() {
    return std::tuple{defaulted("commands", &HeartbeatRetMsg::commands)};
  }
  friend bool operator==(const HeartbeatRetMsg&, const HeartbeatRetMsg&) = default;
};

struct BatchedP2PLookupMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "BatchedP2PLookupMsg";
  std::vector<ChunkHash> hashes;
  std::string instance_id;
  std::int64_t worker_id = 0;

  static constexpr auto fields() {
    return std::tuple{required("hashes", &BatchedP2PLookupMsg::hashes),
                      required("instance_id", &BatchedP2PLookupMsg::instance_id),
                      required("worker_id", &BatchedP2PLookupMsg::worker_id)};
  }
  friend bool operator==(const BatchedP2PLookupMsg&, const BatchedP2PLookupMsg&) = default;
};

struct BatchedP2PLookupRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "BatchedP2PLookupRetMsg";
  std::vector<P2PLayout> layout_info;

  static constexpr auto fields() {
    return std::tuple{required("layout_info", &BatchedP2PLookupRetMsg::layout_info)};
  }
  friend bool operator==(const BatchedP2PLookupRetMsg&, const BatchedP2PLookupRetMsg&) = default;
};

struct FullSyncStartMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "FullSyncStartMsg";
  std::string instance_id;
  std::int64_t worker_id = 0;
  std::string location;
  std::string sync_id;
  std::int64_t total_keys = 0;
  std::int64_t batch_count = 0;

  static constexpr auto fields() {
    return std::tuple{required("instance_id", &FullSyncStartMsg::instance_id),
                      required("worker_id", &FullSyncStartMsg::worker_id),
                      required("location", &FullSyncStartMsg::location),
                      required("sync_id", &FullSyncStartMsg::sync_id),
                      required("total_keys", &FullSyncStartMsg::total_keys),
                      required("batch_count", &FullSyncStartMsg::batch_count)};
  }
  friend bool operator==(const FullSyncStartMsg&, const FullSyncStartMsg&) = default;
};

struct FullSyncStartRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "FullSyncStartRetMsg";
  std::string sync_id;
  bool accepted = false;
  std::optional<std::string> error_msg;

  static constexpr auto fields() {
    return std::tuple{required("sync_id", &FullSyncStartRetMsg::sync_id),
                      required("accepted", &FullSyncStartRetMsg::accepted),
                      defaulted("error_msg", &FullSyncStartRetMsg::error_msg)};
  }
  friend bool operator==(const FullSyncStartRetMsg&, const FullSyncStartRetMsg&) = default;
};

struct FullSyncStatusMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "FullSyncStatusMsg";
  std::string instance_id;
  std::int64_t worker_id = 0;
  std::string sync_id;

  static constexpr auto fields() {
    return std::tuple{required("instance_id", &FullSyncStatusMsg::instance_id),
                      required("worker_id", &FullSyncStatusMsg::worker_id),
                      required("sync_id", &FullSyncStatusMsg::sync_id)};
  }
  friend bool operator==(const FullSyncStatusMsg&, const FullSyncStatusMsg&) = default;
};

struct FullSyncStatusRetMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "FullSyncStatusRetMsg";
  std::string sync_id;
  bool is_complete = false;
  double global_progress = 0.0;
  bool can_exit_freeze = false;
  std::vector<std::int64_t> missing_batches;

  static constexpr auto fields() {
    return std::tuple{required("sync_id", &FullSyncStatusRetMsg::sync_id),
                      required("is_complete", &FullSyncStatusRetMsg::is_complete),
                      required("global_progress", &FullSyncStatusRetMsg::global_progress),
                      required("can_exit_freeze", &FullSyncStatusRetMsg::can_exit_freeze),
                      defaulted("missing_batches", &FullSyncStatusRetMsg::missing_batches)};
  }
  friend bool operator==(const FullSyncStatusRetMsg&, const FullSyncStatusRetMsg&) = default;
};

struct ErrorMsg {
  static constexpr std::string_view kTagKey = "type";
  static constexpr std::string_view kTag = "ErrorMsg";
  std::string error;

  static constexpr auto fields() { return std::tuple{required("error", &ErrorMsg::error)}; }
  friend bool operator==(const ErrorMsg&, const ErrorMsg&) = default;
};

}  // namespace kvnode::wire
