#include "kvnode/controller/metrics.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string_view>

#include "kvnode/controller/registry.hpp"

namespace kvnode::controller {

// ---- LatencyHistogram: relaxed atomics only, so observing never blocks a lookup ----

void LatencyHistogram::observe(double seconds) noexcept {
  std::size_t bucket = kBounds.size();  // +Inf (also NaN)
  for (std::size_t i = 0; i < kBounds.size(); ++i) {
    if (seconds <= kBounds[i]) {
      bucket = i;
      break;
    }
  }
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  // Nanoseconds as an integer keep the sum lock-free; 2^64 ns is 584 years of latency.
  if (std::isfinite(seconds) && seconds > 0)
    sum_ns_.fetch_add(static_cast<std::uint64_t>(std::llround(std::min(seconds, 1e9) * 1e9)),
                      std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

std::array<std::uint64_t, LatencyHistogram::kBounds.size() + 1> LatencyHistogram::cumulative()
    const noexcept {
  std::array<std::uint64_t, kBounds.size() + 1> out{};
  std::uint64_t running = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    out[i] = running;
  }
  return out;
}

double LatencyHistogram::sum() const noexcept {
  return static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
}

std::uint64_t LatencyHistogram::count() const noexcept {
  return count_.load(std::memory_order_relaxed);
}

// ---- Prometheus text format 0.0.4 ----

namespace {

std::string format_double(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

class Writer {
 public:
  // One metric family with one unlabelled-or-labelled sample.
  template <class V>
  void family(std::string_view name, std::string_view type, std::string_view help,
              std::string_view labels, V value) {
    header(name, type, help);
    sample(name, labels, value);
  }
  void header(std::string_view name, std::string_view type, std::string_view help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  template <class V>
  void sample(std::string_view name, std::string_view labels, V value) {
    out_ += name;
    if (!labels.empty()) {
      out_ += '{';
      out_ += labels;
      out_ += '}';
    }
    out_ += ' ';
    if constexpr (std::is_floating_point_v<V>) {
      out_ += format_double(value);
    } else {
      out_ += std::to_string(value);
    }
    out_ += '\n';
  }
  void histogram(std::string_view name, std::string_view help, const LatencyHistogram& h) {
    header(name, "histogram", help);
    const auto cumulative = h.cumulative();
    const std::string bucket = std::string(name) + "_bucket";
    for (std::size_t i = 0; i < cumulative.size(); ++i) {
      const std::string le = i < LatencyHistogram::kBounds.size()
                                 ? format_double(LatencyHistogram::kBounds[i])
                                 : "+Inf";
      sample(bucket, "le=\"" + le + "\"", cumulative[i]);
    }
    // Count from the buckets, not count_: a scrape between the two increments must not show
    // _count below the +Inf bucket.
    sample(std::string(name) + "_sum", "", h.sum());
    sample(std::string(name) + "_count", "", cumulative.back());
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

std::uint64_t load(const std::atomic<std::uint64_t>& a) {
  return a.load(std::memory_order_relaxed);
}
int load(const std::atomic<int>& a) {
  return a.load(std::memory_order_relaxed);
}

}  // namespace

std::string render_prometheus(const Metrics& m, const RegistryStats& stats) {
  Writer w;
  // LMCache's gauges (all of them gauges upstream, counters included), same names and label.
  constexpr std::string_view kRole = "role=\"controller\"";
  const auto lm = [&](std::string_view name, std::string_view help, auto value) {
    const std::string full = "lmcache:cache_controller_" + std::string(name);
    w.family(full, "gauge", help, kRole, value);
  };
  lm("kv_pool_keys_count", "Number of (chunk, worker, location) keys in the KV pool", stats.keys);
  lm("registered_workers_count", "Number of registered workers", stats.workers);
  lm("pull_socket_message_count", "Messages received on the PULL socket", load(m.pull_messages));
  lm("reply_socket_message_count", "Messages received on the reply socket", load(m.reply_messages));
  lm("pull_socket_has_pending", "Whether the PULL socket had input queued at its last poll",
     load(m.pull_has_pending));
  lm("reply_socket_has_pending", "Whether the reply socket had input queued at its last poll",
     load(m.reply_has_pending));
  lm("pull_socket_active_requests", "PULL messages being handled now", load(m.pull_active));
  lm("reply_socket_active_requests", "Reply-socket requests being handled now",
     load(m.reply_active));
  lm("kv_op_seq_discontinuity_count", "KV operation batches with a sequence gap",
     stats.seq_discontinuities);
  lm("full_sync_workers_syncing", "Workers in a full sync now", stats.workers_syncing);
  lm("full_sync_workers_completed", "Workers whose full sync completed", stats.workers_completed);
  lm("full_sync_global_progress", "Full-sync progress over all workers (0.0-1.0)",
     stats.global_progress);
  lm("full_sync_missing_batches_total", "Full-sync batches still missing over syncing workers",
     stats.missing_batches);

  // kvnode's own.
  w.family("kvnode_controller_kv_ops_applied_total", "counter", "KV admit and evict ops applied",
           "", load(m.kv_ops_applied));
  w.family("kvnode_controller_kv_ops_discarded_total", "counter",
           "KV ops discarded (unknown worker, worker syncing)", "", load(m.kv_ops_discarded));
  w.header("kvnode_controller_bad_frames_total", "counter",
           "Frames that failed to decode or made no sense on their socket");
  w.sample("kvnode_controller_bad_frames_total", "socket=\"pull\"", load(m.pull_bad_frames));
  w.sample("kvnode_controller_bad_frames_total", "socket=\"reply\"", load(m.reply_bad_frames));
  w.sample("kvnode_controller_bad_frames_total", "socket=\"heartbeat\"",
           load(m.heartbeat_bad_frames));
  w.header("kvnode_controller_messages_total", "counter", "Messages taken off each socket");
  w.sample("kvnode_controller_messages_total", "socket=\"pull\"", load(m.pull_messages));
  w.sample("kvnode_controller_messages_total", "socket=\"reply\"", load(m.reply_messages));
  w.sample("kvnode_controller_messages_total", "socket=\"heartbeat\"", load(m.heartbeat_messages));
  w.family("kvnode_controller_workers_reaped_total", "counter",
           "Workers removed: no heartbeat, or (never heartbeated) their port refused a probe", "",
           load(m.workers_reaped));
  w.family("kvnode_controller_registrations_refused_total", "counter",
           "Registrations refused because max_workers were registered", "",
           load(m.registrations_refused));
  w.family("kvnode_controller_fanout_timeouts_total", "counter",
           "Per-worker control requests that missed their deadline", "", load(m.fanout_timeouts));
  w.family("kvnode_controller_http_requests_total", "counter", "HTTP requests served", "",
           load(m.http_requests));
  w.family("kvnode_controller_instances", "gauge", "Registered instances", "", stats.instances);
  w.family("kvnode_controller_index_memory_bytes", "gauge", "Memory held by the KV index", "",
           stats.index_memory_bytes);
  w.histogram("kvnode_controller_p2p_lookup_seconds",
              "BatchedP2PLookupMsg latency, receive to reply sent", m.p2p_lookup_latency);
  w.histogram("kvnode_controller_lookup_seconds", "Orchestrator lookup latency", m.lookup_latency);
  return w.take();
}

}  // namespace kvnode::controller
