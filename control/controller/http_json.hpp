// JSON plumbing of the HTTP API: request bodies read field by field into values or errors that
// name the field ("tokens: expected a list of integers"), and response bodies in FastAPI's
// shapes ({"detail": "..."} for errors).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/wire/json.hpp"
#include "kvnode/wire/types.hpp"

namespace kvnode::controller::http {

using Json = wire::Json;

// Deepest nesting a request body may have; the endpoints need 2 (a list in an object).
inline constexpr int kMaxBodyDepth = 32;

// A request body (a JSON object). Its top-level lists of integers (token lists run to 100k
// entries) are read straight into vectors: building each integer as a JSON value cost five times
// the whole parse. Every other field is JSON.
struct Body {
  Json fields = Json::object();
  std::map<std::string, std::vector<std::int64_t>, std::less<>> int_lists;
};

// Parses a request body that must be a JSON object, at most kMaxBodyDepth deep.
Result<Body> parse_object(std::string_view text);

Result<std::string> get_string(const Body& body, std::string_view name);
// Missing -> fallback (nullopt: the field is required).
Result<std::vector<std::int64_t>> get_int_list(
    const Body& body, std::string_view name,
    std::optional<std::vector<std::int64_t>> fallback = std::nullopt);
// Missing or null -> nullopt.
Result<std::optional<std::vector<std::int64_t>>> get_nullable_int_list(const Body& body,
                                                                       std::string_view name);
Result<bool> get_bool(const Body& body, std::string_view name, bool fallback);
// [instance_id, location]
Result<wire::Position> get_position(const Body& body, std::string_view name);

// Serialises without throwing on invalid UTF-8 (replaced), so no text can turn a reply into 500.
std::string dump(const Json& json);
std::string detail(std::string_view text);  // {"detail": text}

}  // namespace kvnode::controller::http
