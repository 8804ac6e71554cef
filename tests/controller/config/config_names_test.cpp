// kvcontroller's names for its settings (issue 19 item 14 and its review): LMCache's spellings in
// every source, two spellings that must agree, `--<key>=value` as lmcache_controller takes it,
// Kubernetes service links, --help's defaults read from the code; and the kvcontroller binary.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "config_support.hpp"
#include "kvnode/controller/config.hpp"
#include "support/child_process.hpp"
#include "support/process.hpp"

namespace kvnode::controller {
namespace {

using namespace config_test;  // NOLINT(google-build-using-namespace): the shared helpers

// ---- The kvcontroller binary (only paths that exit before Controller::start) ----

TEST(KvcontrollerProcess, HelpExitsZero) {
  const auto r = test::run_process({KVCONTROLLER_PATH, "--help"}, "", std::chrono::seconds(30));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("--monitor-ports"), std::string::npos);
}

TEST(KvcontrollerProcess, BadFlagValueExitsTwo) {
  const auto r =
      test::run_process({KVCONTROLLER_PATH, "--port", "abc"}, "", std::chrono::seconds(30));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kvcontroller: --port: expected an integer, got 'abc'\n");
  EXPECT_EQ(r.out, "");
}

TEST(KvcontrollerProcess, UnknownFlagExitsTwo) {
  const auto r = test::run_process({KVCONTROLLER_PATH, "--bogus"}, "", std::chrono::seconds(30));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--bogus"), std::string::npos) << r.err;
}

// ---- One name per setting (issue 19 item 14) ----

// LMCache's spellings (its flag names: port, host, monitor_ports, advertise_host) set the same
// setting as the key in every source, and each key is also a flag named after it.
TEST(ConfigNames, LmcacheSpellingsWorkInEverySource) {
  EXPECT_EQ(loaded({"port=9101"}).controller_port, 9101);
  EXPECT_EQ(loaded({}, {{"LMCACHE_CONTROLLER_PORT", "9102"}}).controller_port, 9102);
  const TempYaml file("port: 9103\nhost: 10.0.0.1\nadvertise_host: ctl\n");
  const ControllerConfig from_file = loaded({"--config", file.path()});
  EXPECT_EQ(from_file.controller_port, 9103);
  EXPECT_EQ(from_file.controller_host, "10.0.0.1");
  EXPECT_EQ(from_file.controller_advertise_host, "ctl");
  EXPECT_EQ(loaded({"--controller-port", "9104"}).controller_port, 9104);
  EXPECT_EQ(loaded({"monitor_ports={\"pull\": 7, \"reply\": 8}"}).controller_monitor_ports.pull, 7);
  EXPECT_EQ(loaded({}, {{"LMCACHE_CONTROLLER_HOST", "10.0.0.2"}}).controller_host, "10.0.0.2");
  EXPECT_EQ(loaded({"--max-workers", "5"}).max_workers, 5);
}

TEST(ConfigNames, TwoSpellingsOfOneSettingMustAgree) {
  EXPECT_EQ(loaded({}, {{"LMCACHE_CONTROLLER_PORT", "9105"},
                        {"LMCACHE_CONTROLLER_CONTROLLER_PORT", "9105"}})
                .controller_port,
            9105);
  EXPECT_EQ(
      error_of({}, {{"LMCACHE_CONTROLLER_PORT", "1"}, {"LMCACHE_CONTROLLER_CONTROLLER_PORT", "2"}}),
      "LMCACHE_CONTROLLER_PORT and LMCACHE_CONTROLLER_CONTROLLER_PORT disagree ('1' and "
      "'2'); set one");
  const TempYaml both("controller_port: 1\nport: 1\n");
  EXPECT_EQ(error_of({"--config", both.path()}),
            both.path() + ": 'controller_port' and 'port' both set controller_port; keep one");
}

// A Service named lmcache-controller makes Kubernetes set LMCACHE_CONTROLLER_PORT=tcp://...
TEST(ConfigNames, KubernetesServiceLinksAreNotPorts) {
  EXPECT_EQ(loaded({}, {{"LMCACHE_CONTROLLER_PORT", "tcp://10.96.0.7:9000"}}).controller_port,
            9000);
}

TEST(ConfigNames, HelpShowsEveryKeyWithItsDefault) {
  auto result = load({"--help"});
  ASSERT_TRUE(result.ok());
  for (const char* shown :
       {"(key controller_port, also port, default 9000)", "--port,--controller-port PORT",
        "(key lmcache_worker_timeout, default 30)", "(key none_hash, default py312)",
        "(key max_workers, default 65536)", "(key log_level, default info)"})
    EXPECT_NE(result->message.find(shown), std::string::npos) << shown << "\n" << result->message;
}

TEST(KvcontrollerProcess, UnknownFlagNamesTheNearestAndTheHelp) {
  const auto r =
      test::run_process({KVCONTROLLER_PATH, "--prot", "1"}, "", std::chrono::seconds(30));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "kvcontroller: unknown flag '--prot' (did you mean '--port'?); see kvcontroller "
            "--help\n");
  const auto extra =
      test::run_process({KVCONTROLLER_PATH, "port=abc"}, "", std::chrono::seconds(30));
  EXPECT_EQ(extra.exit_code, 2);
  EXPECT_EQ(extra.err, "kvcontroller: extra 'port=abc': expected an integer, got 'abc'\n");
}

