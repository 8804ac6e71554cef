// The ceilings kvbench compares the plane with, measured in the same run: UCX's own perftest
// (server and client started here on loopback, same UCX_TLS), memcpy with one thread or as many
// as a same-host move copies with, and a device-to-device copy for device pools.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "kvnode/common/result.hpp"

namespace kvnode::bench {

struct PerftestResult {
  std::string test;  // ucp_put_bw, ucp_get, ucp_am_bw, tag_bw
  double gbps = 0;   // 1e9 bytes per second
};

// Whether a UCX_TLS value leaves tcp as the only way between two processes (then both kvbench's
// planes and ucx_perftest are pinned to loopback with UCX_NET_DEVICES=lo).
bool tcp_only(const std::string& tls);

// Runs each test at `bytes` per message and returns those that ran; `tls` empty: UCX's default.
// Without `iterations`, about 1 GiB moved (10 to 2000 messages) after a tenth as many warm-ups.
std::vector<PerftestResult> run_perftest(const std::string& tls, std::size_t bytes,
                                         const std::vector<std::string>& tests);
std::vector<PerftestResult> run_perftest(const std::string& tls, std::size_t bytes,
                                         const std::vector<std::string>& tests,
                                         std::size_t iterations, std::size_t warmup);

// perftest reuses one buffer per side, which the L3 holds up to its size, while a batch moves
// distinct chunks. The fair ceiling for a batch is one message of the batch's bytes: this many
// bytes at most (a larger batch is compared with a message of this size) ...
inline constexpr std::size_t kBatchMessageMaxBytes = std::size_t{2} << 30;
// ... sent often enough to move 2-4 GiB (at least twice), after 2 warm-ups.
std::size_t batch_perftest_iterations(std::size_t bytes);
inline constexpr std::size_t kBatchPerftestWarmup = 2;
// The tests worth comparing for a transport: one-sided where RMA is native, AM/tag over tcp.
std::vector<std::string> perftest_candidates(const std::string& tls);

// Median of `rounds` memcpy calls of `bytes` between two prefaulted buffers, in GB/s.
double memcpy_gbps(std::size_t bytes, int rounds);
// The same with `threads` threads (0 counts as 1), each copying its share of `bytes` between the
// two buffers, started together per round: the ceiling of a same-host move copied with as many.
// `bytes` of 256 MiB or more, so the buffers are well beyond any cache.
double memcpy_gbps_threads(std::size_t bytes, std::size_t threads, int rounds);
inline constexpr std::size_t kMemcpyBytes = std::size_t{256} << 20;

// Median GB/s of `rounds` device-to-device copies of `bytes` between two buffers on device 0,
// through gpu::make_cuda_copy_engine (cudaMemcpyAsync, completion polled): the ceiling for
// device pools. An error without a GPU.
Result<double> device_copy_gbps(std::size_t bytes, int rounds);

}  // namespace kvnode::bench
