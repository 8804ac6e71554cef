// A zero-copy, bounds-checked msgpack pull reader. It reads one item header at a time (and the
// payload of a str, bin or ext) and never allocates: the codec checks each array and map count
// against the bytes left before reserving anything. Errors carry msgspec's exact texts.
//
// Hand-written rather than msgpack-cxx's unpacker because decoding must be typed and pull-style
// (to report `$.operations[1].key` paths and reject before building anything), and msgpack-cxx
// builds a generic object tree whose allocations follow the length headers.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "kvnode/wire/wide_int.hpp"

namespace kvnode::wire::detail {

enum class Kind : std::uint8_t { kNil, kBool, kInt, kFloat, kStr, kBin, kArray, kMap, kExt };

struct Item {
  Kind kind = Kind::kNil;
  bool boolean = false;
  WideInt integer;
  double real = 0.0;
  std::string_view bytes;   // str, bin and ext payloads (a view into the input)
  std::uint32_t count = 0;  // array elements or map entries
};

// msgspec's name of a msgpack type in "Expected `x`, got `y`" errors.
inline std::string_view kind_name(Kind k, bool from_json) {
  switch (k) {
    case Kind::kNil:
      return from_json ? "null" : "None";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kStr:
      return "str";
    case Kind::kBin:
      return "bytes";
    case Kind::kArray:
      return "array";
    case Kind::kMap:
      return "object";
    case Kind::kExt:
      return "ext";
  }
  return "?";
}

class MsgpackReader {
 public:
  explicit MsgpackReader(std::string_view data)
      : p_(reinterpret_cast<const std::uint8_t*>(data.data())),
        begin_(p_),
        end_(p_ + data.size()) {}

  std::size_t offset() const { return static_cast<std::size_t>(p_ - begin_); }
  std::size_t remaining() const { return static_cast<std::size_t>(end_ - p_); }
  bool at_end() const { return p_ == end_; }
  void seek(std::size_t offset) { p_ = begin_ + offset; }

  // Reads the next item; on failure returns false and error() says why. The one-byte forms that
  // make up most of a KV event batch (fixint, fixstr, fixmap, fixarray) stay inline.
  [[gnu::always_inline]] bool next(Item& it) {
    if (p_ != end_) [[likely]] {
      const std::uint8_t b = *p_;
      if (b <= 0x7f) {
        ++p_;
        return set_int(it, WideInt(static_cast<std::int64_t>(b)));
      }
      if ((b & 0xe0) == 0xa0 && remaining() > static_cast<std::size_t>(b & 0x1f)) {
        ++p_;
        return payload(it, Kind::kStr, b & 0x1f);
      }
      if ((b & 0xe0) == 0x80) {  // fixmap 0x8X, fixarray 0x9X
        ++p_;
        return set_count(it, (b & 0x10) ? Kind::kArray : Kind::kMap, b & 0x0f);
      }
    }
    return next_slow(it);
  }

  const std::string& error() const { return error_; }

  // For fast paths over fixed-shape data: each consumes input only when it matches, and a
  // mismatch sets no error, so the caller can seek back and decode the general way.
  // Consumes `bytes` if the input goes on with exactly them.
  bool skip_literal(std::string_view bytes) {
    if (remaining() < bytes.size() || std::memcmp(p_, bytes.data(), bytes.size()) != 0)
      return false;
    p_ += bytes.size();
    return true;
  }
  // Appends the run of consecutive 8-byte ints (msgpack int 64 / uint 64, how CPython's hashes
  // travel) that starts here, at most `max` of them, to out; returns how many. Only what is read
  // is appended, so a list of other ints costs nothing here (read_int takes those).
  std::size_t read_int64_run(std::vector<WideInt>& out, std::size_t max) {
    std::size_t n = 0;
    for (; n < max && end_ - p_ >= 9; ++n, p_ += 9) {
      const std::uint64_t v = load_be<std::uint64_t>(p_ + 1);
      if (*p_ == 0xd3)
        out.push_back(WideInt(static_cast<std::int64_t>(v)));
      else if (*p_ == 0xcf)
        out.push_back(WideInt::from_unsigned(v));
      else
        break;
    }
    return n;
  }

