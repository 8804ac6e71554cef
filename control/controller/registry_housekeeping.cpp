// Registry housekeeping: reaping (heartbeat timeouts, and probes of workers without a heartbeat
// contract), the worker limit, sync timeouts and stats.
#include <algorithm>
#include <cstddef>
#include <string>
#include <unordered_set>

#include "kvnode/controller/registry.hpp"
#include "registry_state.hpp"

namespace kvnode::controller {

std::optional<std::string> Registry::refusal(std::string_view instance_id,
                                             std::int64_t worker_id) const {
  if (s_->worker_count < s_->options.max_workers || s_->find_worker(instance_id, worker_id))
    return std::nullopt;
  return "worker limit reached: " + std::to_string(s_->worker_count) +
         " workers are registered and --max-workers is " + std::to_string(s_->options.max_workers) +
         "; refusing " + std::string(instance_id) + "/" + std::to_string(worker_id);
}

std::vector<WorkerEndpoint> Registry::reap(double now) {
  std::vector<State::Worker*> dead;
  for (const auto& inst : s_->instances)
    for (const auto& w : inst->workers)
      if (w->heartbeated && now - w->last_heartbeat_time > s_->options.worker_timeout)
        dead.push_back(w.get());
  std::vector<WorkerEndpoint> out;
  for (State::Worker* w : dead) out.push_back(State::endpoint_of(*w));
  s_->remove_workers(dead);
  s_->release_spare_capacity();
  return out;
}

std::vector<WorkerEndpoint> Registry::unconfirmed(double now, std::size_t limit) const {
  std::vector<WorkerEndpoint> out;
  for (const auto& inst : s_->instances)
    for (const auto& w : inst->workers) {
      if (out.size() >= limit) return out;
      if (!w->heartbeated && now - w->last_seen > s_->options.worker_timeout)
        out.push_back(State::endpoint_of(*w));
    }
  return out;
}

std::vector<WorkerEndpoint> Registry::settle_probes(const std::vector<ProbeOutcome>& probes,
                                                    double now) {
  std::vector<State::Worker*> dead;
  std::unordered_set<const State::Worker*> seen;  // a worker probed twice is removed once
  std::vector<WorkerEndpoint> out;
  for (const ProbeOutcome& p : probes) {
    State::Worker* w = s_->find_worker(p.endpoint.instance_id, p.endpoint.worker_id);
    // Re-registered, heartbeating or already gone since the probe: the probe says nothing.
    if (!w || w->generation != p.endpoint.generation || w->heartbeated) continue;
    if (p.reachable) {
      w->last_seen = now;
    } else if (seen.insert(w).second) {
      dead.push_back(w);
      out.push_back(p.endpoint);
    }
  }
  s_->remove_workers(dead);
  s_->release_spare_capacity();
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

bool Registry::need_full_sync_all() const {
  return s_->need_full_sync_all;
}
}  // namespace kvnode::controller
