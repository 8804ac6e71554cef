#include "kvnode/controller/orchestrator.hpp"

#include <algorithm>
#include <future>
#include <type_traits>

#include "kvnode/keys/chunk_hash.hpp"
#include "kvnode/wire/codec.hpp"
#include "orch_call.hpp"
#include "orch_events.hpp"
#include "orch_outcome.hpp"
#include "orch_uuid.hpp"

namespace kvnode::controller {

namespace {

using Clock = std::chrono::steady_clock;

OrchReply error_reply(std::string text, int status) {
  return OrchReply{wire::ErrorMsg{std::move(text)}, status, std::nullopt};
}

std::string unknown_instance_text(const Registry& r, const std::string& instance_id) {
  return r.has_instance(instance_id) ? "instance '" + instance_id + "' has no workers"
                                     : "unknown instance '" + instance_id + "'";
}

WorkerLabel label_of(const WorkerEndpoint& e) {
  return WorkerLabel{e.instance_id, e.worker_id, e.endpoint()};
}

FanOutTarget target_of(const WorkerEndpoint& e, const wire::Msg& payload) {
  return FanOutTarget{e.key(), e.endpoint(), wire::encode(payload)};
}

}  // namespace

std::string_view to_string(EventRecord::State state) {
  switch (state) {
    case EventRecord::State::kPending:
      return "pending";
    case EventRecord::State::kDone:
      return "done";
    case EventRecord::State::kFailed:
      return "failed";
  }
  return "unknown";
}

struct Orchestrator::Impl {
  Guarded<Registry>& registry;
  FanOut& fanout;
  Metrics& metrics;
  OrchestratorOptions options;
  std::shared_ptr<EventLog> events;  // shared with late-reply callbacks (weakly)
  Uuid4Generator uuids;

  Impl(Guarded<Registry>& r, FanOut& f, Metrics& m, OrchestratorOptions o)
      : registry(r),
        fanout(f),
        metrics(m),
        options(std::move(o)),
        events(std::make_shared<EventLog>(options.max_events)) {}

  // The instance's workers sorted by id, or the reason there are none. The shared lock is held
  // only for this copy, never across the fan-out.
  Result<std::vector<WorkerEndpoint>> workers_of(const std::string& instance_id) {
    return registry.read([&](const Registry& r) -> Result<std::vector<WorkerEndpoint>> {
      auto eps = r.endpoints(instance_id);
      if (eps.empty()) return Error{unknown_instance_text(r, instance_id)};
      return eps;
    });
  }

  // Records an operation that failed before any worker was called (bad input, unknown
  // instance): PULL-socket callers learn the outcome only through check_finish.
  OrchReply fail_early(const std::string& event_id, const std::string& operation, std::string text,
                       int status) {
    EventRecord r;
    r.state = EventRecord::State::kFailed;
    r.operation = operation;
    r.reason = text;
    events->put(event_id, std::move(r));
    return error_reply(std::move(text), status);
  }

  // clear, pin, compress, decompress: one payload per worker of the instance.
  template <class RetMsg, class MakePayload>
  OrchReply per_worker_call(const std::string& event_id, const std::string& instance_id,
                            const std::string& operation, std::string_view expected_tag,
                            MakePayload make_payload) {
    auto workers = workers_of(instance_id);
    if (!workers) return fail_early(event_id, operation, workers.error().message, 404);
    TokensCall call{event_id, operation, std::string(expected_tag), {}, {}};
    for (const auto& w : *workers) {
      call.labels.push_back(label_of(w));
      call.targets.push_back(target_of(w, make_payload(w.worker_id)));
    }
    return finish<RetMsg>(event_id, std::move(call));
  }

  template <class RetMsg>
  OrchReply finish(const std::string& event_id, TokensCall call) {
    Verdict v = run_tokens_call(fanout, events, metrics, options.fanout_deadline, std::move(call));
    if (!v.ok) return error_reply(std::move(v.error), v.http_status);
    return OrchReply{RetMsg{event_id, v.num_tokens}, 200, std::nullopt};
  }

  OrchReply on(const wire::LookupMsg& m) {
    const auto start = Clock::now();
    auto hashes = keys::chunk_hashes(m.tokens, options.hashing);
    if (!hashes) return error_reply("lookup: " + hashes.error().message, 500);
    std::vector<std::int64_t> ends(hashes->size());
    for (std::size_t i = 0; i < ends.size(); ++i)
      ends[i] = static_cast<std::int64_t>(
          keys::chunk_end_token(i, m.tokens.size(), options.hashing.chunk_size));
    auto layout = registry.read([&](const Registry& r) { return r.lookup(*hashes, ends); });
    metrics.lookup_latency.observe(std::chrono::duration<double>(Clock::now() - start).count());
    return OrchReply{wire::LookupRetMsg{m.event_id, std::move(layout)}, 200, std::nullopt};
  }

