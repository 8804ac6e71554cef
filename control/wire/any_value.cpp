#include "kvnode/wire/any_value.hpp"

#include "encoder.hpp"

namespace kvnode::wire {

bool operator==(const AnyValue& a, const AnyValue& b) {
  return a.value == b.value;
}

namespace detail {

void encode_any(Writer& w, const AnyValue& v) {
  Packer& pk = w.pk;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
          pk.pack_nil();
        } else if constexpr (std::is_same_v<T, AnyValue::Bytes>) {
          pk.pack_bin(static_cast<std::uint32_t>(x.data.size()));
          pk.pack_bin_body(x.data.data(), static_cast<std::uint32_t>(x.data.size()));
        } else if constexpr (std::is_same_v<T, AnyValue::Array>) {
          pk.pack_array(static_cast<std::uint32_t>(x.size()));
          for (const auto& e : x) encode_any(w, e);
        } else if constexpr (std::is_same_v<T, AnyValue::Map>) {
          pk.pack_map(static_cast<std::uint32_t>(x.size()));
          for (const auto& [k, val] : x) {
            encode_any(w, k);
            encode_any(w, val);
          }
        } else {
          encode_value(w, x);
        }
      },
      v.value);
}

}  // namespace detail
}  // namespace kvnode::wire
