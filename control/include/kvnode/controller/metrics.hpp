// Controller metrics for Prometheus. Counters and the lookup-latency histogram are lock-free
// atomics bumped on the hot paths; gauges that describe the registry are sampled at scrape time
// (RegistryStats) so the hot paths never pay for them. Rendering writes Prometheus text format
// 0.0.4: LMCache's names (prefix lmcache:cache_controller_, label role="controller") first, then
// kvnode's own (prefix kvnode_controller_).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace kvnode::controller {

struct RegistryStats;  // registry.hpp

// Latency histogram with fixed bucket bounds (seconds) from 10 us to 1 s.
class LatencyHistogram {
 public:
  static constexpr std::array<double, 12> kBounds = {1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4,
                                                     1e-3, 2.5e-3, 5e-3, 1e-2, 1e-1,   1.0};
  void observe(double seconds) noexcept;
  // Cumulative counts per bound plus +Inf, the sum in seconds and the count.
  std::array<std::uint64_t, kBounds.size() + 1> cumulative() const noexcept;
  double sum() const noexcept;
  std::uint64_t count() const noexcept;

 private:
  std::array<std::atomic<std::uint64_t>, kBounds.size() + 1> buckets_{};
  std::atomic<std::uint64_t> sum_ns_{0};
  std::atomic<std::uint64_t> count_{0};
};

struct Metrics {
  // Messages taken off each socket (LMCache's *_socket_message_count).
  std::atomic<std::uint64_t> pull_messages{0};
  std::atomic<std::uint64_t> reply_messages{0};
  std::atomic<std::uint64_t> heartbeat_messages{0};
  // Frames that failed to decode or made no sense on that socket; skipped, never fatal.
  std::atomic<std::uint64_t> pull_bad_frames{0};
  std::atomic<std::uint64_t> reply_bad_frames{0};
  std::atomic<std::uint64_t> heartbeat_bad_frames{0};
  // Whether a socket had input queued at its last poll, and requests being handled now.
  std::atomic<int> pull_has_pending{0};
  std::atomic<int> reply_has_pending{0};
  std::atomic<int> pull_active{0};
  std::atomic<int> reply_active{0};
  // KV ops applied (admit + evict) and discarded (unknown worker, worker syncing).
  std::atomic<std::uint64_t> kv_ops_applied{0};
  std::atomic<std::uint64_t> kv_ops_discarded{0};
  std::atomic<std::uint64_t> workers_reaped{0};
  std::atomic<std::uint64_t> registrations_refused{0};  // beyond max_workers
  std::atomic<std::uint64_t> fanout_timeouts{0};
  std::atomic<std::uint64_t> http_requests{0};
  LatencyHistogram p2p_lookup_latency;  // BatchedP2PLookupMsg, receive to reply sent
  LatencyHistogram lookup_latency;      // orchestrator LookupMsg / POST /lookup
};

// The whole /metrics body.
std::string render_prometheus(const Metrics& metrics, const RegistryStats& stats);

}  // namespace kvnode::controller
