#include "lmcache_keys.hpp"

#include <algorithm>
#include <iterator>

namespace kvnode::node {
namespace {

// The union over LMCache v1 releases of lmcache/v1/config.py's keys (_CONFIG_DEFINITIONS,
// _CONFIG_ALIASES, _DEPRECATED_CONFIGS, and the dataclass fields of the releases before them):
// a file written for any of them loads (protocol reference §3.12).
constexpr std::string_view kKeys[] = {
    // Basic, storage and feature toggles.
    "chunk_size", "local_cpu", "max_local_cpu_size", "local_cpu_use_hugepages",
    "reserve_local_cpu_size", "local_disk", "local_disk_path_sharding", "max_local_disk_size",
    "remote_url", "remote_serde", "use_layerwise", "save_decode_cache",
    "pre_caching_hash_algorithm", "local_device", "pipelined_backend",
    // Blending.
    "enable_blending", "blend_recompute_ratio", "blend_recompute_ratios", "blend_thresholds",
    "blend_check_layers", "blend_min_tokens", "blend_special_str", "retrieve_locations",
    "store_location",
    // P2P.
    "enable_p2p", "p2p_host", "p2p_init_ports", "p2p_lookup_ports", "p2p_max_retry_count",
    "mp_host", "mp_port", "lookup_url", "distributed_url", "error_handling",
    // Controller and worker.
    "enable_controller", "lmcache_instance_id", "controller_pull_url", "controller_reply_url",
    "lmcache_worker_ports", "lmcache_worker_ids", "lmcache_worker_heartbeat_delay_time",
    "lmcache_worker_heartbeat_time", "kv_msg_batch_size", "kv_msg_batch_timeout",
    "worker_socket_recv_timeout_ms", "worker_socket_send_timeout_ms",
    // Prefill/decode disaggregation.
    "enable_pd", "pd_role", "pd_buffer_size", "pd_buffer_device", "pd_peer_host",
    "pd_peer_init_port", "pd_peer_alloc_port", "pd_peer_query_port", "pd_proxy_host",
    "pd_proxy_port", "pd_allocation_timeout_sec", "pd_shutdown_timeout_sec",
    "pd_condition_poll_interval_sec", "pd_max_prefill_len", "pd_backend_mode",
    "pd_skip_proxy_notification", "pd_bidirectional",
    // Transfer channel and NIXL.
    "transfer_channel", "nixl_backends", "nixl_buffer_size", "nixl_buffer_device", "enable_nixl",
    "nixl_role", "nixl_receiver_host", "nixl_receiver_port", "nixl_enable_gc",
    // GDS, Maru and other storage.
    "gds_path", "gds_path_sharding", "gds_buffer_size", "use_gds", "gds_backend",
    "cufile_buffer_size", "weka_path", "maru_path", "maru_pool_size",
    // Other.
    "audit_actual_remote_url", "internal_api_server_host", "extra_config", "save_unfull_chunk",
    "blocking_timeout_secs", "external_lookup_client", "py_enable_gc", "cache_policy",
    "cost_aware_half_life_seconds", "cost_aware_ewma_alpha", "numa_mode", "enable_async_loading",
    "internal_api_server_enabled", "internal_api_server_port_start", "priority_limit",
    "internal_api_server_include_index_list", "internal_api_server_socket_path_prefix",
    "runtime_plugin_locations", "storage_plugins", "remote_storage_plugins", "lookup_timeout_ms",
    "min_retrieve_tokens", "hit_miss_ratio", "lookup_server_worker_ids",
    "enable_scheduler_bypass_lookup", "script_allowed_imports", "enable_lazy_memory_allocator",
    "lazy_memory_initial_ratio", "lazy_memory_expand_trigger_ratio", "lazy_memory_step_ratio",
    "lazy_memory_safe_size", "enable_chunk_statistics", "chunk_statistics_auto_start_statistics",
    "chunk_statistics_auto_exit_timeout_hours", "chunk_statistics_auto_exit_target_unique_chunks",
    "chunk_statistics_strategy", "enable_kv_events", "use_gpu_connector_v3", "pin_timeout_sec",
    "pin_check_interval_sec", "remote_config_url", "app_id", "enable_hidden_state_cache",
    "max_hidden_state_cpu_size", "hidden_state_layers", "hidden_states_retrieve_mode",
    // Aliases and deprecated names LMCache still accepts.
    "enable_xpyd", "nixl_peer_host", "nixl_peer_init_port", "nixl_peer_alloc_port",
    "nixl_proxy_host", "nixl_proxy_port", "controller_url", "lmcache_worker_port",
    "plugin_locations", "external_backends", "nixl_peer_port",
    // EC (erasure-coded storage) overrides: a mapping of the keys above.
    "ec"};

}  // namespace

std::span<const std::string_view> lmcache_engine_keys() {
  return kKeys;
}

bool is_lmcache_engine_key(std::string_view key) {
  if (std::find(std::begin(kKeys), std::end(kKeys), key) != std::end(kKeys)) return true;
  constexpr std::string_view kEcPrefix = "ec_";  // ec_<key> overrides <key> for EC storage
  return key.starts_with(kEcPrefix) && std::find(std::begin(kKeys), std::end(kKeys),
                                                 key.substr(kEcPrefix.size())) != std::end(kKeys);
}

}  // namespace kvnode::node
