// UCX discovery. The transfer plane moves chunks with UCX; this probe reports the UCX library
// version, the transport resources a UCP context would use on this host (e.g. "tcp/eth0",
// "cma/memory", "rc_mlx5/mlx5_0:1") and the memory types it can move (host, cuda, ...).
// It never aborts: if UCX cannot start, `note` says why.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvnode::transfer {

struct UcxProbe {
  std::string version;                    // "1.13.1"
  std::vector<std::string> transports;    // "transport/device", or the UCX_TLS value
  std::vector<std::string> memory_types;  // "host", "cuda", "cuda-managed", "rocm", ...
  std::uint64_t memory_type_mask = 0;     // the same as UCX's bitmap (device_path.hpp); 0: unknown
  std::string note;                       // problems met while probing, empty when none
};

UcxProbe probe_ucx();

// UCX's names of the memory types in a ucp_context_query bitmap, in UCX's order.
std::vector<std::string> ucx_memory_type_names(std::uint64_t mask);

}  // namespace kvnode::transfer
