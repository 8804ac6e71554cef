// The controller's state: instances, workers, their KV key sets (through KvIndex) and full-sync
// progress, with the behaviour of protocol reference §3 and the fixes for §6's defects:
//  - duplicate registration replaces the worker's address and clears its keys (D7);
//  - a known worker's heartbeat from a new address re-registers it (same fix, heartbeat side);
//  - a worker that heartbeated is reaped worker_timeout after its last heartbeat; one that never
//    did (LMCache's default, D5) is probed at its worker port worker_timeout after registering
//    (or after its last answered probe) and reaped when nothing accepts the connection;
//  - at most max_workers workers: registrations beyond are refused;
//  - P2P lookup matches the TP rank (D9) and skips holders without a peer_init_url;
//  - orchestrator lookup credits contiguous prefixes from token 0 only (D8);
//  - full sync stages the new key set beside the old one, which keeps serving lookups until the
//    sync completes; End completes only once every batch arrived; resent batches count once;
//    a silent SYNCING worker becomes FAILED after the sync timeout (D10).
// Not thread-safe: the controller guards it with a reader/writer lock. Time is passed in (epoch
// seconds) so tests control it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvnode/controller/kv_index.hpp"
#include "kvnode/keys/chunk_hash.hpp"
#include "kvnode/wire/messages.hpp"

namespace kvnode::controller {

struct RegistryOptions {
  double full_sync_threshold = 0.8;
  double full_sync_timeout = 300.0;            // s
  double worker_timeout = 30.0;                // s without a heartbeat (or a probe) before reaping
  std::size_t max_workers = 65536;             // registrations beyond are refused
  std::optional<std::string> heartbeat_url{};  // handed out in RegisterRetMsg.extra_config
  std::uint64_t index_seed = 0;                // 0: random
};

// Where the controller reaches a worker's REP socket; generation changes when the address does.
struct WorkerEndpoint {
  std::string instance_id;
  std::int64_t worker_id = 0;
  std::string ip;
  std::int64_t port = 0;
  std::optional<std::string> peer_init_url;
  std::uint64_t generation = 0;
  std::string key() const;       // "instance/worker#generation", the fan-out socket key
  std::string endpoint() const;  // "tcp://ip:port" (IPv6 addresses bracketed)
};

struct InstanceStats {
  std::string instance_id;
  std::size_t key_count = 0;
  std::size_t worker_count = 0;
};

struct RegistryStats {
  std::size_t keys = 0;  // (chunk, worker, location) triples, staging sets excluded
  std::size_t workers = 0;
  std::size_t instances = 0;
  std::uint64_t seq_discontinuities = 0;
  std::size_t workers_syncing = 0;
  std::size_t workers_completed = 0;
  double global_progress = 0.0;
  std::size_t missing_batches = 0;  // over all SYNCING workers
  std::size_t index_memory_bytes = 0;
  std::size_t index_capacity = 0;
  std::vector<InstanceStats> per_instance;  // in registration order
};

// Whether a worker's port accepted a connection (see Registry::unconfirmed).
struct ProbeOutcome {
  WorkerEndpoint endpoint;
  bool reachable = false;
};

// kWorkerChanged: a later slice of a batch found its worker re-registered or gone.
enum class ApplyOutcome { kApplied, kEmpty, kWorkerSyncing, kUnknownWorker, kWorkerChanged };

struct ApplyResult {
  ApplyOutcome outcome = ApplyOutcome::kApplied;
  std::size_t ops = 0;         // ops applied
  bool discontinuity = false;  // a sequence gap was counted for this batch
  std::int64_t expected_seq = 0, actual_seq = 0;
  std::uint64_t generation = 0;  // of the worker the ops went to
};

// Part of a batch. The controller applies a large batch in slices and releases the registry's
// lock between them, so a lookup never waits for a whole batch (or for a rehash: see KvIndex).
struct ApplySlice {
  std::size_t first = 0;
  std::size_t count = static_cast<std::size_t>(-1);
  std::uint64_t generation = 0;  // the first slice's worker generation; 0: whichever
  bool gap_counted = false;      // an earlier slice already counted this batch's gap
};

class Registry {
 public:
  explicit Registry(RegistryOptions options = {});
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // ---- worker requests (§3.2-§3.5, §3.7, §3.8) ----
  // Why registering this worker (by RegisterMsg or an unknown worker's heartbeat) is refused:
  // max_workers are registered and it is not one of them. nullopt: accepted.
  std::optional<std::string> refusal(std::string_view instance_id, std::int64_t worker_id) const;
  // Registers or re-registers; the endpoint to (re)connect is endpoint(instance, worker).
  // `replaced` receives the old endpoint when a duplicate registration changed the worker.
  wire::RegisterRetMsg register_worker(const wire::RegisterMsg& msg, double now,
                                       std::optional<WorkerEndpoint>* replaced = nullptr);
  wire::HeartbeatRetMsg heartbeat(const wire::HeartbeatMsg& msg, double now,
                                  std::optional<WorkerEndpoint>* replaced = nullptr);
  // Removes the worker and its keys; the removed endpoint, or nullopt when unknown.
  std::optional<WorkerEndpoint> deregister(std::string_view instance_id, std::int64_t worker_id);
  ApplyResult apply(const wire::BatchedKVOperationMsg& msg, const ApplySlice& slice = {});
  ApplyResult apply(const wire::KVAdmitMsg& msg);  // legacy, a one-op batch (D15)
  ApplyResult apply(const wire::KVEvictMsg& msg);
  wire::BatchedP2PLookupRetMsg p2p_lookup(const wire::BatchedP2PLookupMsg& msg) const;
  wire::FullSyncStartRetMsg sync_start(const wire::FullSyncStartMsg& msg, double now);
  void sync_batch(const wire::FullSyncBatchMsg& msg, double now);
  void sync_end(const wire::FullSyncEndMsg& msg, double now);
  wire::FullSyncStatusRetMsg sync_status(const wire::FullSyncStatusMsg& msg);

