// How an inference engine's paged KV cache lies in memory, and the host copy between it and
// kvnode's chunks. A KvLayout names, per layer, the K and V tensors (one tensor for MLA) by their
// allocation (base, size), the tensor's offset in it and byte strides for block, token-in-block
// and head; a row of head_size elements is contiguous. Presets build it from the shapes vLLM
// (FlashAttention), FlashInfer, MLA models and SGLang use; HND layouts are the same fields with
// other strides. A chunk is LMCache's KV_2LTD layout, [2, layers, tokens, kv_heads * head_size]
// (MLA: [1, layers, tokens, head_size]), so its bytes mean what LMCache's do.
//
// gather() copies the tokens of a block table into one chunk and scatter() copies back, with
// memcpy (host memory); for_each_run() lists the same copies as runs, for the node's GPU kernel.
// Plain structs with default-initialised fields, so the C API can mirror them and new fields can be
// added with defaults that keep today's meaning (as UCX's parameter structs grow).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kvnode/common/result.hpp"

namespace kvnode::client {

// What each layer holds: K and V tensors, or MLA's single latent tensor (in `k`; `v` unused).
enum class KvFormat : std::uint8_t { kKeyValue, kMla };

// One tensor of one layer. Its element (block b, token t of the block, head h, element 0) lies at
// base + offset + b * block_stride + t * token_stride + h * head_stride.
struct KvTensor {
  std::byte* base = nullptr;  // the allocation's base (on GPUs later: the mapped IPC address)
  std::size_t allocation_bytes = 0;  // size of the allocation the tensor lives in
  std::size_t offset = 0;            // the tensor's first byte, from base
  std::size_t block_stride = 0;      // bytes between blocks
  std::size_t token_stride = 0;      // bytes between tokens of one block
  std::size_t head_stride = 0;       // bytes between KV heads of one token
};

struct KvLayerTensors {
  KvTensor k{};
  KvTensor v{};  // unused for KvFormat::kMla
};

struct KvLayout {
  KvFormat format = KvFormat::kKeyValue;
  std::uint32_t num_blocks = 0;
  std::uint32_t block_size = 0;  // tokens per block
  std::uint32_t kv_heads = 0;    // per rank; 1 for MLA
  std::uint32_t head_size = 0;   // elements per head
  std::uint32_t elem_bytes = 0;  // 2 for bf16/fp16, 1 for fp8
  std::vector<KvLayerTensors> layers{};
};

// The engine's cache shape, shared by the presets.
struct KvCacheShape {
  std::uint32_t num_blocks = 0;
  std::uint32_t block_size = 0;
  std::uint32_t kv_heads = 0;  // ignored by mla_layout (always 1)
  std::uint32_t head_size = 0;
  std::uint32_t elem_bytes = 0;
};

// Where one tensor (or one layer's combined tensor) lives: its allocation and offset in it.
struct KvBuffer {
  std::byte* base = nullptr;
  std::size_t allocation_bytes = 0;
  std::size_t offset = 0;
};

// vLLM FlashAttention: one tensor per layer, [2, num_blocks, block_size, num_kv_heads, head_size]
// (K at index 0, V at 1). One buffer per layer.
Result<KvLayout> vllm_flash_attn_layout(const KvCacheShape& shape,
                                        std::span<const KvBuffer> layers);
// FlashInfer: one tensor per layer, [num_blocks, 2, block_size, num_kv_heads, head_size].
Result<KvLayout> flashinfer_layout(const KvCacheShape& shape, std::span<const KvBuffer> layers);
// MLA (DeepSeek): one tensor per layer, [num_blocks, block_size, head_size], one "head".
Result<KvLayout> mla_layout(const KvCacheShape& shape, std::span<const KvBuffer> layers);
// SGLang (MHATokenToKVPool): separate K and V buffers per layer, each
// [num_blocks * block_size token slots, num_kv_heads, head_size]; a block is block_size slots.
Result<KvLayout> sglang_layout(const KvCacheShape& shape, std::span<const KvBuffer> k_layers,
                               std::span<const KvBuffer> v_layers);

// Any layout whose rows (head_size elements) are contiguous, every layer with the same byte
// strides: layer i's K starts at layers[i].offset, its V v_offset bytes further (kKeyValue).
// vLLM >= 0.33 hands each layer as a strided view [num_blocks, kv_heads, block_size,
// 2 * head_size] of one allocation (K and V share the last axis: v_offset = head_size * elem),
// in any of its physical orders (LBNHC, LBHNC, BLNHC, ...); its MLA as [num_blocks, 1,
// block_size, head_size] (format kMla: no V, v_offset unused).
struct KvStrides {
  std::size_t block_stride = 0;  // bytes between blocks
  std::size_t token_stride = 0;  // bytes between tokens of one block
  std::size_t head_stride = 0;   // bytes between KV heads of one token (unused with one head)
  std::size_t v_offset = 0;      // bytes from a layer's K to its V (kKeyValue)
};
Result<KvLayout> strided_layout(const KvCacheShape& shape, KvFormat format,
                                const KvStrides& strides, std::span<const KvBuffer> layers);

// Checks every field; an error names it ("layers[3].v.block_stride: ..."): zero sizes, null
// bases, strides that overlap a row, a tensor whose last byte leaves its allocation, overflow.
Status validate(const KvLayout& layout);

// Bytes of a chunk of `tokens` tokens in KV_2LTD (MLA: 1LTD); an error on zero or overflow.
Result<std::size_t> chunk_bytes(const KvLayout& layout, std::size_t tokens);

// Copies tokens [first_token, first_token + tokens) of the sequence whose blocks are `block_ids`
// (block_ids[i] holds tokens i * block_size ..) into `out`, one chunk in KV_2LTD order for those
// tokens (fewer than the chunk size for LMCache's unfull last chunk). `out` must be exactly
// chunk_bytes(layout, tokens). Nothing is copied when any check fails.
Status gather(const KvLayout& layout, std::span<const std::uint32_t> block_ids,
              std::size_t first_token, std::size_t tokens, std::span<std::byte> out);
// The reverse: writes the chunk `in` into the cache at those tokens' slots.
Status scatter(const KvLayout& layout, std::span<const std::uint32_t> block_ids,
               std::size_t first_token, std::size_t tokens, std::span<const std::byte> in);

// One contiguous piece of such a chunk: `bytes` at `cache` (in the layout's address space) and
// at `chunk_offset` in the chunk. The node turns runs into copy segments for its GPU kernel.
struct KvRun {
  std::byte* cache = nullptr;
  std::size_t chunk_offset = 0;
  std::size_t bytes = 0;
};
// Checks the request as gather() does (`chunk_span_bytes`: the chunk's buffer, which must be
// exactly chunk_bytes(layout, tokens)), then calls `each` for every run, the largest contiguous
// ones the strides allow. Nothing is called when a check fails.
Status for_each_run(const KvLayout& layout, std::span<const std::uint32_t> block_ids,
                    std::size_t first_token, std::size_t tokens, std::size_t chunk_span_bytes,
                    const std::function<void(const KvRun&)>& each);

}  // namespace kvnode::client
