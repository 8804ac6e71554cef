// msgspec's to_builtins(msg, str_keys=True) form, built from the same fields() lists as the codec.
#include <cstdio>

#include "decoder.hpp"
#include "kvnode/wire/json.hpp"

namespace kvnode::wire {
namespace {

std::string base64(std::string_view in) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  std::size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(in[i]) << 16) |
                       (static_cast<unsigned char>(in[i + 1]) << 8) |
                       static_cast<unsigned char>(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kAlphabet[(v >> s) & 63];
  }
  if (const std::size_t rest = in.size() - i; rest > 0) {
    unsigned v = static_cast<unsigned char>(in[i]) << 16;
    if (rest == 2) v |= static_cast<unsigned char>(in[i + 1]) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

Json int_json(const WideInt& v) {
  return v.negative() ? Json(static_cast<std::int64_t>(v.bits())) : Json(v.bits());
}

Json any_json(const AnyValue& v);

// A dict key as a JSON object key (str_keys=True): strings as they are, numbers as Python prints
// them.
std::string key_string(const AnyValue& k) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>)
          return x;
        else if constexpr (std::is_same_v<T, WideInt>)
          return x.to_string();
        else if constexpr (std::is_same_v<T, bool>)
          return x ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::monostate>)
          return "null";
        else if constexpr (std::is_same_v<T, double>)
          return Json(x).dump();
        else if constexpr (std::is_same_v<T, AnyValue::Bytes>)
          return base64(x.data);
        else
          return "";  // arrays and maps are never keys (the decoder refuses them)
      },
      k.value);
}

Json any_json(const AnyValue& v) {
  return std::visit(
      [](const auto& x) -> Json {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::monostate>)
          return nullptr;
        else if constexpr (std::is_same_v<T, WideInt>)
          return int_json(x);
        else if constexpr (std::is_same_v<T, AnyValue::Bytes>)
          return base64(x.data);
        else if constexpr (std::is_same_v<T, AnyValue::Array>) {
          Json a = Json::array();
          for (const auto& e : x) a.push_back(any_json(e));
          return a;
        } else if constexpr (std::is_same_v<T, AnyValue::Map>) {
          Json o = Json::object();
          auto& members = o.get_ref<Json::object_t&>();  // append: operator[] would search linearly
          for (const auto& [k, val] : x) members.emplace_back(key_string(k), any_json(val));
          return o;
        } else {
          return Json(x);
        }
      },
      v.value);
}

template <class T>
Json to_json(const T& v) {
  using namespace detail;
  if constexpr (std::is_same_v<T, WideInt>) {
    return int_json(v);
  } else if constexpr (std::is_same_v<T, OpType>) {
    return v == OpType::kAdmit ? "admit" : "evict";
  } else if constexpr (std::is_same_v<T, AnyValue>) {
    return any_json(v);
  } else if constexpr (IsOptional<T>::value) {
    return v ? to_json(*v) : Json(nullptr);
  } else if constexpr (IsVector<T>::value) {
    Json a = Json::array();
    for (const auto& e : v) a.push_back(to_json(e));
    return a;
  } else if constexpr (IsDict<T>::value) {
    Json o = Json::object();
    for (const auto& [k, val] : v.items) {
      if constexpr (std::is_same_v<std::decay_t<decltype(k)>, std::string>)
        o[k] = to_json(val);
      else
        o[std::to_string(k)] = to_json(val);
    }
    return o;
  } else if constexpr (IsVariant<T>::value) {
    return std::visit([](const auto& alt) { return to_json(alt); }, v);
  } else if constexpr (TupleStruct<T>) {
    Json a = Json::array();
    std::apply([&](const auto&... f) { (a.push_back(to_json(v.*(f.member))), ...); }, T::fields());
    return a;
  } else if constexpr (MapStruct<T>) {
    Json o = Json::object();
    if constexpr (TaggedStruct<T>) o[std::string(T::kTagKey)] = T::kTag;
    std::apply([&](const auto&... f) { ((o[std::string(f.name)] = to_json(v.*(f.member))), ...); },
               T::fields());
    return o;
  } else {
    return Json(v);
  }
}

}  // namespace

Json to_builtins(const Msg& msg) {
  return to_json(msg);
}
Json to_builtins(const KVOpEvent& event) {
  return to_json(event);
}
Json to_builtins(const AnyCommand& command) {
  return to_json(command);
}

}  // namespace kvnode::wire
