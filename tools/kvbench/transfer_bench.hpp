// kvbench transfer: the plane's throughput and latency per transport, chunk size, batch and
// direction, between this process and a `kvbench serve` child on loopback. With same_host both
// planes map each other's pools (memfd or CUDA IPC) instead of going through UCX.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "kvnode/gpu/memory_region.hpp"

namespace kvnode::bench {

struct PointSpec {
  std::string tls;  // UCX_TLS for both processes; empty: UCX's default (shm + cma on one host)
  std::size_t chunk_bytes = 2 << 20;
  std::size_t batch = 8;
  bool pull = true;
  std::string protocol = "auto";  // auto, rma, am
};

struct PointResult {
  PointSpec spec;
  double gbps = 0;
  double chunks_per_s = 0;
  double p50_us = 0;
  double p99_us = 0;
  std::size_t iterations = 0;
  std::string protocol;          // what the plane chose
  std::string transport;         // what carried the bytes: a UCX transport, or "memfd" same-host
  std::string same_host_status;  // this side's plane: TransferPlane::same_host_status()
  std::string error;             // empty when the point ran
};

// How both processes' planes and pools are set up (the child gets the same on its command line).
struct PlaneSetup {
  bool stage = false;  // both pools through a staging ring (memcpy standing in for CUDA)
  // Same-host moves on (PlaneOptions::same_host kAuto, pools allocated shareable); off: kOff
  // and pools as a node without it makes them, so every byte goes through UCX.
  bool same_host = false;
  std::size_t copy_threads = 0;  // PlaneOptions::copy_threads (0: the plane's default)
  gpu::MemoryKind pool = gpu::MemoryKind::kHost;
};

struct GroupSpec {
  std::string self;  // this executable, to start the serving child
  std::string tls;
  std::size_t chunk_bytes = 0;
  std::vector<std::size_t> batches;
  std::vector<bool> ops;  // true: pull
  std::string protocol = "auto";
  PlaneSetup setup;
  std::size_t max_iterations = 100;
  std::chrono::milliseconds budget{1500};  // per point, after at least 3 iterations
};

// One serving child for the whole group; points run one after another.
std::vector<PointResult> run_group(const GroupSpec& group);

// The child side: a plane over a pool of `pages` chunks, url written to port_file, serves until
// SIGTERM.
struct ServeSpec {
  std::string port_file;
  std::size_t chunk_bytes = 0;
  std::size_t pages = 1;
  PlaneSetup setup;
};
int serve(const ServeSpec& spec);

}  // namespace kvnode::bench
