// kvbench engine: the engine KV path end to end (issue 21). Starts kvcontroller and one kvnode
// (the binaries beside kvbench) with Llama-3.1-8B's KV shape (32 layers, 8 KV heads of 128 bf16,
// 256-token chunks of 32 MiB), registers a vLLM flash-attn paged KV cache with it (a host memfd
// for a host pool; GPU memory shared by CUDA IPC for pinned and device pools) and times store
// (every chunk in one call, from a random block table) and load (into another random block
// table) next to the plain copy of the same bytes measured in the same run: single-thread memcpy
// (host pool), d2h and h2d (pinned pool), d2d (device pool). Every byte is checked once, and
// p50/p99 of one-chunk stores are measured too.
#pragma once

#include <cstddef>
#include <string>

namespace kvnode::bench {

struct EngineBenchSpec {
  std::string self;             // this executable: kvcontroller and kvnode are beside it
  std::string memory = "host";  // the node's pool: host, pinned, device, or all this host has
  std::size_t tokens = 16384;   // per store and load; a multiple of the 256-token chunk
  std::size_t iterations = 5;   // stores and loads timed; the median is reported
  bool json = false;
};

// Prints the results; returns the process exit code (1 when a check or an operation failed).
int run_engine_bench(const EngineBenchSpec& spec);

}  // namespace kvnode::bench
