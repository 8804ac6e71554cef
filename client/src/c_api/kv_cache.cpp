// The C API's engine KV path: kvnode_kv_register turns the params into a KvLayout (through the
// preset functions, which name a wrong field) and KvAllocations (array elements whose reserved
// words must be zero); store and load by block table, answering the result fields asked for.
#include <cstring>
#include <string>
#include <vector>

#include "c_api/c_api.hpp"

namespace {

namespace kc = kvnode::client;
using kvnode::ErrorCode;
using kvnode::Result;
using kvnode::c_api::check_fields;
using kvnode::c_api::fail;
using kvnode::c_api::guarded;
using kvnode::c_api::invalid;
using kvnode::c_api::ok;

constexpr std::uint64_t kRegisterFields = KVNODE_KV_REGISTER_FIELD_STRIDES;
constexpr std::uint64_t kTransferFields =
    KVNODE_KV_XFER_FIELD_RETRIEVE | KVNODE_KV_XFER_FIELD_WAIT_EVENT |
    KVNODE_KV_XFER_FIELD_DONE_EVENT | KVNODE_KV_XFER_FIELD_HASHES;

// Writes the result fields the caller asked for (its mask checked already), no other byte.
void answer(kvnode_kv_result_t* result, const kc::KvTransferReply& r) {
  if (result == nullptr) return;
  const std::uint64_t want = result->field_mask;
  if (want & KVNODE_KV_RESULT_FIELD_CHUNKS) result->chunks = r.chunks;
  if (want & KVNODE_KV_RESULT_FIELD_TOKENS) result->tokens = r.tokens;
  if (want & KVNODE_KV_RESULT_FIELD_PULLED) result->pulled = r.pulled;
}

kvnode::Error bad(std::string message) {
  return kvnode::make_error(ErrorCode::kInvalid, "kvnode_kv_register: params->" + message);
}

// An array element's reserved words: zero, or the field is named.
template <class Element>
bool reserved_clear(const Element& e) {
  for (const std::uint64_t word : e.reserved)
    if (word != 0) return false;
  return true;
}

Result<kc::KvLayout> layout_of(const kvnode_kv_register_params_t& p) {
  if (p.layers == nullptr) return bad("layers: required");
  if (p.num_layers == 0) return bad("num_layers: must be > 0");
  const bool sglang = p.preset == KVNODE_KV_SGLANG;  // a K and a V buffer per layer
  if (sglang && p.num_layers > SIZE_MAX / 2) return bad("num_layers: too large");
  std::vector<kc::KvBuffer> buffers;
  for (std::size_t i = 0; i < p.num_layers * (sglang ? 2 : 1); ++i) {
    const kvnode_kv_buffer_t& b = p.layers[i];
    if (!reserved_clear(b))
      return bad("layers[" + std::to_string(i) +
                 "].reserved: must be zero (room for fields of a later version)");
    buffers.push_back({static_cast<std::byte*>(b.base), b.bytes, b.offset});
  }
  // kv_heads is required but for MLA, which ignores it.
  const kc::KvCacheShape shape{p.num_blocks, p.block_size, p.kv_heads, p.head_size, p.elem_bytes};
  const bool strided = p.preset == KVNODE_KV_STRIDED || p.preset == KVNODE_KV_MLA_STRIDED;
  const bool has_strides = (p.field_mask & KVNODE_KV_REGISTER_FIELD_STRIDES) != 0;
  if (strided && !has_strides)
    return bad("strides: required by a STRIDED preset (set KVNODE_KV_REGISTER_FIELD_STRIDES)");
  if (!strided && has_strides)
    return bad("strides: only a STRIDED preset takes them (this preset's strides are fixed)");
  // Read only when its bit is set: a caller built against an older header has no such field.
  const kc::KvStrides strides = has_strides
                                    ? kc::KvStrides{p.strides.block_stride, p.strides.token_stride,
                                                    p.strides.head_stride, p.strides.v_offset}
                                    : kc::KvStrides{};
  switch (p.preset) {
    case KVNODE_KV_STRIDED:
      return kc::strided_layout(shape, kc::KvFormat::kKeyValue, strides, buffers);
    case KVNODE_KV_MLA_STRIDED:
      return kc::strided_layout(shape, kc::KvFormat::kMla, strides, buffers);
    case KVNODE_KV_VLLM:
      return kc::vllm_flash_attn_layout(shape, buffers);
    case KVNODE_KV_FLASHINFER:
      return kc::flashinfer_layout(shape, buffers);
    case KVNODE_KV_MLA:
      return kc::mla_layout(shape, buffers);
    case KVNODE_KV_SGLANG: {
      std::vector<kc::KvBuffer> k, v;
      for (std::size_t l = 0; l < p.num_layers; ++l) {
        k.push_back(buffers[2 * l]);
        v.push_back(buffers[2 * l + 1]);
      }
      return kc::sglang_layout(shape, k, v);
    }
  }
  return bad("preset: " + std::to_string(static_cast<int>(p.preset)) +
             " is not a kvnode_kv_preset_t");
}

Result<std::vector<kc::KvAllocation>> allocations_of(const kvnode_kv_register_params_t& p) {
  if (p.allocations == nullptr || p.num_allocations == 0) return bad("allocations: required");
  std::vector<kc::KvAllocation> out(p.num_allocations);
  for (std::size_t i = 0; i < p.num_allocations; ++i) {
    const kvnode_kv_allocation_t& a = p.allocations[i];
    if (!reserved_clear(a))
      return bad("allocations[" + std::to_string(i) +
                 "].reserved: must be zero (room for fields of a later version)");
    switch (a.kind) {
      case KVNODE_MEMORY_HOST_FD:
        out[i].kind = kc::KvMemoryKind::kHostFd;
        break;
      case KVNODE_MEMORY_CUDA_IPC:
        out[i].kind = kc::KvMemoryKind::kCudaIpc;
        break;
      case KVNODE_MEMORY_CUDA_VMM:
        out[i].kind = kc::KvMemoryKind::kCudaVmmFd;
        break;
      case KVNODE_MEMORY_HOST_PROCESS:
        out[i].kind = kc::KvMemoryKind::kHostProcess;
        break;
      default:
        return bad("allocations[" + std::to_string(i) + "].kind: " +
                   std::to_string(static_cast<int>(a.kind)) + " is not a kvnode_memory_kind_t");
    }
    out[i].base = static_cast<std::byte*>(a.base);
    out[i].bytes = a.bytes;
    out[i].fd = a.fd;
    static_assert(sizeof a.ipc_handle == kc::kCudaIpcHandleBytes);
    std::memcpy(out[i].ipc_handle.data(), a.ipc_handle, sizeof a.ipc_handle);
  }
  return out;
}

kc::CudaIpcHandle handle_of(const std::uint8_t (&bytes)[kc::kCudaIpcHandleBytes]) {
  kc::CudaIpcHandle h{};
  std::memcpy(h.data(), bytes, sizeof bytes);
  return h;
}

// A store or a load: the params checked and turned into a KvTransfer, then sent.
kvnode_status_t transfer(kvnode_kv_cache_t* cache, const kvnode_kv_transfer_params_t* p, bool load,
                         kvnode_kv_result_t* result, kvnode_error_t* err) {
  const std::string_view fn = load ? "kvnode_kv_load" : "kvnode_kv_store";
  if (result != nullptr) {
    if (const kvnode_status_t s =
            check_fields(result->field_mask, KVNODE_KV_RESULT_FIELDS_ALL, fn, err, "result");
        s != KVNODE_OK)
      return s;
    answer(result, {});  // zeroes until the node answers
  }
  if (cache == nullptr) return invalid(std::string(fn) + ": cache is NULL", err);
  if (p == nullptr) return invalid(std::string(fn) + ": params is NULL", err);
  if (const kvnode_status_t s = check_fields(p->field_mask, kTransferFields, fn, err);
      s != KVNODE_OK)
    return s;
  const bool by_hash = (p->field_mask & KVNODE_KV_XFER_FIELD_HASHES) != 0;
  if (by_hash) {
    if (p->tokens != nullptr)
      return invalid(std::string(fn) + ": params->tokens: NULL with hashes (num_tokens counts)",
                     err);
    if (p->hashes == nullptr && p->num_hashes > 0)
      return invalid(std::string(fn) + ": params->hashes is NULL", err);
  } else if (p->tokens == nullptr) {
    return invalid(std::string(fn) + ": params->tokens: required", err);
  }
  if (p->block_ids == nullptr)
    return invalid(std::string(fn) + ": params->block_ids: required", err);
  if (!load && (p->field_mask & KVNODE_KV_XFER_FIELD_RETRIEVE))
    return invalid(
        std::string(fn) + ": params->retrieve: a load's field (a store has nothing to pull)", err);
  const std::shared_ptr<kc::LocalClient> client = cache->client.lock();
  if (!client)
    return fail(ErrorCode::kNotFound,
                std::string(fn) + ": the client this cache was registered through is closed", err);
  kc::KvTransfer t;
  t.kv = cache->id;
  if (by_hash) {
    t.keys = kc::ChunkKeys::of_hashes(
        p->num_hashes > 0 ? std::vector<std::int64_t>(p->hashes, p->hashes + p->num_hashes)
                          : std::vector<std::int64_t>{});
    t.num_tokens = p->num_tokens;
  } else {
    t.keys =
        kc::ChunkKeys::of_tokens(std::vector<std::int64_t>(p->tokens, p->tokens + p->num_tokens));
  }
  t.block_ids.assign(p->block_ids, p->block_ids + p->num_block_ids);
  t.retrieve = (p->field_mask & KVNODE_KV_XFER_FIELD_RETRIEVE) && p->retrieve != 0;
  if (p->field_mask & KVNODE_KV_XFER_FIELD_WAIT_EVENT) t.wait_event = handle_of(p->wait_event);
  if (p->field_mask & KVNODE_KV_XFER_FIELD_DONE_EVENT) t.done_event = handle_of(p->done_event);
  auto reply = load ? client->load(t) : client->store(t);
  if (!reply) return fail(reply.error(), err);
  answer(result, *reply);
  return ok(err);
}

}  // namespace

