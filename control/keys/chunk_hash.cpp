#include "kvnode/keys/chunk_hash.hpp"

#include <charconv>
#include <string>

namespace kvnode::keys {
namespace {

constexpr std::uint64_t kModulus = (std::uint64_t{1} << 61) - 1;  // CPython's _PyHASH_MODULUS

// v mod (2^61-1) for any u64: 2^61 = 1 (mod M), so fold the top 3 bits onto the low 61.
constexpr std::uint64_t reduce(std::uint64_t v) {
  const std::uint64_t r = (v & kModulus) + (v >> 61);  // <= M + 7
  return r >= kModulus ? r - kModulus : r;
}

// Token ids are small non-negative ints, whose hash is themselves; the rest take the slow path.
inline std::int64_t hash_token(std::int64_t t) {
  if (static_cast<std::uint64_t>(t) < kModulus) [[likely]]
    return t;
  return python_hash_int(t);
}

}  // namespace

Status validate(const ChunkHashConfig& cfg) {
  if (cfg.chunk_size == 0) return make_error("chunk_size must be at least 1");
  return {};
}

namespace {
constexpr std::string_view kLmcache056Name = "lmcache-0.5.6";
constexpr std::string_view kLegacyName = "legacy";
}  // namespace

std::string_view hash_generation_name(HashGeneration generation) {
  return generation == HashGeneration::kLegacy ? kLegacyName : kLmcache056Name;
}

std::string_view hash_generation_choices() {
  return "lmcache-0.5.6 (LMCache 0.5.6 and later) or legacy (LMCache before 0.5.6)";
}

Result<HashGeneration> parse_hash_generation(std::string_view text) {
  if (text == kLmcache056Name) return HashGeneration::kLmcache056;
  if (text == kLegacyName) return HashGeneration::kLegacy;
  return make_error(ErrorCode::kInvalid, "expected " + std::string(hash_generation_choices()) +
                                             ", got '" + std::string(text) + "'");
}

Result<wire::WideInt> parse_wide_int(std::string_view text) {
  const bool negative = !text.empty() && text.front() == '-';
  const char* end = text.data() + text.size();
  std::uint64_t magnitude = 0;
  const auto [ptr, ec] = std::from_chars(text.data() + (negative ? 1 : 0), end, magnitude);
  constexpr auto kMaxNegativeMagnitude = static_cast<std::uint64_t>(INT64_MAX) + 1;
  const bool parsed = ec == std::errc() && ptr == end;
  if (ec == std::errc::result_out_of_range ||
      (parsed && negative && magnitude > kMaxNegativeMagnitude))
    return make_error(ErrorCode::kInvalid,
                      "expected an integer, got '" + std::string(text) + "' (out of range)");
  if (!parsed)
    return make_error(ErrorCode::kInvalid, "expected an integer, got '" + std::string(text) + "'");
  if (!negative) return wire::WideInt::from_unsigned(magnitude);
  // Two's complement negation in unsigned arithmetic; the conversion is modular in C++20.
  return wire::WideInt::from_signed(static_cast<std::int64_t>(~magnitude + 1));
}

std::int64_t python_hash_int(wire::WideInt x) {
  if (!x.negative()) return static_cast<std::int64_t>(reduce(x.bits()));
  const std::uint64_t magnitude = 0 - x.bits();  // exact for -2^63 too
  const auto h = -static_cast<std::int64_t>(reduce(magnitude));
  return h == -1 ? -2 : h;  // -1 is CPython's error marker
}

std::int64_t TupleHasher::finish() const noexcept {
  const std::uint64_t acc = acc_ + (length_ ^ (kPrime5 ^ 3527539ull));
  if (acc == ~std::uint64_t{0}) return 1546275796;  // CPython avoids -1 here too
  return static_cast<std::int64_t>(acc);
}

std::int64_t python_hash_tuple(std::span<const std::int64_t> element_hashes) {
  TupleHasher h;
  for (const std::int64_t e : element_hashes) h.add(e);
  return h.finish();
}

std::size_t num_chunks(std::size_t num_tokens, std::size_t chunk_size, bool save_unfull_chunk) {
  if (chunk_size == 0) return 0;
  const bool partial = save_unfull_chunk && num_tokens % chunk_size != 0;
  return num_tokens / chunk_size + (partial ? 1 : 0);
}

std::size_t chunk_end_token(std::size_t chunk_index, std::size_t num_tokens,
                            std::size_t chunk_size) {
  if (chunk_size == 0) return 0;
  // chunk_index >= floor(n/c) implies (chunk_index+1)*c > n; otherwise the product is <= n.
  if (chunk_index >= num_tokens / chunk_size) return num_tokens;
  return (chunk_index + 1) * chunk_size;
}

Result<std::vector<wire::ChunkHash>> chunk_hashes(std::span<const std::int64_t> tokens,
                                                  const ChunkHashConfig& cfg) {
  if (Status s = validate(cfg); !s) return s.error();
  const std::size_t count = num_chunks(tokens.size(), cfg.chunk_size, cfg.save_unfull_chunk);
  std::vector<wire::ChunkHash> out;
  out.reserve(count);

  const std::int64_t extra = cfg.generation == HashGeneration::kLegacy
                                 ? static_cast<std::int64_t>(cfg.none_hash)
                                 : kEmptyTupleHash;
  // The chain feeds hash(h[i-1]) into the next key, not h[i-1] itself (they differ beyond M).
  std::int64_t prev = python_hash_int(cfg.init_hash);
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t end = chunk_end_token(i, tokens.size(), cfg.chunk_size);
    TupleHasher chunk;
    for (std::size_t t = i * cfg.chunk_size; t < end; ++t) chunk.add(hash_token(tokens[t]));
    TupleHasher key;
    key.add(prev);
    key.add(chunk.finish());
    key.add(extra);
    const std::int64_t h = key.finish();
    out.emplace_back(h);
    prev = python_hash_int(h);
  }
  return out;
}

}  // namespace kvnode::keys
