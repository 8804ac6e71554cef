// Small input helpers shared by kvctl commands: line-by-line reading of a file or stdin, and hex.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "kvnode/common/result.hpp"

namespace kvctl {

enum class BlankLines { kSkip, kKeep };  // kKeep: an empty line is an input (an empty hex message)

// Calls fn(line_number, line) for each line of `path` ("-" = stdin), trailing '\r' removed.
// Fails the command (exit 2) when the file cannot be opened.
void for_each_line(const std::string& path, BlankLines blanks,
                   const std::function<void(std::size_t, std::string_view)>& fn);

kvnode::Result<std::string> hex_decode(std::string_view hex);
std::string hex_encode(std::string_view bytes);

}  // namespace kvctl