extern "C" kvnode_status_t kvnode_kv_register(kvnode_client_t* client,
                                              const kvnode_kv_register_params_t* params,
                                              kvnode_kv_cache_t** cache, kvnode_error_t* err) {
  return guarded(err, [&] {
    if (cache == nullptr) return invalid("kvnode_kv_register: cache is NULL", err);
    *cache = nullptr;
    if (client == nullptr) return invalid("kvnode_kv_register: client is NULL", err);
    if (params == nullptr) return invalid("kvnode_kv_register: params is NULL", err);
    if (const kvnode_status_t s =
            check_fields(params->field_mask, kRegisterFields, "kvnode_kv_register", err);
        s != KVNODE_OK)
      return s;
    auto layout = layout_of(*params);
    if (!layout) return fail(layout.error(), err);
    auto allocations = allocations_of(*params);
    if (!allocations) return fail(allocations.error(), err);
    auto id = client->client->register_kv(*layout, *allocations);
    if (!id) return fail(id.error(), err);
    auto handle = std::make_unique<kvnode_kv_cache>();
    handle->client = client->client;
    handle->id = *id;
    *cache = handle.release();
    return ok(err);
  });
}

extern "C" void kvnode_kv_close(kvnode_kv_cache_t* cache) {
  (void)guarded(nullptr, [&] {
    std::unique_ptr<kvnode_kv_cache> owned(cache);
    // Once the client is closed the node has dropped the registration already.
    if (owned)
      if (const std::shared_ptr<kc::LocalClient> client = owned->client.lock())
        (void)client->unregister_kv(owned->id);
    return KVNODE_OK;
  });
}

extern "C" kvnode_status_t kvnode_kv_store(kvnode_kv_cache_t* cache,
                                           const kvnode_kv_transfer_params_t* params,
                                           kvnode_kv_result_t* result, kvnode_error_t* err) {
  return guarded(err, [&] { return transfer(cache, params, false, result, err); });
}

extern "C" kvnode_status_t kvnode_kv_load(kvnode_kv_cache_t* cache,
                                          const kvnode_kv_transfer_params_t* params,
                                          kvnode_kv_result_t* result, kvnode_error_t* err) {
  return guarded(err, [&] { return transfer(cache, params, true, result, err); });
}
