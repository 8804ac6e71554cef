#include "request_handler.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <type_traits>

#include "kvnode/wire/codec.hpp"

namespace kvnode::controller {
namespace {

bool wildcard(std::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "*";
}

std::string error_reply(std::string text) {
  return wire::encode(wire::Msg{wire::ErrorMsg{std::move(text)}});
}

std::string unknown_type(const wire::Msg& msg) {
  return "Unknown message type: " + wire::python_class_text(wire::tag_of(msg));
}

}  // namespace

std::optional<std::string> HeartbeatAdvert::url_for(std::string_view worker_ip) const {
  if (port < 0) return std::nullopt;
  std::string host;
  if (!advertise_host.empty())
    host = advertise_host;
  else if (!wildcard(bind_host))
    host = bind_host;
  else if (own_ip.empty() || worker_ip == own_ip)
    host = "127.0.0.1";  // same host as the worker: loopback always reaches us
  else
    host = own_ip;
  return host + ":" + std::to_string(port);
}

RequestHandler::RequestHandler(Guarded<Registry>& registry, FanOut& fanout, Metrics& metrics,
                               HeartbeatAdvert advert, Clock clock,
                               OrchestratorSink orchestrator_sink)
    : registry_(registry),
      fanout_(fanout),
      metrics_(metrics),
      advert_(std::move(advert)),
      clock_(std::move(clock)),
      orchestrator_sink_(std::move(orchestrator_sink)) {}

void RequestHandler::warn_bad_frame(std::string_view socket, std::string_view what) {
  warn_limited(fmt::format("{} socket: skipped a bad frame: {}", socket, what));
}

void RequestHandler::warn_limited(std::string_view text) {
  const double now = clock_();
  if (now - last_warning_ < 1.0) {
    ++suppressed_warnings_;
    return;
  }
  spdlog::warn("{}{}", text,
               suppressed_warnings_
                   ? fmt::format(" ({} more since the last warning)", suppressed_warnings_)
                   : std::string());
  last_warning_ = now;
  suppressed_warnings_ = 0;
}

std::string RequestHandler::on_router(std::string_view payload, RouterKind kind) {
  auto& bad =
      kind == RouterKind::kReply ? metrics_.reply_bad_frames : metrics_.heartbeat_bad_frames;
  const char* name = kind == RouterKind::kReply ? "reply" : "heartbeat";
  Result<wire::Msg> decoded = wire::decode(payload);
  if (!decoded) {
    ++bad;
    warn_bad_frame(name, decoded.error().message);
    return error_reply(decoded.error().message);
  }
  wire::Msg& msg = *decoded;
  if (kind == RouterKind::kHeartbeat && !std::holds_alternative<wire::HeartbeatMsg>(msg)) {
    ++bad;
    return error_reply("Expected HeartbeatMsg, got " + wire::python_class_text(wire::tag_of(msg)));
  }
  const double now = clock_();
  reply_buf_.clear();
  std::visit(
      [&](auto& m) {
        using M = std::decay_t<decltype(m)>;
        std::optional<WorkerEndpoint> replaced;
        // Past max_workers a new worker is refused, whether it registers or heartbeats.
        std::optional<std::string> refused;
        const auto refuse = [&] {
          ++metrics_.registrations_refused;
          warn_limited(*refused);
          reply_buf_ = error_reply(std::move(*refused));
        };
        if constexpr (std::is_same_v<M, wire::RegisterMsg>) {
          auto ret = registry_.write([&](Registry& r) {
            refused = r.refusal(m.instance_id, m.worker_id);
            return refused ? wire::RegisterRetMsg{} : r.register_worker(m, now, &replaced);
          });
          if (refused) return refuse();
          if (auto url = advert_.url_for(m.ip)) ret.extra_config.set("heartbeat_url", *url);
          spdlog::info("registered worker {}/{} at {}:{} (peer {}){}", m.instance_id, m.worker_id,
                       m.ip, m.port, m.peer_init_url.value_or("none"),
                       replaced ? " replacing its previous registration" : "");
          wire::encode(wire::Msg{std::move(ret)}, reply_buf_);
        } else if constexpr (std::is_same_v<M, wire::HeartbeatMsg>) {
          auto ret = registry_.write([&](Registry& r) {
            refused = r.refusal(m.instance_id, m.worker_id);
            return refused ? wire::HeartbeatRetMsg{} : r.heartbeat(m, now, &replaced);
          });
          if (refused) return refuse();
          wire::encode(wire::Msg{std::move(ret)}, reply_buf_);
        } else if constexpr (std::is_same_v<M, wire::BatchedP2PLookupMsg>) {
          const auto start = std::chrono::steady_clock::now();
          auto ret = registry_.read([&](const Registry& r) { return r.p2p_lookup(m); });
          wire::encode(wire::Msg{std::move(ret)}, reply_buf_);
          metrics_.p2p_lookup_latency.observe(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        } else if constexpr (std::is_same_v<M, wire::FullSyncStartMsg>) {
          auto ret = registry_.write([&](Registry& r) { return r.sync_start(m, now); });
          wire::encode(wire::Msg{std::move(ret)}, reply_buf_);
        } else if constexpr (std::is_same_v<M, wire::FullSyncStatusMsg>) {
          auto ret = registry_.write([&](Registry& r) { return r.sync_status(m); });
          wire::encode(wire::Msg{std::move(ret)}, reply_buf_);
        } else {
          ++bad;
          reply_buf_ = error_reply(unknown_type(msg));
        }
        if (replaced) fanout_.forget(replaced->key());
      },
      msg);
  return reply_buf_;
}

void RequestHandler::on_pull(std::string_view frame) {
  Result<wire::Msg> decoded = wire::decode(frame);
  if (!decoded) {
    ++metrics_.pull_bad_frames;
    warn_bad_frame("pull", decoded.error().message);
    return;
  }
  on_pull_msg(std::move(decoded).value());
}

// Holding the write lock for a whole 1000-op batch (0.2-0.5 ms) would make every lookup that
// arrives meanwhile wait for it; slices of kApplySlice ops bound that wait to a few microseconds.
template <class Count>
void RequestHandler::apply_in_slices(const wire::BatchedKVOperationMsg& m, Count&& count) {
  ApplySlice slice;
  slice.count = kApplySlice;
  ApplyResult total;
  do {
    const ApplyResult r = registry_.write([&](Registry& reg) { return reg.apply(m, slice); });
    total.outcome = r.outcome;
    total.ops += r.ops;
    if (r.discontinuity) {
      total.discontinuity = true;
      total.expected_seq = r.expected_seq;
      total.actual_seq = r.actual_seq;
    }
    if (r.outcome != ApplyOutcome::kApplied) break;
    slice.generation = r.generation;
    slice.gap_counted = total.discontinuity;
    slice.first += r.ops;
  } while (slice.first < m.operations.size());
  const std::size_t discarded =
      total.outcome == ApplyOutcome::kEmpty ? 0 : m.operations.size() - total.ops;
  count(total, discarded, m);
}

void RequestHandler::on_pull_msg(wire::Msg msg) {
  const double now = clock_();
  auto count_apply = [&](const ApplyResult& r, std::size_t discarded, const auto& m) {
    metrics_.kv_ops_applied.fetch_add(r.ops, std::memory_order_relaxed);
    metrics_.kv_ops_discarded.fetch_add(discarded, std::memory_order_relaxed);
    const auto who = [&] { return m.instance_id + "/" + std::to_string(m.worker_id); };
    if (r.outcome == ApplyOutcome::kUnknownWorker)
      warn_limited("pull socket: discarded KV ops from unregistered worker " + who() +
                   " (its next heartbeat re-registers it and a full sync restores its keys)");
    if (r.discontinuity)
      spdlog::debug("seq gap from {}: expected {}, got {}", who(), r.expected_seq, r.actual_seq);
  };
  std::visit(
      [&](auto& m) {
        using M = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<M, wire::BatchedKVOperationMsg> ||
                      std::is_same_v<M, wire::KVAdmitMsg> || std::is_same_v<M, wire::KVEvictMsg>) {
          if constexpr (std::is_same_v<M, wire::BatchedKVOperationMsg>) {
            apply_in_slices(m, count_apply);
          } else {
            const ApplyResult r = registry_.write([&](Registry& reg) { return reg.apply(m); });
            count_apply(r, r.outcome == ApplyOutcome::kApplied ? 0 : 1, m);
          }
        } else if constexpr (std::is_same_v<M, wire::DeRegisterMsg>) {
          auto gone = registry_.write(
              [&](Registry& r) { return r.deregister(m.instance_id, m.worker_id); });
          if (gone) {
            fanout_.forget(gone->key());
            spdlog::info("deregistered worker {}/{}", m.instance_id, m.worker_id);
          } else {
            spdlog::warn("DeRegisterMsg for unknown worker {}/{}", m.instance_id, m.worker_id);
          }
        } else if constexpr (std::is_same_v<M, wire::FullSyncBatchMsg>) {
          registry_.write([&](Registry& r) { r.sync_batch(m, now); });
        } else if constexpr (std::is_same_v<M, wire::FullSyncEndMsg>) {
          registry_.write([&](Registry& r) { r.sync_end(m, now); });
        } else if (Orchestrator::is_orchestrator_msg(msg)) {
          orchestrator_sink_(std::move(msg));
        } else {
          ++metrics_.pull_bad_frames;
          warn_bad_frame("pull", unknown_type(msg));
        }
      },
      msg);
}

}  // namespace kvnode::controller
