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

// One value for one key, as a source spelled it. Env, flags and extras give text; YAML may also
// give null (~) or a mapping/sequence, carried as JSON so --monitor-ports' parser serves both.
struct RawValue {
  std::string text;
  std::optional<json> structured;
  bool null = false;
};

RawValue text_value(std::string text) {
  RawValue v;
  v.text = std::move(text);
  return v;
}

RawValue null_value() {
  RawValue v;
  v.null = true;
  return v;
}

RawValue structured_value(json structured) {
  RawValue v;
  v.structured = std::move(structured);
  return v;
}

ConfigOrExit exit_with(std::string message) {
  ConfigOrExit out;
  out.message = std::move(message);
  out.exit_code = 0;
  return out;
}

// ---- Scalar parsers: the error is the problem alone; callers prefix the source and key. ----

std::string single_quoted(std::string_view s) {
  return "'" + std::string(s) + "'";
}

std::string format_number(double v) {
  std::array<char, 64> buf{};
  const auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  return ec == std::errc() ? std::string(buf.data(), end) : std::to_string(v);
}

// The text of a scalar value, or why there is none ("expected <what>, got null").
Result<std::string> scalar_text(const RawValue& v, std::string_view what) {
  if (v.null) return make_error("expected " + std::string(what) + ", got null");
  if (v.structured)
    return make_error("expected " + std::string(what) + ", got " + v.structured->dump());
  return v.text;
}

// Parses the whole of `text` into an arithmetic T with std::from_chars (no sign other than a
// leading '-', no whitespace, no trailing characters).
template <class T>
Result<T> parse_whole(const std::string& text, std::string_view what) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range)
    return make_error("expected " + std::string(what) + ", got " + single_quoted(text) +
                      " (out of range)");
  if (ec != std::errc() || ptr != end)
    return make_error("expected " + std::string(what) + ", got " + single_quoted(text));
  return value;
}

Result<int> parse_int(const RawValue& v) {
  auto text = scalar_text(v, "an integer");
  if (!text) return std::move(text).error();
  return parse_whole<int>(*text, "an integer");
}

Result<double> parse_number(const RawValue& v) {
  auto text = scalar_text(v, "a number");
  if (!text) return std::move(text).error();
  auto number = parse_whole<double>(*text, "a number");
  // from_chars accepts "inf" and "nan", which no duration or threshold can mean.
  if (number && !std::isfinite(*number))
    return make_error("expected a number, got " + single_quoted(*text));
  return number;
}

// 0 parses: validate() rejects it, so that message names the key whichever source set it.
Result<std::size_t> parse_chunk_size(const RawValue& v) {
  auto text = scalar_text(v, "a positive integer");
  if (!text) return std::move(text).error();
  auto n = parse_whole<std::uint64_t>(*text, "a positive integer");
  if (!n) return std::move(n).error();
  return static_cast<std::size_t>(*n);
}

// An integer anywhere in [-2^63, 2^64-1], the range chunk hashes travel in.
Result<wire::WideInt> parse_wide_int(const std::string& text) {
  const bool negative = !text.empty() && text[0] == '-';
  const char* end = text.data() + text.size();
  std::uint64_t magnitude = 0;
  const auto [ptr, ec] = std::from_chars(text.data() + (negative ? 1 : 0), end, magnitude);
  constexpr auto kMaxNegativeMagnitude = static_cast<std::uint64_t>(INT64_MAX) + 1;
  const bool parsed = ec == std::errc() && ptr == end;
  if (ec == std::errc::result_out_of_range ||
      (parsed && negative && magnitude > kMaxNegativeMagnitude))
    return make_error("expected an integer, got " + single_quoted(text) + " (out of range)");
  if (!parsed) return make_error("expected an integer, got " + single_quoted(text));
  if (!negative) return wire::WideInt::from_unsigned(magnitude);
  // Two's complement negation in unsigned arithmetic; the conversion is modular in C++20.
  return wire::WideInt::from_signed(static_cast<std::int64_t>(~magnitude + 1));
}

Result<wire::WideInt> parse_hash_init(const RawValue& v) {
  auto text = scalar_text(v, "an integer");
  if (!text) return std::move(text).error();
  return parse_wide_int(*text);
}

// hash(None) of the workers' interpreter: a number, or the name of a known interpreter.
Result<std::uint64_t> parse_none_hash(const RawValue& v) {
  constexpr std::string_view kWhat = "an integer, py312 or debian-py311";
  auto text = scalar_text(v, kWhat);
  if (!text) return std::move(text).error();
  if (*text == "py312") return std::uint64_t{keys::kNoneHashPython312};
  if (*text == "debian-py311") return std::uint64_t{keys::kNoneHashDebianPython3112};
  auto n = parse_wide_int(*text);
  if (!n) return make_error("expected " + std::string(kWhat) + ", got " + single_quoted(*text));
  return n->bits();  // CPython hashes are signed; the chain only uses the bits
}

Result<std::string> parse_string(const RawValue& v) {
  return scalar_text(v, "a string");
}

// ---- controller_monitor_ports ----