  // Reads an int item of any width into out.
  bool read_int(WideInt& out) {
    if (p_ == end_) return false;
    const std::uint8_t b = *p_;
    if (b <= 0x7f || b >= 0xe0) {  // positive or negative fixint: the byte is the value
      out = WideInt(static_cast<std::int64_t>(static_cast<std::int8_t>(b)));
      ++p_;
      return true;
    }
    if (b < 0xcc || b > 0xd3) return false;
    const unsigned width_log2 = (b - 0xcc) & 3;  // 1, 2, 4 or 8 bytes
    const std::size_t n = std::size_t{1} << width_log2;
    if (remaining() < 1 + n) return false;
    const std::uint64_t v = read_big_endian(p_ + 1, width_log2);
    p_ += 1 + n;
    if (b <= 0xcf) {
      out = WideInt::from_unsigned(v);
    } else {  // sign-extend from n bytes
      const unsigned shift = static_cast<unsigned>(64 - 8 * n);
      out = WideInt(static_cast<std::int64_t>(v << shift) >> shift);
    }
    return true;
  }

 private:
  // One load per width instead of a byte loop: chunk hashes are 8-byte ints, a thousand a message.
  static std::uint64_t read_big_endian(const std::uint8_t* p, unsigned width_log2) {
    switch (width_log2) {
      case 0:
        return p[0];
      case 1:
        return load_be<std::uint16_t>(p);
      case 2:
        return load_be<std::uint32_t>(p);
      default:
        return load_be<std::uint64_t>(p);
    }
  }
  template <class U>
  static U load_be(const std::uint8_t* p) {
    U v;
    std::memcpy(&v, p, sizeof(U));
    if constexpr (sizeof(U) == 8)
      return __builtin_bswap64(v);
    else if constexpr (sizeof(U) == 4)
      return __builtin_bswap32(v);
    else if constexpr (sizeof(U) == 2)
      return __builtin_bswap16(v);
    else
      return v;
  }
  [[gnu::noinline]] bool next_slow(Item& it) {
    if (p_ == end_) return truncated();
    const std::uint8_t b = *p_++;
    if (b <= 0x7f) return set_int(it, WideInt(static_cast<std::int64_t>(b)));
    if (b >= 0xe0)
      return set_int(it, WideInt(static_cast<std::int64_t>(static_cast<std::int8_t>(b))));
    if ((b & 0xf0) == 0x80) return set_count(it, Kind::kMap, b & 0x0f);
    if ((b & 0xf0) == 0x90) return set_count(it, Kind::kArray, b & 0x0f);
    if ((b & 0xe0) == 0xa0) return payload(it, Kind::kStr, b & 0x1f);
    switch (b) {
      case 0xc0:
        it.kind = Kind::kNil;
        return true;
      case 0xc2:
      case 0xc3:
        it.kind = Kind::kBool;
        it.boolean = b == 0xc3;
        return true;
      case 0xc4:
        return sized_payload<std::uint8_t>(it, Kind::kBin);
      case 0xc5:
        return sized_payload<std::uint16_t>(it, Kind::kBin);
      case 0xc6:
        return sized_payload<std::uint32_t>(it, Kind::kBin);
      case 0xc7:
        return sized_ext<std::uint8_t>(it);
      case 0xc8:
        return sized_ext<std::uint16_t>(it);
      case 0xc9:
        return sized_ext<std::uint32_t>(it);
      case 0xca: {
        std::uint32_t raw;
        if (!read_be(raw)) return false;
        float f;
        std::memcpy(&f, &raw, sizeof f);
        it.kind = Kind::kFloat;
        it.real = f;
        return true;
      }
      case 0xcb: {
        std::uint64_t raw;
        if (!read_be(raw)) return false;
        it.kind = Kind::kFloat;
        std::memcpy(&it.real, &raw, sizeof raw);
        return true;
      }
      case 0xcc:
        return unsigned_int<std::uint8_t>(it);
      case 0xcd:
        return unsigned_int<std::uint16_t>(it);
      case 0xce:
        return unsigned_int<std::uint32_t>(it);
      case 0xcf:
        return unsigned_int<std::uint64_t>(it);
      case 0xd0:
        return signed_int<std::uint8_t, std::int8_t>(it);
      case 0xd1:
        return signed_int<std::uint16_t, std::int16_t>(it);
      case 0xd2:
        return signed_int<std::uint32_t, std::int32_t>(it);
      case 0xd3:
        return signed_int<std::uint64_t, std::int64_t>(it);
      case 0xd4:
        return fixed_ext(it, 1);
      case 0xd5:
        return fixed_ext(it, 2);
      case 0xd6:
        return fixed_ext(it, 4);
      case 0xd7:
        return fixed_ext(it, 8);
      case 0xd8:
        return fixed_ext(it, 16);
      case 0xd9:
        return sized_payload<std::uint8_t>(it, Kind::kStr);
      case 0xda:
        return sized_payload<std::uint16_t>(it, Kind::kStr);
      case 0xdb:
        return sized_payload<std::uint32_t>(it, Kind::kStr);
      case 0xdc:
        return sized_count<std::uint16_t>(it, Kind::kArray);
      case 0xdd:
        return sized_count<std::uint32_t>(it, Kind::kArray);
      case 0xde:
        return sized_count<std::uint16_t>(it, Kind::kMap);
      case 0xdf:
        return sized_count<std::uint32_t>(it, Kind::kMap);
      default:
        break;  // only 0xc1 is left: never used
    }
    static constexpr char kHex[] = "0123456789abcdef";
    error_ = "MessagePack data is malformed: invalid opcode '\\x";
    error_ += kHex[b >> 4];
    error_ += kHex[b & 15];
    error_ += "' (byte " + std::to_string(offset() - 1) + ")";
    return false;
  }

