// kvnode's settings, each described once in add_settings(): its flag, its YAML key, its default
// and its help, so --help, the file reader and the unknown-key check cannot disagree.
#include "kvnode/node/node_config.hpp"

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <charconv>
#include <functional>
#include <sstream>
#include <type_traits>

#include "kvnode/common/nearest_name.hpp"
#include "kvnode/controller/yaml_file.hpp"
#include "kvnode/gpu/kv_shape.hpp"
#include "kvnode/keys/chunk_hash.hpp"
#include "kvnode/transfer/device_path.hpp"
#include "kvnode/transfer/plane.hpp"
#include "lmcache_keys.hpp"

namespace kvnode::node {
namespace {

template <class T>
std::string expected_type() {
  if constexpr (std::is_same_v<T, bool>)
    return "true or false";
  else if constexpr (std::is_same_v<T, std::string>)
    return "a string";
  else if constexpr (std::is_same_v<T, std::vector<int>>)
    return "a list of integers, one integer or \"a,b\"";
  else if constexpr (std::is_floating_point_v<T>)
    return "a number";
  else if constexpr (std::is_unsigned_v<T>)
    return "a non-negative integer";
  else
    return "an integer";
}

template <class T>
Status type_error(const YAML::Node& v, const std::string& key) {
  YAML::Emitter shown;
  shown << YAML::Flow << v;
  return make_error(key + ": expected " + expected_type<T>() + ", got '" + shown.c_str() + "'");
}

template <class T>
Status read_yaml(const YAML::Node& v, const std::string& key, T& out) {
  if (!v || v.IsNull()) return {};  // `key: ~` leaves the default, as LMCache's None does
  try {
    out = v.as<T>();
    return {};
  } catch (const YAML::Exception&) {
  }
  return type_error<T>(v, key);
}

// "8200" or "8200, 8201" (LMCache's _to_int_list), or nothing when a part is not an integer.
std::optional<std::vector<int>> int_list(const std::string& text) {
  std::vector<int> out;
  std::istringstream parts(text);
  for (std::string part; std::getline(parts, part, ',');) {
    const auto first = part.find_first_not_of(' ');
    const auto last = part.find_last_not_of(' ');
    if (first == std::string::npos) return std::nullopt;
    int n = 0;
    const char* end = part.data() + last + 1;
    if (auto [ptr, ec] = std::from_chars(part.data() + first, end, n);
        ec != std::errc() || ptr != end)
      return std::nullopt;
    out.push_back(n);
  }
  if (out.empty()) return std::nullopt;
  return out;
}

// A list-valued port key takes a list, one integer or a "a,b" string, as LMCache's does.
Status read_yaml(const YAML::Node& v, const std::string& key, std::vector<int>& out) {
  if (!v || v.IsNull()) return {};
  if (v.IsScalar()) {
    if (auto list = int_list(v.Scalar())) {
      out = std::move(*list);
      return {};
    }
    return type_error<std::vector<int>>(v, key);
  }
  try {
    out = v.as<std::vector<int>>();
    return {};
  } catch (const YAML::Exception&) {
  }
  return type_error<std::vector<int>>(v, key);
}

// A setting's value as text, to tell whether two spellings in one file agree.
template <class T>
std::string value_text(const T& v) {
  std::ostringstream out;
  if constexpr (std::is_same_v<T, std::vector<int>>) {
    for (std::size_t i = 0; i < v.size(); ++i) out << (i ? "," : "") << v[i];
  } else {
    out << v;
  }
  return out.str();
}

// A setting: its YAML key, LMCache's other spellings of it, its flag, how a YAML value reaches
// the config and how the value reads back.
struct Setting {
  std::string key;
  std::vector<std::string> aliases;
  CLI::Option* flag;
  std::function<Status(const YAML::Node&)> from_yaml;
  std::function<std::string()> value;

  bool named(const std::string& name) const {
    return name == key || std::find(aliases.begin(), aliases.end(), name) != aliases.end();
  }
};

class Settings {
 public:
  explicit Settings(CLI::App& app) : app_(app) {}