// Every field of two configs, compared one by one (ControllerConfig has no operator==).
void expect_same(const ControllerConfig& a, const ControllerConfig& b, const std::string& what) {
  EXPECT_EQ(a.controller_host, b.controller_host) << what;
  EXPECT_EQ(a.controller_port, b.controller_port) << what;
  EXPECT_EQ(a.controller_monitor_ports.pull, b.controller_monitor_ports.pull) << what;
  EXPECT_EQ(a.controller_monitor_ports.reply, b.controller_monitor_ports.reply) << what;
  EXPECT_EQ(a.controller_monitor_ports.heartbeat, b.controller_monitor_ports.heartbeat) << what;
  EXPECT_EQ(a.monitor_port, b.monitor_port) << what;
  EXPECT_EQ(a.health_check_interval, b.health_check_interval) << what;
  EXPECT_EQ(a.lmcache_worker_timeout, b.lmcache_worker_timeout) << what;
  EXPECT_EQ(a.controller_advertise_host, b.controller_advertise_host) << what;
  EXPECT_EQ(a.fanout_timeout, b.fanout_timeout) << what;
  EXPECT_EQ(a.full_sync_threshold, b.full_sync_threshold) << what;
  EXPECT_EQ(a.full_sync_timeout, b.full_sync_timeout) << what;
  EXPECT_EQ(a.max_workers, b.max_workers) << what;
  EXPECT_EQ(a.http_max_connections, b.http_max_connections) << what;
  EXPECT_EQ(a.http_max_body_mb, b.http_max_body_mb) << what;
  EXPECT_EQ(a.http_max_bodies_mb, b.http_max_bodies_mb) << what;
  EXPECT_EQ(a.hashing.chunk_size, b.hashing.chunk_size) << what;
  EXPECT_TRUE(a.hashing.init_hash == b.hashing.init_hash) << what;
  EXPECT_EQ(a.hashing.none_hash, b.hashing.none_hash) << what;
  EXPECT_EQ(a.log_level, b.log_level) << what;
}

// --help states shown_settings(ControllerConfig{}); each of those values, given back as the
// key=value it reads as, leaves every field of ControllerConfig{} as it was (a hand-written
// default that the code did not have passed every test).
TEST(ConfigNames, HelpDefaultsAreTheCodesDefaults) {
  const auto defaults = shown_settings(ControllerConfig{});
  ASSERT_EQ(defaults.size(), config_keys().size());
  auto help = load({"--help"});
  ASSERT_TRUE(help.ok());
  for (const auto& [key, value] : defaults) {
    if (value.empty()) continue;  // unset by default: no value to give back
    expect_same(loaded({key + "=" + value}), ControllerConfig{}, key + "=" + value);
    EXPECT_NE(help->message.find("(key " + key), std::string::npos) << key;
    EXPECT_NE(help->message.find(", default " + value + ")"), std::string::npos) << key;
  }
  ControllerConfig changed;
  changed.lmcache_worker_timeout = 31.5;
  changed.controller_monitor_ports.heartbeat = -1;
  changed.hashing.none_hash = 7;
  const ControllerConfig read_back = loaded({"lmcache_worker_timeout=31.5", "none_hash=7",
                                             R"(controller_monitor_ports={"heartbeat": null})"});
  expect_same(read_back, changed, "changed");
  EXPECT_EQ(shown_settings(read_back), shown_settings(changed));
}

