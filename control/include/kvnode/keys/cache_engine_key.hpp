// LMCache's CacheEngineKey string (protocol reference §5.2), for tools and logs: the controller
// itself only ever sees the integer chunk hashes.
//
//   model_name@world_size@worker_id@<chunk hash hex>@<dtype>[@<layer_id>][@tag%value...]
//
// The hash is lowercase hex without padding or 0x, negative values as '-' + hex of the
// magnitude: Qwen/Qwen3-8B@2@1@-6ac50906de809457@bfloat16 holds -7693565463539782743.
// LMCache's layer-wise keys (LayerCacheEngineKey) add an integer layer id after the dtype.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/wire/wide_int.hpp"

namespace kvnode::keys {

struct CacheEngineKey {
  std::string model_name;
  std::int64_t world_size = 1;
  std::int64_t worker_id = 0;
  wire::ChunkHash chunk_hash;
  std::string dtype = "bfloat16";
  std::optional<std::int64_t> layer_id;                   // set for LMCache's layer-wise keys
  std::vector<std::pair<std::string, std::string>> tags;  // from lmcache.tag.* request configs

  // Formats the string; a key that fails validate() yields one that does not parse back.
  std::string to_string() const;
  // Checks what to_string() needs to round-trip: a model name, separators ('@', and '%' in tag
  // keys) only where they belong, a known dtype.
  Status validate() const;

  friend bool operator==(const CacheEngineKey&, const CacheEngineKey&) = default;
};

// Parses any string; errors name the offending part, e.g.
// "CacheEngineKey part 4 (chunk hash): 'xyz' is not hexadecimal".
Result<CacheEngineKey> parse_cache_engine_key(std::string_view text);

// The hash as it appears in the key: lowercase hex, '-' + magnitude when negative.
std::string format_chunk_hash_hex(wire::ChunkHash hash);
// Inverse of format_chunk_hash_hex over WideInt's whole range ("-8000000000000000" to
// "ffffffffffffffff"); upper-case digits and leading zeros are accepted, as Python's int(s, 16).
Result<wire::ChunkHash> parse_chunk_hash_hex(std::string_view text);

// torch dtype names LMCache writes into keys (DTYPE_TO_STR).
std::span<const std::string_view> known_dtypes();
bool is_known_dtype(std::string_view dtype);

}  // namespace kvnode::keys
