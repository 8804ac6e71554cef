// The ceilings kvbench compares the plane with, measured in the same run: UCX's own perftest
// (server and client started here on loopback, same UCX_TLS) and single-thread memcpy.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace kvnode::bench {

struct PerftestResult {
  std::string test;  // ucp_put_bw, ucp_get, ucp_am_bw, tag_bw
  double gbps = 0;   // 1e9 bytes per second
};

// Whether a UCX_TLS value leaves tcp as the only way between two processes (then both kvbench's
// planes and ucx_perftest are pinned to loopback with UCX_NET_DEVICES=lo).
bool tcp_only(const std::string& tls);

// Runs each test at `bytes` per message and returns those that ran; `tls` empty: UCX's default.
std::vector<PerftestResult> run_perftest(const std::string& tls, std::size_t bytes,
                                         const std::vector<std::string>& tests);
// The tests worth comparing for a transport: one-sided where RMA is native, AM/tag over tcp.
std::vector<std::string> perftest_candidates(const std::string& tls);

// Median of `rounds` memcpy calls of `bytes` between two prefaulted buffers, in GB/s.
double memcpy_gbps(std::size_t bytes, int rounds);

}  // namespace kvnode::bench
