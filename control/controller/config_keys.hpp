// kvcontroller's settings, each described once: its name in every source, LMCache's flag where it
// differs, its help, how a value is applied and how the value reads back (--help's default, from a
// default-constructed ControllerConfig, so the help cannot state a default the code does not
// have). Included by config.cpp alone.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config_values.hpp"
#include "kvnode/controller/config.hpp"

namespace kvnode::controller::key_table {

using namespace config_values;  // NOLINT(google-build-using-namespace): the table applies them

inline std::string monitor_ports_text(const MonitorPorts& m) {
  const std::string heartbeat = m.heartbeat < 0 ? "null" : std::to_string(m.heartbeat);
  return R"({"pull": )" + std::to_string(m.pull) + R"(, "reply": )" + std::to_string(m.reply) +
         R"(, "heartbeat": )" + heartbeat + "}";
}

inline std::string wide_int_text(const wire::WideInt& w) {
  return w.negative() ? std::to_string(static_cast<std::int64_t>(w.bits()))
                      : std::to_string(w.bits());
}

inline std::string none_hash_text(std::uint64_t none_hash) {
  if (none_hash == keys::kNoneHashPython312) return "py312";
  if (none_hash == keys::kNoneHashDebianPython3112) return "debian-py311";
  return std::to_string(none_hash);
}

template <class T>
Status assign(T& field, Result<T> parsed) {
  if (!parsed) return std::move(parsed).error();
  field = std::move(*parsed);
  return {};
}

// One setting. Its name is the YAML key, the LMCACHE_CONTROLLER_<NAME> variable, the key=value
// extra and the flag --<name-with-dashes>. LMCache's flag, where it differs (--port), is a second
// flag, and its spelling (port) a second name in every source.
struct Key {
  std::string_view name;
  std::string_view lmcache_flag;  // "" = none besides --<name>
  std::string_view type_name;     // shown in --help
  // The value as every source spells it: --help's default (of ControllerConfig{}); "" = unset.
  std::string (*shown)(const ControllerConfig&);
  std::string_view help;
  Status (*apply)(ControllerConfig&, const RawValue&);
};

constexpr std::array kKeys{
    Key{"controller_host", "--host", "HOST",
        [](const ControllerConfig& c) -> std::string { return c.controller_host; },
        "bind host of every socket, HTTP included",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.controller_host, parse_string(v));
        }},
    Key{"controller_port", "--port", "PORT",
        [](const ControllerConfig& c) -> std::string { return std::to_string(c.controller_port); },
        "HTTP API port",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.controller_port, parse_int(v));
        }},
    Key{"controller_monitor_ports", "--monitor-ports", "JSON",
        [](const ControllerConfig& c) -> std::string {
          return monitor_ports_text(c.controller_monitor_ports);
        },
        R"(ZMQ ports; a port left out keeps its default; "heartbeat": null or < 0 disables the )"
        "heartbeat socket",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.controller_monitor_ports, parse_monitor_ports(v));
        }},
    Key{"monitor_port", "", "PORT",
        [](const ControllerConfig& c) -> std::string {
          return c.monitor_port ? std::to_string(*c.monitor_port) : std::string();
        },
        "legacy: one extra PULL socket",
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
    Key{"health_check_interval", "", "SECONDS",
        [](const ControllerConfig& c) -> std::string {
          return format_number(c.health_check_interval);
        },
        "reaper period; <= 0 turns the reaper off, else >= 1",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.health_check_interval, parse_number(v));
        }},
    Key{"lmcache_worker_timeout", "", "SECONDS",
        [](const ControllerConfig& c) -> std::string {
          return format_number(c.lmcache_worker_timeout);
        },
        "seconds without a heartbeat before a worker is reaped",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.lmcache_worker_timeout, parse_number(v));
        }},
    Key{"controller_advertise_host", "--advertise-host", "HOST",
        [](const ControllerConfig& c) -> std::string { return c.controller_advertise_host; },
        "host put in heartbeat_url; empty = derive from the bind host",
        [](ControllerConfig& c, const RawValue& v) {
          // YAML null means "not set", which for this key is the empty string (§3.2).
          return v.null ? assign(c.controller_advertise_host, Result<std::string>(std::string()))
                        : assign(c.controller_advertise_host, parse_string(v));
        }},
    // LMCache's extra_config; kvnode has no use for it but accepts files that set it.
    Key{"extra_config", "", "JSON",
        [](const ControllerConfig&) -> std::string { return std::string(); },
        "LMCache's extra settings: accepted and unused",
        [](ControllerConfig&, const RawValue&) { return Status{}; }},
    Key{"fanout_timeout", "", "SECONDS",
        [](const ControllerConfig& c) -> std::string { return format_number(c.fanout_timeout); },
        "seconds each worker has to answer a fanned-out call",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.fanout_timeout, parse_number(v));
        }},
    Key{"full_sync_threshold", "", "FRACTION",
        [](const ControllerConfig& c) -> std::string {
          return format_number(c.full_sync_threshold);
        },
        "global full-sync progress at which workers may leave freeze, in (0, 1]",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.full_sync_threshold, parse_number(v));
        }},
    Key{"full_sync_timeout", "", "SECONDS",
        [](const ControllerConfig& c) -> std::string { return format_number(c.full_sync_timeout); },
        "seconds of silence before a syncing worker is marked failed",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.full_sync_timeout, parse_number(v));
        }},
    Key{"max_workers", "", "N",
        [](const ControllerConfig& c) -> std::string { return std::to_string(c.max_workers); },
        "registered workers beyond which registrations are refused",
        [](ControllerConfig& c, const RawValue& v) { return assign(c.max_workers, parse_int(v)); }},
    Key{"http_max_connections", "", "N",
        [](const ControllerConfig& c) -> std::string {
          return std::to_string(c.http_max_connections);
        },
        "HTTP connections open at once; one more is answered 503 and closed",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.http_max_connections, parse_int(v));
        }},
    Key{"http_max_body_mb", "", "MIB",
        [](const ControllerConfig& c) -> std::string { return std::to_string(c.http_max_body_mb); },
        "MiB of one HTTP request body; a larger one is 413",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.http_max_body_mb, parse_int(v));
        }},
    Key{"http_max_bodies_mb", "", "MIB",
        [](const ControllerConfig& c) -> std::string {
          return std::to_string(c.http_max_bodies_mb);
        },
        "MiB of HTTP request bodies being read at once; a body beyond is 503",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.http_max_bodies_mb, parse_int(v));
        }},
    Key{"log_level", "", "LEVEL",
        [](const ControllerConfig& c) -> std::string { return c.log_level; },
        "trace, debug, info, warn, error, critical or off",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.log_level, parse_string(v));
        }},
    Key{"chunk_size", "", "TOKENS",
        [](const ControllerConfig& c) -> std::string {
          return std::to_string(c.hashing.chunk_size);
        },
        "tokens per chunk when /lookup hashes tokens",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.hashing.chunk_size, parse_chunk_size(v));
        }},
    Key{"hash_generation", "", "NAME",
        [](const ControllerConfig& c) -> std::string {
          return std::string(keys::hash_generation_name(c.hashing.generation));
        },
        "which LMCache releases' chunk hash /lookup computes: lmcache-0.5.6 (0.5.6 and later) or "
        "legacy (before 0.5.6)",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.hashing.generation, parse_hash_generation(v));
        }},
    Key{"hash_init", "", "INT",
        [](const ControllerConfig& c) -> std::string { return wide_int_text(c.hashing.init_hash); },
        "h[-1] of the chunk-hash chain",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.hashing.init_hash, parse_hash_init(v));
        }},
    Key{"none_hash", "", "INT",
        [](const ControllerConfig& c) -> std::string {
          return none_hash_text(c.hashing.none_hash);
        },
        "hash(None) of the workers' Python (legacy hash_generation): an integer, py312 or "
        "debian-py311",
        [](ControllerConfig& c, const RawValue& v) {
          return assign(c.hashing.none_hash, parse_none_hash(v));
        }},
};

inline std::string dashed(std::string_view name) {
  std::string flag = "--";
  for (const char ch : name) flag += ch == '_' ? '-' : ch;
  return flag;
}

// LMCache's other spelling of a key (port for controller_port), or "" when it has none.
inline std::string alias_of(const Key& key) {
  if (key.lmcache_flag.empty()) return "";
  std::string alias;
  for (const char ch : key.lmcache_flag.substr(2)) alias += ch == '-' ? '_' : ch;
  return alias == key.name ? "" : alias;
}

// Every name a key may be given by, for "did you mean" hints.
inline std::vector<std::string> all_names() {
  std::vector<std::string> names;
  for (const Key& key : kKeys) {
    names.emplace_back(key.name);
    if (std::string alias = alias_of(key); !alias.empty()) names.push_back(std::move(alias));
  }
  return names;
}

inline const Key* find_key(std::string_view name) {
  const auto it = std::find_if(kKeys.begin(), kKeys.end(),
                               [&](const Key& k) { return k.name == name || alias_of(k) == name; });
  return it == kKeys.end() ? nullptr : &*it;
}

}  // namespace kvnode::controller::key_table
