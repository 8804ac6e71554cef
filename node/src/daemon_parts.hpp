// What a running kvnode daemon is made of, in the order Daemon::start() builds it: each part
// gets what it needs at construction (no part is wired to another after it exists). Shared by
// daemon.cpp (assembly) and daemon_metrics.cpp (/metrics, /health).
#pragma once

#include <atomic>
#include <memory>
#include <optional>

#include "control_handler.hpp"
#include "instance_lock.hpp"
#include "kvnode/agent/worker_agent.hpp"
#include "kvnode/httpd/server.hpp"
#include "kvnode/node/daemon.hpp"
#include "kvnode/node/local_service.hpp"
#include "kvnode/node/peer_moves.hpp"
#include "kvnode/transfer/plane.hpp"
#include "peer_service.hpp"

namespace kvnode::node {

// Declared in the order they start; destroyed in reverse (HTTP, local clients, agent, control,
// moves, plane, peer service, engine, store, pool).
struct Daemon::Parts {
  std::optional<InstanceLock> instance_lock;  // released last: the node is gone by then
  NodeConfig config;
  std::optional<gpu::ChunkPool> pool;
  std::atomic<agent::WorkerAgent*> agent_ptr{nullptr};
  std::optional<ChunkStore> store;
  std::optional<Engine> engine;
  std::optional<PeerService> peers;  // answers peers' asks (the plane's on_ask); ends their holds
  std::unique_ptr<transfer::TransferPlane> plane;
  std::optional<PeerMoves> moves;
  std::optional<ControlHandler> control;
  std::unique_ptr<agent::WorkerAgent> agent;
  std::unique_ptr<LocalService> local;
  // /health, /ready and /metrics: a probe must be answered whatever other clients hold open.
  std::optional<httpd::Server> http;
  int http_port = -1;

  ~Parts() {
    if (http) http->stop();
    // A running move or retrieve ends at its next state (a move waiting out a destination's full
    // sync is woken), so neither the agent nor a local client waits for it below.
    if (moves) moves->stop();
    local.reset();  // aborts clients' unfinished writes
    agent_ptr = nullptr;
    agent.reset();  // answers or refuses its moves, flushes events, de-registers
    plane.reset();  // no peer ask or transfer after this
  }
};

// Prometheus text: what an SRE watches on a node.
std::string metrics_text(const Daemon::Parts& p);
// /health and /ready: "registered" and, until then, why not.
std::string health_json(const Daemon::Parts& p, bool readiness);

}  // namespace kvnode::node
