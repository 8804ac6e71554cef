#include "utf8.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace kvnode::wire::detail {
namespace {

std::string describe(std::string_view s, std::size_t start, std::size_t end, const char* reason) {
  char buf[160];
  if (end - start == 1) {
    std::snprintf(buf, sizeof buf, "'utf-8' codec can't decode byte 0x%02x in position %zu: %s",
                  static_cast<unsigned>(static_cast<unsigned char>(s[start])), start, reason);
  } else {
    std::snprintf(buf, sizeof buf, "'utf-8' codec can't decode bytes in position %zu-%zu: %s",
                  start, end - 1, reason);
  }
  return buf;
}

}  // namespace

std::optional<std::string> utf8_error(std::string_view s) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    // ASCII runs are the common case: test eight bytes at a time.
    if (i + 8 <= n) {
      std::uint64_t w;
      std::memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const std::uint8_t b = p[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    std::size_t len;
    std::uint8_t lo = 0x80, hi = 0xbf;  // allowed range of the first continuation byte
    if (b >= 0xc2 && b <= 0xdf) {
      len = 2;
    } else if (b >= 0xe0 && b <= 0xef) {
      len = 3;
      if (b == 0xe0) lo = 0xa0;  // overlong
      if (b == 0xed) hi = 0x9f;  // surrogates
    } else if (b >= 0xf0 && b <= 0xf4) {
      len = 4;
      if (b == 0xf0) lo = 0x90;  // overlong
      if (b == 0xf4) hi = 0x8f;  // above U+10FFFF
    } else {
      return describe(s, i, i + 1, "invalid start byte");
    }
    for (std::size_t k = 1; k < len; ++k) {
      if (i + k >= n) return describe(s, i, n, "unexpected end of data");
      const std::uint8_t c = p[i + k];
      const bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xbf);
      if (!ok)
        return describe(s, i, i + k,
                        "invalid continuation byte");  // CPython names the valid prefix
    }
    i += len;
  }
  return std::nullopt;
}

}  // namespace kvnode::wire::detail
