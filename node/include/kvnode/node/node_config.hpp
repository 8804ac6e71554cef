// kvnode's configuration: LMCache's YAML keys where they mean the same thing, LMCache's aliases
// included (an LMCache config file works as is: LMCache keys kvnode does not use are ignored),
// plus kvnode's own (kvnode_*). An unknown key within two edits of a known one, or kvnode_*, is a
// typo, refused with the nearest known one as a hint; any other is ignored with a warning (a key
// of a newer LMCache). Sources, later ones winning: defaults, the YAML file (--config),
// command-line flags. Errors name the key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvnode/common/result.hpp"

namespace kvnode::node {

struct NodeConfig {
  // LMCache keys.
  std::string lmcache_instance_id = "kvnode";
  std::string controller_pull_url;             // host:port
  std::string controller_reply_url;            // host:port
  std::vector<int> lmcache_worker_ports;       // REP port of rank i; empty: a free port
  double lmcache_worker_heartbeat_time = 5.0;  // s; 0 turns heartbeats off (LMCache's default)
  std::string p2p_host = "127.0.0.1";
  std::vector<int> p2p_init_ports;  // transfer plane port of rank i; empty: a free port
  std::size_t chunk_size = 256;     // tokens per chunk
  double max_local_cpu_size = 1.0;  // GB of chunk memory
  // Whether a put's last partial chunk is kept. kvnode keeps it (LMCache's controller hashes it
  // too); LMCache 0.5.6's engine defaults to false.
  bool save_unfull_chunk = true;

  // Shared with kvcontroller (same keys): how tokens become chunk hashes.
  std::string hash_generation = "lmcache-0.5.6";  // or "legacy" (LMCache before 0.5.6)
  std::string hash_init = "0";                    // h[-1], in [-2^63, 2^64-1]

  // kvnode's own.
  std::int64_t worker_id = 0;   // the TP rank this process serves
  std::size_t chunk_bytes = 0;  // bytes per chunk; 0: from the KV shape below
  std::uint32_t kv_layers = 32, kv_heads = 8, kv_head_size = 128;
  std::string kv_dtype = "bfloat16";
  std::string memory = "host";  // host, pinned or device
  // Device pools: "auto" registers them with UCX directly (GPUDirect) where UCX registers CUDA
  // memory, else stages them through pinned memory; "off" always stages.
  std::string gpudirect = "auto";
  // Same-host moves: "auto" shares this pool with kvnodes on the same host (a memfd, or CUDA IPC
  // for a device pool) and maps theirs, so moves between them are copies, not network transfers;
  // "off" moves everything through UCX. copy_threads: threads per copy (0: half the cores, 1-8).
  std::string same_host = "auto";
  std::size_t copy_threads = 0;
  std::string advertise_ip = "127.0.0.1";  // where the controller reaches the REP port
  int http_port = 0;                       // /metrics and /health; 0: a free port; < 0: off
  std::string http_host = "127.0.0.1";
  int http_max_connections = 4096;     // open at once; beyond: 503 and closed
  std::optional<std::string> ucx_tls;  // else UCX_TLS from the environment, else UCX's choice
  std::optional<std::string> ucx_net_devices;
  std::string log_level = "info";
  // The local client socket (LocalService): "" = /tmp/kvnode-<instance>-<rank>.sock, "off" = none.
  std::string local_socket;
  double full_sync_startup_delay = 5.0;  // s: random wait before the start-up full sync
  std::size_t local_staging_mb = 256;    // shared staging for local clients' bytes; 0: inline
  // GB of engines' host KV caches the node maps at once (all clients together); 0: half the
  // host's memory. A registration past it is refused (no_room), never left to the OOM killer.
  double max_kv_registration_gb = 0;
};

// The local socket's path after defaults ("" when off).
std::string local_socket_path(const NodeConfig& c);

struct ConfigOrExit {
  std::optional<NodeConfig> config;
  std::string message;  // --help / --version text
  int exit_code = 0;
  // Unknown keys the file held that were ignored (not near a known key): print each once.
  std::vector<std::string> warnings;
};

// A setting as its sources name it: the YAML key and the flag (for the docs and their tests).
struct SettingName {
  std::string key;
  std::string flag;
};
std::vector<SettingName> node_settings();

// Parses argv (argv[0] is the program name). An unknown flag or key is an error that names it
// and the nearest known one.
Result<ConfigOrExit> load_node_config(const std::vector<std::string>& argv);
// Chunk bytes (configured, or from the KV shape) and the number of chunks the memory holds.
Result<std::pair<std::size_t, std::size_t>> pool_geometry(const NodeConfig& c);

}  // namespace kvnode::node
