// kvbench: benchmarks for operators. `kvbench transfer` measures the transfer plane between two
// processes on loopback next to ucx_perftest and memcpy; `kvbench node` the whole node (moves
// through kvcontroller, P2P retrieve) next to the raw plane; `kvbench engine` the engine KV path
// (store and load by block table) next to memcpy or cudaMemcpy of the same bytes
// (docs/benchmarks.md).
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "baselines.hpp"
#include "engine_bench.hpp"
#include "node_bench.hpp"
#include "transfer_bench.hpp"

using namespace kvnode::bench;

namespace {

std::string self_path() {
  char buffer[PATH_MAX] = {};
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  return n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : "kvbench";
}

std::string size_text(std::size_t bytes) {
  if (bytes % (1 << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes % (1 << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

struct Baseline {
  double gbps = 0;
  std::string test;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvbench: kvnode benchmarks"};
  app.require_subcommand(1);

  auto* transfer =
      app.add_subcommand("transfer", "the transfer plane between two processes on loopback");
  std::string tls = "default";
  std::size_t chunk_bytes = 2 << 20;
  std::size_t batch = 8;
  std::string op = "pull";
  std::size_t iters = 50;
  std::string protocol = "auto";
  bool json = false, quick = false, table = false, no_baselines = false, stage = false;
  transfer->add_option("--tls", tls, "UCX_TLS for both processes; 'default' leaves it to UCX");
  transfer->add_option("--chunk-bytes", chunk_bytes, "bytes per chunk")
      ->check(CLI::Range(std::size_t{4096}, std::size_t{1} << 30));
  transfer->add_option("--batch", batch, "chunks per transfer")->check(CLI::Range(1, 4096));
  transfer->add_option("--op", op, "pull or push")->check(CLI::IsMember({"pull", "push"}));
  transfer->add_option("--iters", iters, "most measured transfers per point")
      ->check(CLI::Range(1, 100000));
  transfer->add_option("--protocol", protocol, "auto, rma or am")
      ->check(CLI::IsMember({"auto", "rma", "am"}));
  transfer->add_flag("--json", json, "one JSON object per line instead of a table");
  transfer->add_flag("--quick", quick,
                     "the whole table (tcp and default; 256 KiB, 2 MiB, 32 MiB; batches 1, 8, 64) "
                     "in about a minute");
  transfer->add_flag("--table", table, "the whole table with longer runs per point");
  transfer->add_flag("--no-baselines", no_baselines, "skip ucx_perftest and memcpy");
  transfer->add_flag(
      "--stage", stage,
      "move both pools through staging slots (the device-pool path, memcpy for CUDA)");

  auto* node_cmd = app.add_subcommand(
      "node", "the whole node: moves through kvcontroller vs the raw plane, P2P retrieve");
  NodeBenchSpec node_spec;
  std::string node_tls = "default";
  node_cmd->add_option("--tls", node_tls, "UCX_TLS for the nodes; 'default' leaves it to UCX");
  node_cmd->add_option("--chunk-bytes", node_spec.chunk_bytes, "bytes per chunk")
      ->check(CLI::Range(std::size_t{4096}, std::size_t{1} << 30));
  node_cmd
      ->add_option("--chunks", node_spec.chunks,
                   "chunks per move (64 or more for the 64-chunk retrieve)")
      ->check(CLI::Range(1, 4096));
  node_cmd->add_option("--iters", node_spec.iterations, "moves each way, retrieves per size")
      ->check(CLI::Range(1, 1000));
  node_cmd->add_flag("--json", node_spec.json, "one JSON object instead of text");

  auto* engine_cmd = app.add_subcommand(
      "engine", "the engine KV path: store and load by block table vs memcpy or cudaMemcpy");
  EngineBenchSpec engine_spec;
  engine_cmd
      ->add_option("--memory", engine_spec.memory,
                   "the node's pool: host, pinned, device, or all this host supports")
      ->capture_default_str()
      ->check(CLI::IsMember({"host", "pinned", "device", "all"}));
  engine_cmd->add_option("--tokens", engine_spec.tokens, "tokens per store and load (x256)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{256}, std::size_t{1} << 24));
  engine_cmd->add_option("--iters", engine_spec.iterations, "stores and loads timed")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  engine_cmd->add_flag("--json", engine_spec.json, "one JSON object per line instead of a table");

  auto* serve_cmd = app.add_subcommand("serve", "(internal) the serving side of kvbench transfer");
  serve_cmd->group("");
  std::string port_file;
  std::size_t pages = 1;
  serve_cmd->add_option("--port-file", port_file)->required();
  serve_cmd->add_option("--chunk-bytes", chunk_bytes)->required();
  serve_cmd->add_option("--pages", pages)->required();
  serve_cmd->add_flag("--stage", stage);

  CLI11_PARSE(app, argc, argv);
  // Logs go to stderr, so stdout stays a table or JSON lines; the serving child only reports
  // errors.
  spdlog::set_default_logger(spdlog::stderr_color_mt("kvbench"));
  spdlog::set_level(serve_cmd->parsed() ? spdlog::level::err : spdlog::level::warn);
  if (serve_cmd->parsed()) return serve(port_file, chunk_bytes, pages, stage);
  if (engine_cmd->parsed()) {
    engine_spec.self = self_path();
    return run_engine_bench(engine_spec);
  }
  if (node_cmd->parsed()) {
    node_spec.self = self_path();
    node_spec.tls = node_tls == "default" ? "" : node_tls;
    return run_node_bench(node_spec);
  }

  std::vector<GroupSpec> groups;
  const std::string self = self_path();
  auto tls_value = [](const std::string& t) { return t == "default" ? std::string() : t; };
  if (quick || table) {
    for (const std::string t : {"tcp", "default"})
      for (const std::size_t c :
           {std::size_t{256} << 10, std::size_t{2} << 20, std::size_t{32} << 20}) {
        GroupSpec g;
        g.self = self;
        g.tls = tls_value(t);
        g.chunk_bytes = c;
        g.batches = {1, 8, 64};
        g.ops = {true, false};
        g.protocol = protocol;
        g.stage = stage;
        g.max_iterations = quick ? 20 : 200;
        g.budget = std::chrono::milliseconds(quick ? 250 : 2000);
        groups.push_back(g);
      }
  } else {
    GroupSpec g;
    g.self = self;
    g.tls = tls_value(tls);
    g.chunk_bytes = chunk_bytes;
    g.batches = {batch};
    g.ops = {op == "pull"};
    g.protocol = protocol;
    g.stage = stage;
    g.max_iterations = iters;
    g.budget = std::chrono::seconds(3600);
    groups.push_back(g);
  }

  double memcpy_ceiling = 0;
  std::map<std::pair<std::string, std::size_t>, Baseline> perftest;
  if (!no_baselines) {
    memcpy_ceiling = memcpy_gbps(std::size_t{256} << 20, quick ? 3 : 7);
    for (const GroupSpec& g : groups) {
      Baseline best;
      for (const PerftestResult& r : run_perftest(g.tls, g.chunk_bytes, perftest_candidates(g.tls)))
        if (r.gbps > best.gbps) best = {r.gbps, r.test};
      perftest[{g.tls, g.chunk_bytes}] = best;
    }
  }

  if (json) {
    if (memcpy_ceiling > 0)
      std::printf("%s\n",
                  nlohmann::json{{"kind", "memcpy"}, {"bytes", 256 << 20}, {"gbps", memcpy_ceiling}}
                      .dump()
                      .c_str());
  } else {
    if (memcpy_ceiling > 0) std::printf("memcpy, one thread, 256 MiB: %.2f GB/s\n", memcpy_ceiling);
    std::printf("%-8s %-4s %-8s %5s %-12s %8s %10s %10s %10s %18s %8s %8s\n", "tls", "op", "chunk",
                "batch", "path", "GB/s", "chunks/s", "p50 us", "p99 us", "ucx_perftest GB/s",
                "ratio", "/memcpy");
  }
  int failures = 0;
  for (const GroupSpec& g : groups) {
    const Baseline base =
        perftest.count({g.tls, g.chunk_bytes}) ? perftest[{g.tls, g.chunk_bytes}] : Baseline{};
    for (const PointResult& r : run_group(g)) {
      const std::string t = r.spec.tls.empty() ? "default" : r.spec.tls;
      const double ratio = base.gbps > 0 ? r.gbps / base.gbps : 0;
      const double vs_memcpy = memcpy_ceiling > 0 ? r.gbps / memcpy_ceiling : 0;
      if (!r.error.empty()) ++failures;
      if (json) {
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
                         {"perftest_test", base.test},
                         {"perftest_gbps", base.gbps},
                         {"ratio_perftest", ratio},
                         {"ratio_memcpy", vs_memcpy}};
        if (!r.error.empty()) j["error"] = r.error;
        std::printf("%s\n", j.dump().c_str());
      } else if (!r.error.empty()) {
        std::printf("%-8s %-4s %-8s %5zu failed: %s\n", t.c_str(), r.spec.pull ? "pull" : "push",
                    size_text(r.spec.chunk_bytes).c_str(), r.spec.batch, r.error.c_str());
      } else {
        const std::string path = r.protocol + "/" + r.transport;
        const std::string pt =
            base.gbps > 0 ? std::to_string(base.gbps).substr(0, 5) + " " + base.test : "n/a";
        std::printf("%-8s %-4s %-8s %5zu %-12s %8.2f %10.0f %10.0f %10.0f %18s %8.2f %8.2f\n",
                    t.c_str(), r.spec.pull ? "pull" : "push", size_text(r.spec.chunk_bytes).c_str(),
                    r.spec.batch, path.c_str(), r.gbps, r.chunks_per_s, r.p50_us, r.p99_us,
                    pt.c_str(), ratio, vs_memcpy);
      }
      std::fflush(stdout);
    }
  }
  return failures ? 1 : 0;
}
