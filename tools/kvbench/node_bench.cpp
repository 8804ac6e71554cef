#include "node_bench.hpp"

#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>
#include <vector>

#include "kvnode/client/local_client.hpp"
#include "processes.hpp"
#include "transfer_bench.hpp"

extern char** environ;

namespace kvnode::bench {
namespace {

using Clock = std::chrono::steady_clock;
using client::ChunkKeys;
using client::LocalClient;
using nlohmann::json;

std::string dir_of(const std::string& path) {
  return path.substr(0, path.rfind('/') + 1);
}

}  // namespace

int run_node_bench(const NodeBenchSpec& s) {
  const std::string bin = dir_of(s.self);
  const int http = free_port(), pull = free_port(), reply = free_port(), hb = free_port();
  const std::string work = "/tmp/kvbench-node-" + std::to_string(getpid());
  const std::size_t tokens_per_chunk = 256;
  // Each pool holds a move's chunks and a retrieve's, with room to spare.
  const double pool_gb = static_cast<double>((s.chunks + 64 + 8) * s.chunk_bytes) / 1e9;

  Child controller({bin + "kvcontroller", "--host", "127.0.0.1", "--port", std::to_string(http),
                    "--log-level", "warn", "--monitor-ports",
                    "{\"pull\": " + std::to_string(pull) + ", \"reply\": " + std::to_string(reply) +
                        ", \"heartbeat\": " + std::to_string(hb) + "}"});
  auto start_node = [&](const std::string& name) {
    std::vector<std::string> args = {bin + "kvnode",
                                     "--instance-id",
                                     name,
                                     "--controller-pull-url",
                                     "127.0.0.1:" + std::to_string(pull),
                                     "--controller-reply-url",
                                     "127.0.0.1:" + std::to_string(reply),
                                     "--chunk-bytes",
                                     std::to_string(s.chunk_bytes),
                                     "--chunk-size",
                                     std::to_string(tokens_per_chunk),
                                     "--max-local-cpu-size",
                                     std::to_string(pool_gb),
                                     "--heartbeat-time",
                                     "1",
                                     "--full-sync-startup-delay",
                                     "0",
                                     "--http-port",
                                     "-1",
                                     "--log-level",
                                     "warn",
                                     "--local-socket",
                                     work + "-" + name + ".sock"};
    if (!s.tls.empty()) args.insert(args.end(), {"--ucx-tls", s.tls});
    if (s.tls == "tcp") args.insert(args.end(), {"--ucx-net-devices", "lo"});
    args.insert(args.end(), {"--same-host", s.same_host ? "auto" : "off"});
    return std::make_unique<Child>(args);
  };
  auto node_a = start_node("bench-a");
  auto node_b = start_node("bench-b");

  auto connect = [&](const std::string& name) -> std::unique_ptr<LocalClient> {
    // The default timeout (15 s): a 64-chunk retrieve on loaded cores takes over 500 ms.
    const std::string path = work + "-" + name + ".sock";
    for (const auto until = Clock::now() + std::chrono::seconds(20); Clock::now() < until;) {
      if (std::filesystem::exists(path))
        if (auto c = LocalClient::connect(path)) return std::move(c).value();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return nullptr;
  };
  std::unique_ptr<LocalClient> a = connect("bench-a"), b = connect("bench-b");
  if (!a || !b) {
    std::fprintf(stderr, "kvbench node: the nodes did not start (kvnode beside kvbench in %s?)\n",
                 bin.c_str());
    return 1;
  }

  std::vector<std::int64_t> tokens(s.chunks * tokens_per_chunk);
  std::iota(tokens.begin(), tokens.end(), 0);
  const std::vector<std::int64_t> hashes = a->hashes(tokens).value();
  std::vector<std::byte> data(s.chunks * s.chunk_bytes);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 131 >> 8);
  for (const auto until = Clock::now() + std::chrono::seconds(30);;) {
    Result<std::size_t> put = a->put(ChunkKeys::of_hashes(hashes), data);
    if (put && *put == s.chunks) break;
    if (Clock::now() > until) {
      std::fprintf(stderr, "kvbench node: put failed: %s\n",
                   put ? "short" : put.error().message.c_str());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }

  httplib::Client api("127.0.0.1", http);
  api.set_read_timeout(std::chrono::seconds(60));
  auto post_text = [&](const std::string& path, const std::string& body) -> json {
    auto r = api.Post(path, body, "application/json");
    if (!r || r->status != 200) return nullptr;
    return json::parse(r->body, nullptr, false);
  };
  auto post = [&](const std::string& path, const json& body) {
    return post_text(path, body.dump());
  };
  // A move's body, written before the clock starts (the orchestrator has its tokens already).
  auto move_body = [](const std::string& from, const std::string& to,
                      const std::vector<std::int64_t>& t) {
    return json{{"old_position", {from, "LocalCPUBackend"}},
                {"new_position", {to, "LocalCPUBackend"}},
                {"tokens", t},
                {"should_copy", false}}
        .dump();
  };
  auto indexed_at = [&](const std::string& who) {
    json j;
    for (const auto until = Clock::now() + std::chrono::seconds(30); Clock::now() < until;) {
      j = post("/lookup", {{"tokens", tokens}});
      if (j.is_object() && j.dump().find(who) != std::string::npos &&
          j.dump().find(std::to_string(tokens.size())) != std::string::npos)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::fprintf(
        stderr,
        "kvbench node: the controller never indexed all %zu tokens at %s; its last lookup: %s\n",
        tokens.size(), who.c_str(), j.dump().c_str());
    auto m = api.Get("/metrics");
    if (m) std::fprintf(stderr, "%s\n", m->body.c_str());
    return false;
  };
  if (!indexed_at("bench-a")) return 1;

  // (1) Moves through the orchestrator, both ways, timed from the call to its answer.
  std::vector<double> move_s;
  std::string from = "bench-a", to = "bench-b";
  for (std::size_t i = 0; i < 2 * s.iterations; ++i) {
    const std::string body = move_body(from, to, tokens);
    const auto t0 = Clock::now();
    json j = post_text("/move", body);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!j.is_object() || j.value("num_tokens", 0) != static_cast<std::int64_t>(tokens.size())) {
      std::fprintf(stderr, "kvbench node: move %s -> %s failed: %s\n", from.c_str(), to.c_str(),
                   j.dump().c_str());
      return 1;
    }
    move_s.push_back(secs);
    std::swap(from, to);
    if (!indexed_at(from)) return 1;  // the next move's source must be indexed
  }
  const double move_gbps = static_cast<double>(s.chunks * s.chunk_bytes) / median(move_s) / 1e9;

  // The control path alone: the same /move for tokens nobody holds (HTTP and JSON, the fan-out,
  // the node's decode and hashing, the answer; nothing to send).
  std::vector<std::int64_t> unheld(tokens);
  for (std::int64_t& t : unheld) t += 1'000'000'000;
  std::vector<double> control_s;
  const std::string unheld_body = move_body("bench-a", "bench-b", unheld);
  for (std::size_t i = 0; i < 2 * s.iterations; ++i) {
    const auto t0 = Clock::now();
    post_text("/move", unheld_body);
    control_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }

  // The raw plane, same chunks and batch, push (what a move does), in this run.
  GroupSpec g;
  g.self = s.self;
  g.tls = s.tls;
  g.setup.same_host = s.same_host;
  g.chunk_bytes = s.chunk_bytes;
  g.batches = {s.chunks};
  g.ops = {false};
  g.max_iterations = 2 * s.iterations;
  g.budget = std::chrono::seconds(3600);
  const std::vector<PointResult> raw = run_group(g);
  const double raw_gbps = raw.empty() || !raw[0].error.empty() ? 0 : raw[0].gbps;

  // (2) P2P retrieve at B (A holds everything after an even number of moves), B cleared first.
  auto retrieve_us = [&](std::size_t n) {
    std::vector<double> us;
    const std::vector<std::int64_t> want(hashes.begin(),
                                         hashes.begin() + static_cast<std::ptrdiff_t>(n));
    for (std::size_t i = 0; i < s.iterations; ++i) {
      post("/clear", {{"instance_id", "bench-b"}, {"location", "LocalCPUBackend"}});
      const auto t0 = Clock::now();
      Result<client::RetrieveReply> r = b->retrieve(ChunkKeys::of_hashes(want));
      const double t = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (!r || r->chunks != n || r->pulled != n) {
        std::fprintf(
            stderr, "kvbench node: retrieve of %zu chunks: %s\n", n,
            r ? ("held " + std::to_string(r->chunks) + ", pulled " + std::to_string(r->pulled))
                    .c_str()
              : r.error().message.c_str());
        return -1.0;
      }
      us.push_back(t);
    }
    return median(us);
  };
  const double r1 = retrieve_us(1);
  const double r64 = s.chunks >= 64 ? retrieve_us(64) : -1;

  const std::string t = s.tls.empty() ? "default" : s.tls;
  const double ratio = raw_gbps > 0 ? move_gbps / raw_gbps : 0;
  if (s.json) {
    std::printf("%s\n", json{{"kind", "node"},
                             {"tls", t},
                             {"same_host", s.same_host},
                             {"chunk_bytes", s.chunk_bytes},
                             {"chunks", s.chunks},
                             {"move_gbps", move_gbps},
                             {"move_p50_ms", median(move_s) * 1e3},
                             {"control_p50_ms", median(control_s) * 1e3},
                             {"raw_push_gbps", raw_gbps},
                             {"ratio", ratio},
                             {"retrieve_1_p50_us", r1},
                             {"retrieve_64_p50_us", r64}}
                            .dump()
                            .c_str());
  } else {
    std::printf(
        "kvbench node: tls %s, same-host %s, %zu chunks of %zu KiB per move, %zu iterations\n",
        t.c_str(), s.same_host ? "auto" : "off", s.chunks, s.chunk_bytes >> 10, s.iterations);
    std::printf("  move via /move (call to answer)  %8.2f GB/s  p50 %.1f ms\n", move_gbps,
                median(move_s) * 1e3);
    std::printf("  control path only (nothing held) p50 %.2f ms\n", median(control_s) * 1e3);
    std::printf("  raw plane push, same batch       %8.2f GB/s  (%s)\n", raw_gbps,
                raw.empty() ? "not run" : (raw[0].protocol + "/" + raw[0].transport).c_str());
    std::printf("  ratio                            %8.2f\n", ratio);
    std::printf("  P2P retrieve, 1 chunk            p50 %8.0f us\n", r1);
    std::printf("  P2P retrieve, 64 chunks          p50 %8.0f us\n", r64);
  }
  return ratio > 0 && r1 >= 0 ? 0 : 1;
}

}  // namespace kvnode::bench
