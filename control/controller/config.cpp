// kvcontroller's configuration sources (protocol reference §3.12). Every key is described once, in
// kKeys: its name (YAML key, LMCACHE_CONTROLLER_<NAME> suffix and key=value extra), its flag and
// how a value is applied. All sources hand their values to the same apply function, so a key
// accepts the same spellings everywhere and its errors differ only in the source prefix.
#include "kvnode/controller/config.hpp"

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>
#include <system_error>
#include <utility>

#include "config_keys.hpp"
#include "config_values.hpp"
#include "kvnode/common/nearest_name.hpp"
#include "kvnode/controller/yaml_file.hpp"
#include "kvnode/httpd/server.hpp"

// control/CMakeLists.txt does not (yet) pass the project version to this library the way
// tools/*/CMakeLists.txt do for their binaries; keep this equal to project(VERSION) until it does.
#ifndef KVNODE_VERSION
#define KVNODE_VERSION "0.1.0"
#endif

namespace kvnode::controller {
namespace {

using nlohmann::json;

constexpr std::string_view kEnvPrefix = "LMCACHE_CONTROLLER_";
constexpr std::string_view kConfigFileEnv = "LMCACHE_CONTROLLER_CONFIG_FILE";

using namespace config_values;  // NOLINT(google-build-using-namespace): this file applies them
using namespace key_table;      // NOLINT(google-build-using-namespace): the table it reads

ConfigOrExit exit_with(std::string message) {
  ConfigOrExit out;
  out.message = std::move(message);
  out.exit_code = 0;
  return out;
}

// Applies one value; an error reads "<label>: <problem>".
Status apply(const Key& key, ControllerConfig& config, const RawValue& value,
             const std::string& label) {
  if (auto status = key.apply(config, value); !status)
    return make_error(label + ": " + status.error().message);
  return {};
}

// ---- YAML file ----

// A YAML mapping/sequence as JSON. yaml-cpp keeps scalars as text, so a plain (unquoted) scalar
// that reads as an integer becomes one, as it would for a YAML loader that resolves types.
json yaml_to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      json object = json::object();
      for (const auto& entry : node) object[entry.first.Scalar()] = yaml_to_json(entry.second);
      return object;
    }
    case YAML::NodeType::Sequence: {
      json array = json::array();
      for (const auto& element : node) array.push_back(yaml_to_json(element));
      return array;
    }
    case YAML::NodeType::Scalar: {
      if (node.Tag() == "?") {  // plain: no quotes, no explicit tag
        if (auto n = parse_whole<std::int64_t>(node.Scalar(), "an integer")) return *n;
      }
      return node.Scalar();
    }
    default:
      return nullptr;
  }
}

RawValue raw_from_yaml(const YAML::Node& node) {
  if (node.IsNull()) return null_value();
  if (node.IsScalar()) return text_value(node.Scalar());
  return structured_value(yaml_to_json(node));
}

Status apply_yaml_file(ControllerConfig& config, const std::string& path) {
  auto root = load_yaml_file(path);
  if (!root) return std::move(root).error();
  if (root->IsNull()) return {};  // an empty file sets nothing
  if (!root->IsMap()) return make_error(path + ": expected a mapping of config keys");
  std::vector<std::pair<const Key*, std::string>> seen;  // a key and the spelling that set it
  for (const auto& entry : *root) {
    const std::string name = entry.first.Scalar();
    const Key* key = find_key(name);
    if (!key) return make_error(path + ": " + unknown_name_message("key", name, all_names()));
    for (const auto& [earlier, spelling] : seen)
      if (earlier == key)
        return make_error(path + ": " + single_quoted(spelling) + " and " + single_quoted(name) +
                          " both set " + std::string(key->name) + "; keep one");
    seen.emplace_back(key, name);
    if (auto status = apply(*key, config, raw_from_yaml(entry.second), path + ": " + name); !status)
      return status;
  }
  return {};
}