// lmcache_controller takes `--<key>=value` for any key (parse_command_line_extra_params strips
// the dashes); it was refused as an unknown flag.
TEST(ConfigNames, DashedKeyValueSetsTheKey) {
  EXPECT_EQ(loaded({"--controller_port=9101"}).controller_port, 9101);
  EXPECT_EQ(loaded({"--max_workers=7"}).max_workers, 7);
  EXPECT_EQ(loaded({R"(--monitor_ports={"pull": 7, "reply": 8})"}).controller_monitor_ports.reply,
            8);
  EXPECT_EQ(error_of({"--controller_port=abc"}),
            "extra 'controller_port=abc': expected an integer, got 'abc'");
  EXPECT_EQ(error_of({"--controler_port=1"}),
            "unknown flag '--controler_port' (did you mean '--controller-port'?); see "
            "kvcontroller --help");
}

// Every port-valued variable may be a service link (a Service named lmcache-controller-monitor
// sets LMCACHE_CONTROLLER_MONITOR_PORT=tcp://...); an empty alias variable is unset.
TEST(ConfigNames, ServiceLinksOfEveryPortVariableAndEmptyAliasesAreUnset) {
  const std::string link = "tcp://10.96.0.7:9000";
  EXPECT_FALSE(loaded({}, {{"LMCACHE_CONTROLLER_MONITOR_PORT", link}}).monitor_port);
  EXPECT_EQ(loaded({}, {{"LMCACHE_CONTROLLER_CONTROLLER_PORT", link}}).controller_port, 9000);
  EXPECT_EQ(loaded({}, {{"LMCACHE_CONTROLLER_MONITOR_PORTS", "udp://10.96.0.8:53"}})
                .controller_monitor_ports.pull,
            8300);
  EXPECT_EQ(loaded({}, {{"LMCACHE_CONTROLLER_PORT", ""}}).controller_port, 9000);
  EXPECT_EQ(
      loaded({}, {{"LMCACHE_CONTROLLER_PORT", ""}, {"LMCACHE_CONTROLLER_CONTROLLER_PORT", "9105"}})
          .controller_port,
      9105);
  EXPECT_EQ(loaded({}, {{"LMCACHE_CONTROLLER_HOST", link}}).controller_host, link)
      << "only a port-valued variable is taken for a service link";
}

// As in the environment and the file, two spellings that disagree are an error; one spelling
// given twice is the last.
TEST(ConfigNames, TwoSpellingsOnTheCommandLineMustAgree) {
  EXPECT_EQ(error_of({"--port", "1", "--controller-port", "2"}),
            "--port 1 and --controller-port 2 both set controller_port; give one");
  EXPECT_EQ(error_of({"--host=a", "--controller-host", "b"}),
            "--host a and --controller-host b both set controller_host; give one");
  EXPECT_EQ(loaded({"--port", "3", "--controller-port=3"}).controller_port, 3);
  EXPECT_EQ(loaded({"--port", "1", "--port", "4"}).controller_port, 4);
  EXPECT_EQ(error_of({"port=1", "controller_port=2"}),
            "extras 'port=1' and 'controller_port=2' both set controller_port; give one");
  EXPECT_EQ(error_of({"--controller_port=5", "port=6"}),
            "extras 'port=6' and 'controller_port=5' both set controller_port; give one");
  EXPECT_EQ(loaded({"port=5", "controller_port=5"}).controller_port, 5);
  EXPECT_EQ(loaded({"controller_port=5", "controller_port=6"}).controller_port, 6);
}

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

bool accepts_connections(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// The binary started the way lmcache_controller's docs start it serves HTTP on the port named.
TEST(KvcontrollerProcess, StartsWithDashedKeyValueArguments) {
  const int port = free_port();
  test::ChildProcess ctl(
      {KVCONTROLLER_PATH, "--controller_host=127.0.0.1",
       "--controller_port=" + std::to_string(port),
       R"(--controller_monitor_ports={"pull": 0, "reply": 0, "heartbeat": -1})"});
  bool serving = false;
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       !serving && ctl.running() && std::chrono::steady_clock::now() < until;
       std::this_thread::sleep_for(std::chrono::milliseconds(20)))
    serving = accepts_connections(port);
  EXPECT_TRUE(serving) << ctl.describe_exit() << "\n" << ctl.output();
  EXPECT_EQ(ctl.stop(SIGTERM, std::chrono::seconds(10)), 0) << ctl.output();
}

}  // namespace
}  // namespace kvnode::controller
