// Values of kvcontroller's config keys as the sources spell them, and their parsers. Each parser's
// error is the problem alone ("expected an integer, got 'abc'"); config.cpp prefixes the source
// and key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "kvnode/common/result.hpp"
#include "kvnode/controller/config.hpp"

namespace kvnode::controller::config_values {

using nlohmann::json;

// One value for one key, as a source spelled it. Env, flags and extras give text; YAML may also
// give null (~) or a mapping/sequence, carried as JSON so --monitor-ports' parser serves both.
struct RawValue {
  std::string text;
  std::optional<json> structured;
  bool null = false;
};

RawValue text_value(std::string text);
RawValue null_value();
RawValue structured_value(json structured);

std::string single_quoted(std::string_view s);
std::string format_number(double v);

// Parses the whole of `text` into an arithmetic T with std::from_chars (no sign other than a
// leading '-', no whitespace, no trailing characters).
template <class T>
Result<T> parse_whole(const std::string& text, std::string_view what);
extern template Result<std::int64_t> parse_whole<std::int64_t>(const std::string&,
                                                               std::string_view);

Result<int> parse_int(const RawValue& v);
Result<double> parse_number(const RawValue& v);
Result<std::size_t> parse_chunk_size(const RawValue& v);
Result<wire::WideInt> parse_hash_init(const RawValue& v);
Result<std::uint64_t> parse_none_hash(const RawValue& v);
Result<keys::HashGeneration> parse_hash_generation(const RawValue& v);
Result<std::string> parse_string(const RawValue& v);
Result<MonitorPorts> parse_monitor_ports(const RawValue& v);

}  // namespace kvnode::controller::config_values