// ---- Environment ----

std::string env_name(std::string_view key) {
  std::string name(kEnvPrefix);
  for (const char c : key) name += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

// Kubernetes puts LMCACHE_CONTROLLER_PORT=tcp://10.0.0.1:9000 into every pod of a namespace with
// a Service named lmcache-controller (LMCACHE_CONTROLLER_MONITOR_PORT for one named
// lmcache-controller-monitor, ...): a service link, not a setting.
bool is_service_link(const std::string& value) {
  return value.starts_with("tcp://") || value.starts_with("udp://");
}

bool takes_ports(const Key& key) {
  return key.type_name == "PORT" || key.name == "controller_monitor_ports";
}

// A variable's value, or nothing for a service link where a port is meant, or (an alias, which
// Kubernetes or a template may leave empty) for an empty value.
std::optional<std::string> env_value(const EnvLookup& env, const Key& key, const std::string& name,
                                     bool empty_is_unset) {
  std::optional<std::string> value = env(name);
  if (value && takes_ports(key) && is_service_link(*value)) return std::nullopt;
  if (value && empty_is_unset && value->empty()) return std::nullopt;
  return value;
}

Status apply_env(ControllerConfig& config, const EnvLookup& env) {
  for (const Key& key : kKeys) {
    const std::string name = env_name(key.name);
    std::optional<std::string> value = env_value(env, key, name, false);
    std::string source = name;
    if (const std::string alias = alias_of(key); !alias.empty()) {
      const std::string alias_name = env_name(alias);
      std::optional<std::string> alias_value = env_value(env, key, alias_name, true);
      if (alias_value && value && *alias_value != *value)
        return make_error(alias_name + " and " + name + " disagree ('" + *alias_value + "' and '" +
                          *value + "'); set one");
      if (alias_value && !value) {
        value = std::move(alias_value);
        source = alias_name;
      }
    }
    if (value) {
      if (auto status = apply(key, config, text_value(*value), source); !status) return status;
    }
  }
  return {};
}

// ---- Command line ----

// What the command line said, as text: values are parsed by the key table afterwards, so that a
// bad flag reads like a bad value from any other source.
struct CommandLine {
  std::array<std::optional<std::string>, kKeys.size()> flag_values;  // nullopt: flag absent
  std::optional<std::string> config_file;
  std::vector<std::string> extras;
  std::optional<ConfigOrExit> exit;  // --help / --version
};

// "bind host of every socket (key controller_host, default 0.0.0.0)"
std::string help_of(const Key& key) {
  std::string help = std::string(key.help) + " (key " + std::string(key.name);
  if (const std::string alias = alias_of(key); !alias.empty()) help += ", also " + alias;
  if (const std::string shown = key.shown(ControllerConfig{}); !shown.empty())
    help += ", default " + shown;
  return help + ")";
}

// LMCache's flag first (what its docs show), then the one named after the key.
std::string flags_of(const Key& key) {
  const std::string own = dashed(key.name);
  if (key.lmcache_flag.empty() || key.lmcache_flag == own) return own;
  return std::string(key.lmcache_flag) + "," + own;
}

// LMCache's lmcache_controller takes `--<key>=value` for any key (its extra parameters with the
// dashes stripped): the key=value extra it names, when it names one.
std::optional<std::string> dashed_extra(const std::string& arg) {
  const auto eq = arg.find('=');
  if (!arg.starts_with("--") || eq == std::string::npos) return std::nullopt;
  if (!find_key(std::string_view(arg).substr(2, eq - 2))) return std::nullopt;
  return arg.substr(2);
}

// Both spellings of one setting on the command line (--port 1 --controller-port 2) must agree,
// as they must in the environment; CLI11 folds them into one option, so they are told apart here.
Status check_flag_spellings(const std::vector<std::string>& argv) {
  for (const Key& key : kKeys) {
    const std::string own = dashed(key.name);
    if (key.lmcache_flag.empty() || key.lmcache_flag == own) continue;
    std::vector<std::pair<std::string, std::string>> given;  // spelling, value
    for (std::size_t i = 1; i < argv.size() && argv[i] != "--"; ++i)
      for (const std::string& flag : {std::string(key.lmcache_flag), own}) {
        if (argv[i] == flag && i + 1 < argv.size())
          given.emplace_back(flag, argv[++i]);
        else if (argv[i].starts_with(flag + "="))
          given.emplace_back(flag, argv[i].substr(flag.size() + 1));
        else
          continue;
        break;
      }
    for (const auto& [spelling, value] : given)
      for (const auto& [other, other_value] : given)
        if (spelling != other && value != other_value)
          return make_error(spelling + " " + value + " and " + other + " " + other_value +
                            " both set " + std::string(key.name) + "; give one");
  }
  return {};
}

Result<CommandLine> parse_command_line(const std::vector<std::string>& argv) {
  CLI::App app{
      "kvcontroller: an LMCache-compatible KV-cache controller.\n"
      "Every setting has one name, its key: a YAML key (--config or "
      "LMCACHE_CONTROLLER_CONFIG_FILE), an LMCACHE_CONTROLLER_<KEY> variable, a key=value "
      "argument and the flag --<key> (LMCache's flag where it has one: --port). Later sources "
      "win: defaults, the file, variables, flags, key=value.",
      "kvcontroller"};
  app.allow_extras();  // refused below with a hint, instead of CLI11's bare message
  std::array<std::string, kKeys.size()> texts;
  std::array<CLI::Option*, kKeys.size()> options{};
  for (std::size_t i = 0; i < kKeys.size(); ++i)
    options[i] = app.add_option(flags_of(kKeys[i]), texts[i], help_of(kKeys[i]))
                     ->type_name(std::string(kKeys[i].type_name))
                     ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::string config_file;
  auto* config_option =
      app.add_option("--config", config_file,
                     "YAML file with the same keys (else LMCACHE_CONTROLLER_CONFIG_FILE)")
          ->type_name("FILE");
  CommandLine line;
  app.add_option("extras", line.extras, "key=value: sets any setting by its key")
      ->type_name("KEY=VALUE");
  app.set_version_flag("--version", "kvcontroller " KVNODE_VERSION);

  std::vector<const char*> args;
  if (argv.empty()) args.push_back("kvcontroller");
  for (const auto& a : argv) args.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::CallForVersion& e) {
    line.exit = exit_with(std::string(e.what()) + "\n");
    return line;
  } catch (const CLI::Success&) {  // --help
    line.exit = exit_with(app.help());
    return line;
  } catch (const CLI::ParseError& e) {
    return make_error(std::string(e.what()) + "; see kvcontroller --help");
  }
  for (const std::string& arg : app.remaining()) {
    std::optional<std::string> extra = dashed_extra(arg);
    if (!extra)
      return make_error(unknown_argument_message(arg, long_flag_names(app), "kvcontroller"));
    line.extras.push_back(std::move(*extra));
  }
  if (auto status = check_flag_spellings(argv); !status) return std::move(status).error();
  for (std::size_t i = 0; i < kKeys.size(); ++i)
    if (options[i]->count() > 0) line.flag_values[i] = texts[i];
  if (config_option->count() > 0) line.config_file = config_file;
  return line;
}

