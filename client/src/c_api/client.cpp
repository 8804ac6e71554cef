// The C API's connection: kvnode_connect (LocalClient::connect with the params' fields or their
// defaults), kvnode_client_close, kvnode_client_info (the fields the caller's mask asks for, no
// other byte) and kvnode_lookup.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "c_api/c_api.hpp"

namespace {

using kvnode::c_api::check_fields;
using kvnode::c_api::fail;
using kvnode::c_api::guarded;
using kvnode::c_api::invalid;
using kvnode::c_api::ok;
using kvnode::client::LocalClient;
using kvnode::client::LocalClientOptions;

constexpr std::uint64_t kConnectFields =
    KVNODE_CONNECT_FIELD_TIMEOUT | KVNODE_CONNECT_FIELD_SHARED_MEMORY;
// Past a day a timeout is a mistake (or an overflow of the milliseconds it becomes).
constexpr double kMaxTimeoutSeconds = 24.0 * 60 * 60;

kvnode_status_t options_of(const kvnode_connect_params_t& p, LocalClientOptions& o,
                           kvnode_error_t* err) {
  if (p.field_mask & KVNODE_CONNECT_FIELD_TIMEOUT) {
    if (!std::isfinite(p.timeout_s) || p.timeout_s <= 0 || p.timeout_s > kMaxTimeoutSeconds)
      return invalid("kvnode_connect: params->timeout_s: must be > 0 s and at most a day", err);
    o.timeout = std::max(
        std::chrono::milliseconds(1),
        std::chrono::ceil<std::chrono::milliseconds>(std::chrono::duration<double>(p.timeout_s)));
  }
  if (p.field_mask & KVNODE_CONNECT_FIELD_SHARED_MEMORY)
    o.use_shared_memory = p.use_shared_memory != 0;
  return KVNODE_OK;
}

}  // namespace

extern "C" kvnode_status_t kvnode_connect(const kvnode_connect_params_t* params,
                                          kvnode_client_t** client, kvnode_error_t* err) {
  return guarded(err, [&] {
    if (client == nullptr) return invalid("kvnode_connect: client is NULL", err);
    *client = nullptr;
    if (params == nullptr) return invalid("kvnode_connect: params is NULL", err);
    if (const kvnode_status_t s =
            check_fields(params->field_mask, kConnectFields, "kvnode_connect", err);
        s != KVNODE_OK)
      return s;
    if (params->socket_path == nullptr || params->socket_path[0] == '\0')
      return invalid("kvnode_connect: params->socket_path: required (the node's local socket)",
                     err);
    LocalClientOptions options;
    if (const kvnode_status_t s = options_of(*params, options, err); s != KVNODE_OK) return s;
    auto connected = LocalClient::connect(params->socket_path, options);
    if (!connected) return fail(connected.error(), err);
    auto handle = std::make_unique<kvnode_client>();
    handle->client = std::move(connected).value();
    *client = handle.release();
    return ok(err);
  });
}

extern "C" void kvnode_client_close(kvnode_client_t* client) {
  // Ends the connection (the node drops its registrations); nothing here throws, but a C caller
  // must never see an exception, so the guard stays.
  (void)guarded(nullptr, [&] {
    std::unique_ptr<kvnode_client> owned(client);
    return KVNODE_OK;
  });
}

extern "C" kvnode_status_t kvnode_client_info(kvnode_client_t* client, kvnode_node_info_t* info,
                                              kvnode_error_t* err) {
  return guarded(err, [&] {
    if (client == nullptr) return invalid("kvnode_client_info: client is NULL", err);
    if (info == nullptr) return invalid("kvnode_client_info: info is NULL", err);
    // Only the fields asked for: a caller built against an older header has a smaller struct.
    const std::uint64_t want = info->field_mask;
    if (const kvnode_status_t s =
            check_fields(want, KVNODE_NODE_INFO_FIELDS_ALL, "kvnode_client_info", err, "info");
        s != KVNODE_OK)
      return s;
    const kvnode::client::NodeInfo& n = client->client->info();
    if (want & KVNODE_NODE_INFO_FIELD_CHUNK_BYTES) info->chunk_bytes = n.chunk_bytes;
    if (want & KVNODE_NODE_INFO_FIELD_CHUNK_SIZE) info->chunk_size = n.chunk_size;
    if (want & KVNODE_NODE_INFO_FIELD_PAGES) info->pages = n.pages;
    if (want & KVNODE_NODE_INFO_FIELD_WORKER_ID) info->worker_id = n.worker_id;
    if (want & KVNODE_NODE_INFO_FIELD_MEMORY)
      kvnode::c_api::copy_cut(info->memory, sizeof info->memory, n.memory);
    if (want & KVNODE_NODE_INFO_FIELD_INSTANCE)
      kvnode::c_api::copy_cut(info->instance, sizeof info->instance, n.instance);
    if (want & KVNODE_NODE_INFO_FIELD_LOCATION)
      kvnode::c_api::copy_cut(info->location, sizeof info->location, n.location);
    if (want & KVNODE_NODE_INFO_FIELD_SAVE_UNFULL_CHUNK)
      info->save_unfull_chunk = n.save_unfull_chunk ? 1 : 0;
    if (want & KVNODE_NODE_INFO_FIELD_HASHING) {
      kvnode::c_api::copy_cut(info->hash_generation, sizeof info->hash_generation,
                              n.hash_generation);
      kvnode::c_api::copy_cut(info->hash_init, sizeof info->hash_init, n.hash_init);
      info->none_hash = n.none_hash;
    }
    return ok(err);
  });
}

extern "C" kvnode_status_t kvnode_lookup(kvnode_client_t* client, const int64_t* tokens,
                                         size_t num_tokens, size_t* held_tokens,
                                         kvnode_error_t* err) {
  return guarded(err, [&] {
    if (client == nullptr) return invalid("kvnode_lookup: client is NULL", err);
    if (held_tokens == nullptr) return invalid("kvnode_lookup: held_tokens is NULL", err);
    *held_tokens = 0;
    if (tokens == nullptr && num_tokens > 0) return invalid("kvnode_lookup: tokens is NULL", err);
    std::vector<std::int64_t> t;
    if (num_tokens > 0) t.assign(tokens, tokens + num_tokens);
    auto held = client->client->lookup(t);
    if (!held) return fail(held.error(), err);
    *held_tokens = *held;
    return ok(err);
  });
}

extern "C" kvnode_status_t kvnode_lookup_chunks(kvnode_client_t* client, const int64_t* hashes,
                                                size_t num_hashes, size_t* held_chunks,
                                                kvnode_error_t* err) {
  return guarded(err, [&] {
    if (client == nullptr) return invalid("kvnode_lookup_chunks: client is NULL", err);
    if (held_chunks == nullptr) return invalid("kvnode_lookup_chunks: held_chunks is NULL", err);
    *held_chunks = 0;
    if (hashes == nullptr && num_hashes > 0)
      return invalid("kvnode_lookup_chunks: hashes is NULL", err);
    if (num_hashes == 0) return ok(err);
    auto present = client->client->contains(kvnode::client::ChunkKeys::of_hashes(
        std::vector<std::int64_t>(hashes, hashes + num_hashes)));
    if (!present) return fail(present.error(), err);
    std::size_t held = 0;
    while (held < present->size() && (*present)[held]) ++held;
    *held_chunks = held;
    return ok(err);
  });
}
