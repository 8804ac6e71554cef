// JSON -> msgpack through nlohmann's SAX parser: no DOM, containers written with 32-bit headers
// whose counts are patched when they close, nesting bounded like the msgpack decoder.
#include "json_transcoder.hpp"

#include <nlohmann/json.hpp>

#include "decoder.hpp"
#include "encoder.hpp"

namespace kvnode::wire {
namespace {

class Transcoder {
 public:
  using number_integer_t = std::int64_t;
  using number_unsigned_t = std::uint64_t;
  using number_float_t = double;
  using string_t = std::string;
  using binary_t = nlohmann::json::binary_t;

  explicit Transcoder(std::size_t input_size) : input_size_(input_size) {}

  bool null() {
    return value([&] { w_.pk.pack_nil(); });
  }
  bool boolean(bool v) {
    return value([&] { v ? w_.pk.pack_true() : w_.pk.pack_false(); });
  }
  bool number_integer(std::int64_t v) {
    return value([&] { w_.pk.pack_int64(v); });
  }
  bool number_unsigned(std::uint64_t v) {
    return value([&] { w_.pk.pack_uint64(v); });
  }
  bool number_float(double v, const std::string&) {
    return value([&] { w_.float64(v); });
  }
  bool string(std::string& s) {
    return value([&] { w_.str(s); });
  }
  bool binary(binary_t&) { return false; }  // JSON has no binary values
  bool key(std::string& s) {
    ++open_.back().count;
    w_.str(s);
    return true;
  }
  bool start_object(std::size_t) { return open(0xdf); }
  bool start_array(std::size_t) { return open(0xdd); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::json::exception& ex) {
    const std::string what = ex.what();
    if (position >= input_size_ + 1 || what.find("unexpected end of input;") != std::string::npos) {
      error_ = "Input data was truncated";
    } else {
      const char* reason = what.find("expected end of input") != std::string::npos
                               ? "trailing characters"
                               : "invalid character";
      error_ = "JSON is malformed: " + std::string(reason) + " (byte " +
               std::to_string(position - 1) + ")";
    }
    return false;
  }

  std::string& out() { return out_; }
  const std::string& error() const { return error_; }

 private:
  struct Open {
    std::size_t header_at;
    std::uint32_t count;
  };

  // Counts an element of the enclosing array (object members are counted by key()).
  template <class Write>
  bool value(Write write) {
    if (!open_.empty() && in_array_.back()) ++open_.back().count;
    write();
    return true;
  }
  bool open(std::uint8_t header) {
    if (open_.size() >= static_cast<std::size_t>(detail::kMaxDepth)) {
      error_ = "maximum recursion depth exceeded while deserializing an object";
      return false;
    }
    if (!open_.empty() && in_array_.back()) ++open_.back().count;  // a container is an element too
    open_.push_back({out_.size(), 0});
    in_array_.push_back(header == 0xdd);
    out_.append({static_cast<char>(header), 0, 0, 0, 0});
    return true;
  }
  bool close() {
    const Open o = open_.back();
    open_.pop_back();
    in_array_.pop_back();
    for (int i = 0; i < 4; ++i)
      out_[o.header_at + 1 + i] = static_cast<char>(o.count >> (24 - 8 * i));
    return true;
  }

  std::size_t input_size_;
  std::string out_;
  detail::Writer w_{out_};
  std::vector<Open> open_;
  std::vector<bool> in_array_;
  std::string error_;
};

}  // namespace

Result<std::string> json_to_msgpack(std::string_view json) {
  Transcoder t(json.size());
  const bool ok =
      nlohmann::json::sax_parse(json.begin(), json.end(), &t, nlohmann::json::input_format_t::json,
                                /*strict=*/true);
  if (!ok) return Error{t.error().empty() ? "JSON is malformed" : t.error()};
  return std::move(t.out());
}

}  // namespace kvnode::wire
