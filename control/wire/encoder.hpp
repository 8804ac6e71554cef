// The msgpack encoder: msgspec's layout (protocol reference §1.2) written with msgpack-cxx's
// packer, which picks the smallest int form with non-negative values in the unsigned family and
// str8 for 32..255-byte strings, as msgspec does. Floats are the exception: msgpack-cxx 4.x packs
// an integral double (1.0) as an int, msgspec always writes float64, so Writer writes those.
#pragma once

#include <cstring>
#include <msgpack.hpp>
#include <string>
#include <tuple>
#include <variant>

#include "decoder.hpp"  // type traits shared with the decoder

namespace kvnode::wire::detail {

struct StringSink {
  std::string* out;
  void write(const char* data, std::size_t size) { out->append(data, size); }
};
using Packer = msgpack::packer<StringSink>;

// Appends msgpack to a string: the packer for everything but floats.
class Writer {
 public:
  explicit Writer(std::string& out) : sink_{&out}, pk(sink_) {}
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  void float64(double d) {
    std::uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    char buf[9] = {static_cast<char>(0xcb)};
    for (int i = 0; i < 8; ++i) buf[1 + i] = static_cast<char>(bits >> (56 - 8 * i));
    sink_.write(buf, sizeof buf);
  }
  void str(std::string_view s) {
    pk.pack_str(static_cast<std::uint32_t>(s.size()));
    pk.pack_str_body(s.data(), static_cast<std::uint32_t>(s.size()));
  }

 private:
  StringSink sink_;

 public:
  Packer pk;
};

void encode_any(Writer& w, const AnyValue& v);
void encode_scalar(Writer& w, std::int64_t v);  // out of line, like the decoder's scalars
void encode_scalar(Writer& w, const WideInt& v);
void encode_scalar(Writer& w, double v);
void encode_scalar(Writer& w, bool v);
void encode_scalar(Writer& w, const std::string& v);
void encode_scalar(Writer& w, OpType v);

template <class T>
void encode_value(Writer& w, const T& v) {
  Packer& pk = w.pk;
  if constexpr (std::is_same_v<T, std::int64_t> || std::is_same_v<T, WideInt> ||
                std::is_same_v<T, double> || std::is_same_v<T, bool> ||
                std::is_same_v<T, std::string> || std::is_same_v<T, OpType>) {
    encode_scalar(w, v);
  } else if constexpr (std::is_same_v<T, AnyValue>) {
    encode_any(w, v);
  } else if constexpr (IsOptional<T>::value) {
    if (v)
      encode_value(w, *v);
    else
      pk.pack_nil();
  } else if constexpr (IsVector<T>::value) {
    pk.pack_array(static_cast<std::uint32_t>(v.size()));
    for (const auto& e : v) encode_value(w, e);
  } else if constexpr (IsDict<T>::value) {
    pk.pack_map(static_cast<std::uint32_t>(v.size()));
    for (const auto& [k, val] : v.items) {
      encode_value(w, k);
      encode_value(w, val);
    }
  } else if constexpr (IsVariant<T>::value) {
    std::visit([&](const auto& alt) { encode_value(w, alt); }, v);
  } else if constexpr (TupleStruct<T>) {
    constexpr auto fields = T::fields();
    pk.pack_array(std::tuple_size_v<decltype(fields)>);
    std::apply([&](const auto&... f) { (encode_value(w, v.*(f.member)), ...); }, fields);
  } else {
    static_assert(MapStruct<T>);
    constexpr auto fields = T::fields();
    constexpr std::uint32_t tagged = TaggedStruct<T> ? 1 : 0;
    pk.pack_map(std::tuple_size_v<decltype(fields)> + tagged);
    if constexpr (TaggedStruct<T>) {
      w.str(T::kTagKey);
      w.str(T::kTag);
    }
    std::apply([&](const auto&... f) { ((w.str(f.name), encode_value(w, v.*(f.member))), ...); },
               fields);
  }
}

}  // namespace kvnode::wire::detail
