// bench_controller's kit: the run's scale, the messages it sends (LMCache's, encoded by our codec),
// the sockets and requests it makes, the child processes it starts (kvcontroller and the bare-ZMQ
// baselines, as `bench_controller --child ROLE ...`), and the report table. The scenarios
// (controller_bench_scenarios.cpp) and main (controller_bench.cpp) are built from these.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "controller_bench_proc.hpp"
#include "kvnode/wire/codec.hpp"

namespace bench {

namespace wire = kvnode::wire;
using Clock = std::chrono::steady_clock;

constexpr const char* kLocation = "LocalCPUBackend";
constexpr const char* kHolder = "inst-holder";  // holds the keys that lookups hit
constexpr const char* kProbe = "inst-probe";    // asks: another instance, so hits are real
constexpr const char* kLoad = "inst-load";      // pushes the admits
constexpr std::uint64_t kHeldSeed = 1, kLoadSeed = 2, kBurstSeed = 3, kIngestSeed = 4;
constexpr std::uint64_t kBurstOps = 1'000'000;  // the burst

struct Scale {
  std::uint64_t ingest_ops;
  int reps;
  int lookups;  // round trips per case and repetition
  double heartbeat_s;
  std::uint64_t mem_entries;
};
constexpr Scale kFull{3'000'000, 3, 2000, 10, 10'000'000};
constexpr Scale kQuick{300'000, 1, 300, 2.5, 1'000'000};

[[gnu::format(printf, 1, 2)]] std::string strf(const char* format, ...);
double seconds_since(Clock::time_point t);

// ---- messages ----

// CPython-style chunk hashes: uniform signed 64-bit; key i of stream `seed` (splitmix64).
wire::ChunkHash chunk_hash(std::uint64_t seed, std::uint64_t i);

template <class M>  // RegisterMsg or HeartbeatMsg: worker 0 of `instance`, with a peer URL
M address(const std::string& instance) {
  return M{instance, 0, "127.0.0.1", 8500, "peer://" + instance};
}

// `n` admits with seq numbers first.. and keys (first..) % pool of stream `seed`.
std::string admits(const std::string& instance, std::uint64_t seed, std::uint64_t first,
                   std::uint64_t n, std::uint64_t pool = UINT64_MAX);
// A full LRU cache's batch: n/2 admits of keys base+first/2.. and n/2 evicts of keys first/2..,
// so an index holding keys 0..base-1 stays at base entries.
std::string lru_ops(const std::string& instance, std::uint64_t seed, std::uint64_t base,
                    std::uint64_t first, std::uint64_t n);
std::string lookup_msg(std::uint64_t seed, std::uint64_t first, std::uint64_t n);
std::int64_t hits(const std::string& reply);

// ---- sockets ----

std::string tcp(int port);
zmq::socket_t connect(zmq::context_t& ctx, zmq::socket_type type, int port);
int bind_ephemeral(zmq::socket_t& s);
void send_request(zmq::socket_t& dealer, std::string_view payload);
std::string recv_reply(zmq::socket_t& dealer);
std::string request(zmq::socket_t& dealer, std::string_view payload);
double round_trip_us(zmq::socket_t& dealer, std::string_view payload);
// PULL frames are applied in order, so once a stream's last key is found, all of it was.
void wait_applied(zmq::socket_t& dealer, const std::string& last_key_lookup);

// ---- child processes ----

struct Ports {
  int pull, reply, heartbeat;
};

// `--child ROLE ARGS... FD`: one of the child roles, reporting through pipe FD.
void child_main(const std::vector<std::string>& args);

// A child and the ports it reported once it was ready.
template <class P>
struct Spawned {
  Child child;
  P ports;
};

template <class P>
Spawned<P> spawn(std::vector<std::string> args, int cpu = kAnyCpu) {
  Child child(std::move(args), cpu);
  const auto ports = child.receive<P>();
  return {std::move(child), ports};
}
using ControllerProc = Spawned<Ports>;
ControllerProc start_controller(int cpu = kAnyCpu);
Spawned<int> start_echo(std::size_t reply_size, int cpu = kAnyCpu);
Child start_pusher(int pull_port, std::uint64_t seed, std::uint64_t total, std::uint64_t pool,
                   int cpu = kAnyCpu);
void register_workers(zmq::context_t& ctx, int reply_port, const std::vector<std::string>& ids);
// A controller where kHolder holds keys 0..999 of kHeldSeed and kLoad may push.
ControllerProc start_lookup_controller(int cpu);

// ---- results ----

struct Row {
  std::string what, measured, baseline, ratio, target, verdict;
};
using Report = std::vector<Row>;

std::string verdict(bool met);
void print(const Report& report);
// Round trips in us, pooled over the repetitions.
std::string p50_p99(const std::vector<double>& us);

// ---- the scenarios (controller_bench_scenarios.cpp) ----

void run_ingest(const Scale& scale, Report& report);
void run_lookup(const Scale& scale, Report& report);
void run_heartbeat(const Scale& scale, Report& report);
void run_memory_case(const Scale& scale, int holders, Report& report);

}  // namespace bench
