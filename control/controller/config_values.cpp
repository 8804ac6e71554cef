// Parsers of kvcontroller's config values (config_values.hpp).
#include "config_values.hpp"

#include <array>
#include <charconv>
#include <climits>
#include <cmath>
#include <system_error>
#include <utility>
#include <vector>

namespace kvnode::controller::config_values {

RawValue text_value(std::string text) {
  RawValue v;
  v.text = std::move(text);
  return v;
}

RawValue null_value() {
  RawValue v;
  v.null = true;
  return v;
}

RawValue structured_value(json structured) {
  RawValue v;
  v.structured = std::move(structured);
  return v;
}

std::string single_quoted(std::string_view s) {
  return "'" + std::string(s) + "'";
}

std::string format_number(double v) {
  std::array<char, 64> buf{};
  const auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  return ec == std::errc() ? std::string(buf.data(), end) : std::to_string(v);
}

namespace {

// The text of a scalar value, or why there is none ("expected <what>, got null").
Result<std::string> scalar_text(const RawValue& v, std::string_view what) {
  if (v.null) return make_error("expected " + std::string(what) + ", got null");
  if (v.structured)
    return make_error("expected " + std::string(what) + ", got " + v.structured->dump());
  return v.text;
}

}  // namespace

// Parses the whole of `text` into an arithmetic T with std::from_chars (no sign other than a
// leading '-', no whitespace, no trailing characters).
template <class T>
Result<T> parse_whole(const std::string& text, std::string_view what) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range)
    return make_error("expected " + std::string(what) + ", got " + single_quoted(text) +
                      " (out of range)");
  if (ec != std::errc() || ptr != end)
    return make_error("expected " + std::string(what) + ", got " + single_quoted(text));
  return value;
}

Result<int> parse_int(const RawValue& v) {
  auto text = scalar_text(v, "an integer");
  if (!text) return std::move(text).error();
  return parse_whole<int>(*text, "an integer");
}

Result<double> parse_number(const RawValue& v) {
  auto text = scalar_text(v, "a number");
  if (!text) return std::move(text).error();
  auto number = parse_whole<double>(*text, "a number");
  // from_chars accepts "inf" and "nan", which no duration or threshold can mean.
  if (number && !std::isfinite(*number))
    return make_error("expected a number, got " + single_quoted(*text));
  return number;
}

// 0 parses: validate() rejects it, so that message names the key whichever source set it.
Result<std::size_t> parse_chunk_size(const RawValue& v) {
  auto text = scalar_text(v, "a positive integer");
  if (!text) return std::move(text).error();
  auto n = parse_whole<std::uint64_t>(*text, "a positive integer");
  if (!n) return std::move(n).error();
  return static_cast<std::size_t>(*n);
}

Result<wire::WideInt> parse_hash_init(const RawValue& v) {
  auto text = scalar_text(v, "an integer");
  if (!text) return std::move(text).error();
  return keys::parse_wide_int(*text);
}

// hash(None) of the workers' interpreter: a number, or the name of a known interpreter.
Result<std::uint64_t> parse_none_hash(const RawValue& v) {
  constexpr std::string_view kWhat = "an integer, py312 or debian-py311";
  auto text = scalar_text(v, kWhat);
  if (!text) return std::move(text).error();
  if (*text == "py312") return std::uint64_t{keys::kNoneHashPython312};
  if (*text == "debian-py311") return std::uint64_t{keys::kNoneHashDebianPython3112};
  auto n = keys::parse_wide_int(*text);
  if (!n) return make_error("expected " + std::string(kWhat) + ", got " + single_quoted(*text));
  return n->bits();  // CPython hashes are signed; the chain only uses the bits
}

Result<keys::HashGeneration> parse_hash_generation(const RawValue& v) {
  auto text = scalar_text(v, "lmcache-0.5.6 or legacy");
  if (!text) return std::move(text).error();
  return keys::parse_hash_generation(*text);
}

Result<std::string> parse_string(const RawValue& v) {
  return scalar_text(v, "a string");
}

// ---- controller_monitor_ports ----

namespace {

// One port of the monitor-ports object; heartbeat alone may be null (no heartbeat socket).
Result<int> parse_port_entry(const json& j, const std::string& name) {
  if (j.is_null() && name == "heartbeat") return -1;
  if (!j.is_number_integer()) return make_error(name + ": expected an integer, got " + j.dump());
  const bool too_big =
      j.is_number_unsigned() ? j.get<std::uint64_t>() > INT_MAX : j.get<std::int64_t>() < INT_MIN;
  if (too_big)
    return make_error(name + ": expected an integer, got " + j.dump() + " (out of range)");
  return static_cast<int>(j.get<std::int64_t>());
}

}  // namespace

namespace {

// Names every key of `object` that is not a monitor port, e.g. "unknown keys 'a', 'b'".
std::optional<std::string> unknown_port_keys(const json& object) {
  std::vector<std::string> unknown;
  for (const auto& [name, value] : object.items())
    if (name != "pull" && name != "reply" && name != "heartbeat")
      unknown.push_back(single_quoted(name));
  if (unknown.empty()) return std::nullopt;
  std::string message = unknown.size() == 1 ? "unknown key " : "unknown keys ";
  for (std::size_t i = 0; i < unknown.size(); ++i) message += (i ? ", " : "") + unknown[i];
  return message;
}

}  // namespace

// A monitor-ports object replaces the whole previous value, like any other key's value; a port
// it leaves out takes its default (heartbeat 8082: kvnode's heartbeat socket is on by default).
Result<MonitorPorts> parse_monitor_ports(const RawValue& v) {
  constexpr std::string_view kWhat = R"(a JSON object such as {"pull": 8300, "reply": 8400})";
  json doc;
  if (v.structured) {
    doc = *v.structured;
  } else {
    auto text = scalar_text(v, kWhat);
    if (!text) return std::move(text).error();
    doc = json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!doc.is_object())
      return make_error("expected " + std::string(kWhat) + ", got " + single_quoted(*text));
  }
  if (!doc.is_object()) return make_error("expected " + std::string(kWhat) + ", got " + doc.dump());
  if (auto unknown = unknown_port_keys(doc)) return make_error(*unknown);
  MonitorPorts ports;
  for (auto [name, field] : {std::pair{"pull", &ports.pull}, std::pair{"reply", &ports.reply},
                             std::pair{"heartbeat", &ports.heartbeat}}) {
    if (!doc.contains(name)) continue;
    auto port = parse_port_entry(doc.at(name), name);
    if (!port) return std::move(port).error();
    *field = *port;
  }
  return ports;
}

template Result<std::int64_t> parse_whole<std::int64_t>(const std::string&, std::string_view);

}  // namespace kvnode::controller::config_values
