#include "transfer_bench.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>

#include "baselines.hpp"
#include "kvnode/gpu/chunk_pool.hpp"
#include "kvnode/gpu/cuda_ipc.hpp"
#include "kvnode/transfer/plane.hpp"
#include "processes.hpp"

extern char** environ;

namespace kvnode::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::seconds kSameHostWarmup{1};

// `kvbench serve` in a child process, with the group's UCX_TLS; stopped and reaped when done.
class ServedPeer {
 public:
  ServedPeer(const GroupSpec& g, std::size_t pages)
      : file_(fresh_file()), env_(env_of(g)), child_(argv(g, pages, file_), &env_) {
    for (auto until = Clock::now() + std::chrono::seconds(30);
         child_.started() && Clock::now() < until;
         std::this_thread::sleep_for(std::chrono::milliseconds(10))) {
      std::ifstream in(file_);
      if (in >> url_) break;
      if (!child_.alive()) break;
    }
  }
  ~ServedPeer() { std::remove(file_.c_str()); }
  const std::string& url() const { return url_; }

 private:
  static std::vector<std::string> argv(const GroupSpec& g, std::size_t pages,
                                       const std::string& file) {
    std::vector<std::string> a = {g.self,          "serve",
                                  "--port-file",   file,
                                  "--chunk-bytes", std::to_string(g.chunk_bytes),
                                  "--pages",       std::to_string(pages),
                                  "--pool",        std::string(gpu::to_string(g.setup.pool))};
    if (g.setup.stage) a.push_back("--stage");
    if (g.setup.same_host) a.push_back("--same-host");
    if (g.setup.copy_threads != 0) {
      a.push_back("--copy-threads");
      a.push_back(std::to_string(g.setup.copy_threads));
    }
    return a;
  }
  static std::string fresh_file() {
    std::string f =
        "/tmp/kvbench-peer-" + std::to_string(getpid()) + "-" + std::to_string(counter_++);
    std::remove(f.c_str());
    return f;
  }
  static std::vector<std::string> env_of(const GroupSpec& g) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "UCX_TLS=", 8) != 0 && std::strncmp(*e, "UCX_NET_DEVICES=", 16) != 0)
        env.emplace_back(*e);
    if (!g.tls.empty()) env.push_back("UCX_TLS=" + g.tls);
    if (tcp_only(g.tls)) env.push_back("UCX_NET_DEVICES=lo");
    return env;
  }

  static inline int counter_ = 0;
  std::string file_;
  std::vector<std::string> env_;
  Child child_;
  std::string url_;
};

// A pool as the setup asks (shareable for same-host moves), every byte written before timing so
// no page fault lands in a measured transfer.
Result<gpu::ChunkPool> make_pool(std::size_t chunk_bytes, std::size_t pages, const PlaneSetup& s,
                                 int fill) {
  gpu::PoolOptions po;
  po.page_bytes = chunk_bytes;
  po.pages = pages;
  po.region.kind = s.pool;
  po.region.shareable = s.same_host;
  Result<gpu::ChunkPool> pool = gpu::ChunkPool::create(po);
  if (!pool) return pool.error();
  const gpu::MemoryRegion& r = pool->region();
  if (r.kind() == gpu::MemoryKind::kDevice) {
    if (Status st = gpu::cuda_fill(r.data(), fill, r.size()); !st) return st.error();
  } else {
    std::memset(r.data(), fill, r.size());
  }
  return pool;
}

void apply(const PlaneSetup& s, transfer::PlaneOptions& options) {
  options.stage_through_host = s.stage;
  options.same_host = s.same_host ? transfer::SameHost::kAuto : transfer::SameHost::kOff;
  options.copy_threads = s.copy_threads;
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ",") + p;
  return out;
}