// One port of the monitor-ports object; heartbeat alone may be null (no heartbeat socket).
Result<int> parse_port_entry(const json& j, const std::string& name) {
  if (j.is_null() && name == "heartbeat") return -1;
  if (!j.is_number_integer()) return make_error(name + ": expected an integer, got " + j.dump());
  const bool too_big =
      j.is_number_unsigned() ? j.get<std::uint64_t>() > INT_MAX : j.get<std::int64_t>() < INT_MIN;
  if (too_big)
    return make_error(name + ": expected an integer, got " + j.dump() + " (out of range)");
  return static_cast<int>(j.get<std::int64_t>());
}

// Names every key of `object` that is not a monitor port, e.g. "unknown keys 'a', 'b'".
std::optional<std::string> unknown_port_keys(const json& object) {
  std::vector<std::string> unknown;
  for (const auto& [name, value] : object.items())
    if (name != "pull" && name != "reply" && name != "heartbeat")
      unknown.push_back(single_quoted(name));
  if (unknown.empty()) return std::nullopt;
  std::string message = unknown.size() == 1 ? "unknown key " : "unknown keys ";
  for (std::size_t i = 0; i < unknown.size(); ++i) message += (i ? ", " : "") + unknown[i];
  return message;
}

// A monitor-ports object replaces the whole previous value, like any other key's value; a port
// it leaves out takes its default (heartbeat 8082: kvnode's heartbeat socket is on by default).
Result<MonitorPorts> parse_monitor_ports(const RawValue& v) {
  constexpr std::string_view kWhat = R"(a JSON object such as {"pull": 8300, "reply": 8400})";
  json doc;
  if (v.structured) {
    doc = *v.structured;
  } else {
    auto text = scalar_text(v, kWhat);
    if (!text) return std::move(text).error();
    doc = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!doc.is_object())
      return make_error("expected " + std::string(kWhat) + ", got " + single_quoted(*text));
  }
  if (!doc.is_object()) return make_error("expected " + std::string(kWhat) + ", got " + doc.dump());
  if (auto unknown = unknown_port_keys(doc)) return make_error(*unknown);
  MonitorPorts ports;
  for (auto [name, field] : {std::pair{"pull", &ports.pull}, std::pair{"reply", &ports.reply},
                             std::pair{"heartbeat", &ports.heartbeat}}) {
    if (!doc.contains(name)) continue;
    auto port = parse_port_entry(doc.at(name), name);
    if (!port) return std::move(port).error();
    *field = *port;
  }
  return ports;
}

// ---- The key table ----

template <class T>
Status assign(T& field, Result<T> parsed) {
  if (!parsed) return std::move(parsed).error();
  field = std::move(*parsed);
  return {};
}

struct Key {
  std::string_view name;       // YAML key, env suffix (upper-cased), key=value extra
  std::string_view flag;       // "" = no flag of its own (a key=value extra still sets it)
  std::string_view type_name;  // shown in --help
  std::string_view help;
  Status (*apply)(ControllerConfig&, const RawValue&);
};

constexpr std::array kKeys{
    Key{"controller_host", "--host", "HOST", "bind host of every socket, HTTP included (0.0.0.0)",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.controller_host, parse_string(v));
        }},
    Key{"controller_port", "--port", "PORT", "HTTP API port (9000)",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.controller_port, parse_int(v));
        }},
    Key{"controller_monitor_ports", "--monitor-ports", "JSON",
        R"(ZMQ ports, e.g. '{"pull": 8300, "reply": 8400, "heartbeat": 8082}'; )"
        R"("heartbeat": null or < 0 disables the heartbeat socket)",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.controller_monitor_ports, parse_monitor_ports(v));
        }},
    Key{"monitor_port", "--monitor-port", "PORT", "legacy: one extra PULL socket (none)",
        [](ControllerConfig& c, const RawValue& v) {
          if (v.null) {  // YAML `monitor_port: ~` undoes an earlier setting
            c.monitor_port.reset();
            return Status{};
          }
          auto port = parse_int(v);
          if (!port) return Status{std::move(port).error()};
          c.monitor_port = *port;
          return Status{};
        }},
    Key{"health_check_interval", "--health-check-interval", "SECONDS",
        "reaper period; <= 0 turns the reaper off (5)",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.health_check_interval, parse_number(v));
        }},
    Key{"lmcache_worker_timeout", "--lmcache-worker-timeout", "SECONDS",
        "seconds without a heartbeat before a worker is reaped (30)",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.lmcache_worker_timeout, parse_number(v));
        }},
    Key{"controller_advertise_host", "--advertise-host", "HOST",
        "host put in heartbeat_url; empty = derive from the bind host",
        [](ControllerConfig& c, const RawValue& v) {
          // YAML null means "not set", which for this key is the empty string (§3.2).
          return v.null ? assign(c.controller_advertise_host, Result<std::string>(std::string()))
                        : assign(c.controller_advertise_host, parse_string(v));
        }},
    // LMCache's extra_config; kvnode has no use for it but accepts files that set it.
    Key{"extra_config", "", "", "", [](ControllerConfig&, const RawValue&) { return Status{}; }},
    Key{"fanout_timeout", "--fanout-timeout", "SECONDS",
        "seconds each worker has to answer a fanned-out call (30)",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.fanout_timeout, parse_number(v));
        }},
    Key{"full_sync_threshold", "--full-sync-threshold", "FRACTION",
        "global full-sync progress at which workers may leave freeze, in (0, 1] (0.8)",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.full_sync_threshold, parse_number(v));
        }},
    Key{"full_sync_timeout", "--full-sync-timeout", "SECONDS",
        "seconds of silence before a syncing worker is marked failed (300)",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.full_sync_timeout, parse_number(v));
        }},
    Key{"log_level", "--log-level", "LEVEL",
        "trace, debug, info, warn, error, critical or off (info)",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.log_level, parse_string(v));
        }},
    Key{"chunk_size", "--chunk-size", "TOKENS", "tokens per chunk when /lookup hashes tokens (256)",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.hashing.chunk_size, parse_chunk_size(v));
        }},
    Key{"hash_init", "--hash-init", "INT", "h[-1] of the chunk-hash chain (0)",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.hashing.init_hash, parse_hash_init(v));
        }},
    Key{"none_hash", "--none-hash", "INT",
        "hash(None) of the workers' Python: an integer, py312 (default) or debian-py311",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.hashing.none_hash, parse_none_hash(v));
        }},
};

