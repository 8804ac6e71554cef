// The size of one KV-cache chunk, from the model's KV shape. kvnode stores chunks in LMCache's
// KV_2LTD layout ([K|V][layer][token][kv_head * head_size], one dtype), so a chunk of T tokens
// takes 2 * layers * T * kv_heads * head_size * dtype bytes: 32 MiB for Llama-3.1-8B at 256 tokens
// in bfloat16. A pool's page size is this figure, or a byte count given directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvnode/common/result.hpp"

namespace kvnode::gpu {

// Element types of KV caches, with the names torch and vLLM use ("bfloat16", "fp8", ...).
enum class KvDtype { kFloat32, kFloat16, kBFloat16, kFloat8E4M3, kFloat8E5M2, kUInt8 };

std::size_t dtype_bytes(KvDtype dtype);
std::string_view to_string(KvDtype dtype);
// Accepts torch's names with or without "torch.", and the usual aliases ("half", "bf16", "fp8").
Result<KvDtype> parse_dtype(std::string_view name);

struct KvShape {
  std::uint32_t layers = 0;
  std::uint32_t kv_heads = 0;  // per rank: the KV heads this worker holds under TP
  std::uint32_t head_size = 0;
  KvDtype dtype = KvDtype::kBFloat16;
  std::uint32_t tokens_per_chunk = 256;
};

// Bytes of one chunk in KV_2LTD; an error names the zero field, or the overflow.
Result<std::size_t> chunk_bytes(const KvShape& shape);

}  // namespace kvnode::gpu
