// The full sync a heartbeat asks for (protocol reference §3.8): the worker freezes, sends every
// chunk hash it holds in batches through the events PUSH socket (in order with the events), and
// polls the controller until it may unfreeze, resending the batches it says are missing.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "worker_agent_impl.hpp"

namespace kvnode::agent {

bool WorkerAgent::Impl::send_raw(const wire::Msg& m) {
  {
    std::lock_guard lock(events_mutex_);
    raw_.push_back(m);
  }
  events_cv_.notify_one();
  return true;
}

void WorkerAgent::Impl::full_sync(const std::string& reason) {
  std::mt19937_64 rng(std::random_device{}());
  const auto delay =
      options_.full_sync_startup_delay.count() > 0
          ? std::chrono::milliseconds(rng() % options_.full_sync_startup_delay.count())
          : std::chrono::milliseconds(0);
  if (wait_or_stop(delay)) return;
  count([](AgentCounters& c) { ++c.full_syncs_started; });
  if (handlers_.freeze) handlers_.freeze(true);
  struct Unfreeze {  // freeze(false) runs whatever happens below
    const AgentHandlers& h;
    ~Unfreeze() {
      if (h.freeze) h.freeze(false);
    }
  } unfreeze{handlers_};

  const std::string location = "LocalCPUBackend";
  const std::vector<std::int64_t> keys = handlers_.snapshot();
  const std::size_t per = std::max<std::size_t>(1, options_.full_sync_batch_size);
  const std::int64_t batches =
      std::max<std::int64_t>(1, static_cast<std::int64_t>((keys.size() + per - 1) / per));
  char id[9];
  std::snprintf(id, sizeof(id), "%08x", static_cast<unsigned>(rng()));
  const std::string sync_id =
      options_.instance_id + "_" + std::to_string(options_.worker_id) + "_" + id;
  spdlog::info("worker agent: full sync {} ({}): {} keys in {} batches", sync_id, reason,
               keys.size(), batches);

  bool accepted = false;
  for (int t = 0; t < options_.full_sync_start_tries && !accepted && !stopping_; ++t) {
    if (t && wait_or_stop(options_.full_sync_retry_delay)) return;
    Result<wire::Msg> r =
        call(wire::FullSyncStartMsg{options_.instance_id, options_.worker_id, location, sync_id,
                                    static_cast<std::int64_t>(keys.size()), batches});
    const auto* ret = r ? std::get_if<wire::FullSyncStartRetMsg>(&*r) : nullptr;
    accepted = ret && ret->accepted;
    if (ret && !ret->accepted)
      spdlog::warn("worker agent: full sync refused: {}", ret->error_msg.value_or(""));
  }
  if (!accepted) return;

  auto send_batch = [&](std::int64_t b) {
    const std::size_t from = static_cast<std::size_t>(b) * per;
    const std::size_t to = std::min(keys.size(), from + per);
    wire::FullSyncBatchMsg m{options_.instance_id, options_.worker_id, location, sync_id, b, {}};
    for (std::size_t i = from; i < to; ++i) m.keys.emplace_back(keys[i]);
    send_raw(m);
  };
  const wire::FullSyncEndMsg end{options_.instance_id, options_.worker_id, location, sync_id,
                                 static_cast<std::int64_t>(keys.size())};
  for (std::int64_t b = 0; b < batches; ++b) {
    send_batch(b);
    if (wait_or_stop(options_.full_sync_batch_interval)) return;
  }
  send_raw(end);

  // The first polls come quickly (a sync of a few keys completes in milliseconds and the node
  // refuses writes while frozen); the wait doubles up to the poll interval. The time allowed
  // is what max_polls polls at the interval would take.
  int resends = 0;
  const auto give_up = std::chrono::steady_clock::now() +
                       options_.full_sync_poll_interval * options_.full_sync_max_polls;
  auto wait = std::min(options_.full_sync_poll_interval, std::chrono::milliseconds(50));
  while (std::chrono::steady_clock::now() < give_up) {
    if (wait_or_stop(wait)) return;
    wait = std::min(wait * 2, options_.full_sync_poll_interval);
    Result<wire::Msg> r =
        call(wire::FullSyncStatusMsg{options_.instance_id, options_.worker_id, sync_id});
    const auto* st = r ? std::get_if<wire::FullSyncStatusRetMsg>(&*r) : nullptr;
    if (!st) continue;  // LMCache's fallback: not complete, keep polling
    if (st->can_exit_freeze) {
      count([](AgentCounters& c) { ++c.full_syncs_completed; });
      spdlog::info("worker agent: full sync {} done", sync_id);
      return;
    }
    if (!st->missing_batches.empty() && resends < options_.full_sync_max_resends) {
      ++resends;
      for (std::int64_t b : st->missing_batches)
        if (b >= 0 && b < batches) send_batch(b);
      send_raw(end);
    }
  }
  spdlog::warn("worker agent: full sync {} not confirmed within {} s; unfreezing", sync_id,
               std::chrono::duration_cast<std::chrono::seconds>(options_.full_sync_poll_interval *
                                                                options_.full_sync_max_polls)
                   .count());
}

}  // namespace kvnode::agent
