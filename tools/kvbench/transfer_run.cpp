#include "transfer_run.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "baselines.hpp"
#include "kvnode/gpu/device_probe.hpp"
#include "kvnode/gpu/parallel_copy.hpp"
#include "transfer_bench.hpp"

namespace kvnode::bench {
namespace {

std::string size_text(std::size_t bytes) {
  if (bytes % (1 << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes % (1 << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

struct Baseline {
  double gbps = 0;
  std::string test;
};

// The bytes one perftest message has to carry to stand for a batch (kBatchMessageMaxBytes at most).
std::size_t batch_message_bytes(std::size_t chunk_bytes, std::size_t batch) {
  return std::min(chunk_bytes * batch, kBatchMessageMaxBytes);
}

// What the rows are compared with, all measured before the first group runs.
struct Ceilings {
  double memcpy = 0;          // one thread, kMemcpyBytes
  double memcpy_threads = 0;  // same-host: the copy threads' count of threads, kMemcpyBytes
  // ucx_perftest's best candidate by (tls, message bytes): a chunk per message, or a batch's
  // bytes; one size measured once serves both.
  std::map<std::pair<std::string, std::size_t>, Baseline> perftest;
  std::map<std::size_t, double> device_copy;  // device pools: by a batch's bytes
};

// The row's own ceiling: device-to-device copy for device pools, memcpy with the copy threads
// for same-host moves, single-thread memcpy otherwise.
struct RowCeiling {
  const char* kind = "memcpy";  // the JSON name
  double gbps = 0;
};

GroupSpec group_of(const TransferBenchSpec& s, const PlaneSetup& setup, std::string tls,
                   std::size_t chunk_bytes) {
  GroupSpec g;
  g.self = s.self;
  g.tls = tls == "default" ? std::string() : std::move(tls);
  g.chunk_bytes = chunk_bytes;
  g.protocol = s.protocol;
  g.setup = setup;
  if (s.quick || s.table) {
    g.max_iterations = s.quick ? 20 : 200;
    g.budget = std::chrono::milliseconds(s.quick ? 250 : 2000);
  } else {
    g.batches = {s.batch};
    g.ops = {s.op == "pull"};
    g.max_iterations = s.iterations;
    g.budget = std::chrono::seconds(3600);
  }
  return g;
}

std::vector<GroupSpec> groups_of(const TransferBenchSpec& s, const PlaneSetup& setup) {
  std::vector<GroupSpec> groups;
  if (!s.quick && !s.table) {
    groups.push_back(group_of(s, setup, s.tls, s.chunk_bytes));
    return groups;
  }
  constexpr std::size_t kKiB = 1 << 10, kMiB = 1 << 20;
  if (setup.same_host) {
    // Same-host moves: UCX only says hello, so one tls; the sizes where bandwidth matters.
    for (const std::size_t c : {2 * kMiB, 32 * kMiB}) {
      GroupSpec g = group_of(s, setup, "default", c);
      g.batches = {8, 64};
      g.ops = {true, false};
      groups.push_back(g);
    }
    return groups;
  }
  for (const std::string t : {"tcp", "default"})
    for (const std::size_t c : {256 * kKiB, 2 * kMiB, 32 * kMiB}) {
      GroupSpec g = group_of(s, setup, t, c);
      g.batches = {1, 8, 64};
      g.ops = {true, false};
      groups.push_back(g);
    }
  return groups;
}

bool with_perftest(const PlaneSetup& setup) {
  return !setup.same_host || setup.pool == gpu::MemoryKind::kHost;
}

Baseline best_perftest(const std::string& tls, std::size_t bytes, bool batch,
                       std::vector<std::string> tests) {
  Baseline best;
  const std::vector<PerftestResult> runs =
      batch
          ? run_perftest(tls, bytes, tests, batch_perftest_iterations(bytes), kBatchPerftestWarmup)
          : run_perftest(tls, bytes, tests);
  for (const PerftestResult& r : runs)
    if (r.gbps > best.gbps) best = {r.gbps, r.test};
  return best;
}

Ceilings measure(const TransferBenchSpec& s, const PlaneSetup& setup,
                 const std::vector<GroupSpec>& groups, std::size_t threads) {
  Ceilings c;
  const int rounds = s.quick ? 3 : 7;
  c.memcpy = memcpy_gbps(kMemcpyBytes, rounds);
  // More rounds for the same-host ceiling: ~20 ms each, and it is the only one those rows have.
  if (setup.same_host)
    c.memcpy_threads = memcpy_gbps_threads(kMemcpyBytes, threads, s.quick ? 9 : 15);
  if (setup.pool == gpu::MemoryKind::kDevice)
    for (const GroupSpec& g : groups)
      for (std::size_t b : g.batches) {
        const std::size_t bytes = batch_message_bytes(g.chunk_bytes, b);
        if (c.device_copy.count(bytes)) continue;
        Result<double> d = device_copy_gbps(bytes, rounds);
        if (!d)
          std::fprintf(stderr, "kvbench transfer: device copy of %s: %s\n",
                       size_text(bytes).c_str(), d.error().message.c_str());
        c.device_copy[bytes] = d ? *d : 0;
      }
  // Same-host host pools stand where UCX's shared memory did: perftest's shared-memory figure
  // (a mapped memcpy of UCX's own buffers) is their ceiling too. Device pools: the device copy.
  if (!with_perftest(setup)) return c;
  for (const GroupSpec& g : groups)
    if (!c.perftest.count({g.tls, g.chunk_bytes}))
      c.perftest[{g.tls, g.chunk_bytes}] =
          best_perftest(g.tls, g.chunk_bytes, false, perftest_candidates(g.tls));
  for (const GroupSpec& g : groups)
    for (std::size_t b : g.batches) {
      const std::size_t bytes = batch_message_bytes(g.chunk_bytes, b);
      if (c.perftest.count({g.tls, bytes})) continue;
      // --quick: only the test that won per chunk, to keep the run short (one 2 GiB message
      // test over tcp takes 10-15 s on a 2-core VM); --table and single points try each.
      const std::string& won = c.perftest[{g.tls, g.chunk_bytes}].test;
      c.perftest[{g.tls, bytes}] = best_perftest(
          g.tls, bytes, true,
          s.quick && !won.empty() ? std::vector<std::string>{won} : perftest_candidates(g.tls));
    }
  return c;
}

void print_line(const nlohmann::json& j) {
  std::printf("%s\n", j.dump().c_str());
}

std::string perftest_text(const Baseline& b) {
  return b.gbps > 0 ? std::to_string(b.gbps).substr(0, 5) + " " + b.test : "n/a";
}

}  // namespace

int run_transfer_bench(const TransferBenchSpec& s) {
  PlaneSetup setup;
  setup.stage = s.stage;
  setup.same_host = s.same_host;
  setup.copy_threads = s.copy_threads;
  Result<gpu::MemoryKind> kind = gpu::parse_memory_kind(s.pool);
  if (!kind) {
    std::fprintf(stderr, "kvbench transfer: --pool: %s\n", kind.error().message.c_str());
    return 2;
  }
  setup.pool = *kind;
  if (setup.pool != gpu::MemoryKind::kHost) {
    const gpu::CudaProbe cuda = gpu::probe_cuda();
    if (cuda.devices.empty()) {
      std::fprintf(stderr, "kvbench transfer: --pool %s needs a CUDA GPU: %s\n", s.pool.c_str(),
                   cuda.note.c_str());
      return 2;
    }
  }
  const std::size_t threads = s.copy_threads ? s.copy_threads : gpu::default_copy_threads();
  const std::vector<GroupSpec> groups = groups_of(s, setup);
  const Ceilings c = s.baselines ? measure(s, setup, groups, threads) : Ceilings{};
  const bool device = setup.pool == gpu::MemoryKind::kDevice;
  const std::string ceiling_name = device            ? "d2d"
                                   : setup.same_host ? "memcpy x" + std::to_string(threads)
                                                     : "memcpy";

  if (s.json) {
    if (c.memcpy > 0) print_line({{"kind", "memcpy"}, {"bytes", kMemcpyBytes}, {"gbps", c.memcpy}});
    if (c.memcpy_threads > 0)
      print_line({{"kind", "memcpy_threads"},
                  {"bytes", kMemcpyBytes},
                  {"threads", threads},
                  {"gbps", c.memcpy_threads}});
    for (const auto& [bytes, gbps] : c.device_copy)
      print_line({{"kind", "device_copy"}, {"bytes", bytes}, {"gbps", gbps}});
  } else {
    std::printf("pools: %s; same-host moves: %s\n", s.pool.c_str(),
                setup.same_host ? ("auto, copy threads " + std::to_string(threads)).c_str()
                                : "off (every byte through UCX)");
    if (c.memcpy > 0) std::printf("memcpy, one thread, 256 MiB: %.2f GB/s\n", c.memcpy);
    if (c.memcpy_threads > 0)
      std::printf("memcpy, %zu thread%s (as the copy threads), 256 MiB: %.2f GB/s\n", threads,
                  threads == 1 ? "" : "s", c.memcpy_threads);
    for (const auto& [bytes, gbps] : c.device_copy)
      std::printf("device-to-device copy, %s: %.2f GB/s\n", size_text(bytes).c_str(), gbps);
    const std::string last = "/" + ceiling_name;
    std::printf("%-8s %-4s %-8s %5s %-14s %8s %10s %10s %10s", "tls", "op", "chunk", "batch",
                "path", "GB/s", "chunks/s", "p50 us", "p99 us");
    if (with_perftest(setup))
      std::printf(" %18s %6s %18s %6s", "perftest/chunk", "ratio", "perftest/batch", "ratio");
    std::printf(" %10s\n", last.c_str());
  }

  int failures = 0;
  std::set<std::string> statuses;
  for (const GroupSpec& g : groups) {
    for (const PointResult& r : run_group(g)) {
      const std::string t = r.spec.tls.empty() ? "default" : r.spec.tls;
      const std::size_t batch_bytes = batch_message_bytes(r.spec.chunk_bytes, r.spec.batch);
      auto perftest_at = [&](std::size_t bytes) {
        const auto it = c.perftest.find({g.tls, bytes});
        return it == c.perftest.end() ? Baseline{} : it->second;
      };
      const Baseline chunk = perftest_at(r.spec.chunk_bytes);
      const Baseline batch = perftest_at(batch_bytes);
      auto ratio = [&](double base) { return base > 0 ? r.gbps / base : 0; };
      RowCeiling ceiling{"memcpy", c.memcpy};
      if (device) {
        const auto it = c.device_copy.find(batch_bytes);
        ceiling = {"device_copy", it == c.device_copy.end() ? 0 : it->second};
      } else if (setup.same_host) {
        ceiling = {"memcpy_threads", c.memcpy_threads};
      }
      if (!r.same_host_status.empty()) statuses.insert(r.same_host_status);
      if (!r.error.empty()) ++failures;
      if (s.json) {
        nlohmann::json j{{"kind", "transfer"},
                         {"tls", t},
                         {"op", r.spec.pull ? "pull" : "push"},
                         {"chunk_bytes", r.spec.chunk_bytes},
                         {"batch", r.spec.batch},
                         {"gbps", r.gbps},
                         {"chunks_per_s", r.chunks_per_s},
                         {"p50_us", r.p50_us},
                         {"p99_us", r.p99_us},
                         {"iterations", r.iterations},
                         {"protocol", r.protocol},
                         {"transport", r.transport},
                         {"pool", s.pool},
                         {"same_host", setup.same_host},
                         {"same_host_status", r.same_host_status},
                         {"copy_threads", setup.same_host ? threads : 0},
                         // perftest_* and ratio_perftest: the per-chunk figure, as before.
                         {"perftest_test", chunk.test},
                         {"perftest_gbps", chunk.gbps},
                         {"ratio_perftest", ratio(chunk.gbps)},
                         {"perftest_chunk_test", chunk.test},
                         {"perftest_chunk_gbps", chunk.gbps},
                         {"ratio_perftest_chunk", ratio(chunk.gbps)},
                         {"perftest_batch_bytes", batch_bytes},
                         {"perftest_batch_test", batch.test},
                         {"perftest_batch_gbps", batch.gbps},
                         {"ratio_perftest_batch", ratio(batch.gbps)},
                         {"ratio_memcpy", ratio(c.memcpy)},
                         {"ceiling", ceiling.kind},
                         {"ceiling_gbps", ceiling.gbps},
                         {"ratio_ceiling", ratio(ceiling.gbps)}};
        if (!r.error.empty()) j["error"] = r.error;
        print_line(j);
      } else if (!r.error.empty()) {
        std::printf("%-8s %-4s %-8s %5zu failed: %s\n", t.c_str(), r.spec.pull ? "pull" : "push",
                    size_text(r.spec.chunk_bytes).c_str(), r.spec.batch, r.error.c_str());
      } else {
        const std::string path = r.protocol + "/" + r.transport;
        std::printf("%-8s %-4s %-8s %5zu %-14s %8.2f %10.0f %10.0f %10.0f", t.c_str(),
                    r.spec.pull ? "pull" : "push", size_text(r.spec.chunk_bytes).c_str(),
                    r.spec.batch, path.c_str(), r.gbps, r.chunks_per_s, r.p50_us, r.p99_us);
        if (with_perftest(setup))
          std::printf(" %18s %6.2f %18s %6.2f", perftest_text(chunk).c_str(), ratio(chunk.gbps),
                      perftest_text(batch).c_str(), ratio(batch.gbps));
        std::printf(" %10.2f\n", ratio(ceiling.gbps));
      }
      std::fflush(stdout);
    }
  }
  if (!s.json && setup.same_host)
    for (const std::string& st : statuses) std::printf("same-host (this side): %s\n", st.c_str());
  return failures ? 1 : 0;
}

}  // namespace kvnode::bench
