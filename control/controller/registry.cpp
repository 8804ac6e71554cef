#include "kvnode/controller/registry.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>

#include "registry_state.hpp"

namespace kvnode::controller {
namespace {

// Start requests announcing more batches than this are refused: the missing-batch list of a
// status reply is built from the announced count and must stay bounded.
constexpr std::int64_t kMaxSyncBatches = 1'000'000;

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
  return wire::BatchedKVOperationMsg{
      msg.instance_id, msg.worker_id, msg.location, {wire::KVOpEvent{op, msg.key, msg.seq_num}}};
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
  if (!w || !w->sync || w->sync->sync_id != msg.sync_id || w->sync->state != SyncState::kSyncing)
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
    if (w->sync->state == SyncState::kSyncing)
      ret.missing_batches = State::missing_batches(*w->sync);
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

std::vector<Registry::WorkerListing> Registry::worker_listing(
    std::string_view instance_id, const std::vector<std::int64_t>& worker_ids) const {
  std::vector<WorkerListing> out;
  auto wanted = [&](std::int64_t id) {
    return worker_ids.empty() ||
           std::find(worker_ids.begin(), worker_ids.end(), id) != worker_ids.end();
  };
  auto listing = [this](const State::Worker& w) {
    std::size_t keys = 0;
    for (const auto& loc : w.locations) keys += s_->index.holder_size(loc->holder);
    return WorkerListing{
        wire::WorkerInfo{w.instance->id, w.worker_id, w.ip, w.port, w.peer_init_url,
                         w.registration_time, w.last_heartbeat_time},
        keys};
  };
  if (instance_id == "all") {
    for (const auto& inst : s_->instances)
      for (const auto& w : inst->workers)
        if (wanted(w->worker_id)) out.push_back(listing(*w));
    return out;
  }
  if (const State::Instance* inst = s_->find_instance(instance_id)) {
    for (const auto& w : inst->workers)
      if (wanted(w->worker_id)) out.push_back(listing(*w));
    std::sort(out.begin(), out.end(),
              [](const auto& a, const auto& b) { return a.info.worker_id < b.info.worker_id; });
  }
  return out;
}

std::vector<wire::WorkerInfo> Registry::worker_infos(
    std::string_view instance_id, const std::vector<std::int64_t>& worker_ids) const {
  std::vector<wire::WorkerInfo> out;
  for (WorkerListing& l : worker_listing(instance_id, worker_ids)) out.push_back(std::move(l.info));
  return out;
}

}  // namespace kvnode::controller
