// The bytes a test peer's pool holds: page p, byte i is a function of (seed, p, i), so a test
// can check every byte it pulled without asking the peer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kvnode::test {

inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Fills `bytes` (a multiple of 8) with page `page`'s pattern.
inline void fill_pattern(std::byte* out, std::size_t bytes, std::uint32_t seed,
                         std::uint32_t page) {
  for (std::size_t w = 0; w < bytes / 8; ++w) {
    const std::uint64_t v = mix((std::uint64_t{seed} << 56) ^ (std::uint64_t{page} << 32) ^ w);
    std::memcpy(out + w * 8, &v, 8);
  }
}

// Index of the first byte that differs from the pattern, or `bytes` when all match.
inline std::size_t check_pattern(const std::byte* in, std::size_t bytes, std::uint32_t seed,
                                 std::uint32_t page) {
  for (std::size_t w = 0; w < bytes / 8; ++w) {
    const std::uint64_t v = mix((std::uint64_t{seed} << 56) ^ (std::uint64_t{page} << 32) ^ w);
    if (std::memcmp(in + w * 8, &v, 8) != 0) return w * 8;
  }
  return bytes;
}

}  // namespace kvnode::test
