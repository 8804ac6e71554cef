#include "kvnode/keys/cache_engine_key.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <limits>
#include <system_error>

namespace kvnode::keys {
namespace {

constexpr std::array<std::string_view, 14> kDtypes = {
    "half",  "bfloat16", "float", "double",     "int8",         "uint8",    "int16",
    "int32", "int64",    "bool",  "fp8_e4m3fn", "fp8_e4m3fnuz", "fp8_e5m2", "fp8_e5m2fnuz"};

// Hostile input ends up in error messages: show a bounded, printable excerpt.
std::string quote(std::string_view s) {
  constexpr std::size_t kMaxShown = 64;
  std::string out = "'";
  for (const char c : s.substr(0, kMaxShown)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '\\') {
      out += c;
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 0xf];
    }
  }
  out += '\'';
  if (s.size() > kMaxShown) out += " (" + std::to_string(s.size()) + " bytes, truncated)";
  return out;
}

Error part_error(std::size_t index, std::string_view what, std::string detail) {
  return make_error("CacheEngineKey part " + std::to_string(index + 1) + " (" + std::string(what) +
                    "): " + std::move(detail));
}

// Decimal as Python's int() writes it: optional '-', digits, nothing else.
Result<std::int64_t> parse_int64(std::string_view s) {
  std::int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc::result_out_of_range) return make_error(quote(s) + " is out of int64 range");
  if (ec != std::errc() || ptr != s.data() + s.size() || s.empty())
    return make_error(quote(s) + " is not a decimal integer");
  return v;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void append_hex(std::string& out, std::uint64_t v) {
  std::array<char, 16> buf{};
  const auto res = std::to_chars(buf.data(), buf.data() + buf.size(), v, 16);
  out.append(buf.data(), res.ptr);
}

}  // namespace

std::span<const std::string_view> known_dtypes() {
  return kDtypes;
}

bool is_known_dtype(std::string_view dtype) {
  return std::find(kDtypes.begin(), kDtypes.end(), dtype) != kDtypes.end();
}

std::string format_chunk_hash_hex(wire::ChunkHash hash) {
  std::string out;
  if (hash.negative()) {
    out += '-';
    append_hex(out, 0 - hash.bits());  // magnitude; exact for -2^63
  } else {
    append_hex(out, hash.bits());
  }
  return out;
}

Result<wire::ChunkHash> parse_chunk_hash_hex(std::string_view text) {
  std::string_view digits = text;
  const bool negative = !digits.empty() && digits.front() == '-';
  if (negative) digits.remove_prefix(1);
  if (digits.empty()) return make_error(quote(text) + " is not hexadecimal");
  std::uint64_t magnitude = 0;
  bool overflow = false;
  for (const char c : digits) {
    const int d = hex_digit(c);
    if (d < 0) return make_error(quote(text) + " is not hexadecimal");
    // Keep scanning after an overflow so that "not hexadecimal" wins over "out of range".
    if (magnitude > (std::numeric_limits<std::uint64_t>::max() >> 4)) overflow = true;
    magnitude = (magnitude << 4) | static_cast<std::uint64_t>(d);
  }
  constexpr std::uint64_t kMinMagnitude = std::uint64_t{1} << 63;  // |-2^63|
  if (overflow || (negative && magnitude > kMinMagnitude))
    return make_error(quote(text) + " is out of range (a chunk hash lies in [-2^63, 2^64-1])");
  if (!negative || magnitude == 0) return wire::WideInt::from_unsigned(magnitude);
  return wire::WideInt::from_signed(static_cast<std::int64_t>(0 - magnitude));
}

std::string CacheEngineKey::to_string() const {
  std::string out = model_name;
  out += '@';
  out += std::to_string(world_size);
  out += '@';
  out += std::to_string(worker_id);
  out += '@';
  out += format_chunk_hash_hex(chunk_hash);
  out += '@';
  out += dtype;
  if (layer_id) {
    out += '@';
    out += std::to_string(*layer_id);
  }
  for (const auto& [key, value] : tags) {
    out += '@';
    out += key;
    out += '%';
    out += value;
  }
  return out;
}

Status CacheEngineKey::validate() const {
  if (model_name.empty()) return make_error("CacheEngineKey model name is empty");
  if (model_name.find('@') != std::string::npos)
    return make_error("CacheEngineKey model name " + quote(model_name) + " contains '@'");
  if (!is_known_dtype(dtype))
    return make_error("CacheEngineKey dtype " + quote(dtype) + " is not a known dtype");
  for (const auto& [key, value] : tags) {
    if (key.find_first_of("@%") != std::string::npos)
      return make_error("CacheEngineKey tag key " + quote(key) + " contains '@' or '%'");
    if (value.find('@') != std::string::npos)
      return make_error("CacheEngineKey tag value " + quote(value) + " contains '@'");
  }
  return {};
}

Result<CacheEngineKey> parse_cache_engine_key(std::string_view text) {
  if (text.empty()) return make_error("CacheEngineKey is empty");
  // Split on '@' (no part contains one); memory stays proportional to the input.
  std::vector<std::string_view> parts;
  for (std::size_t start = 0;;) {
    const std::size_t at = text.find('@', start);
    parts.push_back(text.substr(start, at == std::string_view::npos ? at : at - start));
    if (at == std::string_view::npos) break;
    start = at + 1;
  }
  if (parts.size() < 5)
    return make_error("CacheEngineKey " + quote(text) + " has " + std::to_string(parts.size()) +
                      " '@'-separated parts, expected at least 5: "
                      "model@world_size@worker_id@chunk_hash_hex@dtype");

  CacheEngineKey key;
  if (parts[0].empty()) return part_error(0, "model name", "is empty");
  key.model_name = parts[0];

  auto world_size = parse_int64(parts[1]);
  if (!world_size) {
    std::string detail = world_size.error().message;
    if (parts.size() >= 6) detail += " (legacy 'fmt@model@...' keys are not supported)";
    return part_error(1, "world size", std::move(detail));
  }
  key.world_size = *world_size;

  auto worker_id = parse_int64(parts[2]);
  if (!worker_id) return part_error(2, "worker id", std::move(worker_id).error().message);
  key.worker_id = *worker_id;

  auto hash = parse_chunk_hash_hex(parts[3]);
  if (!hash) return part_error(3, "chunk hash", std::move(hash).error().message);
  key.chunk_hash = *hash;

  if (!is_known_dtype(parts[4]))
    return part_error(4, "dtype", quote(parts[4]) + " is not a known dtype");
  key.dtype = parts[4];

  std::size_t next = 5;
  // A layer id is a bare integer; tags always hold a '%', so the two cannot be confused.
  if (parts.size() > 5 && parts[5].find('%') == std::string_view::npos) {
    auto layer = parse_int64(parts[5]);
    if (!layer)
      return part_error(5, "layer id or tag",
                        quote(parts[5]) + " is neither a layer id (integer) nor a tag (key%value)");
    key.layer_id = *layer;
    next = 6;
  }
  key.tags.reserve(parts.size() - next);
  for (std::size_t i = next; i < parts.size(); ++i) {
    const std::size_t pct = parts[i].find('%');
    if (pct == std::string_view::npos)
      return part_error(i, "tag", quote(parts[i]) + " is not key%value");
    key.tags.emplace_back(parts[i].substr(0, pct), parts[i].substr(pct + 1));
  }
  return key;
}

}  // namespace kvnode::keys
