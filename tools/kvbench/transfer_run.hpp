// kvbench transfer, the subcommand as a whole: which groups of points run (one point, or the
// table), the ceilings measured before them in the same run (ucx_perftest per chunk and per
// batch, memcpy with one thread or the same-host copy threads, a device-to-device copy for device
// pools), and the table or JSON lines on stdout.
#pragma once

#include <cstddef>
#include <string>

namespace kvnode::bench {

struct TransferBenchSpec {
  std::string self;  // this executable, to start the serving children
  std::string tls = "default";
  std::size_t chunk_bytes = 2 << 20;
  std::size_t batch = 8;
  std::string op = "pull";
  std::size_t iterations = 50;
  std::string protocol = "auto";
  std::string pool = "host";  // host, pinned, device
  bool json = false;
  bool quick = false;
  bool table = false;
  bool baselines = true;
  bool stage = false;
  bool same_host = false;
  std::size_t copy_threads = 0;  // 0: the plane's default
};

// 0: every point ran; 1: some failed; 2: the options ask for what this host lacks (a GPU).
int run_transfer_bench(const TransferBenchSpec& spec);

}  // namespace kvnode::bench
