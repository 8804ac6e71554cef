// The typed msgpack decoder: one set of templates that decodes every message by walking its
// fields() list, with msgspec's acceptance rules and error texts (protocol reference §1.4, §1.5).
// JSON input arrives here too, transcoded to msgpack first (json_transcoder.hpp), with
// from_json set so that nil is named `null` and int-keyed maps take numeric string keys.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "kvnode/wire/messages.hpp"
#include "msgpack_reader.hpp"
#include "utf8.hpp"

namespace kvnode::wire::detail {

// Containers may nest this deep (msgspec stops at Python's recursion limit, about 1000).
inline constexpr int kMaxDepth = 1000;

// A decode path, linked through the call stack and formatted only when an error is reported.
struct PathNode {
  enum class Kind : std::uint8_t { kRoot, kField, kIndex, kDictValue };
  const PathNode* parent = nullptr;
  Kind kind = Kind::kRoot;
  std::string_view field;
  std::size_t index = 0;
};

std::string format_path(const PathNode& node);  // "$.operations[1].key"

class DecodeContext {
 public:
  DecodeContext(std::string_view data, bool from_json) : reader(data), from_json(from_json) {}

  MsgpackReader reader;
  std::string error;
  int depth = 0;
  const bool from_json;

  bool next(Item& it) { return reader.next(it) || fail_plain(reader.error()); }
  bool enter() {
    return ++depth <= kMaxDepth ||
           fail_plain("maximum recursion depth exceeded while deserializing an object");
  }
  void leave() { --depth; }

  // Errors: the problem, then " - at `path`" unless the path is the root.
  [[gnu::cold]] bool fail(std::string_view problem, const PathNode& at);
  [[gnu::cold]] bool fail_key(std::string_view problem, const PathNode& map_at);
  [[gnu::cold]] bool fail_plain(std::string_view problem);
  [[gnu::cold]] bool expected(std::string_view want, const Item& got, const PathNode& at);
  [[gnu::cold]] bool expected_key(std::string_view want, const Item& got, const PathNode& map_at);
};

bool skip_value(DecodeContext& ctx);
bool decode_any(DecodeContext& ctx, const Item& it, AnyValue& out);

// ---- What msgpack kinds a C++ type accepts, and its name in errors ----

template <class T>
concept TupleStruct = requires {
  T::kTuple;
};
template <class T>
concept MapStruct = requires {
  T::fields();
}
&&!TupleStruct<T>;
template <class T>
concept TaggedStruct = MapStruct<T> && requires {
  T::kTagKey;
};

// The fewest bytes a value of T can take on the wire. Vectors reserve at most remaining / this, so
// a length header cannot make the decoder allocate more than a small multiple of the input.
template <class T>
constexpr std::size_t min_wire_size() {
  if constexpr (TupleStruct<T>) {
    return std::apply(
        [](const auto&... f) {
          return (std::size_t{1} + ... + min_wire_size<typename std::decay_t<decltype(f)>::type>());
        },
        T::fields());
  } else if constexpr (MapStruct<T>) {
    return std::apply(
        [](const auto&... f) {
          return (std::size_t{1} + ... +
                  (f.presence == Presence::kRequired ? 1 + f.name.size() + 1 : std::size_t{0}));
        },
        T::fields());
  } else {
    return 1;
  }
}

template <class T>
constexpr std::string_view type_name() {
  if constexpr (std::is_same_v<T, std::int64_t> || std::is_same_v<T, WideInt>)
    return "int";
  else if constexpr (std::is_same_v<T, double>)
    return "float";
  else if constexpr (std::is_same_v<T, bool>)
    return "bool";
  else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, OpType>)
    return "str";
  else if constexpr (IsVector<T>::value || TupleStruct<T>)
    return "array";
  else
    return "object";
}

template <class T>
constexpr bool accepts(Kind k) {
  if constexpr (std::is_same_v<T, std::int64_t> || std::is_same_v<T, WideInt>)
    return k == Kind::kInt;
  else if constexpr (std::is_same_v<T, double>)
    return k == Kind::kFloat || k == Kind::kInt;
  else if constexpr (std::is_same_v<T, bool>)
    return k == Kind::kBool;
  else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, OpType>)
    return k == Kind::kStr;
  else if constexpr (IsVector<T>::value || TupleStruct<T>)
    return k == Kind::kArray;
  else
    return k == Kind::kMap;
}

