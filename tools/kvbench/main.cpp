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

#include "engine_bench.hpp"
#include "node_bench.hpp"
#include "transfer_bench.hpp"
#include "transfer_run.hpp"

using namespace kvnode::bench;

namespace {

std::string self_path() {
  char buffer[PATH_MAX] = {};
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  return n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : "kvbench";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvbench: kvnode benchmarks"};
  app.require_subcommand(1);

  auto* transfer =
      app.add_subcommand("transfer", "the transfer plane between two processes on loopback");
  TransferBenchSpec ts;
  bool no_baselines = false;
  transfer->add_option("--tls", ts.tls, "UCX_TLS for both processes; 'default' leaves it to UCX");
  transfer->add_option("--chunk-bytes", ts.chunk_bytes, "bytes per chunk")
      ->check(CLI::Range(std::size_t{4096}, std::size_t{1} << 30));
  transfer->add_option("--batch", ts.batch, "chunks per transfer")->check(CLI::Range(1, 4096));
  transfer->add_option("--op", ts.op, "pull or push")->check(CLI::IsMember({"pull", "push"}));
  transfer->add_option("--iters", ts.iterations, "most measured transfers per point")
      ->check(CLI::Range(1, 100000));
  transfer->add_option("--protocol", ts.protocol, "auto, rma or am")
      ->check(CLI::IsMember({"auto", "rma", "am"}));
  transfer->add_flag("--json", ts.json, "one JSON object per line instead of a table");
  transfer->add_flag("--quick", ts.quick,
                     "the whole table (tcp and default; 256 KiB, 2 MiB, 32 MiB; batches 1, 8, 64; "
                     "with --same-host: 2 MiB, 32 MiB; batches 8, 64) in a minute or two");
  transfer->add_flag("--table", ts.table, "the whole table with longer runs per point");
  transfer->add_flag("--no-baselines", no_baselines,
                     "skip ucx_perftest, memcpy and the device copy");
  transfer->add_flag(
      "--stage", ts.stage,
      "move both pools through staging slots (the device-pool path, memcpy for CUDA)");
  transfer->add_flag("--same-host", ts.same_host,
                     "both planes map each other's pool (shareable pools) instead of using UCX; "
                     "compared with memcpy on as many threads");
  transfer
      ->add_option("--copy-threads", ts.copy_threads,
                   "threads per same-host copy (0: the plane's default)")
      ->check(CLI::Range(0, 64));
  transfer->add_option("--pool", ts.pool, "both pools' memory: host, pinned or device")
      ->capture_default_str()
      ->check(CLI::IsMember({"host", "pinned", "device"}));

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
  std::string node_same_host = "auto";
  node_cmd
      ->add_option("--same-host", node_same_host,
                   "the nodes' --same-host: auto (copies between same-host pools) or off (UCX)")
      ->check(CLI::IsMember({"auto", "off"}));

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
  ServeSpec serve_spec;
  std::string serve_pool = "host";
  serve_cmd->add_option("--port-file", serve_spec.port_file)->required();
  serve_cmd->add_option("--chunk-bytes", serve_spec.chunk_bytes)->required();
  serve_cmd->add_option("--pages", serve_spec.pages)->required();
  serve_cmd->add_flag("--stage", serve_spec.setup.stage);
  serve_cmd->add_flag("--same-host", serve_spec.setup.same_host);
  serve_cmd->add_option("--copy-threads", serve_spec.setup.copy_threads);
  serve_cmd->add_option("--pool", serve_pool)->check(CLI::IsMember({"host", "pinned", "device"}));

  CLI11_PARSE(app, argc, argv);
  // Logs go to stderr, so stdout stays a table or JSON lines; the serving child only reports
  // errors.
  spdlog::set_default_logger(spdlog::stderr_color_mt("kvbench"));
  spdlog::set_level(serve_cmd->parsed() ? spdlog::level::err : spdlog::level::warn);
  if (serve_cmd->parsed()) {
    serve_spec.setup.pool = *kvnode::gpu::parse_memory_kind(serve_pool);  // checked above
    return serve(serve_spec);
  }
  if (engine_cmd->parsed()) {
    engine_spec.self = self_path();
    return run_engine_bench(engine_spec);
  }
  if (node_cmd->parsed()) {
    node_spec.self = self_path();
    node_spec.tls = node_tls == "default" ? "" : node_tls;
    node_spec.same_host = node_same_host == "auto";
    return run_node_bench(node_spec);
  }

  ts.self = self_path();
  ts.baselines = !no_baselines;
  return run_transfer_bench(ts);
}
