#include "kvnode/controller/registry.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>

namespace kvnode::controller {
namespace {

// Start requests announcing more batches than this are refused: the missing-batch list of a
// status reply is built from the announced count and must stay bounded.
constexpr std::int64_t kMaxSyncBatches = 1'000'000;

enum class SyncState { kSyncing, kCompleted, kFailed };

// Calls visit(i) for i in [first, last) while it returns true, having started to load the index
// bucket of key(i + kAhead): on a large table each key is a likely cache miss.
template <class Key, class Visit>
void visit_prefetched(const KvIndex& index, std::size_t first, std::size_t last, Key&& key,
                      Visit&& visit) {
  constexpr std::size_t kAhead = 8;
  for (std::size_t i = first; i < std::min(last, first + kAhead); ++i) index.prefetch(key(i));
  for (std::size_t i = first; i < last; ++i) {
    if (i + kAhead < last) index.prefetch(key(i + kAhead));
    if (!visit(i)) return;
  }
}

}  // namespace

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
  std::vector<std::unique_ptr<Instance>> instances;  // registration order
  std::unordered_map<std::string_view, Instance*> instance_by_id;  // keys view Instance::id
  std::vector<HolderRef> holders;
  std::uint64_t next_order = 1;
  std::uint64_t next_generation = 1;
  std::uint64_t seq_discontinuities = 0;
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
    return WorkerEndpoint{w.instance->id, w.worker_id, w.ip, w.port, w.peer_init_url,
                          w.generation};
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
    w.heartbeated = false;
    w.generation = next_generation++;
  }

  template <class M>
  static bool same_address(const Worker& w, const M& msg) {
    return w.ip == msg.ip && w.port == msg.port && w.peer_init_url == msg.peer_init_url;
  }

  void remove_worker(Worker& w) {
    clear_worker(w);
    Instance* inst = w.instance;
    std::erase_if(inst->workers, [&](const auto& p) { return p.get() == &w; });
    if (inst->workers.empty()) {
      instance_by_id.erase(inst->id);
      std::erase_if(instances, [&](const auto& p) { return p.get() == inst; });
    }
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

// ---------------------------------------------------------------------------------------------

std::string WorkerEndpoint::key() const {
  return instance_id + "/" + std::to_string(worker_id) + "#" + std::to_string(generation);
}

std::string WorkerEndpoint::endpoint() const {
  const bool v6 = ip.find(':') != std::string::npos && ip.front() != '[';
  return "tcp://" + (v6 ? "[" + ip + "]" : ip) + ":" + std::to_string(port);
}

Registry::Registry(RegistryOptions options) : s_(std::make_unique<State>(std::move(options))) {}
Registry::~Registry() = default;

wire::RegisterRetMsg Registry::register_worker(const wire::RegisterMsg& msg, double now,
                                               std::optional<WorkerEndpoint>* replaced) {
  if (replaced) replaced->reset();
  if (State::Worker* w = s_->find_worker(msg.instance_id, msg.worker_id)) {
    // A duplicate registration is a restarted worker: its old keys are gone and it may live at
    // a new address, so clear the keys and take the new address (LMCache keeps the old, D7).
    if (replaced) *replaced = State::endpoint_of(*w);
    s_->clear_worker(*w);
    s_->readdress(*w, msg, now);
  } else {
    s_->add_worker(msg, now);
  }
  wire::RegisterRetMsg ret;
  if (s_->options.heartbeat_url) ret.extra_config.set("heartbeat_url", *s_->options.heartbeat_url);
  return ret;
}

wire::HeartbeatRetMsg Registry::heartbeat(const wire::HeartbeatMsg& msg, double now,
                                          std::optional<WorkerEndpoint>* replaced) {
  if (replaced) replaced->reset();
  wire::HeartbeatRetMsg ret;
  auto full_sync = [&](const char* reason) {
    wire::FullSyncCommand cmd;
    cmd.reason = reason;
    ret.commands.emplace_back(std::move(cmd));
  };
  State::Worker* w = s_->find_worker(msg.instance_id, msg.worker_id);
  if (!w || !State::same_address(*w, msg)) {
    // Unknown (the controller restarted, or the worker was reaped) or back at a new address
    // (restarted elsewhere): register from the heartbeat and ask for its keys.
    if (w) {
      if (replaced) *replaced = State::endpoint_of(*w);
      s_->clear_worker(*w);
      s_->readdress(*w, msg, now);
    } else {
      w = &s_->add_worker(msg, now);
    }
    w->heartbeated = true;
    full_sync("worker_re_registered");
    return ret;
  }
  w->last_heartbeat_time = now;
  w->heartbeated = true;
  const bool syncing_or_done =
      w->sync && (w->sync->state == SyncState::kSyncing || w->sync->state == SyncState::kCompleted);
  if (s_->need_full_sync_all && !syncing_or_done) {
    full_sync("controller_restart");
  } else if (w->sync && w->sync->state == SyncState::kFailed) {
    full_sync("sync_failed_retry");
  }
  return ret;
}

std::optional<WorkerEndpoint> Registry::deregister(std::string_view instance_id,
                                                   std::int64_t worker_id) {
  State::Worker* w = s_->find_worker(instance_id, worker_id);
  if (!w) return std::nullopt;
  WorkerEndpoint ep = State::endpoint_of(*w);
  s_->remove_worker(*w);
  return ep;
}

ApplyResult Registry::apply(const wire::BatchedKVOperationMsg& msg, const ApplySlice& slice) {
  ApplyResult r;
  if (msg.operations.empty()) {
    r.outcome = ApplyOutcome::kEmpty;
    return r;
  }
  State::Worker* w = s_->find_worker(msg.instance_id, msg.worker_id);
  if (!w) {
    r.outcome = slice.generation ? ApplyOutcome::kWorkerChanged : ApplyOutcome::kUnknownWorker;
    return r;
  }
  if (slice.generation && w->generation != slice.generation) {
    r.outcome = ApplyOutcome::kWorkerChanged;  // the rest was meant for the old key set
    return r;
  }
  r.generation = w->generation;
  if (w->sync && w->sync->state == SyncState::kSyncing) {
    r.outcome = ApplyOutcome::kWorkerSyncing;  // the full sync brings the whole set
    return r;
  }
  const std::size_t first = std::min(slice.first, msg.operations.size());
  const std::size_t last = first + std::min(slice.count, msg.operations.size() - first);
  State::Location& loc = s_->location(*w, msg.location);
  KvIndex& index = s_->index;
  const bool was_empty = index.holder_size(loc.holder) == 0;
  bool gap_counted = slice.gap_counted;
  const auto key = [&](std::size_t i) { return msg.operations[i].key; };
  visit_prefetched(index, first, last, key, [&](std::size_t i) {
    const wire::KVOpEvent& op = msg.operations[i];
    if (op.op_type == wire::OpType::kAdmit)
      index.insert(op.key, loc.holder);
    else
      index.erase(op.key, loc.holder);
    if (loc.last_seq && op.seq_num != *loc.last_seq + 1 && !gap_counted) {
      gap_counted = r.discontinuity = true;
      r.expected_seq = *loc.last_seq + 1;
      r.actual_seq = op.seq_num;
      ++s_->seq_discontinuities;
    }
    loc.last_seq = op.seq_num;
    return true;
  });
  if (was_empty && index.holder_size(loc.holder) > 0) loc.order = s_->next_order++;
  r.ops = last - first;
  return r;
}

template <class M>
static wire::BatchedKVOperationMsg one_op_batch(const M& msg, wire::OpType op) {
  return wire::BatchedKVOperationMsg{msg.instance_id, msg.worker_id, msg.location,
                                     {wire::KVOpEvent{op, msg.key, msg.seq_num}}};
}

ApplyResult Registry::apply(const wire::KVAdmitMsg& msg) {
  return apply(one_op_batch(msg, wire::OpType::kAdmit));
}
ApplyResult Registry::apply(const wire::KVEvictMsg& msg) {
  return apply(one_op_batch(msg, wire::OpType::kEvict));
}

wire::BatchedP2PLookupRetMsg Registry::p2p_lookup(const wire::BatchedP2PLookupMsg& msg) const {
  wire::BatchedP2PLookupRetMsg ret;
  ret.layout_info.push_back(wire::P2PLayout{"", "", 0, ""});
  if (msg.hashes.empty()) return ret;
  // The first holder of hashes[0] in another instance, at the requester's TP rank (D9), that
  // can serve (has a peer_init_url).
  const State::HolderRef* best = nullptr;
  s_->index.for_each_holder(msg.hashes[0], [&](HolderId h) {
    const State::HolderRef& ref = s_->holders[h];
    if (!ref.location) return;  // staging set of a running full sync
    const State::Worker& w = *ref.worker;
    if (w.instance->id == msg.instance_id || w.worker_id != msg.worker_id || !w.peer_init_url)
      return;
    if (!best || State::walk_order(ref) < State::walk_order(*best)) best = &ref;
  });
  if (!best) return ret;
  const HolderId holder = best->location->holder;
  const auto hits = static_cast<std::int64_t>(s_->index.leading_held(msg.hashes, holder));
  ret.layout_info[0] = wire::P2PLayout{best->worker->instance->id, best->location->name, hits,
                                       *best->worker->peer_init_url};
  return ret;
}

wire::FullSyncStartRetMsg Registry::sync_start(const wire::FullSyncStartMsg& msg, double now) {
  wire::FullSyncStartRetMsg ret;
  ret.sync_id = msg.sync_id;
  State::Worker* w = s_->find_worker(msg.instance_id, msg.worker_id);
  auto reject = [&](std::string why) {
    ret.accepted = false;
    ret.error_msg = std::move(why);
    return ret;
  };
  if (!w)
    return reject("Worker " + msg.instance_id + ":" + std::to_string(msg.worker_id) +
                  " is not registered");
  if (w->sync && w->sync->state == SyncState::kSyncing && w->sync->sync_id != msg.sync_id)
    return reject("Worker is already syncing with sync_id " + w->sync->sync_id);
  if (msg.batch_count < 0 || msg.batch_count > kMaxSyncBatches || msg.total_keys < 0)
    return reject("batch_count must be in [0, " + std::to_string(kMaxSyncBatches) +
                  "] and total_keys >= 0");
  s_->drop_sync_staging(*w);
  State::SyncInfo s;
  s.sync_id = msg.sync_id;
  s.location = msg.location;
  s.last_activity = now;
  s.expected_total_keys = msg.total_keys;
  s.expected_batch_count = msg.batch_count;
  // New keys go to a staging set; the old set keeps answering lookups until the sync completes.
  s.staging = s_->new_holder(w, nullptr);
  s.has_staging = true;
  w->sync = std::move(s);
  s_->location(*w, msg.location).last_seq.reset();
  ret.accepted = true;
  return ret;
}

void Registry::sync_batch(const wire::FullSyncBatchMsg& msg, double now) {
  State::Worker* w = s_->find_worker(msg.instance_id, msg.worker_id);
  if (!w || !w->sync || w->sync->state != SyncState::kSyncing || w->sync->sync_id != msg.sync_id)
    return;
  State::SyncInfo& s = *w->sync;
  if (msg.batch_id < 0 || msg.batch_id >= s.expected_batch_count) return;
  s.last_activity = now;
  if (!s.received_batches.insert(msg.batch_id).second) return;  // a resend: counted once
  s.received_keys += static_cast<std::int64_t>(msg.keys.size());
  for (const ChunkHash& k : msg.keys) s_->index.insert(k, s.staging);
  if (s.end_received && std::ssize(s.received_batches) == s.expected_batch_count)
    s_->complete_sync(*w);
}

void Registry::sync_end(const wire::FullSyncEndMsg& msg, double now) {
  State::Worker* w = s_->find_worker(msg.instance_id, msg.worker_id);
  if (!w || !w->sync || w->sync->sync_id != msg.sync_id ||
      w->sync->state != SyncState::kSyncing)
    return;
  State::SyncInfo& s = *w->sync;
  s.last_activity = now;
  s.end_received = true;
  // Complete only with every batch in; otherwise status keeps listing the missing ones so the
  // worker resends them (LMCache completes at once and the missing keys are lost, D10).
  if (std::ssize(s.received_batches) == s.expected_batch_count) s_->complete_sync(*w);
}

wire::FullSyncStatusRetMsg Registry::sync_status(const wire::FullSyncStatusMsg& msg) {
  wire::FullSyncStatusRetMsg ret;
  ret.sync_id = msg.sync_id;
  ret.global_progress = s_->global_progress();
  ret.can_exit_freeze = ret.global_progress >= s_->options.full_sync_threshold;
  if (ret.can_exit_freeze) s_->need_full_sync_all = false;
  const State::Worker* w = s_->find_worker(msg.instance_id, msg.worker_id);
  if (w && w->sync && w->sync->sync_id == msg.sync_id) {
    ret.is_complete = w->sync->state == SyncState::kCompleted;
    if (w->sync->state == SyncState::kSyncing) ret.missing_batches = State::missing_batches(*w->sync);
  }
  return ret;
}

wire::Dict<std::string, wire::LookupLayout> Registry::lookup(
    const std::vector<ChunkHash>& hashes, const std::vector<std::int64_t>& ends) const {
  // Contiguous multi-holder walk (§3.6): every instance holding chunks 0..i is credited with
  // end[i] at the location of its first holding worker; the walk stops when none is left.
  struct Credit {
    const State::Instance* instance;
    const State::HolderRef* first;  // first holder in walk order within the instance
  };
  wire::Dict<std::string, wire::LookupLayout> layout;
  std::vector<Credit> live, next;
  auto holders_by_instance = [&](const ChunkHash& h, std::vector<Credit>& out) {
    out.clear();
    s_->index.for_each_holder(h, [&](HolderId id) {
      const State::HolderRef& ref = s_->holders[id];
      if (!ref.location) return;
      auto it = std::find_if(out.begin(), out.end(),
                             [&](const Credit& c) { return c.instance == ref.worker->instance; });
      if (it == out.end())
        out.push_back(Credit{ref.worker->instance, &ref});
      else if (State::walk_order(ref) < State::walk_order(*it->first))
        it->first = &ref;
    });
  };
  const std::size_t n = std::min(hashes.size(), ends.size());
  for (std::size_t i = 0; i < n; ++i) {
    holders_by_instance(hashes[i], next);
    if (i > 0)
      std::erase_if(next, [&](const Credit& c) {
        return std::none_of(live.begin(), live.end(),
                            [&](const Credit& l) { return l.instance == c.instance; });
      });
    if (next.empty()) break;
    std::sort(next.begin(), next.end(), [](const Credit& a, const Credit& b) {
      return a.instance->order < b.instance->order;
    });
    for (const Credit& c : next)
      layout.set(c.instance->id, wire::LookupLayout{c.first->location->name, ends[i]});
    live.swap(next);
  }
  return layout;
}

std::optional<std::string> Registry::instance_by_ip(std::string_view ip) const {
  for (const auto& inst : s_->instances)
    for (const auto& w : inst->workers)
      if (w->ip == ip) return inst->id;
  return std::nullopt;
}

bool Registry::has_instance(std::string_view instance_id) const {
  return s_->find_instance(instance_id) != nullptr;
}

std::vector<WorkerEndpoint> Registry::endpoints(std::string_view instance_id) const {
  std::vector<WorkerEndpoint> out;
  if (const State::Instance* inst = s_->find_instance(instance_id))
    for (const auto& w : inst->workers) out.push_back(State::endpoint_of(*w));
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.worker_id < b.worker_id; });
  return out;
}

