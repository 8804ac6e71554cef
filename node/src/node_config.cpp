#include "kvnode/node/node_config.hpp"

#include <CLI/CLI.hpp>
#include <yaml-cpp/yaml.h>

#include <cctype>

#include "kvnode/gpu/kv_shape.hpp"

namespace kvnode::node {
namespace {

template <class T>
Status from_yaml(const YAML::Node& root, const char* key, T& out) {
  const YAML::Node v = root[key];
  if (!v || v.IsNull()) return {};
  try {
    out = v.as<T>();
  } catch (const YAML::Exception&) {
    return make_error(std::string(key) + ": not the expected type");
  }
  return {};
}

}  // namespace

Result<ConfigOrExit> load_node_config(const std::vector<std::string>& argv) {
  NodeConfig c;
  CLI::App app{"kvnode: the KV-cache transfer node (LMCache-compatible worker)", "kvnode"};
  std::string config_file;
  std::string tls, net_devices;
  app.add_option("--config", config_file, "an LMCache-style YAML file");
  auto* o_instance = app.add_option("--instance-id", c.lmcache_instance_id, "lmcache_instance_id");
  auto* o_pull = app.add_option("--controller-pull-url", c.controller_pull_url, "host:port");
  auto* o_reply = app.add_option("--controller-reply-url", c.controller_reply_url, "host:port");
  auto* o_worker_ports = app.add_option("--worker-ports", c.lmcache_worker_ports, "lmcache_worker_ports");
  auto* o_hb = app.add_option("--heartbeat-time", c.lmcache_worker_heartbeat_time, "seconds; 0: off");
  auto* o_p2p_host = app.add_option("--p2p-host", c.p2p_host, "the transfer plane's host");
  auto* o_p2p_ports = app.add_option("--p2p-init-ports", c.p2p_init_ports, "p2p_init_ports");
  auto* o_chunk_size = app.add_option("--chunk-size", c.chunk_size, "tokens per chunk");
  auto* o_cpu = app.add_option("--max-local-cpu-size", c.max_local_cpu_size, "GB of chunk memory");
  auto* o_worker_id = app.add_option("--worker-id", c.worker_id, "the TP rank served");
  auto* o_chunk_bytes = app.add_option("--chunk-bytes", c.chunk_bytes, "bytes per chunk (0: from the KV shape)");
  auto* o_layers = app.add_option("--kv-layers", c.kv_layers);
  auto* o_heads = app.add_option("--kv-heads", c.kv_heads, "KV heads per rank");
  auto* o_head_size = app.add_option("--kv-head-size", c.kv_head_size);
  auto* o_dtype = app.add_option("--kv-dtype", c.kv_dtype);
  auto* o_memory = app.add_option("--memory", c.memory, "host, pinned or device")
                       ->check(CLI::IsMember({"host", "pinned", "device"}));
  auto* o_ip = app.add_option("--advertise-ip", c.advertise_ip, "where the controller reaches this node");
  auto* o_http = app.add_option("--http-port", c.http_port, "/metrics and /health; <0: off");
  auto* o_http_host = app.add_option("--http-host", c.http_host);
  auto* o_tls = app.add_option("--ucx-tls", tls, "UCX_TLS for the transfer plane");
  auto* o_net = app.add_option("--ucx-net-devices", net_devices, "UCX_NET_DEVICES");
  auto* o_log = app.add_option("--log-level", c.log_level);
  auto* o_local = app.add_option("--local-socket", c.local_socket,
                                 "the local client socket's path; off: none (default /tmp/kvnode-<instance>-<rank>.sock)");
  auto* o_sync_delay = app.add_option("--full-sync-startup-delay", c.full_sync_startup_delay,
                                      "seconds: a random wait up to this before the start-up full sync");
  auto* o_staging = app.add_option("--local-staging-mb", c.local_staging_mb,
                                   "MiB of shared memory local clients' chunk bytes pass through; 0: inline");
  app.set_version_flag("--version", "kvnode " KVNODE_VERSION);
  std::vector<const char*> args;
  for (const std::string& a : argv) args.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::CallForVersion& e) {
    return ConfigOrExit{std::nullopt, e.what(), 0};
  } catch (const CLI::Success&) {
    return ConfigOrExit{std::nullopt, app.help(), 0};
  } catch (const CLI::ParseError& e) {
    return make_error(e.what());
  }
  if (!config_file.empty()) {
    YAML::Node y;
    try {
      y = YAML::LoadFile(config_file);
    } catch (const YAML::Exception& e) {
      return make_error(config_file + ": " + e.what());
    }
    // Flags win: a key is taken from the file only when its flag was not given.
    auto take = [&](CLI::Option* flag, const char* key, auto& out) -> Status {
      if (flag->count() > 0) return {};
      Status s = from_yaml(y, key, out);
      return s ? s : make_error(config_file + ": " + s.error().message);
    };
    for (Status s : {take(o_instance, "lmcache_instance_id", c.lmcache_instance_id),
                     take(o_pull, "controller_pull_url", c.controller_pull_url),
                     take(o_reply, "controller_reply_url", c.controller_reply_url),
                     take(o_worker_ports, "lmcache_worker_ports", c.lmcache_worker_ports),
                     take(o_hb, "lmcache_worker_heartbeat_time", c.lmcache_worker_heartbeat_time),
                     take(o_p2p_host, "p2p_host", c.p2p_host),
                     take(o_p2p_ports, "p2p_init_ports", c.p2p_init_ports),
                     take(o_chunk_size, "chunk_size", c.chunk_size),
                     take(o_cpu, "max_local_cpu_size", c.max_local_cpu_size),
                     take(o_worker_id, "kvnode_worker_id", c.worker_id),
                     take(o_chunk_bytes, "kvnode_chunk_bytes", c.chunk_bytes),
                     take(o_layers, "kvnode_kv_layers", c.kv_layers),
                     take(o_heads, "kvnode_kv_heads", c.kv_heads),
                     take(o_head_size, "kvnode_kv_head_size", c.kv_head_size),
                     take(o_dtype, "kvnode_kv_dtype", c.kv_dtype),
                     take(o_memory, "kvnode_memory", c.memory),
                     take(o_ip, "kvnode_advertise_ip", c.advertise_ip),
                     take(o_http, "kvnode_http_port", c.http_port),
                     take(o_http_host, "kvnode_http_host", c.http_host),
                     take(o_tls, "kvnode_ucx_tls", tls),
                     take(o_net, "kvnode_ucx_net_devices", net_devices),
                     take(o_log, "kvnode_log_level", c.log_level),
                     take(o_local, "kvnode_local_socket", c.local_socket),
                     take(o_staging, "kvnode_local_staging_mb", c.local_staging_mb),
                     take(o_sync_delay, "kvnode_full_sync_startup_delay", c.full_sync_startup_delay)})
      if (!s) return s.error();
  }
  if (!tls.empty()) c.ucx_tls = tls;
  if (!net_devices.empty()) c.ucx_net_devices = net_devices;
  if (c.controller_pull_url.empty() || c.controller_reply_url.empty())
    return make_error("controller_pull_url and controller_reply_url are required (flags or --config)");
  if (c.chunk_size == 0) return make_error("chunk_size: must be at least 1");
  if (c.max_local_cpu_size <= 0) return make_error("max_local_cpu_size: must be positive (GB)");
  if (c.worker_id < 0) return make_error("worker_id: must not be negative");
  auto port_of = [&](const std::vector<int>& ports, const char* key) -> Status {
    if (ports.empty()) return {};
    if (static_cast<std::size_t>(c.worker_id) >= ports.size())
      return make_error(std::string(key) + ": no port for worker " + std::to_string(c.worker_id));
    const int p = ports[static_cast<std::size_t>(c.worker_id)];
    if (p < 0 || p > 65535) return make_error(std::string(key) + ": port " + std::to_string(p) + " out of range");
    return {};
  };
  if (Status s = port_of(c.lmcache_worker_ports, "lmcache_worker_ports"); !s) return s.error();
  if (Status s = port_of(c.p2p_init_ports, "p2p_init_ports"); !s) return s.error();
  if (c.http_port > 65535) return make_error("http_port: out of range");
  if (c.full_sync_startup_delay < 0 || c.full_sync_startup_delay > 3600)
    return make_error("full_sync_startup_delay: between 0 and 3600 seconds");
  if (c.local_staging_mb > (1u << 20)) return make_error("local_staging_mb: more than 1 TiB");
  // sun_path holds 107 bytes; a longer path would be cut silently by the kernel.
  if (local_socket_path(c).size() > 100)
    return make_error("local_socket: '" + local_socket_path(c) + "' is longer than 100 bytes");
  if (Result<std::pair<std::size_t, std::size_t>> g = pool_geometry(c); !g) return g.error();
  return ConfigOrExit{c, "", 0};
}

std::string local_socket_path(const NodeConfig& c) {
  if (c.local_socket == "off") return "";
  if (!c.local_socket.empty()) return c.local_socket;
  std::string name = c.lmcache_instance_id;
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.') ch = '_';
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