  // The help reads "<what> (key <key>)"; the default is CLI11's "=value" after the type.
  template <class T>
  CLI::Option* add(const std::string& flag, const std::string& key, T& field,
                   const std::string& help, std::vector<std::string> aliases = {}) {
    std::string described = help + " (key " + key;
    for (const std::string& alias : aliases) described += ", also " + alias;
    CLI::Option* option = app_.add_option(flag, field, described + ")");
    if constexpr (std::is_same_v<T, std::vector<int>>)
      option->delimiter(',');  // --worker-ports 8500,8501 as well as two values
    else if constexpr (std::is_same_v<T, bool>)
      option->default_str(field ? "true" : "false");  // as YAML and LMCache spell it, not 1/0
    else
      option->capture_default_str();
    all_.push_back({key, std::move(aliases), option,
                    [&field, key](const YAML::Node& v) { return read_yaml(v, key, field); },
                    [&field] { return value_text(field); }});
    return option;
  }

  const std::vector<Setting>& all() const { return all_; }

 private:
  CLI::App& app_;
  std::vector<Setting> all_;
};

// The UCX overrides are optional<string> in the config; flags and keys fill these first.
struct UcxText {
  std::string tls, net_devices;
};

void add_settings(Settings& s, NodeConfig& c, UcxText& ucx) {
  // LMCache's keys.
  s.add("--instance-id", "lmcache_instance_id", c.lmcache_instance_id,
        "the LMCache instance this node serves");
  s.add("--controller-pull-url", "controller_pull_url", c.controller_pull_url,
        "host:port of the controller's PULL socket; required", {"controller_url"});
  s.add("--controller-reply-url", "controller_reply_url", c.controller_reply_url,
        "host:port of the controller's reply socket; required");
  s.add("--worker-ports", "lmcache_worker_ports", c.lmcache_worker_ports,
        "REP port of each rank (default: a free port)", {"lmcache_worker_port"});
  s.add("--heartbeat-time", "lmcache_worker_heartbeat_time", c.lmcache_worker_heartbeat_time,
        "seconds between heartbeats; 0: off");
  s.add("--p2p-host", "p2p_host", c.p2p_host, "the transfer plane's host");
  s.add("--p2p-init-ports", "p2p_init_ports", c.p2p_init_ports,
        "transfer plane port of each rank (default: a free port)");
  s.add("--chunk-size", "chunk_size", c.chunk_size, "tokens per chunk");
  s.add("--max-local-cpu-size", "max_local_cpu_size", c.max_local_cpu_size,
        "GB (10^9 bytes) of chunk memory");
  s.add("--save-unfull-chunk", "save_unfull_chunk", c.save_unfull_chunk,
        "keep a put's last partial chunk (LMCache 0.5.6's engine: false)");
  // Shared with kvcontroller.
  s.add("--hash-generation", "hash_generation", c.hash_generation,
        "chunk hash of " + std::string(keys::hash_generation_choices()));
  s.add("--hash-init", "hash_init", c.hash_init,
        "h[-1] of the chunk-hash chain (LMCache's NONE_HASH)");
  // kvnode's own.
  s.add("--worker-id", "kvnode_worker_id", c.worker_id, "the TP rank served");
  s.add("--chunk-bytes", "kvnode_chunk_bytes", c.chunk_bytes,
        "bytes per chunk; 0: from the KV shape");
  s.add("--kv-layers", "kvnode_kv_layers", c.kv_layers, "KV shape: layers");
  s.add("--kv-heads", "kvnode_kv_heads", c.kv_heads, "KV shape: KV heads per rank");
  s.add("--kv-head-size", "kvnode_kv_head_size", c.kv_head_size, "KV shape: head size");
  s.add("--kv-dtype", "kvnode_kv_dtype", c.kv_dtype, "KV shape: element type");
  s.add("--memory", "kvnode_memory", c.memory, "chunk memory: host, pinned or device")
      ->check(CLI::IsMember({"host", "pinned", "device"}));
  s.add("--gpudirect", "kvnode_gpudirect", c.gpudirect,
        "device pools: auto (GPUDirect where UCX registers CUDA memory, else staged through "
        "pinned memory) or off (always staged)")
      ->check(CLI::IsMember({"auto", "off"}));
  s.add("--same-host", "kvnode_same_host", c.same_host,
        "auto (share this pool with kvnodes on this host and copy to and from theirs directly) "
        "or off (every move through UCX)")
      ->check(CLI::IsMember({"auto", "off"}));
  s.add("--copy-threads", "kvnode_copy_threads", c.copy_threads,
        "threads copying a same-host move between host pools; 0: half the cores (1-8)");
  s.add("--advertise-ip", "kvnode_advertise_ip", c.advertise_ip,
        "where the controller reaches this node's REP port");
  s.add("--http-port", "kvnode_http_port", c.http_port,
        "/metrics and /health; 0: a free port; < 0: off");
  s.add("--http-host", "kvnode_http_host", c.http_host, "bind host of /metrics and /health");
  s.add("--http-max-connections", "kvnode_http_max_connections", c.http_max_connections,
        "HTTP connections open at once; one more is answered 503 and closed");
  s.add("--ucx-tls", "kvnode_ucx_tls", ucx.tls,
        "UCX_TLS for the transfer plane (default: the environment's, else UCX's choice)");
  s.add("--ucx-net-devices", "kvnode_ucx_net_devices", ucx.net_devices,
        "UCX_NET_DEVICES (default: the environment's, else every device)");
  s.add("--log-level", "kvnode_log_level", c.log_level,
        "trace, debug, info, warn, error, critical or off");
  s.add("--local-socket", "kvnode_local_socket", c.local_socket,
        "the local client socket's path; off: none (default /tmp/kvnode-<instance>-<rank>.sock)");
  s.add("--local-staging-mb", "kvnode_local_staging_mb", c.local_staging_mb,
        "MiB of shared memory local clients' chunk bytes pass through; 0: inline");
  s.add("--full-sync-startup-delay", "kvnode_full_sync_startup_delay", c.full_sync_startup_delay,
        "seconds: a random wait up to this before the start-up full sync");
  s.add("--max-kv-registration-gb", "kvnode_max_kv_registration_gb", c.max_kv_registration_gb,
        "GB of engines' host KV caches mapped at once, all clients together; 0: half the "
        "host's memory");
}

// Every key a kvnode file may hold: kvnode's settings, and LMCache's (those kvnode has no use for
// are ignored, so an engine's file works as is).
std::vector<std::string> known_keys(const std::vector<Setting>& settings) {
  std::vector<std::string> keys;
  for (const Setting& s : settings) keys.push_back(s.key);
  for (std::string_view k : lmcache_engine_keys()) keys.emplace_back(k);
  return keys;
}

// An unknown key this near a known one (two slips of the keyboard), or in kvnode's own namespace,
// is a typo and refused; any other is taken for a key of an LMCache release newer than kvnode's
// list (LMCache itself only warns) and ignored with a warning.
constexpr std::size_t kTypoEdits = 2;
constexpr std::string_view kOwnPrefix = "kvnode_";

// Whether an unknown key is refused (else ignored with a warning).
bool refuse_unknown(const std::string& name, const std::vector<Setting>& settings) {
  return name.starts_with(kOwnPrefix) || within_edits(name, known_keys(settings), kTypoEdits);
}

// Flags win: a key is taken from the file only when its flag was not given. Two spellings of one
// setting (controller_url and controller_pull_url) must agree.
Status apply_file(const std::string& path, const std::vector<Setting>& settings,
                  std::vector<std::string>& warnings) {
  auto root = controller::load_yaml_file(path);
  if (!root) return std::move(root).error();
  if (root->IsNull()) return {};  // an empty file sets nothing
  if (!root->IsMap()) return make_error(path + ": expected a mapping of config keys");
  struct Applied {
    const Setting* setting;
    std::string spelling, value;
  };
  std::vector<Applied> applied;
  for (const auto& entry : *root) {
    const std::string name = entry.first.Scalar();
    const auto it = std::find_if(settings.begin(), settings.end(),
                                 [&](const Setting& s) { return s.named(name); });
    if (it == settings.end()) {
      if (is_lmcache_engine_key(name)) continue;
      if (refuse_unknown(name, settings))
        return make_error(path + ": " + unknown_name_message("key", name, known_keys(settings)));
      warnings.push_back(path + ": unknown key '" + name +
                         "' ignored (not kvnode's, nor LMCache's as far as kvnode knows)");
      continue;
    }
    if (it->flag->count() > 0) continue;
    if (Status s = it->from_yaml(entry.second); !s)
      return make_error(path + ": " + s.error().message);
    const std::string value = it->value();
    for (const Applied& earlier : applied)
      if (earlier.setting == &*it && earlier.value != value)
        return make_error(path + ": '" + earlier.spelling + "' and '" + name + "' both set " +
                          it->key + " ('" + earlier.value + "' and '" + value + "'); keep one");
    applied.push_back({&*it, name, value});
  }
  return {};
}

Status validate(const NodeConfig& c) {
  if (c.controller_pull_url.empty() || c.controller_reply_url.empty())
    return make_error(
        "controller_pull_url and controller_reply_url are required (flags or --config)");
  if (c.chunk_size == 0) return make_error("chunk_size: must be at least 1");
  if (Result<keys::HashGeneration> g = keys::parse_hash_generation(c.hash_generation); !g)
    return make_error(ErrorCode::kInvalid, "hash_generation: " + g.error().message);
  if (Result<wire::WideInt> h = keys::parse_wide_int(c.hash_init); !h)
    return make_error(ErrorCode::kInvalid, "hash_init: " + h.error().message);
  if (c.max_local_cpu_size <= 0) return make_error("max_local_cpu_size: must be positive (GB)");
  if (c.worker_id < 0) return make_error("kvnode_worker_id: must not be negative");
  auto port_of = [&](const std::vector<int>& ports, const char* key) -> Status {
    if (ports.empty()) return {};
    if (static_cast<std::size_t>(c.worker_id) >= ports.size())
      return make_error(std::string(key) + ": no port for worker " + std::to_string(c.worker_id));
    const int p = ports[static_cast<std::size_t>(c.worker_id)];
    if (p < 0 || p > 65535)
      return make_error(std::string(key) + ": port " + std::to_string(p) + " out of range");
    return {};
  };
  if (Status s = port_of(c.lmcache_worker_ports, "lmcache_worker_ports"); !s) return s;
  if (Status s = port_of(c.p2p_init_ports, "p2p_init_ports"); !s) return s;
  if (Result<transfer::GpuDirect> g = transfer::parse_gpudirect(c.gpudirect); !g)
    return make_error("kvnode_gpudirect: '" + c.gpudirect + "': expected auto or off");
  if (!transfer::parse_same_host(c.same_host))
    return make_error("kvnode_same_host: '" + c.same_host + "': expected auto or off");
  if (c.copy_threads > 64) return make_error("kvnode_copy_threads: at most 64");
  if (c.http_port > 65535) return make_error("kvnode_http_port: out of range");
  if (c.http_max_connections < 1) return make_error("kvnode_http_max_connections: at least 1");
  if (c.full_sync_startup_delay < 0 || c.full_sync_startup_delay > 3600)
    return make_error("kvnode_full_sync_startup_delay: between 0 and 3600 seconds");
  if (c.local_staging_mb > (1u << 20))
    return make_error("kvnode_local_staging_mb: more than 1 TiB");
  if (!(c.max_kv_registration_gb >= 0) || c.max_kv_registration_gb > 1e6)
    return make_error(
        "kvnode_max_kv_registration_gb: expected 0 (half the host's memory) up to "
        "1e6 GB, got " +
        std::to_string(c.max_kv_registration_gb));
  // sun_path holds 107 bytes; a longer path would be cut silently by the kernel.
  if (local_socket_path(c).size() > 100)
    return make_error("kvnode_local_socket: '" + local_socket_path(c) +
                      "' is longer than 100 bytes");
  if (Result<std::pair<std::size_t, std::size_t>> g = pool_geometry(c); !g) return g.error();
  return {};
}

}  // namespace

std::vector<SettingName> node_settings() {
  CLI::App app;
  NodeConfig config;
  UcxText ucx;
  Settings settings(app);
  add_settings(settings, config, ucx);
  std::vector<SettingName> names;
  for (const Setting& s : settings.all()) names.push_back({s.key, s.flag->get_name()});
  return names;
}

Result<ConfigOrExit> load_node_config(const std::vector<std::string>& argv) {
  NodeConfig c;
  UcxText ucx;
  CLI::App app{
      "kvnode: the KV-cache transfer node (LMCache-compatible worker).\n"
      "Each setting is a flag and a key of the YAML file (--config: an LMCache config file, whose "
      "other LMCache keys are ignored); flags win over the file. docs/operations.md lists them.",
      "kvnode"};
  app.allow_extras();  // refused below with a hint, instead of CLI11's bare message
  std::string config_file;
  app.add_option("--config", config_file, "an LMCache-style YAML file")->type_name("FILE");
  Settings settings(app);
  add_settings(settings, c, ucx);
  app.set_version_flag("--version", "kvnode " KVNODE_VERSION);
  std::vector<const char*> args;
  for (const std::string& a : argv) args.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::CallForVersion& e) {
    return ConfigOrExit{std::nullopt, e.what(), 0, {}};
  } catch (const CLI::Success&) {
    return ConfigOrExit{std::nullopt, app.help(), 0, {}};
  } catch (const CLI::ParseError& e) {
    return make_error(std::string(e.what()) + "; see kvnode --help");
  }
  if (!app.remaining().empty())
    return make_error(
        unknown_argument_message(app.remaining().front(), long_flag_names(app), "kvnode"));
  std::vector<std::string> warnings;
  if (!config_file.empty()) {
    if (Status s = apply_file(config_file, settings.all(), warnings); !s) return s.error();
  }
  if (!ucx.tls.empty()) c.ucx_tls = ucx.tls;
  if (!ucx.net_devices.empty()) c.ucx_net_devices = ucx.net_devices;
  if (Status s = validate(c); !s) return s.error();
  return ConfigOrExit{c, "", 0, std::move(warnings)};
}

