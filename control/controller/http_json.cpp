#include "http_json.hpp"

#include <algorithm>
#include <charconv>
#include <limits>

namespace kvnode::controller::http {

namespace {

Json body_loc(std::string_view name) {
  return Json::array({"body", std::string(name)});
}

FieldError missing(const Body& body, std::string_view name) {
  return {"missing", body_loc(name), "Field required", to_json(body), nullptr};
}
FieldError wrong(std::string type, Json loc, std::string msg, Json input) {
  return {std::move(type), std::move(loc), std::move(msg), std::move(input), nullptr};
}
FieldError not_string(Json loc, const Json& input) {
  return wrong("string_type", std::move(loc), "Input should be a valid string", input);
}

const Json* find(const Body& body, std::string_view name) {
  auto it = body.fields.find(std::string(name));
  return it == body.fields.end() ? nullptr : &*it;
}

const std::vector<std::int64_t>* find_list(const Body& body, std::string_view name) {
  auto it = body.int_lists.find(name);
  return it == body.int_lists.end() ? nullptr : &it->second;
}

Json list_json(const std::vector<std::int64_t>& list) {
  Json array = Json::array();
  for (std::int64_t v : list) array.push_back(v);
  return array;
}

// The pydantic error for a list item that is not a 64-bit integer.
FieldError bad_item(std::string_view name, std::size_t index, const Json& item) {
  Json loc = body_loc(name);
  loc.push_back(index);
  if (item.is_number_float())
    return wrong("int_from_float", std::move(loc),
                 "Input should be a valid integer, got a number with a fractional part", item);
  if (item.is_string())
    return wrong("int_parsing", std::move(loc),
                 "Input should be a valid integer, unable to parse string as an integer", item);
  if (item.is_number_unsigned())  // past int64: pydantic would take it, LMCache's keys cannot
    return wrong("int_type", std::move(loc), "Input should be an integer of at most 64 bits", item);
  return wrong("int_type", std::move(loc), "Input should be a valid integer", item);
}

Field<std::vector<std::int64_t>> to_int_list(const Json& value, std::string_view name) {
  if (!value.is_array())
    return wrong("list_type", body_loc(name), "Input should be a valid list", value);
  std::vector<std::int64_t> out;
  out.reserve(value.size());
  for (std::size_t i = 0; i < value.size(); ++i) {
    const Json& item = value[i];
    if (item.is_number_integer() && !item.is_number_unsigned()) {
      out.push_back(item.get<std::int64_t>());
    } else if (item.is_number_unsigned() &&
               item.get<std::uint64_t>() <=
                   static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      out.push_back(static_cast<std::int64_t>(item.get<std::uint64_t>()));
    } else {
      return bad_item(name, i, item);
    }
  }
  return out;
}

}  // namespace

std::string FieldError::text() const {
  std::string where;
  for (std::size_t i = 1; i < loc.size(); ++i)  // loc[0] is "body" or "query"
    where += (i > 1 ? "." : "") + (loc[i].is_string() ? loc[i].get<std::string>() : loc[i].dump());
  return (where.empty() ? std::string("request body") : where) + ": " + msg;
}

Json FieldError::to_json() const {
  Json j = Json::object();
  j["type"] = type;
  j["loc"] = loc;
  j["msg"] = msg;
  j["input"] = input;
  if (!ctx.is_null()) j["ctx"] = ctx;
  return j;
}

Json to_json(const Body& body) {
  Json j = body.fields;
  for (const auto& [name, list] : body.int_lists) j[name] = list_json(list);
  return j;
}

Field<std::string> get_string(const Body& body, std::string_view name) {
  if (const auto* list = find_list(body, name)) return not_string(body_loc(name), list_json(*list));
  const Json* v = find(body, name);
  if (!v) return missing(body, name);
  if (!v->is_string()) return not_string(body_loc(name), *v);
  return v->get<std::string>();
}

Field<std::vector<std::int64_t>> get_int_list(const Body& body, std::string_view name,
                                              std::optional<std::vector<std::int64_t>> fallback) {
  if (const auto* list = find_list(body, name)) return *list;
  const Json* v = find(body, name);
  if (!v) {
    if (fallback) return std::move(*fallback);
    return missing(body, name);
  }
  return to_int_list(*v, name);
}

Field<std::optional<std::vector<std::int64_t>>> get_nullable_int_list(const Body& body,
                                                                      std::string_view name) {
  if (const auto* list = find_list(body, name))
    return std::optional<std::vector<std::int64_t>>(*list);
  const Json* v = find(body, name);
  if (!v || v->is_null()) return std::optional<std::vector<std::int64_t>>();
  auto list = to_int_list(*v, name);
  if (!list) return list.error();
  return std::optional<std::vector<std::int64_t>>(std::move(*list));
}

Field<bool> get_bool(const Body& body, std::string_view name, bool fallback) {
  const Json* v = find(body, name);
  const auto* list = find_list(body, name);
  if (!v && !list) return fallback;
  if (list || !v->is_boolean())
    return wrong("bool_type", body_loc(name), "Input should be a valid boolean",
                 list ? list_json(*list) : *v);
  return v->get<bool>();
}

Field<wire::Position> get_position(const Body& body, std::string_view name) {
  const Json* v = find(body, name);
  const auto* list = find_list(body, name);
  if (!v && !list) return missing(body, name);
  const Json given = list ? list_json(*list) : *v;
  if (!given.is_array())
    return wrong("tuple_type", body_loc(name), "Input should be a valid tuple", given);
  for (std::size_t i = 0; i < std::min<std::size_t>(given.size(), 2); ++i) {
    if (!given[i].is_string()) {
      Json loc = body_loc(name);
      loc.push_back(i);
      return not_string(std::move(loc), given[i]);
    }
  }
  if (given.size() < 2) {
    Json loc = body_loc(name);
    loc.push_back(given.size());
    return wrong("missing", std::move(loc), "Field required", given);
  }
  if (given.size() > 2) {
    FieldError e = wrong(
        "too_long", body_loc(name),
        "Tuple should have at most 2 items after validation, not " + std::to_string(given.size()),
        given);
    e.ctx = Json{{"field_type", "Tuple"}, {"max_length", 2}, {"actual_length", given.size()}};
    return e;
  }
  return wire::Position{given[0].get<std::string>(), given[1].get<std::string>()};
}

Field<std::int64_t> get_query_int(std::string_view name, std::string_view text) {
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    return wrong("int_parsing", Json::array({"query", std::string(name)}),
                 "Input should be a valid integer, unable to parse string as an integer",
                 std::string(text));
  return v;
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
