// What kvctl's command groups share: failing with an exit code, and token arguments.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvctl {

// kvctl's messages for a command line it cannot parse: an unknown flag before the subcommand
// ("kvctl --bogus" would otherwise read "A subcommand is required") and CLI11's parse errors, each
// naming the flag, the nearest known one and the --help to read.
std::optional<std::string> unknown_top_level_argument(const CLI::App& app,
                                                      const std::vector<std::string>& args);
std::string usage_error_message(const CLI::App& app, const CLI::Error& error);

// Prints "kvctl: message" on stderr and ends the command with `code` (1 failed, 2 bad input).
[[noreturn]] void fail(int code, const std::string& message);

// Tokens from --tokens "1,2,3", --token-range A:B (A inclusive, B exclusive) or --token-file
// (integers separated by spaces, commas or newlines, or a JSON array; - = stdin).
struct TokenArgs {
  std::string list, range, file;
  void add(CLI::App* c);
  std::vector<std::int64_t> get() const;
};

}  // namespace kvctl