Status apply_flags(ControllerConfig& config, const CommandLine& line) {
  for (std::size_t i = 0; i < kKeys.size(); ++i) {
    if (!line.flag_values[i]) continue;
    const RawValue value = text_value(*line.flag_values[i]);
    const std::string label =
        kKeys[i].lmcache_flag.empty() ? dashed(kKeys[i].name) : std::string(kKeys[i].lmcache_flag);
    if (auto status = apply(kKeys[i], config, value, label); !status) return status;
  }
  return {};
}

// key=value extras; two spellings of one setting must agree (one spelling given twice: the last).
Status apply_extras(ControllerConfig& config, const std::vector<std::string>& extras) {
  std::vector<std::pair<const Key*, std::string>> given;  // a key and the extra that set it
  for (const auto& extra : extras) {
    const std::string label = "extra " + single_quoted(extra);
    const auto eq = extra.find('=');
    if (eq == std::string::npos) return make_error(label + ": expected key=value");
    const std::string name = extra.substr(0, eq);
    const Key* key = find_key(name);
    if (!key) return make_error(label + ": " + unknown_name_message("key", name, all_names()));
    for (const auto& [earlier_key, earlier] : given)
      if (earlier_key == key && earlier.substr(0, earlier.find('=')) != name &&
          earlier.substr(earlier.find('=') + 1) != extra.substr(eq + 1))
        return make_error("extras " + single_quoted(earlier) + " and " + single_quoted(extra) +
                          " both set " + std::string(key->name) + "; give one");
    given.emplace_back(key, extra);
    if (auto status = apply(*key, config, text_value(extra.substr(eq + 1)), label); !status)
      return status;
  }
  return {};
}