std::optional<WorkerEndpoint> Registry::endpoint(std::string_view instance_id,
                                                 std::int64_t worker_id) const {
  if (const State::Worker* w = s_->find_worker(instance_id, worker_id))
    return State::endpoint_of(*w);
  return std::nullopt;
}

std::vector<wire::WorkerInfo> Registry::worker_infos(
    std::string_view instance_id, const std::vector<std::int64_t>& worker_ids) const {
  std::vector<wire::WorkerInfo> out;
  auto wanted = [&](std::int64_t id) {
    return worker_ids.empty() ||
           std::find(worker_ids.begin(), worker_ids.end(), id) != worker_ids.end();
  };
  auto info = [](const State::Worker& w) {
    return wire::WorkerInfo{w.instance->id, w.worker_id,          w.ip,
                            w.port,         w.peer_init_url,      w.registration_time,
                            w.last_heartbeat_time};
  };
  if (instance_id == "all") {
    for (const auto& inst : s_->instances)
      for (const auto& w : inst->workers)
        if (wanted(w->worker_id)) out.push_back(info(*w));
    return out;
  }
  if (const State::Instance* inst = s_->find_instance(instance_id)) {
    for (const auto& w : inst->workers)
      if (wanted(w->worker_id)) out.push_back(info(*w));
    std::sort(out.begin(), out.end(),
              [](const auto& a, const auto& b) { return a.worker_id < b.worker_id; });
  }
  return out;
}

