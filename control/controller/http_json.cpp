#include "http_json.hpp"

#include <limits>

namespace kvnode::controller::http {

namespace {

Error field_error(std::string_view name, std::string_view what) {
  return Error{std::string(name) + ": " + std::string(what)};
}

const Json* find(const Body& body, std::string_view name) {
  auto it = body.fields.find(std::string(name));
  return it == body.fields.end() ? nullptr : &*it;
}

const std::vector<std::int64_t>* find_list(const Body& body, std::string_view name) {
  auto it = body.int_lists.find(name);
  return it == body.int_lists.end() ? nullptr : &it->second;
}

Result<std::vector<std::int64_t>> to_int_list(const Json& value, std::string_view name) {
  if (!value.is_array()) return field_error(name, "expected a list of integers");
  std::vector<std::int64_t> out;
  out.reserve(value.size());
  for (const auto& item : value) {
    if (item.is_number_integer() && !item.is_number_unsigned()) {
      out.push_back(item.get<std::int64_t>());
    } else if (item.is_number_unsigned() &&
               item.get<std::uint64_t>() <=
                   static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      out.push_back(static_cast<std::int64_t>(item.get<std::uint64_t>()));
    } else {
      return field_error(name, "expected a list of integers");
    }
  }
  return out;
}

}  // namespace

Result<std::string> get_string(const Body& body, std::string_view name) {
  const Json* v = find(body, name);
  if (find_list(body, name)) return field_error(name, "expected a string");
  if (!v) return field_error(name, "field required");
  if (!v->is_string()) return field_error(name, "expected a string");
  return v->get<std::string>();
}

Result<std::vector<std::int64_t>> get_int_list(const Body& body, std::string_view name,
                                               std::optional<std::vector<std::int64_t>> fallback) {
  if (const auto* list = find_list(body, name)) return *list;
  const Json* v = find(body, name);
  if (!v) {
    if (fallback) return std::move(*fallback);
    return field_error(name, "field required");
  }
  return to_int_list(*v, name);
}

Result<std::optional<std::vector<std::int64_t>>> get_nullable_int_list(const Body& body,
                                                                       std::string_view name) {
  if (const auto* list = find_list(body, name))
    return std::optional<std::vector<std::int64_t>>(*list);
  const Json* v = find(body, name);
  if (!v || v->is_null()) return std::optional<std::vector<std::int64_t>>();
  auto list = to_int_list(*v, name);
  if (!list) return Error{list.error().message};
  return std::optional<std::vector<std::int64_t>>(std::move(*list));
}

Result<bool> get_bool(const Body& body, std::string_view name, bool fallback) {
  const Json* v = find(body, name);
  if (find_list(body, name)) return field_error(name, "expected a boolean");
  if (!v) return fallback;
  if (!v->is_boolean()) return field_error(name, "expected a boolean");
  return v->get<bool>();
}

Result<wire::Position> get_position(const Body& body, std::string_view name) {
  const Json* v = find(body, name);
  if (find_list(body, name))
    return field_error(name, "expected [instance_id, location] (two strings)");
  if (!v) return field_error(name, "field required");
  if (!v->is_array() || v->size() != 2 || !(*v)[0].is_string() || !(*v)[1].is_string())
    return field_error(name, "expected [instance_id, location] (two strings)");
  return wire::Position{(*v)[0].get<std::string>(), (*v)[1].get<std::string>()};
}

std::string dump(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string detail(std::string_view text) {
  Json j = Json::object();
  j["detail"] = std::string(text);
  return dump(j);
}

}  // namespace kvnode::controller::http