  OrchReply on(const wire::QueryInstMsg& m) {
    auto instance = registry.read([&](const Registry& r) { return r.instance_by_ip(m.ip); });
    // nullopt is the wire answer for an unknown ip; the HTTP layer turns it into 404.
    return OrchReply{wire::QueryInstRetMsg{m.event_id, std::move(instance)}, 200, std::nullopt};
  }

  OrchReply on(const wire::QueryWorkerInfoMsg& m) {
    static const std::vector<std::int64_t> kAll;
    auto infos = registry.read([&](const Registry& r) {
      return r.worker_infos(m.instance_id, m.worker_ids ? *m.worker_ids : kAll);
    });
    return OrchReply{wire::QueryWorkerInfoRetMsg{m.event_id, std::move(infos)}, 200, std::nullopt};
  }

  OrchReply on(const wire::ClearMsg& m) {
    return per_worker_call<wire::ClearRetMsg>(
        m.event_id, m.instance_id, "clear", wire::ClearWorkerRetMsg::kTag, [&](std::int64_t wid) {
          return wire::ClearWorkerMsg{"Worker" + std::to_string(wid) + m.event_id, m.location};
        });
  }

  OrchReply on(const wire::PinMsg& m) {
    return per_worker_call<wire::PinRetMsg>(
        m.event_id, m.instance_id, "pin", wire::PinWorkerRetMsg::kTag, [&](std::int64_t wid) {
          return wire::PinWorkerMsg{"Worker" + std::to_string(wid) + m.event_id, m.location,
                                    m.tokens};
        });
  }

  OrchReply on(const wire::CompressMsg& m) {
    return per_worker_call<wire::CompressRetMsg>(
        m.event_id, m.instance_id, "compress", wire::CompressWorkerRetMsg::kTag,
        [&](std::int64_t wid) {
          return wire::CompressWorkerMsg{"CompressWorker" + std::to_string(wid) + uuids.next(),
                                         m.method, m.location, m.tokens};
        });
  }

  OrchReply on(const wire::DecompressMsg& m) {
    return per_worker_call<wire::DecompressRetMsg>(
        m.event_id, m.instance_id, "decompress", wire::DecompressWorkerRetMsg::kTag,
        [&](std::int64_t wid) {
          return wire::DecompressWorkerMsg{"DecompressWorker" + std::to_string(wid) + uuids.next(),
                                           m.method, m.location, m.tokens};
        });
  }

  OrchReply on(const wire::MoveMsg& m) {
    const std::string& src_id = m.old_position.target;
    const std::string& dst_id = m.new_position.target;
    // To itself, every chunk is "already there" and a move (copy off) would evict the only copy.
    if (src_id == dst_id)
      return fail_early(m.event_id, "move",
                        "move source and destination are the same instance '" + src_id +
                            "': a move to itself moves nothing (name another instance)",
                        400);
    auto src = workers_of(src_id);
    if (!src) return fail_early(m.event_id, "move", "move source: " + src.error().message, 404);
    auto dst = workers_of(dst_id);
    if (!dst)
      return fail_early(m.event_id, "move", "move destination: " + dst.error().message, 404);
    // Ranks pair up by sorted worker id; upstream zips and silently drops extras (D12).
    if (src->size() != dst->size())
      return fail_early(m.event_id, "move",
                        "move pairs workers by rank, but source " + src_id + " has " +
                            std::to_string(src->size()) + " workers and destination " + dst_id +
                            " has " + std::to_string(dst->size()),
                        400);
    TokensCall call{m.event_id, "move", std::string(wire::MoveWorkerRetMsg::kTag), {}, {}};
    for (std::size_t i = 0; i < src->size(); ++i) {
      const WorkerEndpoint& s = (*src)[i];
      const WorkerEndpoint& d = (*dst)[i];
      if (!d.peer_init_url)
        return fail_early(m.event_id, "move",
                          "destination worker " + std::to_string(d.worker_id) + " of " + dst_id +
                              " has no peer_init_url, so worker " + std::to_string(s.worker_id) +
                              " of " + src_id + " cannot reach it",
                          400);
      if (s.peer_init_url && *s.peer_init_url == *d.peer_init_url)
        return fail_early(m.event_id, "move",
                          "worker " + std::to_string(s.worker_id) + " of " + src_id +
                              " and worker " + std::to_string(d.worker_id) + " of " + dst_id +
                              " are the same node (peer_init_url " + *d.peer_init_url +
                              "): a move to itself moves nothing",
                          400);
      wire::MoveWorkerMsg payload{
          "MoveWorker" + std::to_string(s.worker_id) + uuids.next(), m.old_position.location,
          wire::Position{*d.peer_init_url, m.new_position.location}, m.tokens, m.copy};
      call.labels.push_back(label_of(s));
      call.targets.push_back(target_of(s, payload));
    }
    return finish<wire::MoveRetMsg>(m.event_id, std::move(call));
  }

