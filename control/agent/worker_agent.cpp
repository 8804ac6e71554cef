// The worker agent: registration and heartbeats, requests on a DEALER, event batching, and the
// facade; the full sync is in full_sync.cpp, the worker port in control_server.cpp.
#include "kvnode/agent/worker_agent.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>

#include "kvnode/wire/codec.hpp"
#include "worker_agent_impl.hpp"

namespace kvnode::agent {
namespace {

template <class T>
const T* as(const wire::Msg& m) {
  return std::get_if<T>(&m);
}

}  // namespace

// Binds the worker port and answers control requests from now on (moves on their own executor).
Status WorkerAgent::Impl::serve_control() {
  Result<std::unique_ptr<ControlServer>> server = ControlServer::start(
      context_, options_.worker_port, options_.max_queued_moves, handlers_.control);
  if (!server) return server.error();
  server_ = std::move(server).value();
  port_ = server_->port();
  return {};
}

void WorkerAgent::Impl::launch() {
  events_thread_ = std::thread([this] { push_events(); });
  control_thread_ = std::thread([this] { register_and_heartbeat(); });
}

void WorkerAgent::Impl::shutdown() {
  // The control port first, while the rest still runs: a running move finishes, and its reply
  // and the events it reported reach the controller before the DeRegisterMsg does.
  if (server_) server_->stop();
  if (stopping_.exchange(true)) return;
  { std::lock_guard lock(stop_mutex_); }
  stop_cv_.notify_all();
  events_cv_.notify_all();
  for (std::thread* t : {&control_thread_, &sync_thread_, &events_thread_})
    if (t->joinable()) t->join();
}

// ---- Requests on a DEALER -------------------------------------------------------------------

Result<wire::Msg> WorkerAgent::Impl::call(const wire::Msg& request) {
  std::lock_guard lock(call_mutex_);
  if (!call_link_) {
    Result<ControllerLink> made = link(options_.controller_reply_url);
    if (!made) return made.error();
    call_link_.emplace(std::move(made).value());
  }
  Result<wire::Msg> reply = exchange(*call_link_, request);
  if (!reply) call_link_.reset();  // a late reply must not answer the next request
  return reply;
}

// ---- Registration and heartbeats --------------------------------------------------------------

void WorkerAgent::Impl::register_and_heartbeat() {
  const wire::RegisterMsg hello{options_.instance_id, options_.worker_id, options_.ip, port_,
                                options_.peer_init_url};
  std::optional<std::string> heartbeat_url;
  // An unanswered attempt gives up after register_timeout (not the 30 s request timeout), so
  // an operator hears of an unreachable controller within seconds.
  const auto attempt_timeout = std::min(options_.request_timeout, options_.register_timeout);
  for (auto backoff = options_.register_backoff_first; !stopping_;) {
    Result<ControllerLink> s = link(options_.controller_reply_url);
    count([](AgentCounters& c) { ++c.register_attempts; });
    Result<wire::Msg> reply =
        s ? s->exchange(hello, attempt_timeout, [this] { return stopping_.load(); })
          : Result<wire::Msg>(s.error());
    if (reply && as<wire::RegisterRetMsg>(*reply)) {
      if (const std::string* url =
              as<wire::RegisterRetMsg>(*reply)->extra_config.find("heartbeat_url"))
        heartbeat_url = *url;
      registered_ = true;
      count([](AgentCounters& c) {
        c.registered = true;
        c.last_register_error.clear();
      });
      events_cv_.notify_all();
      spdlog::info("worker agent: registered {}/{} with {}", options_.instance_id,
                   options_.worker_id, options_.controller_reply_url);
      break;
    }
    if (stopping_) return;
    std::string why = !reply ? reply.error().message
                      : as<wire::ErrorMsg>(*reply)
                          ? "the controller refused: " + as<wire::ErrorMsg>(*reply)->error
                          : "the controller answered " + std::string(wire::tag_of(*reply));
    std::uint64_t failures = 0;
    count([&](AgentCounters& c) {
      failures = ++c.register_failures;
      c.last_register_error = why;
    });
    spdlog::warn("worker agent: registration {} of {}/{} with {} failed ({}); retrying in {} ms",
                 failures, options_.instance_id, options_.worker_id, options_.controller_reply_url,
                 why, backoff.count());
    if (wait_or_stop(backoff)) return;
    backoff = std::min(backoff * 2, options_.register_backoff_max);
  }
  if (options_.heartbeat_period.count() <= 0) return;
  // The heartbeat socket of the registration answer; the reply socket accepts heartbeats too.
  const std::string url = heartbeat_url.value_or(options_.controller_reply_url);
  std::optional<ControllerLink> s;
  const wire::HeartbeatMsg beat{options_.instance_id, options_.worker_id, options_.ip, port_,
                                options_.peer_init_url};
  while (!wait_or_stop(options_.heartbeat_period)) {
    if (!s) {
      Result<ControllerLink> made = link(url);
      if (!made) {
        spdlog::warn("worker agent: heartbeat: {}", made.error().message);
        count([](AgentCounters& c) { ++c.heartbeat_failures; });
        continue;
      }
      s.emplace(std::move(made).value());
    }
    Result<wire::Msg> reply = exchange(*s, beat);
    const auto* ret = reply ? as<wire::HeartbeatRetMsg>(*reply) : nullptr;
    if (!ret) {
      // LMCache's fallback: an empty HeartbeatRetMsg. The socket is recreated.
      s.reset();
      count([](AgentCounters& c) { ++c.heartbeat_failures; });
      continue;
    }
    count([](AgentCounters& c) { ++c.heartbeats; });
    for (const wire::AnyCommand& command : ret->commands) {
      const auto* sync = std::get_if<wire::FullSyncCommand>(&command);
      if (!sync) continue;
      if (!handlers_.snapshot) {
        spdlog::warn(
            "worker agent: the controller asks for a full sync ({}) but this worker has "
            "nothing to send",
            sync->reason.value_or(""));
        continue;
      }
      if (syncing_.exchange(true)) continue;  // one at a time; later requests are ignored
      if (sync_thread_.joinable()) sync_thread_.join();
      sync_thread_ = std::thread([this, reason = sync->reason.value_or("")] {
        full_sync(reason);
        syncing_ = false;
      });
    }
  }
}

// ---- Events -----------------------------------------------------------------------------------

void WorkerAgent::Impl::report(const std::string& location, wire::OpType op, std::int64_t hash) {
  std::size_t queued;
  {
    std::lock_guard lock(events_mutex_);
    events_.emplace_back(location, wire::KVOpEvent{op, wire::ChunkHash(hash), -1});
    queued = events_.size();
  }
  if (queued >= options_.batch_size) events_cv_.notify_one();
}

void WorkerAgent::Impl::push_events() {
  zmq::socket_t push(context_, zmq::socket_type::push);
  push.set(zmq::sockopt::linger, 1000);  // DeRegister gets a second to leave at shutdown
  push.set(zmq::sockopt::sndtimeo, 1000);
  push.connect(endpoint(options_.controller_pull_url));
  auto send = [&](const wire::Msg& m) {
    try {
      return static_cast<bool>(push.send(zmq::buffer(wire::encode(m)), zmq::send_flags::none));
    } catch (const zmq::error_t&) {
      return false;
    }
  };
  for (;;) {
    std::deque<std::pair<std::string, wire::KVOpEvent>> batch;
    std::deque<wire::Msg> raw;
    {
      std::unique_lock lock(events_mutex_);
      events_cv_.wait_for(lock, options_.batch_timeout, [&] {
        return stopping_ || !raw_.empty() || (registered_ && events_.size() >= options_.batch_size);
      });
      // Events wait for registration: the controller drops those of unknown workers.
      if (registered_) batch.swap(events_);
      raw.swap(raw_);
      if (batch.empty() && raw.empty() && stopping_) break;
    }
    for (const wire::Msg& m : raw) send(m);
    // One message per location and per batch_size ops, sequence numbers per location from 0.
    while (!batch.empty()) {
      wire::BatchedKVOperationMsg m{
          options_.instance_id, options_.worker_id, batch.front().first, {}};
      for (auto it = batch.begin();
           it != batch.end() && m.operations.size() < options_.batch_size;) {
        if (it->first != m.location) {
          ++it;
          continue;
        }
        it->second.seq_num = next_seq_[m.location]++;
        m.operations.push_back(it->second);
        it = batch.erase(it);
      }
      const std::size_t n = m.operations.size();
      const bool sent = send(m);
      count([&](AgentCounters& c) { (sent ? c.events_sent : c.events_dropped) += n; });
    }
  }
  if (registered_)
    send(wire::DeRegisterMsg{options_.instance_id, options_.worker_id, options_.ip, port_});
}

// ---- Facade -----------------------------------------------------------------------------------

Result<std::unique_ptr<WorkerAgent>> WorkerAgent::start(const AgentOptions& options,
                                                        AgentHandlers handlers) {
  if (options.instance_id.empty()) return make_error("worker agent: instance_id is empty");
  if (options.controller_pull_url.empty() || options.controller_reply_url.empty())
    return make_error("worker agent: controller_pull_url and controller_reply_url are required");
  if (options.batch_size == 0) return make_error("worker agent: batch_size must be at least 1");
  auto impl = std::make_unique<Impl>(options, std::move(handlers));
  if (Status s = impl->serve_control(); !s) return s.error();
  impl->launch();
  return std::unique_ptr<WorkerAgent>(new WorkerAgent(std::move(impl)));
}

WorkerAgent::WorkerAgent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WorkerAgent::~WorkerAgent() = default;
int WorkerAgent::port() const {
  return impl_->port();
}
void WorkerAgent::report(const std::string& location, wire::OpType op, std::int64_t hash) {
  impl_->report(location, op, hash);
}
Result<wire::Msg> WorkerAgent::call(const wire::Msg& request) {
  return impl_->call(request);
}
bool WorkerAgent::registered() const {
  return impl_->counters().registered;
}
AgentCounters WorkerAgent::counters() const {
  return impl_->counters();
}

}  // namespace kvnode::agent
