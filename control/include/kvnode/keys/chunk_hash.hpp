// Token -> chunk-hash chain, bit-exact with LMCache's "builtin" pre-caching hash (CPython's
// hash() on 64-bit builds, protocol reference §5.4/§5.5). The controller hashes every /lookup
// with it, so it is allocation-free apart from the output vector.
//
//   h[-1] = init_hash
//   h[i]  = hash((h[i-1], tuple(tokens[i*c:(i+1)*c]), extra))
//
// extra is what the LMCache release puts third (HashGeneration): () from 0.5.6 on (its token
// database passes `tuple(extra_keys) if extra_keys is not None else ()`), None before. hash(None)
// is interpreter-dependent: ChunkHashConfig::none_hash makes it pluggable (§5.5, defect D14).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/wire/wide_int.hpp"

namespace kvnode::keys {

// hash(None) on CPython >= 3.12 (a constant there).
inline constexpr std::uint64_t kNoneHashPython312 = 0xFCA86420;
// hash(None) of Debian 12's python3.11.2: before 3.12 it derives from None's address, which
// that build happens to fix. A controller serving workers on that interpreter sets this.
inline constexpr std::uint64_t kNoneHashDebianPython3112 = 612812;

// hash(()): the third element of every key from LMCache 0.5.6 on (the same on every CPython
// >= 3.8).
inline constexpr std::int64_t kEmptyTupleHash = 5740354900026072187;

// Which LMCache releases' chain: the third element of each chunk's key tuple.
enum class HashGeneration {
  kLmcache056,  // LMCache 0.5.6 and later: (prefix, tokens, ()) -- the default
  kLegacy,      // releases before 0.5.6: (prefix, tokens, None), hash(None) = none_hash
};

// The setting's spellings ("lmcache-0.5.6", "legacy"), shared by every flag and key that names it.
std::string_view hash_generation_name(HashGeneration generation);
Result<HashGeneration> parse_hash_generation(std::string_view text);
// Both names, for help texts: "lmcache-0.5.6 (default) or legacy (LMCache before 0.5.6)".
std::string_view hash_generation_choices();

struct ChunkHashConfig {
  std::size_t chunk_size = 256;   // tokens per chunk; must be > 0
  wire::WideInt init_hash = 0;    // h[-1]: LMCache's NONE_HASH (0 unless vLLM's is importable)
  bool save_unfull_chunk = true;  // hash the last partial chunk (the controller keeps it)
  HashGeneration generation = HashGeneration::kLmcache056;
  std::uint64_t none_hash = kNoneHashPython312;  // hash(None) of the workers' interpreter (legacy)
};

// Rejects what chunk_hashes() cannot hash (chunk_size 0).
Status validate(const ChunkHashConfig& cfg);

// A decimal integer in [-2^63, 2^64-1] (the range hashes and init hashes travel in), as typed in
// a flag, a YAML value or a JSON string.
Result<wire::WideInt> parse_wide_int(std::string_view text);

// CPython's hash(int) for any x in WideInt's range: sign(x) * (|x| mod (2^61-1)), -1 -> -2.
std::int64_t python_hash_int(wire::WideInt x);

// CPython's hash(tuple) given the hashes of its elements (xxHash-based, 3.8+).
std::int64_t python_hash_tuple(std::span<const std::int64_t> element_hashes);

// CPython's tuple hash, fed one element hash at a time (no temporary tuple).
class TupleHasher {
 public:
  void add(std::int64_t element_hash) noexcept {
    acc_ += static_cast<std::uint64_t>(element_hash) * kPrime2;
    acc_ = (acc_ << 31) | (acc_ >> 33);
    acc_ *= kPrime1;
    ++length_;
  }
  std::int64_t finish() const noexcept;

  static constexpr std::uint64_t kPrime1 = 11400714785074694791ull;  // 0x9E3779B185EBCA87
  static constexpr std::uint64_t kPrime2 = 14029467366897019727ull;  // 0xC2B2AE3D27D4EB4F
  static constexpr std::uint64_t kPrime5 = 2870177450012600261ull;   // 0x27D4EB2F165667C5

 private:
  std::uint64_t acc_ = kPrime5;
  std::uint64_t length_ = 0;
};

// Number of hashes chunk_hashes() returns for num_tokens tokens (chunk_size must be > 0).
std::size_t num_chunks(std::size_t num_tokens, std::size_t chunk_size, bool save_unfull_chunk);

// End (exclusive) of chunk chunk_index: min((chunk_index+1) * chunk_size, num_tokens),
// without overflow. A lookup that matches chunks 0..i has matched this many tokens.
std::size_t chunk_end_token(std::size_t chunk_index, std::size_t num_tokens,
                            std::size_t chunk_size);

// The chain of chunk hashes: full chunks always, the last partial one only with
// save_unfull_chunk; no tokens -> no hashes. Fails only when validate(cfg) fails.
Result<std::vector<wire::ChunkHash>> chunk_hashes(std::span<const std::int64_t> tokens,
                                                  const ChunkHashConfig& cfg = {});

}  // namespace kvnode::keys
