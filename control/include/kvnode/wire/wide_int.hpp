// WideInt: an integer over msgpack's whole range [-2^63, 2^64-1], compared by value.
// LMCache chunk hashes are signed int64 (CPython's builtin hash) or uint64 (vLLM's
// sha256_cbor_64bit); both travel unchanged and re-encode to the sender's bytes.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace kvnode::wire {

class WideInt {
 public:
  constexpr WideInt() = default;
  constexpr WideInt(std::int64_t v)
      : bits_(static_cast<std::uint64_t>(v)), negative_(v < 0) {}  // NOLINT

  static constexpr WideInt from_signed(std::int64_t v) { return WideInt(v); }
  static constexpr WideInt from_unsigned(std::uint64_t v) {
    WideInt w;
    w.bits_ = v;
    return w;
  }

  constexpr bool negative() const { return negative_; }
  // Two's complement bits: the value itself when non-negative.
  constexpr std::uint64_t bits() const { return bits_; }
  constexpr std::optional<std::int64_t> as_int64() const {
    if (!negative_ && bits_ > static_cast<std::uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<std::int64_t>(bits_);
  }
  constexpr std::optional<std::uint64_t> as_uint64() const {
    if (negative_) return std::nullopt;
    return bits_;
  }
  std::string to_string() const {
    return negative_ ? std::to_string(static_cast<std::int64_t>(bits_)) : std::to_string(bits_);
  }

  friend constexpr bool operator==(const WideInt&, const WideInt&) = default;
  friend constexpr std::strong_ordering operator<=>(const WideInt& a, const WideInt& b) {
    if (a.negative_ != b.negative_)
      return a.negative_ ? std::strong_ordering::less : std::strong_ordering::greater;
    return a.bits_ <=> b.bits_;  // same sign: two's complement order matches value order
  }

 private:
  std::uint64_t bits_ = 0;
  bool negative_ = false;
};

// A chunk hash as it travels in `key`, `hashes` and `keys`.
using ChunkHash = WideInt;

}  // namespace kvnode::wire

template <>
struct std::hash<kvnode::wire::WideInt> {
  std::size_t operator()(const kvnode::wire::WideInt& w) const noexcept {
    // Chunk hashes are already well mixed; fold the sign in so -1 and 2^64-1 differ.
    return static_cast<std::size_t>(w.bits() ^ (w.negative() ? 0x9E3779B97F4A7C15ull : 0));
  }
};
