// The node tests' rig: a controller in-process on ephemeral loopback ports, nodes assembled
// as the kvnode daemon assembles them (pool, store, engine, transfer plane, moves, agent) so a
// test can reach each part, and the helpers every node test uses.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "kvnode/agent/worker_agent.hpp"
#include "kvnode/controller/controller.hpp"
#include "kvnode/node/peer_moves.hpp"
#include "support/http_client.hpp"

namespace kvnode::node::rig {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;
inline constexpr const char* kCpu = "LocalCPUBackend";
inline constexpr std::size_t kChunkBytes = 64 << 10;

// A chunk's bytes: a function of its hash, so any copy can be checked.
inline std::vector<std::byte> chunk_bytes(ChunkHash h, std::size_t size = kChunkBytes) {
  std::vector<std::byte> b(size);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>((h * 7 + i) & 0xff);
  return b;
}

inline bool eventually(const std::function<bool()>& c) {
  for (const auto until = Clock::now() + 15s; !c();) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

inline std::unique_ptr<controller::Controller> start_controller() {
  controller::ControllerConfig c;
  c.controller_host = "127.0.0.1";
  c.controller_port = 0;
  c.controller_monitor_ports = {0, 0, 0};
  c.log_level = "warn";
  return std::move(controller::Controller::start(c)).value();
}

// One node: what the kvnode daemon assembles, minus the daemon.
class Node {
 public:
  Node(const controller::BoundPorts& ports, const std::string& instance, const char* tls)
      : instance_(instance),
        pool_(make_pool()),
        store_(pool_, kCpu,
               [this](const StoreEvent& e) {
                 if (auto* a = agent_ptr_.load())
                   a->report(kCpu, e.kind == StoreEvent::Kind::kAdmit ? wire::OpType::kAdmit
                                                                       : wire::OpType::kEvict,
                             e.hash);
               }),
        engine_(store_),
        moves_(engine_, nullptr) {
    transfer::PlaneOptions po;
    if (tls) {
      po.tls = tls;
      po.net_devices = "lo";
    }
    po.on_ask = [this](const std::string& peer, const std::vector<std::byte>& r) {
      return moves_.on_ask(peer, r);
    };
    plane_ = std::move(transfer::TransferPlane::start(po, pool_)).value();
    moves_.set_plane(plane_.get());
    engine_.set_mover([this](const wire::MoveWorkerMsg& m) { return moves_.on_move(m); });
    agent::AgentOptions o;
    o.instance_id = instance;
    o.controller_pull_url = "127.0.0.1:" + std::to_string(ports.pull);
    o.controller_reply_url = "127.0.0.1:" + std::to_string(ports.reply);
    o.peer_init_url = plane_->url();
    o.heartbeat_period = 100ms;
    o.request_timeout = 5s;
    o.full_sync_startup_delay = 0ms;
    o.full_sync_poll_interval = 50ms;
    agent::AgentHandlers h;
    h.control = [this](const wire::Msg& m) { return engine_.on_control(m); };
    h.snapshot = [this] { return engine_.snapshot(); };
    h.freeze = [this](bool on) { engine_.freeze(on); };
    agent_ = std::move(agent::WorkerAgent::start(o, h)).value();
    agent_ptr_ = agent_.get();
  }
  ~Node() {
    agent_ptr_ = nullptr;
    agent_.reset();
    engine_.set_mover(nullptr);
    plane_.reset();
  }
  RetrieveResult retrieve(const std::vector<std::int64_t>& tokens) {
    return moves_.retrieve(
        tokens, locate_through([this](const wire::Msg& m) { return agent_->call(m); }, instance_, 0));
  }
  Engine& engine() { return engine_; }
  ChunkStore& store() { return store_; }
  agent::WorkerAgent& agent() { return *agent_; }

 private:
  static gpu::ChunkPool make_pool() {
    gpu::PoolOptions o;
    o.page_bytes = kChunkBytes;
    o.pages = 32;
    return std::move(gpu::ChunkPool::create(o)).value();
  }
  std::string instance_;
  gpu::ChunkPool pool_;
  std::atomic<agent::WorkerAgent*> agent_ptr_{nullptr};
  ChunkStore store_;
  Engine engine_;
  PeerMoves moves_;
  std::unique_ptr<transfer::TransferPlane> plane_;
  std::unique_ptr<agent::WorkerAgent> agent_;
};

// A controller and two nodes, A and B, both through their first full sync (until then the
// controller would drop their keys).
struct TwoNodes {
  explicit TwoNodes(const char* tls)
      : ctl(start_controller()), a(ctl->ports(), "inst-A", tls), b(ctl->ports(), "inst-B", tls) {}
  bool synced() {
    return eventually([&] {
      return a.agent().counters().full_syncs_completed >= 1 &&
             b.agent().counters().full_syncs_completed >= 1;
    });
  }
  std::unique_ptr<controller::Controller> ctl;
  Node a;
  Node b;
};

}  // namespace kvnode::node::rig
