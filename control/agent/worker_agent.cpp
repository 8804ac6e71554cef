#include "kvnode/agent/worker_agent.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "control_server.hpp"
#include "controller_link.hpp"
#include "kvnode/wire/codec.hpp"

namespace kvnode::agent {
namespace {

std::string endpoint(const std::string& url) {
  return url.starts_with("tcp://") ? url : "tcp://" + url;
}

template <class T>
const T* as(const wire::Msg& m) {
  return std::get_if<T>(&m);
}

}  // namespace

class WorkerAgent::Impl {
 public:
  Impl(const AgentOptions& o, AgentHandlers h) : options_(o), handlers_(std::move(h)) {}
  ~Impl() { shutdown(); }

  Status serve_control();
  void launch();
  void shutdown();
  int port() const { return port_; }
  void report(const std::string& location, wire::OpType op, std::int64_t hash);
  Result<wire::Msg> call(const wire::Msg& request);
  AgentCounters counters() const {
    AgentCounters c;
    {
      std::lock_guard lock(counters_mutex_);
      c = counters_;
    }
    const ControlStats s = server_->stats();
    c.control_requests = s.requests;
    c.control_errors = s.errors;
    c.moves_running = s.moves_running;
    c.moves_queued = s.moves_queued;
    c.moves_refused = s.moves_refused;
    return c;
  }

 private:
  ControllerLink link(const std::string& url) {
    // The monitor's inproc name needs to be unique within context_, which is this agent's.
    const auto n = links_made_.fetch_add(1, std::memory_order_relaxed);
    return ControllerLink(context_, endpoint(url), std::to_string(n), options_.request_timeout);
  }
  Result<wire::Msg> exchange(ControllerLink& link, const wire::Msg& request) {
    return link.exchange(request, options_.request_timeout, [this] { return stopping_.load(); });
  }
  bool wait_or_stop(std::chrono::milliseconds d) {
    std::unique_lock lock(stop_mutex_);
    return stop_cv_.wait_for(lock, d, [&] { return stopping_.load(); });
  }
  void push_events();
  void register_and_heartbeat();
  void full_sync(const std::string& reason);
  bool send_raw(const wire::Msg& m);  // through the events thread's PUSH, in order
  template <class F>
  void count(F f) {
    std::lock_guard lock(counters_mutex_);
    f(counters_);
  }

  AgentOptions options_;
  AgentHandlers handlers_;
  zmq::context_t context_{1};
  std::unique_ptr<ControlServer> server_;  // after context_: its socket closes first
  int port_ = 0;

  std::atomic<bool> stopping_{false};
  std::atomic<bool> registered_{false};
  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;

  std::mutex events_mutex_;
  std::condition_variable events_cv_;
  std::deque<std::pair<std::string, wire::KVOpEvent>> events_;
  std::map<std::string, std::int64_t> next_seq_;  // per location, from 0

  std::deque<wire::Msg> raw_;  // full-sync messages for the PUSH socket (under events_mutex_)
  std::thread sync_thread_;
  std::atomic<bool> syncing_{false};

  std::atomic<std::uint64_t> links_made_{0};
  std::mutex call_mutex_;
  std::optional<ControllerLink> call_link_;

  mutable std::mutex counters_mutex_;
  AgentCounters counters_;
  std::thread events_thread_, control_thread_;
};

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
  if (!call_link_) call_link_.emplace(link(options_.controller_reply_url));
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
    ControllerLink s = link(options_.controller_reply_url);
    count([](AgentCounters& c) { ++c.register_attempts; });
    Result<wire::Msg> reply =
        s.exchange(hello, attempt_timeout, [this] { return stopping_.load(); });
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
    if (!s) s.emplace(link(url));
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

// ---- Full sync --------------------------------------------------------------------------------

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
