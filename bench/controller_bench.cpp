// bench_controller: kvcontroller end to end over tcp loopback, each figure beside a bare-ZMQ
// baseline measured in the same run (these machines are noisy: compare ratios, not absolutes).
// The controller and each baseline run in child processes; this process generates the load.
//   ingest     BatchedKVOperationMsg admits, batch 50 and 1000, vs a bare PULL that counts frames
//   lookup     BatchedP2PLookupMsg round trips (1/100/1000 hashes) vs a bare ROUTER echo, idle,
//              under continuous ingest, and (1 hash) during a burst of 1 M admits
//   heartbeat  CPU of the controller answering 10 k workers at 1 Hz, vs the bare echo
//   memory     in-process Registry at 10 M (chunk, holder) entries: bytes, admit/evict/lookup ns
// Usage: bench_controller [--quick] [--only ingest|lookup|heartbeat|memory]
//
// Files: controller_bench_proc.hpp (child processes, CPU, RSS, percentiles),
// controller_bench_kit.{hpp,cpp} (messages, sockets, child roles, the report),
// controller_bench_scenarios.cpp (the four parts), this file (main).
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "controller_bench_kit.hpp"

namespace {

std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string one, five;
  in >> one >> five;
  return one + " " + five;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "--child") {
    try {
      bench::child_main({args.begin() + 1, args.end()});
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_controller --child %s: %s\n", args.at(1).c_str(), e.what());
      return 1;
    }
  }
  bench::Scale scale = bench::kFull;
  std::string only;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--quick") {
      scale = bench::kQuick;
    } else if (args[i] == "--only" && i + 1 < args.size()) {
      only = args[++i];
    } else if (args[i].starts_with("--benchmark_")) {
      // ./dev.sh bench passes Google Benchmark's flags to every bench_*: run as usual.
    } else {
      std::fprintf(stderr,
                   "usage: bench_controller [--quick] [--only ingest|lookup|heartbeat|memory]\n");
      return 2;
    }
  }
  const auto wanted = [&](const char* part) { return only.empty() || only == part; };
  std::printf("bench_controller: %d repetition(s), %u cores, load average %s\n", scale.reps,
              std::thread::hardware_concurrency(), loadavg().c_str());
  bench::Report report;
  int rc = 0;
  try {
    if (wanted("ingest")) bench::run_ingest(scale, report);
    if (wanted("lookup")) bench::run_lookup(scale, report);
    if (wanted("heartbeat")) bench::run_heartbeat(scale, report);
    if (wanted("memory")) {
      bench::run_memory_case(scale, 1, report);
      bench::run_memory_case(scale, 2, report);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_controller: %s\n", e.what());
    rc = 1;
  }
  bench::print(report);
  std::printf("\nload average at the end: %s\n", loadavg().c_str());
  return rc;
}
