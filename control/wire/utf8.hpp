// Strict UTF-8 validation with CPython's UnicodeDecodeError texts (what msgspec raises for a
// msgpack str that is not valid UTF-8).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kvnode::wire::detail {

// nullopt when `s` is valid UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
std::optional<std::string> utf8_error(std::string_view s);

}  // namespace kvnode::wire::detail
