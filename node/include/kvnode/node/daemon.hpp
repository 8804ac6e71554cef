// The kvnode daemon as a library: from a NodeConfig it assembles the node (chunk pool, store,
// engine, transfer plane at p2p_host:p2p_init_ports[rank], cross-node moves, worker agent
// registered with the controller, the local client socket) and serves /health and /metrics over
// HTTP. tools/kvnode is a
// thin main over it; tests start it in-process or as a process.
#pragma once

#include <memory>
#include <string>

#include "kvnode/common/result.hpp"
#include "kvnode/node/node_config.hpp"

namespace kvnode::node {

struct DaemonPorts {
  int worker = -1;    // REP (control requests)
  int transfer = -1;  // the transfer plane (peer_init_url's port)
  int http = -1;      // -1: off
};

class Daemon {
 public:
  static Result<std::unique_ptr<Daemon>> start(const NodeConfig& config);
  ~Daemon();  // de-registers, stops the plane, frees the pool
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  DaemonPorts ports() const;
  std::string peer_init_url() const;
  std::string local_socket() const;  // the local client socket's path; "" when off
  std::string metrics() const;       // Prometheus text, as /metrics serves it

  struct Parts;

 private:
  explicit Daemon(std::unique_ptr<Parts> parts);
  std::unique_ptr<Parts> parts_;
};

}  // namespace kvnode::node