template <class T>
bool decode_item(DecodeContext&, const Item&, T&, const PathNode&);
template <class V>
bool decode_union_body(DecodeContext&, std::uint32_t, V&, const PathNode&);

template <class T>
bool decode_value(DecodeContext& ctx, T& out, const PathNode& at) {
  Item it;
  return ctx.next(it) && decode_item(ctx, it, out, at);
}

// ---- Scalars ----

// Equality of short strings without a memcmp call: field names are 2..20 bytes.
[[gnu::always_inline]] inline bool same_name(std::string_view a, std::string_view b) {
  const std::size_t n = a.size();
  if (n != b.size()) return false;
  auto load8 = [](const char* p) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
  };
  auto load4 = [](const char* p) {
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
  };
  if (n >= 8) {
    if (load8(a.data()) != load8(b.data()) || load8(a.data() + n - 8) != load8(b.data() + n - 8))
      return false;
    return n <= 16 || std::memcmp(a.data() + 8, b.data() + 8, n - 16) == 0;
  }
  if (n >= 4)
    return load4(a.data()) == load4(b.data()) && load4(a.data() + n - 4) == load4(b.data() + n - 4);
  for (std::size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return false;
  return true;
}

inline bool decode_scalar(DecodeContext& ctx, const Item& it, std::int64_t& out,
                          const PathNode& at) {
  const auto v = it.integer.as_int64();
  if (!v) return ctx.fail("Expected `int` <= 9223372036854775807", at);
  out = *v;
  return true;
}
inline bool decode_scalar(DecodeContext&, const Item& it, WideInt& out, const PathNode&) {
  out = it.integer;
  return true;
}
inline bool decode_scalar(DecodeContext&, const Item& it, double& out, const PathNode&) {
  if (it.kind == Kind::kFloat)
    out = it.real;
  else if (it.integer.negative())
    out = static_cast<double>(static_cast<std::int64_t>(it.integer.bits()));
  else
    out = static_cast<double>(it.integer.bits());
  return true;
}
inline bool decode_scalar(DecodeContext&, const Item& it, bool& out, const PathNode&) {
  out = it.boolean;
  return true;
}
inline bool decode_scalar(DecodeContext& ctx, const Item& it, std::string& out, const PathNode&) {
  if (auto bad = utf8_error(it.bytes)) return ctx.fail_plain(*bad);
  out.assign(it.bytes);
  return true;
}
inline bool decode_scalar(DecodeContext& ctx, const Item& it, OpType& out, const PathNode& at) {
  if (same_name(it.bytes, "admit"))
    out = OpType::kAdmit;
  else if (same_name(it.bytes, "evict"))
    out = OpType::kEvict;
  else
    return ctx.fail("Invalid enum value '" + std::string(it.bytes) + "'", at);
  return true;
}

// ---- Structs: a map of fields (tagged or not) or a fixed-length array ----

// Bit i set when field i must be present.
template <class S>
inline constexpr std::uint64_t kRequiredMask = std::apply(
    [](const auto&... f) {
      std::uint64_t mask = 0, bit = 1;
      ((mask |= f.presence == Presence::kRequired ? bit : 0, bit <<= 1), ...);
      return mask;
    },
    S::fields());

template <class S>
inline constexpr auto kFieldNames = std::apply(
    [](const auto&... f) { return std::array<std::string_view, sizeof...(f)>{f.name...}; },
    S::fields());

// Index of `key` among S's fields (N when unknown). Encoders write fields in declaration order,
// so the field after the last one matched is tried first.
template <class S>
std::size_t find_field(std::string_view key, std::size_t hint) {
  constexpr auto& names = kFieldNames<S>;
  if (hint < names.size() && same_name(key, names[hint])) return hint;
  for (std::size_t i = 0; i < names.size(); ++i)
    if (same_name(key, names[i])) return i;
  return names.size();
}

