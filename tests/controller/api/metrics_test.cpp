// Metrics rendering and the lock-free latency histogram.
#include "kvnode/controller/metrics.hpp"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "kvnode/controller/registry.hpp"

namespace kvnode::controller {
namespace {

TEST(LatencyHistogram, CountsCumulativelyWithPrometheusLeSemantics) {
  LatencyHistogram h;
  h.observe(1e-5);  // exactly on the first bound: counted there (le = less or equal)
  h.observe(3e-4);  // 5e-4 bucket
  h.observe(0.05);  // 0.1 bucket
  h.observe(2.0);   // +Inf only
  const auto c = h.cumulative();
  EXPECT_EQ(c[0], 1u);
  EXPECT_EQ(c[4], 1u);   // 2.5e-4
  EXPECT_EQ(c[5], 2u);   // 5e-4
  EXPECT_EQ(c[9], 2u);   // 1e-2
  EXPECT_EQ(c[10], 3u);  // 1e-1
  EXPECT_EQ(c[11], 3u);  // 1.0
  EXPECT_EQ(c[12], 4u);  // +Inf
  EXPECT_EQ(h.count(), 4u);
  EXPECT_NEAR(h.sum(), 1e-5 + 3e-4 + 0.05 + 2.0, 1e-8);
}

TEST(LatencyHistogram, ConcurrentObservationsAreAllCounted) {
  LatencyHistogram h;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) h.observe(1e-4);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(h.count(), 40000u);
  EXPECT_EQ(h.cumulative().back(), 40000u);
  EXPECT_NEAR(h.sum(), 4.0, 1e-6);
}

TEST(RenderPrometheus, HasEveryLmcacheGaugeAndKvnodeFamily) {
  Metrics m;
  m.pull_messages = 5;
  m.reply_bad_frames = 2;
  m.fanout_timeouts = 3;
  m.lookup_latency.observe(2e-3);
  RegistryStats s;
  s.keys = 10;
  s.workers = 2;
  s.instances = 1;
  s.seq_discontinuities = 4;
  s.global_progress = 0.5;
  s.missing_batches = 6;
  s.index_memory_bytes = 4096;
  const std::string text = render_prometheus(m, s);
  for (const char* name :
       {"kv_pool_keys_count", "registered_workers_count", "pull_socket_message_count",
        "reply_socket_message_count", "pull_socket_has_pending", "reply_socket_has_pending",
        "pull_socket_active_requests", "reply_socket_active_requests",
        "kv_op_seq_discontinuity_count", "full_sync_workers_syncing", "full_sync_workers_completed",
        "full_sync_global_progress", "full_sync_missing_batches_total"}) {
    const std::string full = std::string("lmcache:cache_controller_") + name;
    EXPECT_NE(text.find("# TYPE " + full + " gauge\n"), std::string::npos) << full;
    EXPECT_NE(text.find(full + "{role=\"controller\"} "), std::string::npos) << full;
  }
  for (const char* line :
       {"lmcache:cache_controller_kv_pool_keys_count{role=\"controller\"} 10\n",
        "lmcache:cache_controller_pull_socket_message_count{role=\"controller\"} 5\n",
        "lmcache:cache_controller_kv_op_seq_discontinuity_count{role=\"controller\"} 4\n",
        "lmcache:cache_controller_full_sync_global_progress{role=\"controller\"} 0.5\n",
        "lmcache:cache_controller_full_sync_missing_batches_total{role=\"controller\"} 6\n",
        "# TYPE kvnode_controller_kv_ops_applied_total counter\n",
        "kvnode_controller_bad_frames_total{socket=\"reply\"} 2\n",
        "kvnode_controller_bad_frames_total{socket=\"heartbeat\"} 0\n",
        "kvnode_controller_messages_total{socket=\"pull\"} 5\n",
        "kvnode_controller_fanout_timeouts_total 3\n",
        "kvnode_controller_workers_reaped_total 0\n",
        "kvnode_controller_http_requests_total 0\n",
        "kvnode_controller_instances 1\n",
        "kvnode_controller_index_memory_bytes 4096\n",
        "kvnode_controller_lookup_seconds_bucket{le=\"1e-05\"} 0\n",
        "kvnode_controller_lookup_seconds_bucket{le=\"0.0025\"} 1\n",
        "kvnode_controller_lookup_seconds_bucket{le=\"+Inf\"} 1\n",
        "kvnode_controller_lookup_seconds_count 1\n",
        "kvnode_controller_lookup_seconds_sum 0.002\n",
        "# HELP kvnode_controller_p2p_lookup_seconds ",
        "kvnode_controller_p2p_lookup_seconds_count 0\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  // Each family's HELP/TYPE appears once.
  EXPECT_EQ(text.find("# TYPE kvnode_controller_bad_frames_total"),
            text.rfind("# TYPE kvnode_controller_bad_frames_total"));
}

}  // namespace
}  // namespace kvnode::controller
