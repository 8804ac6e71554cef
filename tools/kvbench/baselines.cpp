#include "baselines.hpp"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include "kvnode/gpu/copy_engine.hpp"
#include "kvnode/gpu/cuda_ipc.hpp"
#include "processes.hpp"

extern char** environ;

namespace kvnode::bench {
bool tcp_only(const std::string& tls) {
  return !tls.empty() && tls.find("tcp") != std::string::npos &&
         tls.find("shm") == std::string::npos && tls.find("cma") == std::string::npos &&
         tls.find("rc") == std::string::npos;
}

namespace {

std::string env_prefix(const std::string& tls) {
  if (tls.empty()) return "env -u UCX_TLS -u UCX_NET_DEVICES ";
  std::string out = "env UCX_TLS=" + tls + " ";
  if (tcp_only(tls)) out += "UCX_NET_DEVICES=lo ";
  return out;
}

// The "Final:" row: iterations, then latency 50%/avg/overall, then bandwidth avg/overall (MB/s).
std::optional<double> parse_final(const std::string& text) {
  const auto at = text.rfind("Final:");
  if (at == std::string::npos) return std::nullopt;
  std::istringstream row(text.substr(at + 6));
  double v[6];
  for (double& x : v)
    if (!(row >> x)) return std::nullopt;
  return v[5] * 1024.0 * 1024.0 / 1e9;
}

std::string run_capture(const std::string& command) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (!p) return out;
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof(buffer), p)) out.append(buffer, n);
  ::pclose(p);
  return out;
}

}  // namespace

std::vector<std::string> perftest_candidates(const std::string& tls) {
  if (tcp_only(tls)) return {"ucp_am_bw", "tag_bw"};
  return {"ucp_put_bw", "ucp_get"};
}

std::vector<PerftestResult> run_perftest(const std::string& tls, std::size_t bytes,
                                         const std::vector<std::string>& tests) {
  const std::size_t iterations = std::clamp<std::size_t>((std::size_t{1} << 30) / bytes, 10, 2000);
  return run_perftest(tls, bytes, tests, iterations, std::max<std::size_t>(2, iterations / 10));
}

std::size_t batch_perftest_iterations(std::size_t bytes) {
  const std::size_t target = std::size_t{2} << 30;
  return std::clamp<std::size_t>((target + bytes - 1) / std::max<std::size_t>(bytes, 1), 2, 2000);
}

std::vector<PerftestResult> run_perftest(const std::string& tls, std::size_t bytes,
                                         const std::vector<std::string>& tests,
                                         std::size_t iterations, std::size_t warmup) {
  std::vector<PerftestResult> out;
  for (const std::string& test : tests) {
    const std::uint16_t port = free_port();
    // The server serves one test, then exits; the shell wrapper bounds it in case the client fails.
    const std::string server = env_prefix(tls) + "timeout 60 ucx_perftest -p " +
                               std::to_string(port) + " >/dev/null 2>&1 &";
    if (std::system(server.c_str()) != 0) continue;
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    const std::string client = env_prefix(tls) + "timeout 60 ucx_perftest 127.0.0.1 -p " +
                               std::to_string(port) + " -t " + test + " -s " +
                               std::to_string(bytes) + " -n " + std::to_string(iterations) +
                               " -w " + std::to_string(warmup) + " 2>&1";
    if (const auto gbps = parse_final(run_capture(client))) out.push_back({test, *gbps});
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return out;
}

double memcpy_gbps(std::size_t bytes, int rounds) {
  std::vector<char> a(bytes, 1), b(bytes, 2);  // touched: no page faults in the timing
  std::vector<double> samples;
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    samples.push_back(static_cast<double>(bytes) / dt.count() / 1e9);
    a[static_cast<std::size_t>(i) % bytes] = b[0];  // keep the copy observable
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

double memcpy_gbps_threads(std::size_t bytes, std::size_t threads, int rounds) {
  threads = std::max<std::size_t>(threads, 1);
  rounds = std::max(rounds, 1);
  std::vector<char> a(bytes, 1), b(bytes, 2);  // touched: no page faults in the timing
  // Shares in whole 4 KiB pages, as the plane's copy threads cut theirs.
  const std::size_t page = 4096;
  const std::size_t share = (bytes / threads + page - 1) / page * page;
  // Two phases a round: all start together, then all have finished.
  std::barrier sync(static_cast<std::ptrdiff_t>(threads + 1));
  std::vector<std::jthread> workers;
  for (std::size_t t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      const std::size_t at = std::min(bytes, t * share);
      const std::size_t n = std::min(bytes - at, share);
      for (int i = 0; i < rounds; ++i) {
        sync.arrive_and_wait();
        std::memcpy(b.data() + at, a.data() + at, n);
        sync.arrive_and_wait();
      }
    });
  std::vector<double> samples;
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    samples.push_back(static_cast<double>(bytes) / dt.count() / 1e9);
  }
  return median(samples);
}

Result<double> device_copy_gbps(std::size_t bytes, int rounds) {
  Result<std::unique_ptr<gpu::CopyEngine>> engine = gpu::make_cuda_copy_engine(0);
  if (!engine) return engine.error();
  Result<gpu::DeviceBuffer> src = gpu::DeviceBuffer::allocate(bytes, 0);
  if (!src) return src.error();
  Result<gpu::DeviceBuffer> dst = gpu::DeviceBuffer::allocate(bytes, 0);
  if (!dst) return dst.error();
  if (Status s = gpu::cuda_fill(src->data(), 1, bytes); !s) return s.error();
  auto once = [&]() -> Result<double> {
    const auto t0 = std::chrono::steady_clock::now();
    Result<gpu::CopyEngine::Ticket> ticket = (*engine)->copy(dst->data(), src->data(), bytes);
    if (!ticket) return ticket.error();
    for (;;) {
      Result<bool> done = (*engine)->done(*ticket);
      if (!done) return done.error();
      if (*done) break;
    }
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    return static_cast<double>(bytes) / dt.count() / 1e9;
  };
  if (Result<double> warm = once(); !warm) return warm.error();  // first touch, module load
  std::vector<double> samples;
  for (int i = 0; i < std::max(rounds, 1); ++i) {
    Result<double> r = once();
    if (!r) return r.error();
    samples.push_back(*r);
  }
  return median(samples);
}

}  // namespace kvnode::bench
