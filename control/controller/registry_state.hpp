// Registry's state, shared by registry.cpp (worker requests and queries) and
// registry_housekeeping.cpp (reaping, limits, stats). Private to the controller library.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "kvnode/controller/registry.hpp"

namespace kvnode::controller {

enum class SyncState { kSyncing, kCompleted, kFailed };

struct Registry::State {
  struct Instance;
  struct Worker;

  // One (worker, location) key set.
  struct Location {
    std::string name;
    HolderId holder = 0;
    std::uint64_t order = 0;  // place among the worker's non-empty sets (LMCache dict order)
    std::optional<std::int64_t> last_seq;
  };

  struct SyncInfo {
    std::string sync_id;
    SyncState state = SyncState::kSyncing;
    std::string location;
    double last_activity = 0;
    std::int64_t expected_total_keys = 0;
    std::int64_t expected_batch_count = 0;
    std::set<std::int64_t> received_batches;
    std::int64_t received_keys = 0;
    bool end_received = false;
    HolderId staging = 0;
    bool has_staging = false;
  };

  struct Worker {
    Instance* instance = nullptr;
    std::int64_t worker_id = 0;
    std::string ip;
    std::int64_t port = 0;
    std::optional<std::string> peer_init_url;
    double registration_time = 0;
    double last_heartbeat_time = 0;
    bool heartbeated = false;  // the heartbeat contract that makes a worker reapable (D5)
    // Without that contract: when it last registered or answered a probe of its worker port.
    double last_seen = 0;
    std::uint64_t generation = 0;
    std::uint64_t order = 0;
    std::vector<std::unique_ptr<Location>> locations;
    std::optional<SyncInfo> sync;
  };

  struct Instance {
    std::string id;
    std::uint64_t order = 0;
    std::vector<std::unique_ptr<Worker>> workers;  // registration order
  };

  // What a holder id stands for; location == nullptr for a full-sync staging set.
  struct HolderRef {
    Worker* worker = nullptr;
    Location* location = nullptr;
  };

  RegistryOptions options;
  KvIndex index;
  std::vector<std::unique_ptr<Instance>> instances;                // registration order
  std::unordered_map<std::string_view, Instance*> instance_by_id;  // keys view Instance::id
  std::vector<HolderRef> holders;
  std::uint64_t next_order = 1;
  std::uint64_t next_generation = 1;
  std::uint64_t seq_discontinuities = 0;
  std::size_t worker_count = 0;
  bool need_full_sync_all = true;  // a fresh controller knows nothing: ask workers to sync

  explicit State(RegistryOptions o) : options(std::move(o)), index(options.index_seed) {}

  // ---- lookup helpers ----
  Instance* find_instance(std::string_view id) const {
    const auto it = instance_by_id.find(id);
    return it == instance_by_id.end() ? nullptr : it->second;
  }
  Worker* find_worker(std::string_view instance_id, std::int64_t worker_id) const {
    Instance* inst = find_instance(instance_id);
    if (!inst) return nullptr;
    for (const auto& w : inst->workers)
      if (w->worker_id == worker_id) return w.get();
    return nullptr;
  }
  static Location* find_location(const Worker& w, std::string_view name) {
    for (const auto& loc : w.locations)
      if (loc->name == name) return loc.get();
    return nullptr;
  }

  HolderId new_holder(Worker* w, Location* loc) {
    const HolderId id = index.new_holder();
    if (holders.size() <= id) holders.resize(id + 1);
    holders[id] = HolderRef{w, loc};
    return id;
  }
  void retire(HolderId id) {
    index.retire_holder(id);
    holders[id] = HolderRef{};
  }

  Location& location(Worker& w, std::string_view name) {
    if (Location* loc = find_location(w, name)) return *loc;
    auto loc = std::make_unique<Location>();
    loc->name = std::string(name);
    loc->holder = new_holder(&w, loc.get());
    w.locations.push_back(std::move(loc));
    return *w.locations.back();
  }

  void drop_sync_staging(Worker& w) {
    if (w.sync && w.sync->has_staging) {
      retire(w.sync->staging);
      w.sync->has_staging = false;
    }
  }
  // Forgets every key, sequence tracker and sync state of the worker.
  void clear_worker(Worker& w) {
    drop_sync_staging(w);
    w.sync.reset();
    for (const auto& loc : w.locations) retire(loc->holder);
    w.locations.clear();
  }