// ---- validate() helpers ----

Status check_port(std::string_view name, int port) {
  if (port >= 0 && port <= 65535) return {};
  return make_error(std::string(name) + ": expected a port in 0..65535, got " +
                    std::to_string(port));
}

Status check_positive(std::string_view name, double value) {
  if (value > 0) return {};
  return make_error(std::string(name) + ": expected a number > 0, got " + format_number(value));
}

// Two sockets on one host cannot share a port; 0 (ephemeral) never collides.
Status check_distinct_ports(const ControllerConfig& c) {
  std::vector<std::pair<std::string_view, int>> ports = {
      {"controller_port", c.controller_port},
      {"controller_monitor_ports.pull", c.controller_monitor_ports.pull},
      {"controller_monitor_ports.reply", c.controller_monitor_ports.reply}};
  if (c.controller_monitor_ports.heartbeat >= 0)
    ports.emplace_back("controller_monitor_ports.heartbeat", c.controller_monitor_ports.heartbeat);
  if (c.monitor_port) ports.emplace_back("monitor_port", *c.monitor_port);
  for (std::size_t i = 0; i < ports.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (ports[i].second != 0 && ports[i].second == ports[j].second)
        return make_error(std::string(ports[i].first) + ": port " +
                          std::to_string(ports[i].second) + " is also " +
                          std::string(ports[j].first));
  return {};
}

Status check_ports(const ControllerConfig& c) {
  const MonitorPorts& m = c.controller_monitor_ports;
  for (const auto& [name, port] :
       {std::pair<std::string_view, int>{"controller_port", c.controller_port},
        {"controller_monitor_ports.pull", m.pull},
        {"controller_monitor_ports.reply", m.reply}})
    if (auto status = check_port(name, port); !status) return status;
  if (m.heartbeat >= 0) {  // negative: no heartbeat socket
    if (auto status = check_port("controller_monitor_ports.heartbeat", m.heartbeat); !status)
      return status;
  }
  if (c.monitor_port) {
    if (auto status = check_port("monitor_port", *c.monitor_port); !status) return status;
  }
  return check_distinct_ports(c);
}

Status check_timings(const ControllerConfig& c) {
  if (c.health_check_interval > 0 && c.health_check_interval < 1)  // LMCache requires >= 1
    return make_error("health_check_interval: expected <= 0 (off) or >= 1, got " +
                      format_number(c.health_check_interval));
  for (const auto& [name, value] :
       {std::pair<std::string_view, double>{"lmcache_worker_timeout", c.lmcache_worker_timeout},
        {"fanout_timeout", c.fanout_timeout},
        {"full_sync_timeout", c.full_sync_timeout}})
    if (auto status = check_positive(name, value); !status) return status;
  if (c.max_workers < 1)
    return make_error("max_workers: expected an integer >= 1, got " +
                      std::to_string(c.max_workers));
  for (const auto& [name, value] :
       {std::pair<std::string_view, int>{"http_max_connections", c.http_max_connections},
        {"http_max_body_mb", c.http_max_body_mb},
        {"http_max_bodies_mb", c.http_max_bodies_mb}})
    if (value < 1)
      return make_error(std::string(name) + ": expected an integer >= 1, got " +
                        std::to_string(value));
  // A body's buffer doubles as it arrives and both buffers count while one is copied (about 1.5
  // times the body): a budget under that refuses every body of the largest size, even alone.
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  const std::size_t peak_mb =
      (httpd::peak_body_bytes(static_cast<std::size_t>(c.http_max_body_mb) * kMiB) + kMiB - 1) /
      kMiB;
  if (static_cast<std::size_t>(c.http_max_bodies_mb) < peak_mb)
    return make_error("http_max_bodies_mb: " + std::to_string(c.http_max_bodies_mb) +
                      " is below the " + std::to_string(peak_mb) + " MiB one body of " +
                      "http_max_body_mb (" + std::to_string(c.http_max_body_mb) +
                      ") holds at its peak: every body that large would be refused 503; set at "
                      "least " +
                      std::to_string(peak_mb));
  if (!(c.full_sync_threshold > 0 && c.full_sync_threshold <= 1))
    return make_error("full_sync_threshold: expected a number in (0, 1], got " +
                      format_number(c.full_sync_threshold));
  return {};
}

Status check_misc(const ControllerConfig& c) {
  if (c.controller_host.empty()) return make_error("controller_host: expected a host, got ''");
  if (c.hashing.chunk_size == 0) return make_error("chunk_size: expected an integer > 0, got 0");
  // spdlog's level names, with the short forms its from_str also understands.
  constexpr std::array<std::string_view, 9> kLevels = {
      "trace", "debug", "info", "warn", "warning", "err", "error", "critical", "off"};
  if (std::find(kLevels.begin(), kLevels.end(), c.log_level) == kLevels.end())
    return make_error(
        "log_level: expected one of trace, debug, info, warn, error, critical, off, got " +
        single_quoted(c.log_level));
  return {};
}

}  // namespace

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());  // NOLINT(concurrency-mt-unsafe): read-only use
    if (!value) return std::nullopt;
    return std::string(value);
  };
}