// Decodes field number `index` (known only at run time) of S.
template <class S, std::size_t... I>
bool decode_field(DecodeContext& ctx, S& out, std::size_t index, const PathNode& at,
                  std::index_sequence<I...>) {
  constexpr auto fields = S::fields();
  bool ok = false;
  (void)((index == I &&
          (ok = decode_value(ctx, out.*(std::get<I>(fields).member),
                             PathNode{&at, PathNode::Kind::kField, std::get<I>(fields).name, 0}),
           true)) ||
         ...);
  return ok;
}

template <class S>
bool decode_struct_body(DecodeContext& ctx, std::uint32_t entries, S& out, const PathNode& at) {
  if (!ctx.enter()) return false;
  constexpr std::size_t n = kFieldNames<S>.size();
  static_assert(n <= 64);
  std::uint64_t seen = 0;
  std::size_t hint = 0;
  for (std::uint32_t e = 0; e < entries; ++e) {
    Item key;
    if (!ctx.next(key)) return false;
    if (key.kind != Kind::kStr) return ctx.expected_key("str", key, at);
    if constexpr (TaggedStruct<S>) {
      if (same_name(key.bytes, S::kTagKey)) {  // a repeated tag must name this same type
        const PathNode tag_at{&at, PathNode::Kind::kField, S::kTagKey, 0};
        Item tag;
        if (!ctx.next(tag)) return false;
        if (tag.kind != Kind::kStr) return ctx.expected("str", tag, tag_at);
        if (tag.bytes != S::kTag)
          return ctx.fail("Invalid value '" + std::string(tag.bytes) + "'", tag_at);
        continue;
      }
    }
    const std::size_t index = find_field<S>(key.bytes, hint);
    if (index == n) {
      if (!skip_value(ctx)) return false;
      continue;
    }
    if (!decode_field(ctx, out, index, at, std::make_index_sequence<n>{})) return false;
    seen |= 1ull << index;
    hint = index + 1;
  }
  ctx.leave();
  if ((seen & kRequiredMask<S>) == kRequiredMask<S>) [[likely]]
    return true;
  const auto missing =
      static_cast<std::size_t>(std::countr_zero(kRequiredMask<S> & ~seen));  // first in order
  return ctx.fail("Object missing required field `" + std::string(kFieldNames<S>[missing]) + "`",
                  at);
}

template <class S>
bool decode_tuple_body(DecodeContext& ctx, std::uint32_t count, S& out, const PathNode& at) {
  constexpr auto fields = S::fields();
  constexpr std::size_t n = std::tuple_size_v<decltype(fields)>;
  if (count != n) {
    return ctx.fail(
        "Expected `array` of length " + std::to_string(n) + ", got " + std::to_string(count), at);
  }
  if (!ctx.enter()) return false;
  std::size_t i = 0;
  bool ok = std::apply(
      [&](const auto&... f) {
        return (
            decode_value(ctx, out.*(f.member), PathNode{&at, PathNode::Kind::kIndex, {}, i++}) &&
            ...);
      },
      fields);
  if (ok) ctx.leave();
  return ok;
}

// ---- Containers ----

// msgspec writes a KVOpEvent as {"op_type": "admit"|"evict", "key": int, "seq_num": int}, in
// that order, and a batch carries a thousand of them: this reads exactly that shape with a few
// compares. Any other shape (order, extra fields, a bad value) consumes nothing and returns false;
// the general decoder then reads it, with its error texts.
inline bool read_kv_op_fast(MsgpackReader& r, KVOpEvent& out) {
  const std::size_t start = r.offset();
  constexpr std::string_view kAdmit =
      "\x83\xa7op_type\xa5"
      "admit\xa3key";
  constexpr std::string_view kEvict =
      "\x83\xa7op_type\xa5"
      "evict\xa3key";
  static_assert(kAdmit.size() == 19 && kEvict.size() == 19);
  if (r.skip_literal(kAdmit))
    out.op_type = OpType::kAdmit;
  else if (r.skip_literal(kEvict))
    out.op_type = OpType::kEvict;
  else
    return false;
  WideInt seq;
  if (r.read_int(out.key) && r.skip_literal("\xa7seq_num") && r.read_int(seq)) {
    if (const auto v = seq.as_int64()) {
      out.seq_num = *v;
      return true;
    }
  }
  r.seek(start);
  return false;
}

