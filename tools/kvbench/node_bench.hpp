// kvbench node: the whole node, end to end. Starts kvcontroller and two kvnode processes on
// loopback (the binaries beside kvbench), loads chunks into node A through the local client API,
// then measures (1) moves through the controller's orchestrator API (HTTP /move, call to
// completion) A -> B and back, next to the raw transfer plane pushing the same chunks between two
// processes in the same run; (2) P2P retrieve latency at B (controller lookup, lease, pull,
// commit) for 1 and for 64 chunks, with B cleared before each.
#pragma once

#include <cstddef>
#include <string>

namespace kvnode::bench {

struct NodeBenchSpec {
  std::string self;  // this executable: kvcontroller and kvnode are beside it
  std::string tls;   // UCX_TLS for the nodes and the raw plane; empty: UCX's default
  std::size_t chunk_bytes = 2 << 20;
  std::size_t chunks = 64;      // per move
  std::size_t iterations = 10;  // moves each way, retrieves per size
  // The nodes' --same-host (on by default: two nodes of one host copy between their pools); the
  // raw plane baseline moves the same way, so the ratio is what the node adds to the plane.
  bool same_host = true;
  bool json = false;
  int base_port = 19400;  // kvcontroller and the nodes use ports from here
};

// Prints the results; returns the process exit code.
int run_node_bench(const NodeBenchSpec& spec);

}  // namespace kvnode::bench