Result<ConfigOrExit> load_config(const std::vector<std::string>& argv, const EnvLookup& env) {
  auto line = parse_command_line(argv);
  if (!line) return std::move(line).error();
  if (line->exit) return std::move(*line->exit);

  ControllerConfig config;
  std::optional<std::string> file = line->config_file;
  if (!file) {
    file = env(std::string(kConfigFileEnv));
    if (file && file->empty()) file.reset();  // an empty variable means "no file"
  }
  if (file) {
    if (auto status = apply_yaml_file(config, *file); !status) return status.error();
  }
  if (auto status = apply_env(config, env); !status) return status.error();
  if (auto status = apply_flags(config, *line); !status) return status.error();
  if (auto status = apply_extras(config, line->extras); !status) return status.error();
  if (auto status = validate(config); !status) return status.error();
  ConfigOrExit out;
  out.config = std::move(config);
  return out;
}

std::vector<std::string> config_keys() {
  std::vector<std::string> keys;
  for (const Key& key : kKeys) keys.emplace_back(key.name);
  return keys;
}

std::vector<std::pair<std::string, std::string>> shown_settings(const ControllerConfig& config) {
  std::vector<std::pair<std::string, std::string>> shown;
  for (const Key& key : kKeys) shown.emplace_back(key.name, key.shown(config));
  return shown;
}

Status validate(const ControllerConfig& config) {
  if (auto status = check_ports(config); !status) return status;
  if (auto status = check_timings(config); !status) return status;
  return check_misc(config);
}

}  // namespace kvnode::controller