  OrchReply on(const wire::HealthMsg& m) {
    EventRecord done;
    done.state = EventRecord::State::kDone;
    done.operation = "health";
    auto workers = registry.read([&](const Registry& r) { return r.endpoints(m.instance_id); });
    wire::HealthRetMsg ret{m.event_id, {}};
    if (workers.empty()) {  // as LMCache: an unknown instance is healthy with no codes
      events->put(m.event_id, std::move(done));
      return OrchReply{std::move(ret), 200, std::nullopt};
    }
    EventRecord pending;
    pending.operation = "health";
    const auto ticket = events->put(m.event_id, std::move(pending));
    std::vector<FanOutTarget> targets;
    for (const auto& w : workers)
      targets.push_back(target_of(
          w, wire::HealthWorkerMsg{"HealthWorker" + std::to_string(w.worker_id) + uuids.next()}));
    std::vector<Result<std::string>> replies;
    try {
      replies = fanout.call(std::move(targets), options.fanout_deadline).get();
    } catch (const std::future_error&) {
      // The executor went away (shutdown); every worker counts as silent.
    }
    for (std::size_t i = 0; i < workers.size(); ++i) {
      std::int64_t code = kHealthNoReply;
      if (i < replies.size()) {
        if (!replies[i].ok() && is_deadline_error(replies[i].error()))
          metrics.fanout_timeouts.fetch_add(1, std::memory_order_relaxed);
        code = interpret_health_reply(replies[i]);
      }
      ret.error_codes.set(workers[i].worker_id, code);
    }
    events->update(m.event_id, ticket, std::move(done));
    return OrchReply{std::move(ret), 200, std::nullopt};
  }

  OrchReply on(const wire::CheckFinishMsg& m) {
    auto record = events->get(m.event_id);
    if (!record) return error_reply("unknown event_id '" + m.event_id + "'", 404);
    std::string status(to_string(record->state));
    return OrchReply{wire::CheckFinishRetMsg{std::move(status)}, 200, std::move(record)};
  }
};

Orchestrator::Orchestrator(Guarded<Registry>& registry, FanOut& fanout, Metrics& metrics,
                           OrchestratorOptions options)
    : impl_(std::make_unique<Impl>(registry, fanout, metrics, std::move(options))) {}

Orchestrator::~Orchestrator() = default;

bool Orchestrator::is_orchestrator_msg(const wire::Msg& msg) {
  return std::visit(
      [](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        return std::is_same_v<T, wire::QueryInstMsg> || std::is_same_v<T, wire::LookupMsg> ||
               std::is_same_v<T, wire::ClearMsg> || std::is_same_v<T, wire::PinMsg> ||
               std::is_same_v<T, wire::CompressMsg> || std::is_same_v<T, wire::DecompressMsg> ||
               std::is_same_v<T, wire::MoveMsg> || std::is_same_v<T, wire::HealthMsg> ||
               std::is_same_v<T, wire::CheckFinishMsg> ||
               std::is_same_v<T, wire::QueryWorkerInfoMsg>;
      },
      msg);
}

OrchReply Orchestrator::handle(const wire::Msg& request) {
  if (!is_orchestrator_msg(request))
    return error_reply("Unknown message type: " + wire::python_class_text(wire::tag_of(request)) +
                           " is not an orchestrator message",
                       400);
  return std::visit(
      [&](const auto& m) -> OrchReply {
        if constexpr (requires { impl_->on(m); }) {
          return impl_->on(m);
        } else {
          return error_reply("unreachable", 500);  // is_orchestrator_msg covers every on()
        }
      },
      request);
}

}  // namespace kvnode::controller