std::vector<WorkerEndpoint> Registry::reap(double now) {
  std::vector<State::Worker*> dead;
  for (const auto& inst : s_->instances)
    for (const auto& w : inst->workers)
      if (w->heartbeated && now - w->last_heartbeat_time > s_->options.worker_timeout)
        dead.push_back(w.get());
  std::vector<WorkerEndpoint> out;
  for (State::Worker* w : dead) {
    out.push_back(State::endpoint_of(*w));
    s_->remove_worker(*w);
  }
  return out;
}

std::size_t Registry::expire_syncs(double now) {
  std::size_t expired = 0;
  for (const auto& inst : s_->instances)
    for (const auto& w : inst->workers)
      if (w->sync && w->sync->state == SyncState::kSyncing &&
          now - w->sync->last_activity > s_->options.full_sync_timeout) {
        s_->drop_sync_staging(*w);
        w->sync->state = SyncState::kFailed;  // next heartbeat: sync_failed_retry
        ++expired;
      }
  return expired;
}

RegistryStats Registry::stats() const {
  RegistryStats st;
  st.seq_discontinuities = s_->seq_discontinuities;
  st.index_memory_bytes = s_->index.memory_bytes();
  st.index_capacity = s_->index.capacity();
  st.instances = s_->instances.size();
  std::size_t ready = 0;
  for (const auto& inst : s_->instances) {
    InstanceStats is{inst->id, 0, inst->workers.size()};
    for (const auto& w : inst->workers) {
      ++st.workers;
      for (const auto& loc : w->locations) is.key_count += s_->index.holder_size(loc->holder);
      if (!w->sync || w->sync->state == SyncState::kCompleted) ++ready;
      if (!w->sync) continue;
      if (w->sync->state == SyncState::kSyncing) {
        ++st.workers_syncing;
        st.missing_batches += static_cast<std::size_t>(w->sync->expected_batch_count) -
                              w->sync->received_batches.size();
      } else if (w->sync->state == SyncState::kCompleted) {
        ++st.workers_completed;
      }
    }
    st.keys += is.key_count;
    st.per_instance.push_back(std::move(is));
  }
  st.global_progress =
      st.workers == 0 ? 0.0 : static_cast<double>(ready) / static_cast<double>(st.workers);
  return st;
}

bool Registry::need_full_sync_all() const { return s_->need_full_sync_all; }

}  // namespace kvnode::controller
