// AnyValue: a dynamically typed msgpack value, for the one schemaless field of the protocol
// (a heartbeat command's `args: dict[str, Any]`). Maps keep insertion order like Python dicts.
#pragma once

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kvnode/wire/wide_int.hpp"

namespace kvnode::wire {

struct AnyValue {
  struct Bytes {
    std::string data;
    friend bool operator==(const Bytes&, const Bytes&) = default;
  };
  using Array = std::vector<AnyValue>;
  using Map = std::vector<std::pair<AnyValue, AnyValue>>;
  using Storage =
      std::variant<std::monostate, bool, WideInt, double, std::string, Bytes, Array, Map>;

  Storage value;

  AnyValue() = default;
  template <class T>
  AnyValue(T v) : value(std::move(v)) {}  // NOLINT: implicit like the variant it wraps

  bool is_nil() const { return std::holds_alternative<std::monostate>(value); }
};

bool operator==(const AnyValue& a, const AnyValue& b);

}  // namespace kvnode::wire