template <class T>
bool decode_vector(DecodeContext& ctx, std::uint32_t count, std::vector<T>& out,
                   const PathNode& at) {
  if (!ctx.enter()) return false;
  out.clear();
  out.reserve(std::min<std::size_t>(count, ctx.reader.remaining() / min_wire_size<T>()));
  for (std::uint32_t i = 0; i < count; ++i) {
    if constexpr (std::is_same_v<T, WideInt>) {  // chunk hash lists: 8-byte ints in bulk
      i += static_cast<std::uint32_t>(ctx.reader.read_int64_run(out, count - i));
      if (i == count) break;
    }
    T& item = out.emplace_back();
    if constexpr (std::is_same_v<T, KVOpEvent>) {
      if (read_kv_op_fast(ctx.reader, item)) continue;
    } else if constexpr (std::is_same_v<T, WideInt>) {  // chunk hash lists: any int is fine
      if (ctx.reader.read_int(item)) continue;
    }
    if (!decode_value(ctx, item, PathNode{&at, PathNode::Kind::kIndex, {}, i})) return false;
  }
  ctx.leave();
  return true;
}

inline bool decode_dict_key(DecodeContext& ctx, const Item& it, std::string& out,
                            const PathNode& map_at) {
  if (it.kind != Kind::kStr) return ctx.expected_key("str", it, map_at);
  if (auto bad = utf8_error(it.bytes)) return ctx.fail_plain(*bad);
  out.assign(it.bytes);
  return true;
}
inline bool decode_dict_key(DecodeContext& ctx, const Item& it, std::int64_t& out,
                            const PathNode& map_at) {
  if (it.kind == Kind::kStr && ctx.from_json) {  // JSON object keys are strings: "0" -> 0
    const char* end = it.bytes.data() + it.bytes.size();
    auto [p, ec] = std::from_chars(it.bytes.data(), end, out);
    if (ec == std::errc() && p == end && !it.bytes.empty()) return true;
    return ctx.expected_key("int", it, map_at);
  }
  if (it.kind != Kind::kInt) return ctx.expected_key("int", it, map_at);
  const auto v = it.integer.as_int64();
  if (!v) return ctx.fail_key("Expected `int` <= 9223372036854775807", map_at);
  out = *v;
  return true;
}

// Python dict semantics for repeated keys: the first position keeps the last value. Sorting (not
// hashing) finds the repeats, so keys chosen by a peer cannot degrade it: O(n log n) at worst.
template <class Pair, class Key>
void keep_last_of_duplicates(std::vector<Pair>& items, const std::vector<Key>& keys) {
  const std::size_t n = items.size();
  if (n < 2) return;
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return keys[a] < keys[b]; });
  std::vector<bool> drop(n, false);
  for (std::size_t run = 0; run < n;) {
    std::size_t end = run + 1;
    while (end < n && !(keys[order[run]] < keys[order[end]])) ++end;
    if (end - run > 1) {  // order[run] is the first position, order[end - 1] the last value
      items[order[run]].second = std::move(items[order[end - 1]].second);
      for (std::size_t k = run + 1; k < end; ++k) drop[order[k]] = true;
    }
    run = end;
  }
  std::size_t kept = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (drop[i]) continue;
    if (kept != i) items[kept] = std::move(items[i]);  // never self-move: it empties strings
    ++kept;
  }
  items.erase(items.begin() + static_cast<std::ptrdiff_t>(kept), items.end());
}

template <class K, class V>
bool decode_dict(DecodeContext& ctx, std::uint32_t count, Dict<K, V>& out, const PathNode& at) {
  if (!ctx.enter()) return false;
  out.items.clear();
  out.items.reserve(
      std::min<std::size_t>(count, ctx.reader.remaining() / (1 + min_wire_size<V>())));
  std::vector<K> keys;
  keys.reserve(out.items.capacity());
  for (std::uint32_t i = 0; i < count; ++i) {
    Item key_item;
    K key{};
    V value{};
    if (!ctx.next(key_item) || !decode_dict_key(ctx, key_item, key, at) ||
        !decode_value(ctx, value, PathNode{&at, PathNode::Kind::kDictValue, {}, 0})) {
      return false;
    }
    keys.push_back(key);
    out.items.emplace_back(std::move(key), std::move(value));
  }
  keep_last_of_duplicates(out.items, keys);
  ctx.leave();
  return true;
}

// ---- The dispatcher ----

