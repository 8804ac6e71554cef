// JSON -> msgpack transcoding (nlohmann SAX), private to the codec: decode() sends a payload that
// starts with '{' through it. Public callers use kvnode/wire/json.hpp.
#pragma once

#include <string>
#include <string_view>

#include "kvnode/common/result.hpp"

namespace kvnode::wire {

Result<std::string> json_to_msgpack(std::string_view json);

}  // namespace kvnode::wire
