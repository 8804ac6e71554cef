// The kvnode binary as a process against a real controller: configuration from an LMCache-style
// YAML file with flags on top, registration, /health and /metrics, a clean stop on SIGTERM that
// de-registers, and clear errors for bad configuration.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <memory>
#include <thread>

#include "kvnode/node/node_config.hpp"
#include "node_rig.hpp"
#include "support/child_process.hpp"

namespace kvnode::node {
namespace {

using rig::Clock;
using namespace std::chrono_literals;

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(NodeConfig, AnLmcacheYamlWorksAndFlagsWin) {
  const std::string yaml = write_file("kvnode_cfg.yaml", R"(
chunk_size: 256
local_cpu: true
max_local_cpu_size: 0.5
lmcache_instance_id: "lmcache_instance_7"
controller_pull_url: "10.0.0.1:8300"
controller_reply_url: "10.0.0.1:8400"
lmcache_worker_ports: [8500, 8501]
lmcache_worker_heartbeat_time: 2
p2p_host: "10.0.0.5"
p2p_init_ports: [8200, 8202]
enable_p2p: true
kvnode_kv_layers: 32
)");
  auto r =
      load_node_config({"kvnode", "--config", yaml, "--worker-id", "1", "--p2p-host", "10.0.0.6"});
  ASSERT_TRUE(r) << r.error().message;
  const NodeConfig& c = *r->config;
  EXPECT_EQ(c.lmcache_instance_id, "lmcache_instance_7");
  EXPECT_EQ(c.lmcache_worker_ports, (std::vector<int>{8500, 8501}));
  EXPECT_EQ(c.p2p_host, "10.0.0.6") << "the flag wins over the file";
  EXPECT_EQ(c.worker_id, 1);
  EXPECT_DOUBLE_EQ(c.lmcache_worker_heartbeat_time, 2.0);
  const auto g = pool_geometry(c).value();
  EXPECT_EQ(g.first, 32u << 20) << "Llama-3.1-8B shape: 32 MiB per 256-token chunk";
  EXPECT_EQ(g.second, 14u);  // 0.5 GB / 32 MiB

  auto error_of = [](const std::vector<std::string>& argv) {
    auto e = load_node_config(argv);
    return e ? std::string("accepted") : e.error().message;
  };
  EXPECT_NE(error_of({"kvnode"}).find("controller_pull_url"), std::string::npos);
  EXPECT_NE(error_of({"kvnode", "--config", yaml, "--worker-id", "2"})
                .find("lmcache_worker_ports: no port for worker 2"),
            std::string::npos);
  EXPECT_NE(error_of({"kvnode", "--config", "/nonexistent.yaml"}).find("/nonexistent.yaml"),
            std::string::npos);
  const std::string bad =
      write_file("kvnode_bad.yaml", "chunk_size: [1, 2]\ncontroller_pull_url: a:1\n");
  EXPECT_NE(error_of({"kvnode", "--config", bad}).find("chunk_size"), std::string::npos);
  EXPECT_NE(error_of({"kvnode", "--controller-pull-url", "a:1", "--controller-reply-url", "a:2",
                      "--max-local-cpu-size", "0.001"})
                .find("holds no chunk"),
            std::string::npos);
  EXPECT_NE(error_of({"kvnode", "--memory", "disk"}).find("memory"), std::string::npos);
}

// A kvnode process registering with `ctl` over loopback TCP; `flags` add to (or repeat, the last
// winning) what every process test here gives it.
std::unique_ptr<test::ChildProcess> start_node(const controller::Controller& ctl, int http_port,
                                               std::vector<std::string> flags) {
  std::vector<std::string> argv = {KVNODE_PATH,
                                   "--controller-pull-url",
                                   "127.0.0.1:" + std::to_string(ctl.ports().pull),
                                   "--controller-reply-url",
                                   "127.0.0.1:" + std::to_string(ctl.ports().reply),
                                   "--http-port",
                                   std::to_string(http_port),
                                   "--ucx-tls",
                                   "tcp",
                                   "--ucx-net-devices",
                                   "lo"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return std::make_unique<test::ChildProcess>(argv);
}

// The body of the first 200 answer to GET `path` that `ready` accepts, within 20 s; "" (and a
// test failure naming how the node ended) when there is none.
std::string await_get(test::ChildProcess& node, httplib::Client& http, const std::string& path,
                      const std::function<bool(const std::string&)>& ready) {
  for (auto until = Clock::now() + 20s; Clock::now() < until; std::this_thread::sleep_for(50ms)) {
    if (auto r = http.Get(path); r && r->status == 200 && ready(r->body)) return r->body;
    if (!node.running()) break;
  }
  ADD_FAILURE() << path << " never ready; node " << node.describe_exit() << "\n" << node.output();
  return "";
}

TEST(KvnodeProcess, RegistersServesHealthAndMetricsAndStopsCleanly) {
  auto ctl = rig::start_controller();
  const int http_port = free_port();
  auto process = start_node(*ctl, http_port,
                            {"--instance-id", "proc-node", "--chunk-bytes", "65536",
                             "--max-local-cpu-size", "0.01", "--heartbeat-time", "0.2"});
  test::ChildProcess& node = *process;
  httplib::Client http("127.0.0.1", http_port);
  http.set_connection_timeout(1s);
  const std::string health = await_get(node, http, "/health", [](const std::string& body) {
    return body.find("\"registered\":true") != std::string::npos;
  });
  ASSERT_FALSE(health.empty());
  EXPECT_NE(health.find("\"peer_init_url\":\"127.0.0.1:"), std::string::npos) << health;
  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics && metrics->status == 200);
  for (const char* line : {"kvnode_chunks{location=\"LocalCPUBackend\"} 0",
                           "kvnode_chunks_capacity{location=\"LocalCPUBackend\"} 152",
                           "kvnode_controller_registered 1", "kvnode_chunk_bytes 65536",
                           "kvnode_transfers_total{result=\"timeout\"} 0",
                           "kvnode_peer_reservations 0", "kvnode_peer_leases 0"})
    EXPECT_NE(metrics->body.find(line), std::string::npos) << line << "\n" << metrics->body;
  node.signal(SIGTERM);
  for (auto until = Clock::now() + 10s; Clock::now() < until && node.running();)
    std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(node.running());
  EXPECT_EQ(node.describe_exit(), "exited with code 0") << node.output();

  test::ChildProcess bad({KVNODE_PATH, "--memory", "disk"});
  for (auto until = Clock::now() + 10s; Clock::now() < until && bad.running();)
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(bad.describe_exit(), "exited with code 2");
}

// Metrics are integers: a 4 MiB chunk size printed through a double read 4.1943e+06.
TEST(KvnodeProcess, MetricsPrintIntegers) {
  auto ctl = rig::start_controller();
  const int http_port = free_port();
  auto node = start_node(*ctl, http_port,
                         {"--instance-id", "int-metrics", "--chunk-bytes", "4194304",
                          "--max-local-cpu-size", "0.009", "--local-socket", "off"});
  httplib::Client http("127.0.0.1", http_port);
  http.set_connection_timeout(1s);
  const std::string metrics =
      await_get(*node, http, "/metrics", [](const std::string&) { return true; });
  ASSERT_FALSE(metrics.empty());
  EXPECT_NE(metrics.find("\nkvnode_chunk_bytes 4194304\n"), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("e+"), std::string::npos) << metrics;
}

// Issue 19 item 13: a node whose controller is unreachable says why at once (log, /health, a
// metric), is alive (/health 200) but not ready (/ready 503) until it registers; its start-up
// says how much memory it faults in and how long that took.
TEST(KvnodeProcess, UnreachableControllerIsExplainedAndReadinessWaitsForRegistration) {
  const int pull = free_port(), reply = free_port(), http_port = free_port();
  test::ChildProcess node({KVNODE_PATH, "--instance-id", "ready-" + std::to_string(::getpid()),
                           "--controller-pull-url", "127.0.0.1:" + std::to_string(pull),
                           "--controller-reply-url", "127.0.0.1:" + std::to_string(reply),
                           "--chunk-bytes", "65536", "--max-local-cpu-size", "0.01", "--http-port",
                           std::to_string(http_port), "--local-socket", "off", "--ucx-tls", "tcp",
                           "--ucx-net-devices", "lo"});
  httplib::Client http("127.0.0.1", http_port);
  http.set_connection_timeout(1s);
  std::string health;
  for (auto until = Clock::now() + 10s; Clock::now() < until; std::this_thread::sleep_for(20ms)) {
    ASSERT_TRUE(node.running()) << node.describe_exit() << "\n" << node.output();
    auto r = http.Get("/health");
    if (r && r->body.find("connection refused") != std::string::npos) {
      EXPECT_EQ(r->status, 200);
      health = r->body;
      break;
    }
  }
  ASSERT_FALSE(health.empty()) << node.output();
  EXPECT_NE(health.find("\"status\":\"ok\""), std::string::npos) << health;
  EXPECT_NE(
      health.find(
          "\"detail\":\"not registered: cannot connect to the controller at tcp://127.0.0.1:" +
          std::to_string(reply)),
      std::string::npos)
      << health;
  auto ready = http.Get("/ready");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 503) << ready->body;
  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->body.find("kvnode_controller_registration_failures_total 0\n"),
            std::string::npos);
  EXPECT_NE(metrics->body.find("kvnode_controller_registration_failures_total "),
            std::string::npos);
  const std::string log = node.output();
  EXPECT_NE(log.find("registration 1 of ready-"), std::string::npos) << log;
  EXPECT_NE(log.find("retrying in"), std::string::npos) << log;
  EXPECT_NE(log.find("faulting in 0.01 GB of host memory"), std::string::npos) << log;
  EXPECT_NE(log.find("ready in"), std::string::npos) << log;

  auto ctl = rig::start_controller([&](controller::ControllerConfig& c) {
    c.controller_monitor_ports = {pull, reply, 0};
  });
  bool became_ready = false;
  for (auto until = Clock::now() + 20s; !became_ready && Clock::now() < until;
       std::this_thread::sleep_for(50ms))
    if (auto r = http.Get("/ready"); r && r->status == 200) became_ready = true;
  EXPECT_TRUE(became_ready) << node.output();
  auto after = http.Get("/health");
  ASSERT_TRUE(after);
  EXPECT_NE(after->body.find("\"registered\":true"), std::string::npos) << after->body;
  EXPECT_EQ(after->body.find("detail"), std::string::npos) << after->body;
}

}  // namespace
}  // namespace kvnode::node
