#include "orch_uuid.hpp"

#include <array>

namespace kvnode::controller {

namespace {

std::uint64_t seed_from_device() {
  std::random_device device;
  // random_device yields 32 bits a call; two calls fill the 64-bit seed.
  return (static_cast<std::uint64_t>(device()) << 32) ^ device();
}

}  // namespace

Uuid4Generator::Uuid4Generator() : rng_(seed_from_device()) {}

std::string Uuid4Generator::next() {
  std::uint64_t hi = 0, lo = 0;
  {
    std::lock_guard lock(mutex_);
    hi = rng_();
    lo = rng_();
  }
  hi = (hi & ~0xF000ull) | 0x4000ull;              // version 4 (bits 12-15 of time_hi)
  lo = (lo & ~(0xC0ull << 56)) | (0x80ull << 56);  // RFC 4122 variant (10xx)
  std::array<std::uint8_t, 16> bytes{};
  for (int i = 0; i < 8; ++i) {
    bytes[i] = static_cast<std::uint8_t>(hi >> (56 - 8 * i));
    bytes[8 + i] = static_cast<std::uint8_t>(lo >> (56 - 8 * i));
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(36);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 0xF]);
  }
  return out;
}

}  // namespace kvnode::controller
