#include "decoder.hpp"

#include <cstring>

namespace kvnode::wire::detail {

std::string format_path(const PathNode& node) {
  std::vector<const PathNode*> chain;
  for (const PathNode* p = &node; p != nullptr; p = p->parent) chain.push_back(p);
  std::string out = "$";
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    switch ((*it)->kind) {
      case PathNode::Kind::kRoot:
        break;
      case PathNode::Kind::kField:
        out.append(".").append((*it)->field);
        break;
      case PathNode::Kind::kIndex:
        out.append("[").append(std::to_string((*it)->index)).append("]");
        break;
      case PathNode::Kind::kDictValue:
        out.append("[...]");
        break;
    }
  }
  return out;
}

bool DecodeContext::fail(std::string_view problem, const PathNode& at) {
  error.assign(problem);
  if (at.kind != PathNode::Kind::kRoot) error.append(" - at `").append(format_path(at)).append("`");
  return false;
}

bool DecodeContext::fail_key(std::string_view problem, const PathNode& map_at) {
  error.assign(problem).append(" - at `key` in `").append(format_path(map_at)).append("`");
  return false;
}

bool DecodeContext::fail_plain(std::string_view problem) {
  error.assign(problem);
  return false;
}

bool DecodeContext::expected(std::string_view want, const Item& got, const PathNode& at) {
  return fail("Expected `" + std::string(want) + "`, got `" +
                  std::string(kind_name(got.kind, from_json)) + "`",
              at);
}

bool DecodeContext::expected_key(std::string_view want, const Item& got, const PathNode& map_at) {
  return fail_key("Expected `" + std::string(want) + "`, got `" +
                      std::string(kind_name(got.kind, from_json)) + "`",
                  map_at);
}

bool skip_value(DecodeContext& ctx) {
  Item it;
  if (!ctx.next(it)) return false;
  if (it.kind != Kind::kArray && it.kind != Kind::kMap) return true;
  if (!ctx.enter()) return false;
  const std::uint64_t items = it.kind == Kind::kMap ? 2ull * it.count : it.count;
  for (std::uint64_t i = 0; i < items; ++i) {
    if (!skip_value(ctx)) return false;
  }
  ctx.leave();
  return true;
}

namespace {

// Identity of a dict key for duplicate detection in big maps (values of distinct kinds differ).
std::string key_identity(const AnyValue& v) {
  std::string id(1, static_cast<char>('0' + v.value.index()));
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>)
          id += x ? '1' : '0';
        else if constexpr (std::is_same_v<T, WideInt>)
          id += x.to_string();
        else if constexpr (std::is_same_v<T, double>)
          id.append(reinterpret_cast<const char*>(&x), sizeof x);
        else if constexpr (std::is_same_v<T, std::string>)
          id += x;
        else if constexpr (std::is_same_v<T, AnyValue::Bytes>)
          id += x.data;
      },
      v.value);
  return id;
}

bool decode_any_map(DecodeContext& ctx, std::uint32_t count, AnyValue::Map& map) {
  // No reserve: Any containers nest, and each level reserving against the same remaining bytes
  // would multiply what a few length headers can make the decoder allocate.
  std::vector<std::string> identities;
  for (std::uint32_t i = 0; i < count; ++i) {
    Item key_item, value_item;
    AnyValue key, value;
    if (!ctx.next(key_item)) return false;
    if (key_item.kind == Kind::kArray || key_item.kind == Kind::kMap) {  // as Python dicts refuse
      return ctx.fail_plain(key_item.kind == Kind::kArray ? "unhashable type: 'list'"
                                                          : "unhashable type: 'dict'");
    }
    if (!decode_any(ctx, key_item, key) || !ctx.next(value_item) ||
        !decode_any(ctx, value_item, value)) {
      return false;
    }
    identities.push_back(key_identity(key));
    map.emplace_back(std::move(key), std::move(value));
  }
  keep_last_of_duplicates(map, identities);
  return true;
}

}  // namespace

bool decode_any(DecodeContext& ctx, const Item& it, AnyValue& out) {
  switch (it.kind) {
    case Kind::kNil:
      out.value = std::monostate{};
      return true;
    case Kind::kBool:
      out.value = it.boolean;
      return true;
    case Kind::kInt:
      out.value = it.integer;
      return true;
    case Kind::kFloat:
      out.value = it.real;
      return true;
    case Kind::kStr:
      if (auto bad = utf8_error(it.bytes)) return ctx.fail_plain(*bad);
      out.value = std::string(it.bytes);
      return true;
    case Kind::kBin:
      out.value = AnyValue::Bytes{std::string(it.bytes)};
      return true;
    case Kind::kExt:
      return ctx.fail_plain("MessagePack extension types are not supported");
    case Kind::kArray: {
      if (!ctx.enter()) return false;
      auto& arr = out.value.emplace<AnyValue::Array>();  // no reserve: see decode_any_map
      for (std::uint32_t i = 0; i < it.count; ++i) {
        Item child;
        if (!ctx.next(child) || !decode_any(ctx, child, arr.emplace_back())) return false;
      }
      ctx.leave();
      return true;
    }
    case Kind::kMap: {
      if (!ctx.enter() || !decode_any_map(ctx, it.count, out.value.emplace<AnyValue::Map>()))
        return false;
      ctx.leave();
      return true;
    }
  }
  return false;
}

}  // namespace kvnode::wire::detail