PointResult run_point(transfer::TransferPlane& plane, const std::string& peer,
                      const PointSpec& spec, const GroupSpec& g) {
  PointResult out;
  out.spec = spec;
  // Scattered pages, one UCX operation per chunk: the honest case (adjacent pages coalesce).
  std::vector<transfer::PageCopy> pages;
  for (std::size_t i = 0; i < spec.batch; ++i)
    pages.push_back({static_cast<gpu::PageId>(i), static_cast<gpu::PageId>(spec.batch - 1 - i)});
  auto once = [&]() -> std::optional<transfer::TransferResult> {
    transfer::TransferOptions o;
    o.deadline = std::chrono::seconds(60);
    transfer::TransferResult r =
        spec.pull ? plane.pull(peer, pages, o).get() : plane.push(peer, pages, o).get();
    if (!r.ok()) {
      out.error = std::string(transfer::to_string(r.failure)) + ": " + r.message;
      return std::nullopt;
    }
    return r;
  };
  for (int i = 0; i < 2; ++i)
    if (!once()) return out;
  // Same-host: the plane maps the peer's pool on its first moves and may carry them over UCX
  // meanwhile; warm up until one went same-host (bounded), so the row measures the settled path.
  // A plane that never gets there shows it in the path column and the status line.
  if (g.setup.same_host)
    for (const auto until = Clock::now() + kSameHostWarmup; Clock::now() < until;) {
      const std::uint64_t before = plane.counters().bytes_same_host;
      if (!once()) return out;
      if (plane.counters().bytes_same_host > before) break;
    }
  // What the measured transfers went by, in the order first seen: more than one when the path
  // changed during the point (e.g. the first over UCX while the peer's pool was being mapped).
  std::vector<std::string> protocols, transports;
  auto note = [](std::vector<std::string>& seen, std::string v) {
    if (std::find(seen.begin(), seen.end(), v) == seen.end()) seen.push_back(std::move(v));
  };
  std::vector<double> latencies;
  const auto start = Clock::now();
  while (latencies.size() < g.max_iterations &&
         (latencies.size() < 3 || Clock::now() - start < g.budget)) {
    const auto t0 = Clock::now();
    const std::optional<transfer::TransferResult> r = once();
    if (!r) return out;
    latencies.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    note(protocols, transfer::to_string(r->stats.protocol));
    note(transports, r->stats.transport);
  }
  out.protocol = join(protocols);
  out.transport = join(transports);
  // Rates from the median batch: one stall on this shared machine must not move the figure.
  out.iterations = latencies.size();
  out.p50_us = percentile(latencies, 0.5);
  out.p99_us = percentile(latencies, 0.99);
  out.gbps = static_cast<double>(spec.batch * spec.chunk_bytes) / out.p50_us / 1e3;
  out.chunks_per_s = static_cast<double>(spec.batch) / out.p50_us * 1e6;
  return out;
}

}  // namespace

std::vector<PointResult> run_group(const GroupSpec& g) {
  const std::size_t pages = *std::max_element(g.batches.begin(), g.batches.end());
  std::vector<PointResult> results;
  auto fail_all = [&](const std::string& why) {
    for (std::size_t b : g.batches)
      for (bool pull : g.ops) {
        PointResult r;
        r.spec = PointSpec{g.tls, g.chunk_bytes, b, pull, g.protocol};
        r.error = why;
        results.push_back(r);
      }
    return results;
  };
  Result<gpu::ChunkPool> pool = make_pool(g.chunk_bytes, pages, g.setup, 0x5A);
  if (!pool) return fail_all(pool.error().message);
  transfer::PlaneOptions options;
  apply(g.setup, options);
  if (!g.tls.empty()) options.tls = g.tls;
  if (tcp_only(g.tls)) options.net_devices = "lo";
  Result<transfer::Protocol> protocol = transfer::parse_protocol(g.protocol);
  if (!protocol) return fail_all(protocol.error().message);
  options.protocol = *protocol;
  ServedPeer peer(g, pages);  // outlives the plane: no "peer lost" at the end
  if (peer.url().empty()) return fail_all("the serving child did not start");
  auto plane = transfer::TransferPlane::start(options, *pool);
  if (!plane) return fail_all(plane.error().message);
  for (std::size_t b : g.batches)
    for (bool pull : g.ops) {
      results.push_back(
          run_point(**plane, peer.url(), PointSpec{g.tls, g.chunk_bytes, b, pull, g.protocol}, g));
      results.back().same_host_status = (*plane)->same_host_status();
    }
  return results;
}

int serve(const ServeSpec& spec) {
  Result<gpu::ChunkPool> pool = make_pool(spec.chunk_bytes, spec.pages, spec.setup, 0xA5);
  if (!pool) {
    std::fprintf(stderr, "kvbench serve: %s\n", pool.error().message.c_str());
    return 1;
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before the plane's thread starts
  // A kvbench killed mid-run (Ctrl-C, a timeout) takes its serving child along.
  const pid_t parent = getppid();
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) return 0;
  transfer::PlaneOptions options;
  apply(spec.setup, options);
  auto plane = transfer::TransferPlane::start(options, *pool);
  if (!plane) {
    std::fprintf(stderr, "kvbench serve: %s\n", plane.error().message.c_str());
    return 1;
  }
  {
    std::ofstream out(spec.port_file + ".tmp");
    out << (*plane)->url() << "\n";
  }
  std::rename((spec.port_file + ".tmp").c_str(), spec.port_file.c_str());
  int sig = 0;
  sigwait(&set, &sig);
  return 0;
}

}  // namespace kvnode::bench
