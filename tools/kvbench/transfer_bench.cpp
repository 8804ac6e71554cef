#include "transfer_bench.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>

#include "baselines.hpp"
#include "kvnode/gpu/chunk_pool.hpp"
#include "kvnode/transfer/plane.hpp"
#include "processes.hpp"

extern char** environ;

namespace kvnode::bench {
namespace {

using Clock = std::chrono::steady_clock;

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
                                  "--pages",       std::to_string(pages)};
    if (g.stage) a.push_back("--stage");
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
    if (auto r = once()) {
      out.protocol = transfer::to_string(r->stats.protocol);
      out.transport = r->stats.transport;
    } else {
      return out;
    }
  std::vector<double> latencies;
  const auto start = Clock::now();
  while (latencies.size() < g.max_iterations &&
         (latencies.size() < 3 || Clock::now() - start < g.budget)) {
    const auto t0 = Clock::now();
    if (!once()) return out;
    latencies.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
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
  gpu::PoolOptions po;
  po.page_bytes = g.chunk_bytes;
  po.pages = pages;
  Result<gpu::ChunkPool> pool = gpu::ChunkPool::create(po);
  if (!pool) return fail_all(pool.error().message);
  std::memset(pool->region().data(), 0x5A, pool->region().size());  // fault it in before timing
  transfer::PlaneOptions options;
  if (!g.tls.empty()) options.tls = g.tls;
  if (tcp_only(g.tls)) options.net_devices = "lo";
  Result<transfer::Protocol> protocol = transfer::parse_protocol(g.protocol);
  if (!protocol) return fail_all(protocol.error().message);
  options.protocol = *protocol;
  options.stage_through_host = g.stage;
  ServedPeer peer(g, pages);  // outlives the plane: no "peer lost" at the end
  if (peer.url().empty()) return fail_all("the serving child did not start");
  auto plane = transfer::TransferPlane::start(options, *pool);
  if (!plane) return fail_all(plane.error().message);
  for (std::size_t b : g.batches)
    for (bool pull : g.ops)
      results.push_back(
          run_point(**plane, peer.url(), PointSpec{g.tls, g.chunk_bytes, b, pull, g.protocol}, g));
  return results;
}

int serve(const std::string& port_file, std::size_t chunk_bytes, std::size_t pages, bool stage) {
  gpu::PoolOptions po;
  po.page_bytes = chunk_bytes;
  po.pages = pages;
  Result<gpu::ChunkPool> pool = gpu::ChunkPool::create(po);
  if (!pool) {
    std::fprintf(stderr, "kvbench serve: %s\n", pool.error().message.c_str());
    return 1;
  }
  std::memset(pool->region().data(), 0xA5, pool->region().size());
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before the plane's thread starts
  transfer::PlaneOptions options;
  options.stage_through_host = stage;
  auto plane = transfer::TransferPlane::start(options, *pool);
  if (!plane) {
    std::fprintf(stderr, "kvbench serve: %s\n", plane.error().message.c_str());
    return 1;
  }
  {
    std::ofstream out(port_file + ".tmp");
    out << (*plane)->url() << "\n";
  }
  std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  int sig = 0;
  sigwait(&set, &sig);
  return 0;
}

}  // namespace kvnode::bench
