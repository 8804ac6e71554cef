// LMCache's cache-controller messages (lmcache/v1/cache_controller/message.py), field for field:
// names, order, defaults and nullability follow ../shared/docs/lmcache-protocol.md §2. `Msg` is
// the tagged union of all 51 concrete messages (tag key "type", value = the class name).
#pragma once

#include <string_view>
#include <variant>

#include "kvnode/wire/control_messages.hpp"
#include "kvnode/wire/orchestrator_messages.hpp"
#include "kvnode/wire/worker_messages.hpp"

namespace kvnode::wire {

using Msg =
    std::variant<DeRegisterMsg, BatchedKVOperationMsg, FullSyncBatchMsg, FullSyncEndMsg, KVAdmitMsg,
                 KVEvictMsg, RegisterMsg, RegisterRetMsg, HeartbeatMsg, HeartbeatRetMsg,
                 BatchedP2PLookupMsg, BatchedP2PLookupRetMsg, FullSyncStartMsg, FullSyncStartRetMsg,
                 FullSyncStatusMsg, FullSyncStatusRetMsg, ErrorMsg, ClearWorkerMsg,
                 ClearWorkerRetMsg, PinWorkerMsg, PinWorkerRetMsg, CompressWorkerMsg,
                 CompressWorkerRetMsg, DecompressWorkerMsg, DecompressWorkerRetMsg, MoveWorkerMsg,
                 MoveWorkerRetMsg, HealthWorkerMsg, HealthWorkerRetMsg, CheckFinishWorkerMsg,
                 CheckFinishWorkerRetMsg, QueryInstMsg, QueryInstRetMsg, LookupMsg, LookupRetMsg,
                 ClearMsg, ClearRetMsg, PinMsg, PinRetMsg, CompressMsg, CompressRetMsg,
                 DecompressMsg, DecompressRetMsg, MoveMsg, MoveRetMsg, HealthMsg, HealthRetMsg,
                 CheckFinishMsg, CheckFinishRetMsg, QueryWorkerInfoMsg, QueryWorkerInfoRetMsg>;

// The tag ("type" value) of the message held.
std::string_view tag_of(const Msg& msg);

}  // namespace kvnode::wire
