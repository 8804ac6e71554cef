// Whether workers' ports accept a TCP connection: how the reaper tells a worker without a
// heartbeat contract (LMCache's default) that is alive from one that died or never existed.
#pragma once

#include <chrono>
#include <vector>

#include "kvnode/controller/registry.hpp"

namespace kvnode::controller {

// Connects to each endpoint's ip:port (at most a few hundred sockets open at once) and closes
// at once; reachable when the connection was accepted within `timeout`.
std::vector<ProbeOutcome> probe_ports(const std::vector<WorkerEndpoint>& endpoints,
                                      std::chrono::milliseconds timeout);

}  // namespace kvnode::controller