  static WorkerEndpoint endpoint_of(const Worker& w) {
    return WorkerEndpoint{w.instance->id, w.worker_id, w.ip, w.port, w.peer_init_url, w.generation};
  }

  template <class M>
  Worker& add_worker(const M& msg, double now) {
    Instance* inst = find_instance(msg.instance_id);
    if (!inst) {
      instances.push_back(std::make_unique<Instance>());
      inst = instances.back().get();
      inst->id = msg.instance_id;
      inst->order = next_order++;
      instance_by_id.emplace(inst->id, inst);
    }
    auto w = std::make_unique<Worker>();
    w->instance = inst;
    w->worker_id = msg.worker_id;
    w->order = next_order++;
    inst->workers.push_back(std::move(w));
    ++worker_count;
    Worker& worker = *inst->workers.back();
    readdress(worker, msg, now);
    return worker;
  }

  template <class M>
  void readdress(Worker& w, const M& msg, double now) {
    w.ip = msg.ip;
    w.port = msg.port;
    w.peer_init_url = msg.peer_init_url;
    w.registration_time = now;
    w.last_heartbeat_time = now;
    w.last_seen = now;
    w.heartbeated = false;
    w.generation = next_generation++;
  }

  template <class M>
  static bool same_address(const Worker& w, const M& msg) {
    return w.ip == msg.ip && w.port == msg.port && w.peer_init_url == msg.peer_init_url;
  }

  void remove_worker(Worker& w) { remove_workers({&w}); }
  // One pass over the instance list however many go: reaping 50,000 abandoned registrations
  // one erase at a time took seconds under the write lock.
  void remove_workers(const std::vector<Worker*>& gone) {
    bool emptied = false;
    for (Worker* w : gone) {
      clear_worker(*w);
      Instance* inst = w->instance;
      std::erase_if(inst->workers, [&](const auto& p) { return p.get() == w; });
      --worker_count;
      if (inst->workers.empty()) {
        instance_by_id.erase(inst->id);
        emptied = true;
      }
    }
    if (emptied) std::erase_if(instances, [](const auto& p) { return p->workers.empty(); });
  }
  // Gives the lists' spare room back once most workers are gone (a flood of registrations that
  // was reaped), so the allocator can return it to the system.
  void release_spare_capacity() {
    constexpr std::size_t kSlack = 4, kFloor = 64;
    if (instances.capacity() > kSlack * (instances.size() + kFloor)) instances.shrink_to_fit();
    if (instance_by_id.bucket_count() > kSlack * (instance_by_id.size() + kFloor))
      instance_by_id.rehash(0);
  }

  // ---- full sync ----
  std::pair<std::size_t, std::size_t> ready_and_total() const {
    std::size_t ready = 0, total = 0;
    for (const auto& inst : instances)
      for (const auto& w : inst->workers) {
        ++total;
        if (!w->sync || w->sync->state == SyncState::kCompleted) ++ready;
      }
    return {ready, total};
  }
  double global_progress() const {
    const auto [ready, total] = ready_and_total();
    return total == 0 ? 0.0 : static_cast<double>(ready) / static_cast<double>(total);
  }

  // The staged key set replaces the location's live set in one step.
  void complete_sync(Worker& w) {
    SyncInfo& s = *w.sync;
    Location& loc = location(w, s.location);
    retire(loc.holder);
    loc.holder = s.staging;
    holders[loc.holder] = HolderRef{&w, &loc};
    loc.order = next_order++;
    loc.last_seq.reset();
    s.has_staging = false;
    s.state = SyncState::kCompleted;
  }

  static std::vector<std::int64_t> missing_batches(const SyncInfo& s) {
    std::vector<std::int64_t> missing;
    for (std::int64_t b = 0; b < s.expected_batch_count; ++b)
      if (!s.received_batches.contains(b)) missing.push_back(b);
    return missing;
  }

  // ---- lookups ----
  // Sort key reproducing LMCache's find_kv walk: instances, then workers, then locations, each
  // in insertion order.
  static std::tuple<std::uint64_t, std::uint64_t, std::uint64_t> walk_order(const HolderRef& r) {
    return {r.worker->instance->order, r.worker->order, r.location->order};
  }
};

}  // namespace kvnode::controller
