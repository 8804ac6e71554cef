// The building blocks of the message catalogue: field descriptors and Python-dict-like maps.
// Each message struct lists its fields with fields(); one generic codec (msgpack, JSON) walks
// those lists, so every message is encoded and decoded by the same audited code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace kvnode::wire {

// kRequired: the key must be present (its value may be nil when the type is std::optional).
// kDefaulted: a missing key takes the member's default initialiser; the encoder always writes it.
enum class Presence : std::uint8_t { kRequired, kDefaulted };

template <class S, class M>
struct Field {
  using type = M;
  std::string_view name;
  M S::*member;
  Presence presence;
};

template <class S, class M>
constexpr Field<S, M> required(std::string_view name, M S::*member) {
  return {name, member, Presence::kRequired};
}
template <class S, class M>
constexpr Field<S, M> defaulted(std::string_view name, M S::*member) {
  return {name, member, Presence::kDefaulted};
}

// A tag as a template argument: messages of one shape (KVAdmitMsg and KVEvictMsg, the five
// *RetMsg replies, ...) share one definition and stay distinct types, e.g.
// `using KVAdmitMsg = KVOpMsg<"KVAdmitMsg">;`.
template <std::size_t N>
struct TagName {
  char chars[N]{};
  constexpr TagName(const char (&s)[N]) {  // NOLINT: implicit, so a string literal is the argument
    for (std::size_t i = 0; i < N; ++i) chars[i] = s[i];
  }
  constexpr std::string_view view() const { return {chars, N - 1}; }
};

// A map that keeps insertion order and lets a later duplicate key replace the value in place,
// as a Python dict does when msgspec decodes one.
template <class K, class V>
struct Dict {
  std::vector<std::pair<K, V>> items;

  const V* find(const K& key) const {
    for (const auto& [k, v] : items)
      if (k == key) return &v;
    return nullptr;
  }
  void set(K key, V value) {
    for (auto& [k, v] : items)
      if (k == key) {
        v = std::move(value);
        return;
      }
    items.emplace_back(std::move(key), std::move(value));
  }
  std::size_t size() const { return items.size(); }
  bool empty() const { return items.empty(); }
  friend bool operator==(const Dict&, const Dict&) = default;
};

// Shapes of field types, for code that walks fields() (the codec, JSON views, test generators).
template <class T>
struct IsVector : std::false_type {};
template <class T>
struct IsVector<std::vector<T>> : std::true_type {};
template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};
template <class T>
struct IsDict : std::false_type {};
template <class K, class V>
struct IsDict<Dict<K, V>> : std::true_type {};
template <class T>
struct IsVariant : std::false_type {};
template <class... T>
struct IsVariant<std::variant<T...>> : std::true_type {};

}  // namespace kvnode::wire
