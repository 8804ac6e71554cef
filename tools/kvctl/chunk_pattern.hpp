// Generated chunk contents: the bytes `kvctl put --seed S` writes for a chunk, a function of the
// seed and the chunk's hash only, so any node holding a copy can be checked against them
// (`kvctl verify`, the demo, the multi-host test). Test data: kvctl's, not the node's API.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace kvctl {

// splitmix64 from (seed, hash), 8 bytes per step; a short tail takes the first bytes of a step.
inline void fill_chunk_pattern(std::span<std::byte> out, std::uint64_t seed, std::int64_t hash) {
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(hash);
  for (std::size_t i = 0; i < out.size(); i += 8) {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(out.data() + i, &z, std::min<std::size_t>(8, out.size() - i));
  }
}

}  // namespace kvctl
