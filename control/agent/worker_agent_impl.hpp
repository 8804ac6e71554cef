// The worker agent's insides, shared by the files that implement it: worker_agent.cpp
// (registration, heartbeats, requests on a DEALER, event batching, the facade) and full_sync.cpp
// (the full sync a heartbeat asks for). Private to the agent library.
#pragma once

#include <fcntl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "control_server.hpp"
#include "controller_link.hpp"
#include "kvnode/agent/worker_agent.hpp"
#include "kvnode/common/unique_fd.hpp"

namespace kvnode::agent {

// A URL as LMCache configures it (host:port) as a ZeroMQ endpoint.
inline std::string endpoint(const std::string& url) {
  return url.starts_with("tcp://") ? url : "tcp://" + url;
}

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
  // A new link, or an error when no socket can be made (out of descriptors: the caller counts it
  // as a failed attempt and tries again later, instead of the exception ending the process).
  Result<ControllerLink> link(const std::string& url) {
    // Asked first, so the common case throws nothing (the catch below is the backstop for a
    // race): a link takes a descriptor for each of its two sockets and one for its connection.
    if (!descriptors_free(3))
      return make_error(ErrorCode::kIo, "cannot open a socket to the controller at " + url +
                                            ": out of file descriptors");
    // The monitor's inproc name needs to be unique within context_, which is this agent's.
    const auto n = links_made_.fetch_add(1, std::memory_order_relaxed);
    try {
      return ControllerLink(context_, endpoint(url), std::to_string(n), options_.request_timeout);
    } catch (const zmq::error_t& e) {
      return make_error(ErrorCode::kIo,
                        "cannot open a socket to the controller at " + url + ": " + e.what());
    }
  }
  // Whether `n` more descriptors can be opened now.
  static bool descriptors_free(int n) {
    std::vector<UniqueFd> probes;
    for (int i = 0; i < n; ++i) {
      probes.emplace_back(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      if (!probes.back()) return false;
    }
    return true;
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
  // full_sync.cpp
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

}  // namespace kvnode::agent
