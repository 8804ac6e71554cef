// kvcontroller's configuration: LMCache's controller keys and flags with the same meaning
// (protocol reference §3.12), plus kvnode's own knobs. Sources, later ones winning: defaults,
// the YAML file (--config or LMCACHE_CONTROLLER_CONFIG_FILE), LMCACHE_CONTROLLER_<KEY>
// environment variables, command-line flags, then trailing key=value extras.
// Port 0 binds an ephemeral port (tests); a negative heartbeat port disables that socket.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/keys/chunk_hash.hpp"

namespace kvnode::controller {

struct MonitorPorts {
  int pull = 8300;
  int reply = 8400;
  int heartbeat = 8082;  // < 0: no heartbeat socket (LMCache's default when the key is absent)
};

struct ControllerConfig {
  // LMCache keys.
  std::string controller_host = "0.0.0.0";  // bind host of every socket, HTTP included
  int controller_port = 9000;               // HTTP API
  MonitorPorts controller_monitor_ports;
  std::optional<int> monitor_port;        // legacy --monitor-port: one extra PULL socket
  double health_check_interval = 5.0;     // reaper period, s; <= 0 turns the reaper off
  double lmcache_worker_timeout = 30.0;   // s without a heartbeat before a worker is reaped
  std::string controller_advertise_host;  // host put in heartbeat_url; "" = derive (§3.2)

  // kvnode's own keys.
  double fanout_timeout = 30.0;      // s each worker has to answer a clear/pin/move/... call
  double full_sync_threshold = 0.8;  // global progress at which workers may leave freeze
  double full_sync_timeout = 300.0;  // s of silence before a SYNCING worker becomes FAILED
  int max_workers = 65536;           // registrations beyond are refused with an ErrorMsg
  int http_max_connections = 4096;   // HTTP connections open at once; beyond: 503 and closed
  int http_max_body_mb = 64;         // MiB of one request body; beyond: 413
  int http_max_bodies_mb = 256;      // MiB of request bodies being read at once; beyond: 503
  keys::ChunkHashConfig hashing;     // how /lookup turns tokens into chunk hashes
  std::string log_level = "info";    // trace, debug, info, warn, error, critical, off
};

// Reads one environment variable; injectable so tests need not touch the process environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_env();

// The outcome of parsing a command line: a config to run, or text to print and an exit code
// (--help, --version: exit 0).
struct ConfigOrExit {
  std::optional<ControllerConfig> config;
  std::string message;
  int exit_code = 0;
};

// Parses argv (argv[0] is the program name) and the sources above. Errors name the source and
// key, e.g. "LMCACHE_CONTROLLER_CONTROLLER_PORT: expected an integer, got 'abc'".
Result<ConfigOrExit> load_config(const std::vector<std::string>& argv, const EnvLookup& env);

// Every setting's key (its one name in every source), in --help's order: for the docs' tests.
std::vector<std::string> config_keys();

// Each key and its value in `config` as a key=value extra would spell it ("" = unset); --help's
// defaults are shown_settings(ControllerConfig{}).
std::vector<std::pair<std::string, std::string>> shown_settings(const ControllerConfig& config);

// Rejects out-of-range values (ports outside 0..65535, negative timeouts, threshold outside
// (0,1], chunk_size 0, health_check_interval in (0,1)).
Status validate(const ControllerConfig& config);

}  // namespace kvnode::controller