  // ---- orchestrator queries (§3.6, §3.9) ----
  // Multi-holder walk over precomputed chunk hashes; ends[i] = end token of chunk i.
  wire::Dict<std::string, wire::LookupLayout> lookup(const std::vector<ChunkHash>& hashes,
                                                     const std::vector<std::int64_t>& ends) const;
  std::optional<std::string> instance_by_ip(std::string_view ip) const;
  bool has_instance(std::string_view instance_id) const;
  // Workers of an instance sorted by worker id (empty when unknown).
  std::vector<WorkerEndpoint> endpoints(std::string_view instance_id) const;
  std::optional<WorkerEndpoint> endpoint(std::string_view instance_id,
                                         std::int64_t worker_id) const;
  // "all" or an instance id; worker_ids empty = every worker. "all" lists in registration
  // order, an instance's workers sorted by id.
  std::vector<wire::WorkerInfo> worker_infos(std::string_view instance_id,
                                             const std::vector<std::int64_t>& worker_ids) const;
  // The same workers with the keys each holds over all its locations (LMCache's key_count in
  // GET /controller/workers).
  struct WorkerListing {
    wire::WorkerInfo info;
    std::size_t key_count = 0;
  };
  std::vector<WorkerListing> worker_listing(std::string_view instance_id,
                                            const std::vector<std::int64_t>& worker_ids) const;

  // ---- housekeeping ----
  // Removes workers that heartbeated before but not within worker_timeout; returns them.
  std::vector<WorkerEndpoint> reap(double now);
  // Up to `limit` workers that never heartbeated and were not seen within worker_timeout (since
  // registering or their last answered probe). The caller probes their worker ports outside the
  // lock and reports back through settle_probes.
  std::vector<WorkerEndpoint> unconfirmed(double now, std::size_t limit) const;
  // Probed workers still at the probed generation and still without a heartbeat: reachable ones
  // count as seen now, the others are removed and returned.
  std::vector<WorkerEndpoint> settle_probes(const std::vector<ProbeOutcome>& probes, double now);
  // SYNCING workers silent for full_sync_timeout become FAILED; returns how many.
  std::size_t expire_syncs(double now);

  RegistryStats stats() const;
  bool need_full_sync_all() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace kvnode::controller