const Key* find_key(std::string_view name) {
  const auto it =
      std::find_if(kKeys.begin(), kKeys.end(), [&](const Key& k) { return k.name == name; });
  return it == kKeys.end() ? nullptr : &*it;
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

Result<YAML::Node> load_yaml(const std::string& path) {
  try {
    return YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return make_error(path + ": cannot read the config file");
  } catch (const YAML::Exception& e) {
    return make_error(path + ": " + e.what());
  }
}

Status apply_yaml_file(ControllerConfig& config, const std::string& path) {
  auto root = load_yaml(path);
  if (!root) return std::move(root).error();
  if (root->IsNull()) return {};  // an empty file sets nothing
  if (!root->IsMap()) return make_error(path + ": expected a mapping of config keys");
  for (const auto& entry : *root) {
    const std::string name = entry.first.Scalar();
    const Key* key = find_key(name);
    if (!key) return make_error(path + ": unknown key " + single_quoted(name));
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

Status apply_env(ControllerConfig& config, const EnvLookup& env) {
  for (const Key& key : kKeys) {
    const std::string name = env_name(key.name);
    if (auto value = env(name)) {
      if (auto status = apply(key, config, text_value(*value), name); !status) return status;
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

Result<CommandLine> parse_command_line(const std::vector<std::string>& argv) {
  CLI::App app{
      "kvcontroller: an LMCache-compatible KV-cache controller.\n"
      "Sources, later ones winning: defaults, the YAML file (--config or "
      "LMCACHE_CONTROLLER_CONFIG_FILE), LMCACHE_CONTROLLER_<KEY> variables, flags, "
      "key=value extras.",
      "kvcontroller"};
  std::array<std::string, kKeys.size()> texts;
  std::array<CLI::Option*, kKeys.size()> options{};
  for (std::size_t i = 0; i < kKeys.size(); ++i) {
    if (kKeys[i].flag.empty()) continue;
    options[i] = app.add_option(std::string(kKeys[i].flag), texts[i], std::string(kKeys[i].help))
                     ->type_name(std::string(kKeys[i].type_name))
                     ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
  std::string config_file;
  auto* config_option =
      app.add_option("--config", config_file,
                     "YAML file with the same keys (else LMCACHE_CONTROLLER_CONFIG_FILE)")
          ->type_name("FILE");
  CommandLine line;
  app.add_option("extras", line.extras, "key=value: sets any config key by its YAML name")
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
    return make_error(e.what());
  }
  for (std::size_t i = 0; i < kKeys.size(); ++i)
    if (options[i] && options[i]->count() > 0) line.flag_values[i] = texts[i];
  if (config_option->count() > 0) line.config_file = config_file;
  return line;
}

Status apply_flags(ControllerConfig& config, const CommandLine& line) {
  for (std::size_t i = 0; i < kKeys.size(); ++i) {
    if (!line.flag_values[i]) continue;
    const RawValue value = text_value(*line.flag_values[i]);
    if (auto status = apply(kKeys[i], config, value, std::string(kKeys[i].flag)); !status)
      return status;
  }
  return {};
}

Status apply_extras(ControllerConfig& config, const std::vector<std::string>& extras) {
  for (const auto& extra : extras) {
    const std::string label = "extra " + single_quoted(extra);
    const auto eq = extra.find('=');
    if (eq == std::string::npos) return make_error(label + ": expected key=value");
    const std::string name = extra.substr(0, eq);
    const Key* key = find_key(name);
    if (!key) return make_error(label + ": unknown key " + single_quoted(name));
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

Status validate(const ControllerConfig& config) {
  if (auto status = check_ports(config); !status) return status;
  if (auto status = check_timings(config); !status) return status;
  return check_misc(config);
}

}  // namespace kvnode::controller