template <class T>
bool decode_item(DecodeContext& ctx, const Item& it, T& out, const PathNode& at) {
  if constexpr (IsOptional<T>::value) {
    using Inner = typename T::value_type;
    if (it.kind == Kind::kNil) {
      out.reset();
      return true;
    }
    if constexpr (!std::is_same_v<Inner, AnyValue>) {
      if (!accepts<Inner>(it.kind)) {
        return ctx.expected(std::string(type_name<Inner>()) + " | null", it, at);
      }
    }
    return decode_item(ctx, it, out.emplace(), at);
  } else if constexpr (std::is_same_v<T, AnyValue>) {
    return decode_any(ctx, it, out);
  } else if constexpr (IsVariant<T>::value) {
    if (it.kind != Kind::kMap) return ctx.expected("object", it, at);
    return decode_union_body(ctx, it.count, out, at);
  } else {
    if (!accepts<T>(it.kind)) return ctx.expected(type_name<T>(), it, at);
    if constexpr (IsVector<T>::value)
      return decode_vector(ctx, it.count, out, at);
    else if constexpr (IsDict<T>::value)
      return decode_dict(ctx, it.count, out, at);
    else if constexpr (TupleStruct<T>)
      return decode_tuple_body(ctx, it.count, out, at);
    else if constexpr (MapStruct<T>)
      return decode_struct_body(ctx, it.count, out, at);
    else
      return decode_scalar(ctx, it, out, at);
  }
}

// ---- Tagged unions: find the tag anywhere in the map, then decode that type ----

template <class V>
struct TagTable {
  static constexpr std::size_t kSize = std::variant_size_v<V>;
  static constexpr std::string_view kTagKey = std::variant_alternative_t<0, V>::kTagKey;
  using Entry = std::pair<std::string_view, std::size_t>;

  static constexpr std::array<Entry, kSize> sorted() {
    std::array<Entry, kSize> a{};
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((a[I] = Entry{std::variant_alternative_t<I, V>::kTag, I}), ...);
    }
    (std::make_index_sequence<kSize>{});
    std::sort(a.begin(), a.end());
    return a;
  }
  static constexpr std::array<Entry, kSize> kSorted = sorted();

  static std::optional<std::size_t> find(std::string_view tag) {
    auto it = std::lower_bound(kSorted.begin(), kSorted.end(), tag,
                               [](const Entry& e, std::string_view t) { return e.first < t; });
    if (it == kSorted.end() || it->first != tag) return std::nullopt;
    return it->second;
  }

  using Fn = bool (*)(DecodeContext&, std::uint32_t, V&, const PathNode&);
  static constexpr std::array<Fn, kSize> kDecoders =
      []<std::size_t... I>(std::index_sequence<I...>) {
    return std::array<Fn, kSize>{
        +[](DecodeContext& ctx, std::uint32_t n, V& out, const PathNode& at) {
          return decode_struct_body(ctx, n, out.template emplace<I>(), at);
        }...};
  }
  (std::make_index_sequence<kSize>{});
};

template <class V>
bool decode_union_body(DecodeContext& ctx, std::uint32_t entries, V& out, const PathNode& at) {
  using Table = TagTable<V>;
  const std::size_t start = ctx.reader.offset();
  const PathNode tag_at{&at, PathNode::Kind::kField, Table::kTagKey};
  std::optional<std::size_t> index;
  for (std::uint32_t e = 0; e < entries && !index; ++e) {
    Item key;
    if (!ctx.next(key)) return false;
    if (key.kind != Kind::kStr) return ctx.expected_key("str", key, at);
    if (key.bytes != Table::kTagKey) {
      if (!skip_value(ctx)) return false;
      continue;
    }
    Item tag;
    if (!ctx.next(tag)) return false;
    if (tag.kind != Kind::kStr) return ctx.expected("str", tag, tag_at);
    index = Table::find(tag.bytes);
    if (!index) return ctx.fail("Invalid value '" + std::string(tag.bytes) + "'", tag_at);
  }
  if (!index)
    return ctx.fail("Object missing required field `" + std::string(Table::kTagKey) + "`", at);
  ctx.reader.seek(start);
  return Table::kDecoders[*index](ctx, entries, out, at);
}

}  // namespace kvnode::wire::detail