std::string local_socket_path(const NodeConfig& c) {
  if (c.local_socket == "off") return "";
  if (!c.local_socket.empty()) return c.local_socket;
  std::string name = c.lmcache_instance_id;
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.')
      ch = '_';
  return "/tmp/kvnode-" + name + "-" + std::to_string(c.worker_id) + ".sock";
}

Result<std::pair<std::size_t, std::size_t>> pool_geometry(const NodeConfig& c) {
  std::size_t bytes = c.chunk_bytes;
  if (bytes == 0) {
    Result<gpu::KvDtype> dtype = gpu::parse_dtype(c.kv_dtype);
    if (!dtype) return make_error("kv_dtype: " + dtype.error().message);
    gpu::KvShape shape{c.kv_layers, c.kv_heads, c.kv_head_size, *dtype,
                       static_cast<std::uint32_t>(c.chunk_size)};
    Result<std::size_t> b = gpu::chunk_bytes(shape);
    if (!b) return make_error("kv shape: " + b.error().message);
    bytes = *b;
  }
  const double total = c.max_local_cpu_size * 1e9;
  const auto chunks = static_cast<std::size_t>(total / static_cast<double>(bytes));
  if (chunks == 0)
    return make_error("max_local_cpu_size " + std::to_string(c.max_local_cpu_size) +
                      " GB holds no chunk of " + std::to_string(bytes) + " bytes");
  return std::make_pair(bytes, chunks);
}

}  // namespace kvnode::node