  bool truncated() {
    error_ = "Input data was truncated";
    return false;
  }
  template <class U>
  bool read_be(U& out) {
    if (remaining() < sizeof(U)) return truncated();
    const U v = load_be<U>(p_);
    p_ += sizeof(U);
    out = v;
    return true;
  }
  static bool set_int(Item& it, WideInt v) {
    it.kind = Kind::kInt;
    it.integer = v;
    return true;
  }
  static bool set_count(Item& it, Kind k, std::uint32_t n) {
    it.kind = k;
    it.count = n;
    return true;
  }
  template <class U>
  bool unsigned_int(Item& it) {
    U v;
    if (!read_be(v)) return false;
    return set_int(it, WideInt::from_unsigned(v));
  }
  template <class U, class S>
  bool signed_int(Item& it) {
    U v;
    if (!read_be(v)) return false;
    return set_int(it, WideInt(static_cast<std::int64_t>(static_cast<S>(v))));
  }
  bool payload(Item& it, Kind k, std::size_t n) {
    if (remaining() < n) return truncated();
    it.kind = k;
    it.bytes = std::string_view(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return true;
  }
  template <class U>
  bool sized_payload(Item& it, Kind k) {
    U n;
    return read_be(n) && payload(it, k, n);
  }
  template <class U>
  bool sized_count(Item& it, Kind k) {
    U n;
    return read_be(n) && set_count(it, k, n);
  }
  bool fixed_ext(Item& it, std::size_t n) {
    return remaining() >= 1 ? (++p_, payload(it, Kind::kExt, n)) : truncated();
  }
  template <class U>
  bool sized_ext(Item& it) {
    U n;
    return read_be(n) && fixed_ext(it, n);
  }

  const std::uint8_t* p_;
  const std::uint8_t* begin_;
  const std::uint8_t* end_;
  std::string error_;
};

}  // namespace kvnode::wire::detail
