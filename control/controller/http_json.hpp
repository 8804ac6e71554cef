// JSON plumbing of the HTTP API: request bodies read field by field into values or validation
// errors in FastAPI's (pydantic's) terms, and response bodies in FastAPI's shapes: {"detail":
// "..."} for errors, 422 {"detail": [{"type", "loc", "msg", "input"}]} for a request that fails
// validation (the first bad field; pydantic lists them all).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/wire/json.hpp"
#include "kvnode/wire/types.hpp"

namespace kvnode::controller::http {

using Json = wire::Json;

// Deepest nesting a request body may have; the endpoints need 2 (a list in an object).
inline constexpr int kMaxBodyDepth = 32;

// A request field that failed validation, as pydantic reports it (a client that handles LMCache's
// 422 answers reads ours the same way).
struct FieldError {
  std::string type;          // pydantic's error type: "missing", "string_type", "list_type", ...
  Json loc;                  // ["body", field], ["body", field, index], ["query", name]
  std::string msg;           // pydantic's message for the type
  Json input;                // what was given; the whole body when the field is missing
  Json ctx;                  // null, or details (the JSON parser's error, a tuple's length)
  std::string text() const;  // "tokens: Field required", for logs
  Json to_json() const;      // one entry of the 422's "detail" list
};

// A value or the FieldError that stopped it; the same surface as Result<T>.
template <class T>
class [[nodiscard]] Field {
 public:
  Field(T value) : v_(std::in_place_index<0>, std::move(value)) {}   // NOLINT: implicit by design
  Field(FieldError e) : v_(std::in_place_index<1>, std::move(e)) {}  // NOLINT
  explicit operator bool() const noexcept { return v_.index() == 0; }
  T& operator*() { return std::get<0>(v_); }
  T* operator->() { return &std::get<0>(v_); }
  const FieldError& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, FieldError> v_;
};

// A request body (a JSON object). Its top-level lists of integers (token lists run to 100k
// entries) are read straight into vectors: building each integer as a JSON value cost five times
// the whole parse. Every other field is JSON.
struct Body {
  Json fields = Json::object();
  std::map<std::string, std::vector<std::int64_t>, std::less<>> int_lists;
};

// Parses a request body that must be a JSON object, at most kMaxBodyDepth deep.
Field<Body> parse_object(std::string_view text);
Json to_json(const Body& body);  // the body as it was sent (for "missing" errors)

Field<std::string> get_string(const Body& body, std::string_view name);
// Missing -> fallback (nullopt: the field is required).
Field<std::vector<std::int64_t>> get_int_list(
    const Body& body, std::string_view name,
    std::optional<std::vector<std::int64_t>> fallback = std::nullopt);
// Missing or null -> nullopt.
Field<std::optional<std::vector<std::int64_t>>> get_nullable_int_list(const Body& body,
                                                                      std::string_view name);
Field<bool> get_bool(const Body& body, std::string_view name, bool fallback);
// [instance_id, location]
Field<wire::Position> get_position(const Body& body, std::string_view name);
// A query parameter that must be an integer.
Field<std::int64_t> get_query_int(std::string_view name, std::string_view text);

// Serialises without throwing on invalid UTF-8 (replaced), so no text can turn a reply into 500.
std::string dump(const Json& json);
std::string detail(std::string_view text);  // {"detail": text}

}  // namespace kvnode::controller::http
