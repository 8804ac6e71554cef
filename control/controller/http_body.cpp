// parse_object: a request body read through nlohmann's SAX interface. The reader builds the JSON
// of every field except a top-level list of integers, which goes straight into a vector (a list
// that turns out to hold anything else becomes JSON again, so the getters still name the field
// in their errors). Nesting is bounded while reading, so "[[[[..." costs nothing.
#include <limits>

#include "http_json.hpp"

namespace kvnode::controller::http {
namespace {

class BodyReader final : public nlohmann::json_sax<Json> {
 public:
  explicit BodyReader(Body& out) : out_(out) {}
  const std::string& error() const { return error_; }
  bool not_an_object() const { return skipping_; }

  bool null() override { return scalar(nullptr); }
  bool boolean(bool v) override { return scalar(v); }
  bool number_integer(number_integer_t v) override {
    if (in_list_) {
      list_.push_back(v);
      return true;
    }
    return scalar(v);
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (in_list_ && v <= static_cast<number_unsigned_t>(std::numeric_limits<std::int64_t>::max())) {
      list_.push_back(static_cast<std::int64_t>(v));
      return true;
    }
    return scalar(v);
  }
  bool number_float(number_float_t v, const string_t&) override { return scalar(v); }
  bool string(string_t& v) override { return scalar(std::move(v)); }
  bool binary(binary_t& v) override { return scalar(Json::binary(std::move(v))); }

  bool start_object(std::size_t) override {
    if (!deeper()) return false;
    if (skipping_) return true;
    if (stack_.empty()) {
      stack_.push_back(&out_.fields);
      return true;
    }
    return open(Json::object());
  }
  bool key(string_t& k) override {
    if (skipping_) return true;
    if (stack_.size() == 1) {  // a repeated top-level key: the last one counts, as in nlohmann
      out_.int_lists.erase(k);
      out_.fields.erase(k);
    }
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    --depth_;
    if (!skipping_) stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (!deeper()) return false;
    if (stack_.empty()) skipping_ = true;
    if (skipping_) return true;
    if (stack_.size() == 1 && !in_list_) {
      in_list_ = true;
      list_.clear();
      return true;
    }
    return open(Json::array());
  }
  bool end_array() override {
    --depth_;
    if (skipping_) return true;
    if (in_list_) {
      in_list_ = false;
      out_.int_lists.insert_or_assign(key_, std::move(list_));
      list_ = {};
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t at, const std::string&,
                   const nlohmann::detail::exception& e) override {
    if (error_.empty()) error_at_ = at;
    return fail(e.what());
  }
  std::size_t error_at() const { return error_at_; }

 private:
  bool fail(std::string text) {
    if (error_.empty()) error_ = std::move(text);
    return false;
  }
  bool deeper() {
    if (++depth_ > kMaxBodyDepth)
      return fail("JSON nested deeper than " + std::to_string(kMaxBodyDepth));
    return true;
  }
  // The list being read holds something other than integers: from here on it is JSON.
  void list_to_json() {
    Json array = Json::array();
    array.get_ref<Json::array_t&>().reserve(list_.size());
    for (std::int64_t v : list_) array.push_back(v);
    list_ = {};
    in_list_ = false;
    stack_.push_back(place(std::move(array)));
  }
  // Stores a value at the current position; returns where it lives. Pointers on the stack stay
  // valid: only the innermost container grows, and none of its children is open.
  Json* place(Json value) {
    Json& parent = *stack_.back();
    if (parent.is_object()) {
      Json& slot = parent[key_];
      slot = std::move(value);
      return &slot;
    }
    parent.push_back(std::move(value));
    return &parent.back();
  }
  bool scalar(Json value) {
    if (stack_.empty()) skipping_ = true;
    if (skipping_) return true;
    if (in_list_) list_to_json();
    place(std::move(value));
    return true;
  }
  bool open(Json container) {
    if (in_list_) list_to_json();
    stack_.push_back(place(std::move(container)));
    return true;
  }

  Body& out_;
  std::vector<Json*> stack_;  // the open containers, outermost first (the body's object)
  int depth_ = 0;             // open containers, counting a list read into list_
  std::string key_;
  bool in_list_ = false;   // reading a top-level field's list of integers into list_
  bool skipping_ = false;  // the body is not an object: read on only to report bad JSON first
  std::vector<std::int64_t> list_;
  std::string error_;
  std::size_t error_at_ = 0;
};

// FastAPI's answer to a body that is not JSON: type json_invalid at ["body", offset].
FieldError json_invalid(std::size_t at, std::string why) {
  FieldError e{"json_invalid", Json::array({"body", at}), "JSON decode error", Json::object(),
               Json::object()};
  e.ctx["error"] = std::move(why);
  return e;
}

}  // namespace

Field<Body> parse_object(std::string_view text) {
  Body body;
  BodyReader reader(body);
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), &reader);
  } catch (const std::exception& e) {  // the reader throws only bad_alloc; nlohmann reports by call
    return json_invalid(0, e.what());
  }
  if (!ok)
    return json_invalid(reader.error_at(),
                        reader.error().empty() ? "invalid JSON" : reader.error());
  if (reader.not_an_object())
    return FieldError{"model_attributes_type", Json::array({"body"}),
                      "Input should be a valid dictionary or object to extract fields from",
                      nullptr, nullptr};
  return body;
}

}  // namespace kvnode::controller::http
