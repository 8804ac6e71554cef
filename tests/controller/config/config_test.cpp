// kvcontroller's configuration: defaults, each source (YAML file, LMCACHE_CONTROLLER_* variables,
// flags, key=value extras), their precedence, and the exact error text of bad values.
#include "kvnode/controller/config.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "config_support.hpp"

namespace kvnode::controller {
namespace {

using namespace config_test;  // NOLINT(google-build-using-namespace): the shared helpers

// ---- Defaults ----

TEST(ConfigDefaults, NoSourcesGiveTheDocumentedDefaults) {
  const ControllerConfig c = loaded({});
  EXPECT_EQ(c.controller_host, "0.0.0.0");
  EXPECT_EQ(c.controller_port, 9000);
  EXPECT_EQ(c.controller_monitor_ports.pull, 8300);
  EXPECT_EQ(c.controller_monitor_ports.reply, 8400);
  EXPECT_EQ(c.controller_monitor_ports.heartbeat, 8082);
  EXPECT_FALSE(c.monitor_port.has_value());
  EXPECT_EQ(c.health_check_interval, 5.0);
  EXPECT_EQ(c.lmcache_worker_timeout, 30.0);
  EXPECT_EQ(c.controller_advertise_host, "");
  EXPECT_EQ(c.fanout_timeout, 30.0);
  EXPECT_EQ(c.full_sync_threshold, 0.8);
  EXPECT_EQ(c.full_sync_timeout, 300.0);
  EXPECT_EQ(c.log_level, "info");
  EXPECT_EQ(c.hashing.chunk_size, 256u);
  EXPECT_EQ(c.hashing.init_hash, wire::WideInt(0));
  EXPECT_EQ(c.hashing.none_hash, keys::kNoneHashPython312);
}

TEST(ConfigDefaults, DefaultConfigValidates) {
  EXPECT_TRUE(validate(ControllerConfig{}).ok());
}

// ---- Command-line flags ----

TEST(ConfigFlags, EveryFlagSetsItsKey) {
  const ControllerConfig c = loaded({"--host",
                                     "127.0.0.1",
                                     "--port",
                                     "0",
                                     "--monitor-ports",
                                     R"({"pull": 1, "reply": 2, "heartbeat": 3})",
                                     "--monitor-port",
                                     "4",
                                     "--health-check-interval",
                                     "2.5",
                                     "--lmcache-worker-timeout",
                                     "12",
                                     "--advertise-host",
                                     "ctrl.example",
                                     "--fanout-timeout",
                                     "7.5",
                                     "--full-sync-threshold",
                                     "1",
                                     "--full-sync-timeout",
                                     "60",
                                     "--log-level",
                                     "debug",
                                     "--chunk-size",
                                     "16",
                                     "--hash-init",
                                     "-42",
                                     "--none-hash",
                                     "123"});
  EXPECT_EQ(c.controller_host, "127.0.0.1");
  EXPECT_EQ(c.controller_port, 0);
  EXPECT_EQ(c.controller_monitor_ports.pull, 1);
  EXPECT_EQ(c.controller_monitor_ports.reply, 2);
  EXPECT_EQ(c.controller_monitor_ports.heartbeat, 3);
  EXPECT_EQ(c.monitor_port, 4);
  EXPECT_EQ(c.health_check_interval, 2.5);
  EXPECT_EQ(c.lmcache_worker_timeout, 12.0);
  EXPECT_EQ(c.controller_advertise_host, "ctrl.example");
  EXPECT_EQ(c.fanout_timeout, 7.5);
  EXPECT_EQ(c.full_sync_threshold, 1.0);
  EXPECT_EQ(c.full_sync_timeout, 60.0);
  EXPECT_EQ(c.log_level, "debug");
  EXPECT_EQ(c.hashing.chunk_size, 16u);
  EXPECT_EQ(c.hashing.init_hash, wire::WideInt(-42));
  EXPECT_EQ(c.hashing.none_hash, 123u);
}

TEST(ConfigFlags, EqualsFormAndNegativeNumbers) {
  EXPECT_EQ(loaded({"--port=9100"}).controller_port, 9100);
  EXPECT_EQ(loaded({"--health-check-interval=-1"}).health_check_interval, -1.0);
  EXPECT_EQ(loaded({"--health-check-interval", "-1"}).health_check_interval, -1.0);
  EXPECT_EQ(loaded({"--health-check-interval", "0"}).health_check_interval, 0.0);
}

TEST(ConfigFlags, RepeatedFlagLastWins) {
  EXPECT_EQ(loaded({"--port", "1000", "--port", "2000"}).controller_port, 2000);
}

TEST(ConfigFlags, BadFlagValuesNameFlagAndValue) {
  EXPECT_EQ(error_of({"--port", "abc"}), "--port: expected an integer, got 'abc'");
  EXPECT_EQ(error_of({"--port", "80x"}), "--port: expected an integer, got '80x'");
  EXPECT_EQ(error_of({"--port", ""}), "--port: expected an integer, got ''");
  EXPECT_EQ(error_of({"--port", "99999999999"}),
            "--port: expected an integer, got '99999999999' (out of range)");
  EXPECT_EQ(error_of({"--health-check-interval", "soon"}),
            "--health-check-interval: expected a number, got 'soon'");
  EXPECT_EQ(error_of({"--fanout-timeout", "inf"}),
            "--fanout-timeout: expected a number, got 'inf'");
  EXPECT_EQ(error_of({"--full-sync-threshold", "nan"}),
            "--full-sync-threshold: expected a number, got 'nan'");
  EXPECT_EQ(error_of({"--chunk-size", "-5"}),
            "--chunk-size: expected a positive integer, got '-5'");
  EXPECT_EQ(error_of({"--monitor-port", "x"}), "--monitor-port: expected an integer, got 'x'");
}

TEST(ConfigFlags, UsageErrorsComeFromTheParser) {
  EXPECT_NE(error_of({"--bogus"}).find("--bogus"), std::string::npos);
  EXPECT_NE(error_of({"--port"}).find("--port"), std::string::npos);
}

TEST(ConfigFlags, HelpExitsZeroListingTheFlags) {
  auto result = load({"--help"});
  ASSERT_TRUE(result.ok());
  EXPECT_FALSE(result->config.has_value());
  EXPECT_EQ(result->exit_code, 0);
  for (const char* flag :
       {"--host", "--port", "--monitor-ports", "--monitor-port", "--health-check-interval",
        "--lmcache-worker-timeout", "--config", "--advertise-host", "--fanout-timeout",
        "--full-sync-threshold", "--full-sync-timeout", "--log-level", "--chunk-size",
        "--hash-init", "--none-hash", "--version"})
    EXPECT_NE(result->message.find(flag), std::string::npos) << flag;
}

TEST(ConfigFlags, HelpWinsOverBadValues) {
  auto result = load({"--port", "abc", "--help"});
  ASSERT_TRUE(result.ok());
  EXPECT_FALSE(result->config.has_value());
  EXPECT_EQ(result->exit_code, 0);
}

TEST(ConfigFlags, VersionExitsZero) {
  auto result = load({"--version"});
  ASSERT_TRUE(result.ok());
  EXPECT_FALSE(result->config.has_value());
  EXPECT_EQ(result->exit_code, 0);
  EXPECT_EQ(result->message.rfind("kvcontroller ", 0), 0u) << result->message;
}

TEST(ConfigFlags, EmptyArgvIsTolerated) {
  auto result = load_config({}, env_of({}));
  ASSERT_TRUE(result.ok());
  EXPECT_TRUE(result->config.has_value());
}

// ---- --monitor-ports ----

MonitorPorts ports_of(const std::string& json) {
  return loaded({"--monitor-ports", json}).controller_monitor_ports;
}

TEST(ConfigMonitorPorts, FullObject) {
  const MonitorPorts p = ports_of(R"({"pull": 8300, "reply": 8400, "heartbeat": 8082})");
  EXPECT_EQ(p.pull, 8300);
  EXPECT_EQ(p.reply, 8400);
  EXPECT_EQ(p.heartbeat, 8082);
}

TEST(ConfigMonitorPorts, MissingHeartbeatKeepsTheDefault) {
  const MonitorPorts p = ports_of(R"({"pull": 18300, "reply": 18400})");
  EXPECT_EQ(p.pull, 18300);
  EXPECT_EQ(p.reply, 18400);
  EXPECT_EQ(p.heartbeat, 8082);
}

TEST(ConfigMonitorPorts, NullOrNegativeHeartbeatDisablesIt) {
  EXPECT_LT(ports_of(R"({"pull": 1, "reply": 2, "heartbeat": null})").heartbeat, 0);
  EXPECT_LT(ports_of(R"({"pull": 1, "reply": 2, "heartbeat": -1})").heartbeat, 0);
  EXPECT_LT(ports_of(R"({"pull": 1, "reply": 2, "heartbeat": -7})").heartbeat, 0);
}

TEST(ConfigMonitorPorts, AnObjectReplacesTheWholeEarlierValue) {
  // The env turns heartbeat off; a flag without "heartbeat" brings back the default.
  const ControllerConfig c = loaded(
      {"--monitor-ports", R"({"reply": 7})"},
      {{"LMCACHE_CONTROLLER_CONTROLLER_MONITOR_PORTS", R"({"pull": 5, "heartbeat": null})"}});
  EXPECT_EQ(c.controller_monitor_ports.pull, 8300);
  EXPECT_EQ(c.controller_monitor_ports.reply, 7);
  EXPECT_EQ(c.controller_monitor_ports.heartbeat, 8082);
}

TEST(ConfigMonitorPorts, Errors) {
  EXPECT_EQ(error_of({"--monitor-ports", R"({"pul": 8300, "reply": 8400})"}),
            "--monitor-ports: unknown key 'pul'");
  EXPECT_EQ(error_of({"--monitor-ports", R"({"pul": 1, "rep": 2})"}),
            "--monitor-ports: unknown keys 'pul', 'rep'");
  EXPECT_EQ(error_of({"--monitor-ports", "8300"}),
            R"(--monitor-ports: expected a JSON object such as {"pull": 8300, "reply": 8400}, )"
            "got '8300'");
  EXPECT_EQ(error_of({"--monitor-ports", "{pull: 1}"}),
            R"(--monitor-ports: expected a JSON object such as {"pull": 8300, "reply": 8400}, )"
            "got '{pull: 1}'");
  EXPECT_EQ(error_of({"--monitor-ports", R"({"pull": "8300"})"}),
            R"(--monitor-ports: pull: expected an integer, got "8300")");
  EXPECT_EQ(error_of({"--monitor-ports", R"({"reply": null})"}),
            "--monitor-ports: reply: expected an integer, got null");
  EXPECT_EQ(error_of({"--monitor-ports", R"({"pull": 1.5})"}),
            "--monitor-ports: pull: expected an integer, got 1.5");
  EXPECT_EQ(error_of({"--monitor-ports", R"({"pull": 99999999999})"}),
            "--monitor-ports: pull: expected an integer, got 99999999999 (out of range)");
  EXPECT_EQ(error_of({"--monitor-ports", R"({"pull": 70000})"}),
            "controller_monitor_ports.pull: expected a port in 0..65535, got 70000");
}

TEST(ConfigMonitorPorts, LegacyMonitorPort) {
  EXPECT_EQ(loaded({"--monitor-port", "9001"}).monitor_port, 9001);
  EXPECT_EQ(error_of({"--monitor-port", "70000"}),
            "monitor_port: expected a port in 0..65535, got 70000");
}

// ---- Chunk-hash knobs ----

TEST(ConfigHashing, NoneHashWordsAndNumbers) {
  EXPECT_EQ(loaded({"--none-hash", "py312"}).hashing.none_hash, keys::kNoneHashPython312);
  EXPECT_EQ(loaded({"--none-hash", "debian-py311"}).hashing.none_hash,
            keys::kNoneHashDebianPython3112);
  EXPECT_EQ(loaded({"--none-hash", "612812"}).hashing.none_hash, 612812u);
  EXPECT_EQ(loaded({"--none-hash", "-2"}).hashing.none_hash, static_cast<std::uint64_t>(-2));
  EXPECT_EQ(error_of({"--none-hash", "py311"}),
            "--none-hash: expected an integer, py312 or debian-py311, got 'py311'");
}

TEST(ConfigHashing, HashInitCoversTheWholeWireRange) {
  EXPECT_EQ(loaded({"--hash-init", "18446744073709551615"}).hashing.init_hash,
            wire::WideInt::from_unsigned(UINT64_MAX));
  EXPECT_EQ(loaded({"--hash-init", "-9223372036854775808"}).hashing.init_hash,
            wire::WideInt(INT64_MIN));
  EXPECT_EQ(loaded({"--hash-init=-0"}).hashing.init_hash, wire::WideInt(0));
  EXPECT_EQ(error_of({"--hash-init=-9223372036854775809"}),
            "--hash-init: expected an integer, got '-9223372036854775809' (out of range)");
  EXPECT_EQ(error_of({"--hash-init", "18446744073709551616"}),
            "--hash-init: expected an integer, got '18446744073709551616' (out of range)");
  EXPECT_EQ(error_of({"--hash-init", "0x10"}), "--hash-init: expected an integer, got '0x10'");
  EXPECT_EQ(error_of({"--hash-init=--1"}), "--hash-init: expected an integer, got '--1'");
}

// ---- Environment ----

TEST(ConfigEnv, EveryKeyHasAVariable) {
  const ControllerConfig c = loaded(
      {}, {{"LMCACHE_CONTROLLER_CONTROLLER_HOST", "10.0.0.1"},
           {"LMCACHE_CONTROLLER_CONTROLLER_PORT", "9100"},
           {"LMCACHE_CONTROLLER_CONTROLLER_MONITOR_PORTS", R"({"pull": 8301, "reply": 8401})"},
           {"LMCACHE_CONTROLLER_MONITOR_PORT", "9001"},
           {"LMCACHE_CONTROLLER_HEALTH_CHECK_INTERVAL", "-1"},
           {"LMCACHE_CONTROLLER_LMCACHE_WORKER_TIMEOUT", "300"},
           {"LMCACHE_CONTROLLER_CONTROLLER_ADVERTISE_HOST", "ctrl"},
           {"LMCACHE_CONTROLLER_EXTRA_CONFIG", "anything"},
           {"LMCACHE_CONTROLLER_FANOUT_TIMEOUT", "3"},
           {"LMCACHE_CONTROLLER_FULL_SYNC_THRESHOLD", "0.5"},
           {"LMCACHE_CONTROLLER_FULL_SYNC_TIMEOUT", "30"},
           {"LMCACHE_CONTROLLER_LOG_LEVEL", "warn"},
           {"LMCACHE_CONTROLLER_CHUNK_SIZE", "32"},
           {"LMCACHE_CONTROLLER_HASH_INIT", "7"},
           {"LMCACHE_CONTROLLER_NONE_HASH", "debian-py311"}});
  EXPECT_EQ(c.controller_host, "10.0.0.1");
  EXPECT_EQ(c.controller_port, 9100);
  EXPECT_EQ(c.controller_monitor_ports.pull, 8301);
  EXPECT_EQ(c.controller_monitor_ports.reply, 8401);
  EXPECT_EQ(c.controller_monitor_ports.heartbeat, 8082);
  EXPECT_EQ(c.monitor_port, 9001);
  EXPECT_EQ(c.health_check_interval, -1.0);
  EXPECT_EQ(c.lmcache_worker_timeout, 300.0);
  EXPECT_EQ(c.controller_advertise_host, "ctrl");
  EXPECT_EQ(c.fanout_timeout, 3.0);
  EXPECT_EQ(c.full_sync_threshold, 0.5);
  EXPECT_EQ(c.full_sync_timeout, 30.0);
  EXPECT_EQ(c.log_level, "warn");
  EXPECT_EQ(c.hashing.chunk_size, 32u);
  EXPECT_EQ(c.hashing.init_hash, wire::WideInt(7));
  EXPECT_EQ(c.hashing.none_hash, keys::kNoneHashDebianPython3112);
}

TEST(ConfigEnv, BadValuesNameTheVariable) {
  EXPECT_EQ(error_of({}, {{"LMCACHE_CONTROLLER_CONTROLLER_PORT", "abc"}}),
            "LMCACHE_CONTROLLER_CONTROLLER_PORT: expected an integer, got 'abc'");
  EXPECT_EQ(error_of({}, {{"LMCACHE_CONTROLLER_LMCACHE_WORKER_TIMEOUT", "30s"}}),
            "LMCACHE_CONTROLLER_LMCACHE_WORKER_TIMEOUT: expected a number, got '30s'");
  EXPECT_EQ(error_of({}, {{"LMCACHE_CONTROLLER_CONTROLLER_MONITOR_PORTS", R"({"pul": 1})"}}),
            "LMCACHE_CONTROLLER_CONTROLLER_MONITOR_PORTS: unknown key 'pul'");
}

TEST(ConfigEnv, EmptyAdvertiseHostMeansDerive) {
  EXPECT_EQ(loaded({"--advertise-host", "x"}, {}).controller_advertise_host, "x");
  EXPECT_EQ(
      loaded({}, {{"LMCACHE_CONTROLLER_CONTROLLER_ADVERTISE_HOST", ""}}).controller_advertise_host,
      "");
}

// ---- YAML file ----

TEST(ConfigYaml, EveryKeyWithLmcacheNames) {
  const TempYaml file(R"(
controller_host: 127.0.0.2
controller_port: 9200
controller_monitor_ports:
  pull: 8310
  reply: 8410
  heartbeat: 8092
monitor_port: 9002
health_check_interval: 10
lmcache_worker_timeout: 60.5
controller_advertise_host: adv.example
extra_config:
  anything: [1, 2]
fanout_timeout: 4
full_sync_threshold: 0.9
full_sync_timeout: 100
log_level: error
chunk_size: 64
hash_init: -3
none_hash: py312
)");
  const ControllerConfig c = loaded({"--config", file.path()});
  EXPECT_EQ(c.controller_host, "127.0.0.2");
  EXPECT_EQ(c.controller_port, 9200);
  EXPECT_EQ(c.controller_monitor_ports.pull, 8310);
  EXPECT_EQ(c.controller_monitor_ports.reply, 8410);
  EXPECT_EQ(c.controller_monitor_ports.heartbeat, 8092);
  EXPECT_EQ(c.monitor_port, 9002);
  EXPECT_EQ(c.health_check_interval, 10.0);
  EXPECT_EQ(c.lmcache_worker_timeout, 60.5);
  EXPECT_EQ(c.controller_advertise_host, "adv.example");
  EXPECT_EQ(c.fanout_timeout, 4.0);
  EXPECT_EQ(c.full_sync_threshold, 0.9);
  EXPECT_EQ(c.full_sync_timeout, 100.0);
  EXPECT_EQ(c.log_level, "error");
  EXPECT_EQ(c.hashing.chunk_size, 64u);
  EXPECT_EQ(c.hashing.init_hash, wire::WideInt(-3));
  EXPECT_EQ(c.hashing.none_hash, keys::kNoneHashPython312);
}

TEST(ConfigYaml, MonitorPortsForms) {
  const TempYaml flow(R"(controller_monitor_ports: {"pull": 1, "reply": 2, "heartbeat": ~})");
  EXPECT_LT(loaded({"--config", flow.path()}).controller_monitor_ports.heartbeat, 0);
  const TempYaml json_text(R"(controller_monitor_ports: '{"pull": 3, "reply": 4}')");
  const MonitorPorts p = loaded({"--config", json_text.path()}).controller_monitor_ports;
  EXPECT_EQ(p.pull, 3);
  EXPECT_EQ(p.reply, 4);
  EXPECT_EQ(p.heartbeat, 8082);
  const TempYaml quoted("controller_monitor_ports:\n  pull: '8300'\n");
  EXPECT_EQ(error_of({"--config", quoted.path()}),
            quoted.path() + R"(: controller_monitor_ports: pull: expected an integer, got "8300")");
}

TEST(ConfigYaml, NullsUnsetOptionalKeys) {
  const TempYaml file("controller_advertise_host: ~\nmonitor_port:\nextra_config: null\n");
  const ControllerConfig c = loaded({"--config", file.path(), "--advertise-host", "a"});
  EXPECT_EQ(c.controller_advertise_host, "a");
  const ControllerConfig d =
      loaded({"--config", file.path()}, {{"LMCACHE_CONTROLLER_MONITOR_PORT", "1"}});
  EXPECT_EQ(d.monitor_port, 1);  // env comes after the file
  EXPECT_FALSE(loaded({"--config", file.path()}).monitor_port.has_value());
  EXPECT_EQ(loaded({"--config", file.path()}).controller_advertise_host, "");
}

TEST(ConfigYaml, BadValueNamesFileAndKey) {
  const TempYaml file("controller_port: abc\n");
  EXPECT_EQ(error_of({"--config", file.path()}),
            file.path() + ": controller_port: expected an integer, got 'abc'");
  const TempYaml null_port("controller_port: ~\n");
  EXPECT_EQ(error_of({"--config", null_port.path()}),
            null_port.path() + ": controller_port: expected an integer, got null");
  const TempYaml list_host("controller_host: [a, b]\n");
  EXPECT_EQ(error_of({"--config", list_host.path()}),
            list_host.path() + R"(: controller_host: expected a string, got ["a","b"])");
}

TEST(ConfigYaml, UnknownKeyNamesFileAndKey) {
  const TempYaml file("controller_port: 9000\ncontroler_host: x\n");
  EXPECT_EQ(error_of({"--config", file.path()}),
            file.path() + ": unknown key 'controler_host' (did you mean 'controller_host'?)");
}

TEST(ConfigYaml, FileProblems) {
  EXPECT_EQ(error_of({"--config", "/nonexistent/kvcontroller.yaml"}),
            "/nonexistent/kvcontroller.yaml: cannot read the config file");
  const TempYaml list("- a\n- b\n");
  EXPECT_EQ(error_of({"--config", list.path()}),
            list.path() + ": expected a mapping of config keys");
  const TempYaml broken("controller_port: [1\n");
  EXPECT_EQ(error_of({"--config", broken.path()}).rfind(broken.path() + ": ", 0), 0u);
  const TempYaml empty("");
  EXPECT_EQ(loaded({"--config", empty.path()}).controller_port, 9000);
}

TEST(ConfigYaml, FileFromEnvironment) {
  const TempYaml file("controller_port: 9300\n");
  EXPECT_EQ(loaded({}, {{"LMCACHE_CONTROLLER_CONFIG_FILE", file.path()}}).controller_port, 9300);
  EXPECT_EQ(loaded({}, {{"LMCACHE_CONTROLLER_CONFIG_FILE", ""}}).controller_port, 9000);
}

TEST(ConfigYaml, ConfigFlagBeatsTheEnvironmentsFile) {
  const TempYaml env_file("controller_port: 9300\n");
  const TempYaml flag_file("controller_host: 1.2.3.4\n");
  const ControllerConfig c =
      loaded({"--config", flag_file.path()}, {{"LMCACHE_CONTROLLER_CONFIG_FILE", env_file.path()}});
  EXPECT_EQ(c.controller_host, "1.2.3.4");
  EXPECT_EQ(c.controller_port, 9000);  // the env's file was not read
}

// ---- key=value extras ----

TEST(ConfigExtras, SetAnyKeyByName) {
  const ControllerConfig c =
      loaded({"controller_port=9400", "controller_monitor_ports={\"pull\": 5, \"reply\": 6}",
              "none_hash=debian-py311", "extra_config=whatever", "controller_advertise_host="});
  EXPECT_EQ(c.controller_port, 9400);
  EXPECT_EQ(c.controller_monitor_ports.pull, 5);
  EXPECT_EQ(c.controller_monitor_ports.reply, 6);
  EXPECT_EQ(c.hashing.none_hash, keys::kNoneHashDebianPython3112);
  EXPECT_EQ(c.controller_advertise_host, "");
}

TEST(ConfigExtras, Errors) {
  EXPECT_EQ(error_of({"controller_port=abc"}),
            "extra 'controller_port=abc': expected an integer, got 'abc'");
  EXPECT_EQ(error_of({"controler_port=1"}),
            "extra 'controler_port=1': unknown key 'controler_port' (did you mean "
            "'controller_port'?)");
  EXPECT_EQ(error_of({"zzz=1"}), "extra 'zzz=1': unknown key 'zzz'");  // no key is near
  EXPECT_EQ(error_of({"controller_port"}), "extra 'controller_port': expected key=value");
}

// ---- Precedence: defaults < YAML < env < flags < extras ----

TEST(ConfigPrecedence, LaterSourcesWin) {
  const TempYaml file(
      "controller_port: 1001\nfanout_timeout: 1\nfull_sync_timeout: 1\n"
      "chunk_size: 1\n");
  const EnvMap env = {{"LMCACHE_CONTROLLER_CONFIG_FILE", file.path()},
                      {"LMCACHE_CONTROLLER_CONTROLLER_PORT", "1002"},
                      {"LMCACHE_CONTROLLER_FANOUT_TIMEOUT", "2"},
                      {"LMCACHE_CONTROLLER_FULL_SYNC_TIMEOUT", "2"}};
  EXPECT_EQ(loaded({}, env).hashing.chunk_size, 1u);  // YAML over default
  EXPECT_EQ(loaded({}, env).full_sync_timeout, 2.0);  // env over YAML
  const ControllerConfig c =
      loaded({"--port", "1003", "--fanout-timeout", "3", "controller_port=1004"}, env);
  EXPECT_EQ(c.controller_port, 1004);       // extra over flag
  EXPECT_EQ(c.fanout_timeout, 3.0);         // flag over env
  EXPECT_EQ(c.full_sync_timeout, 2.0);      // env over YAML
  EXPECT_EQ(c.hashing.chunk_size, 1u);      // YAML over default
  EXPECT_EQ(c.controller_host, "0.0.0.0");  // default
}

TEST(ConfigPrecedence, ValidationSeesTheMergedResult) {
  // A bad value in an earlier source is fine when a later one overrides it with a good value.
  EXPECT_EQ(
      loaded({"--full-sync-threshold", "0.5"}, {{"LMCACHE_CONTROLLER_FULL_SYNC_THRESHOLD", "2"}})
          .full_sync_threshold,
      0.5);
}

// ---- validate() ----

Status validate_with(void (*edit)(ControllerConfig&)) {
  ControllerConfig c;
  edit(c);
  return validate(c);
}

std::string validation_error(void (*edit)(ControllerConfig&)) {
  const Status status = validate_with(edit);
  if (status.ok()) {
    ADD_FAILURE() << "expected a validation error";
    return "";
  }
  return status.error().message;
}

TEST(ConfigValidate, Ports) {
  EXPECT_TRUE(validate_with([](ControllerConfig& c) {
                c.controller_port = 0;
                c.controller_monitor_ports = {0, 0, 0};
              }).ok());
  EXPECT_TRUE(validate_with([](ControllerConfig& c) { c.controller_port = 65535; }).ok());
  EXPECT_TRUE(
      validate_with([](ControllerConfig& c) { c.controller_monitor_ports.heartbeat = -1; }).ok());
  EXPECT_EQ(validation_error([](ControllerConfig& c) { c.controller_port = -1; }),
            "controller_port: expected a port in 0..65535, got -1");
  EXPECT_EQ(validation_error([](ControllerConfig& c) { c.controller_port = 65536; }),
            "controller_port: expected a port in 0..65535, got 65536");
  EXPECT_EQ(validation_error([](ControllerConfig& c) { c.controller_monitor_ports.reply = -2; }),
            "controller_monitor_ports.reply: expected a port in 0..65535, got -2");
  EXPECT_EQ(
      validation_error([](ControllerConfig& c) { c.controller_monitor_ports.heartbeat = 70000; }),
      "controller_monitor_ports.heartbeat: expected a port in 0..65535, got 70000");
  EXPECT_EQ(validation_error([](ControllerConfig& c) { c.monitor_port = 65536; }),
            "monitor_port: expected a port in 0..65535, got 65536");
}

TEST(ConfigValidate, PortsMustDifferExceptEphemeral) {
  EXPECT_EQ(validation_error([](ControllerConfig& c) { c.controller_monitor_ports.reply = 8300; }),
            "controller_monitor_ports.reply: port 8300 is also controller_monitor_ports.pull");
  EXPECT_EQ(validation_error([](ControllerConfig& c) { c.monitor_port = 9000; }),
            "monitor_port: port 9000 is also controller_port");
  // A disabled heartbeat socket does not collide with anything.
  EXPECT_TRUE(validate_with([](ControllerConfig& c) {
                c.controller_monitor_ports = {1, 2, -1};
                c.monitor_port = 3;
              }).ok());
}

TEST(ConfigValidate, Timings) {
  for (double off : {0.0, -1.0, -5.0})
    EXPECT_TRUE(loaded({"--health-check-interval=" + std::to_string(off)}).health_check_interval <=
                0);
  EXPECT_EQ(loaded({"--health-check-interval", "1"}).health_check_interval, 1.0);
  EXPECT_EQ(error_of({"--health-check-interval", "0.5"}),
            "health_check_interval: expected <= 0 (off) or >= 1, got 0.5");
  EXPECT_EQ(validation_error([](ControllerConfig& c) { c.lmcache_worker_timeout = 0; }),
            "lmcache_worker_timeout: expected a number > 0, got 0");
  EXPECT_EQ(validation_error([](ControllerConfig& c) { c.fanout_timeout = -1; }),
            "fanout_timeout: expected a number > 0, got -1");
  EXPECT_EQ(validation_error([](ControllerConfig& c) { c.full_sync_timeout = 0; }),
            "full_sync_timeout: expected a number > 0, got 0");
  EXPECT_TRUE(validate_with([](ControllerConfig& c) { c.fanout_timeout = 0.001; }).ok());
}

// A body's buffer doubles as it arrives and both buffers count while one is copied: a 64 MiB body
// holds 96 MiB of the budget at its peak, so a smaller budget would refuse every such body, even
// alone (a budget merely >= the body size was accepted before).
TEST(ConfigValidate, BodyBudgetHoldsOneLargestBodyAtItsPeak) {
  EXPECT_EQ(validation_error([](ControllerConfig& c) {
              c.http_max_body_mb = 64;
              c.http_max_bodies_mb = 64;
            }),
            "http_max_bodies_mb: 64 is below the 96 MiB one body of http_max_body_mb (64) holds "
            "at its peak: every body that large would be refused 503; set at least 96");
  EXPECT_TRUE(validate_with([](ControllerConfig& c) {
                c.http_max_body_mb = 64;
                c.http_max_bodies_mb = 96;
              }).ok());
  // 1 MiB peaks at 1.5 MiB: 2 MiB at least; 100 MiB at 64 + 100 MiB.
  EXPECT_FALSE(validate_with([](ControllerConfig& c) {
                 c.http_max_body_mb = 1;
                 c.http_max_bodies_mb = 1;
               }).ok());
  EXPECT_TRUE(validate_with([](ControllerConfig& c) {
                c.http_max_body_mb = 1;
                c.http_max_bodies_mb = 2;
              }).ok());
  EXPECT_FALSE(validate_with([](ControllerConfig& c) {
                 c.http_max_body_mb = 100;
                 c.http_max_bodies_mb = 163;
               }).ok());
  EXPECT_TRUE(validate_with([](ControllerConfig& c) {
                c.http_max_body_mb = 100;
                c.http_max_bodies_mb = 164;
              }).ok());
  EXPECT_NE(
      error_of({"--http-max-body-mb", "64", "--http-max-bodies-mb", "80"}).find("set at least 96"),
      std::string::npos);
}

TEST(ConfigValidate, FullSyncThresholdIsAFraction) {
  EXPECT_TRUE(validate_with([](ControllerConfig& c) { c.full_sync_threshold = 1; }).ok());
  EXPECT_TRUE(validate_with([](ControllerConfig& c) { c.full_sync_threshold = 0.01; }).ok());
  EXPECT_EQ(validation_error([](ControllerConfig& c) { c.full_sync_threshold = 0; }),
            "full_sync_threshold: expected a number in (0, 1], got 0");
  EXPECT_EQ(validation_error([](ControllerConfig& c) { c.full_sync_threshold = 1.5; }),
            "full_sync_threshold: expected a number in (0, 1], got 1.5");
}

TEST(ConfigValidate, ChunkSizeHostAndLogLevel) {
  EXPECT_EQ(error_of({"--chunk-size", "0"}), "chunk_size: expected an integer > 0, got 0");
  EXPECT_EQ(error_of({"--host", ""}), "controller_host: expected a host, got ''");
  for (const char* level :
       {"trace", "debug", "info", "warn", "warning", "err", "error", "critical", "off"})
    EXPECT_EQ(loaded({"--log-level", level}).log_level, level);
  EXPECT_EQ(
      error_of({"--log-level", "verbose"}),
      "log_level: expected one of trace, debug, info, warn, error, critical, off, got 'verbose'");
}

}  // namespace
}  // namespace kvnode::controller
