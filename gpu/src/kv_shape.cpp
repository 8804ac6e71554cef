#include "kvnode/gpu/kv_shape.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <limits>
#include <utility>

namespace kvnode::gpu {
namespace {

struct DtypeName {
  std::string_view name;
  KvDtype dtype;
};

// First entry per dtype is its canonical name.
constexpr std::array<DtypeName, 14> kNames{{
    {"float32", KvDtype::kFloat32},
    {"float", KvDtype::kFloat32},
    {"fp32", KvDtype::kFloat32},
    {"float16", KvDtype::kFloat16},
    {"half", KvDtype::kFloat16},
    {"fp16", KvDtype::kFloat16},
    {"bfloat16", KvDtype::kBFloat16},
    {"bf16", KvDtype::kBFloat16},
    {"float8_e4m3fn", KvDtype::kFloat8E4M3},
    {"fp8", KvDtype::kFloat8E4M3},
    {"fp8_e4m3", KvDtype::kFloat8E4M3},
    {"float8_e5m2", KvDtype::kFloat8E5M2},
    {"fp8_e5m2", KvDtype::kFloat8E5M2},
    {"uint8", KvDtype::kUInt8},
}};

}  // namespace

std::size_t dtype_bytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFloat32:
      return 4;
    case KvDtype::kFloat16:
    case KvDtype::kBFloat16:
      return 2;
    case KvDtype::kFloat8E4M3:
    case KvDtype::kFloat8E5M2:
    case KvDtype::kUInt8:
      return 1;
  }
  return 0;
}

std::string_view to_string(KvDtype dtype) {
  for (const auto& n : kNames)
    if (n.dtype == dtype) return n.name;
  return "?";
}

Result<KvDtype> parse_dtype(std::string_view name) {
  std::string lower;
  for (char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string_view key = lower;
  if (key.starts_with("torch.")) key.remove_prefix(6);
  for (const auto& n : kNames)
    if (n.name == key) return n.dtype;
  std::string known;
  for (const auto& n : kNames) known += (known.empty() ? "" : ", ") + std::string(n.name);
  return make_error("unknown KV dtype '" + std::string(name) + "' (known: " + known + ")");
}

Result<std::size_t> chunk_bytes(const KvShape& shape) {
  const std::pair<const char*, std::uint64_t> factors[] = {
      {"layers", shape.layers},
      {"kv_heads", shape.kv_heads},
      {"head_size", shape.head_size},
      {"tokens_per_chunk", shape.tokens_per_chunk},
  };
  std::uint64_t bytes = 2 * dtype_bytes(shape.dtype);  // K and V
  for (const auto& [field, value] : factors) {
    if (value == 0) return make_error(std::string("KV shape: ") + field + " must be > 0");
    if (bytes > std::numeric_limits<std::size_t>::max() / value)
      return make_error("KV shape: the chunk size overflows (" + std::string(field) + ")");
    bytes *= value;
  }
  return static_cast<std::size_t>(bytes);
}

}  // namespace kvnode::gpu
