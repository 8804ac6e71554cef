#include "cli_support.hpp"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>

#include "kvnode/common/nearest_name.hpp"

namespace kvctl {

namespace {

// "kvctl lookup": the subcommands the command line selected, innermost last.
std::pair<const CLI::App*, std::string> innermost(const CLI::App& app) {
  const CLI::App* at = &app;
  std::string path = "kvctl";
  for (auto selected = at->get_subcommands(); !selected.empty(); selected = at->get_subcommands()) {
    at = selected.front();
    path += " " + at->get_name();
  }
  return {at, path};
}

}  // namespace

std::optional<std::string> unknown_top_level_argument(const CLI::App& app,
                                                      const std::vector<std::string>& args) {
  const std::vector<std::string> flags = kvnode::long_flag_names(app);
  for (const std::string& arg : args) {
    if (!arg.starts_with("-")) return std::nullopt;  // the subcommand: CLI11 takes it from here
    if (arg == "-h" || std::find(flags.begin(), flags.end(), arg) != flags.end()) continue;
    return kvnode::unknown_argument_message(arg, flags, "kvctl");
  }
  return std::nullopt;
}

std::string usage_error_message(const CLI::App& app, const CLI::Error& error) {
  const auto [at, path] = innermost(app);
  if (dynamic_cast<const CLI::ExtrasError*>(&error) && !at->remaining().empty())
    return kvnode::unknown_argument_message(at->remaining().front(), kvnode::long_flag_names(*at),
                                            path);
  return std::string(error.what()) + "; see " + path + " --help";
}

void fail(int code, const std::string& message) {
  std::cerr << "kvctl: " << message << "\n";
  throw CLI::RuntimeError(code);
}

void TokenArgs::add(CLI::App* c) {
  c->add_option("--tokens", list, "token ids: 1,2,3");
  c->add_option("--token-range", range, "token ids A..B-1: A:B");
  c->add_option("--token-file", file,
                "token ids from a file (- = stdin): integers or a JSON array");
}

std::vector<std::int64_t> TokenArgs::get() const {
  std::vector<std::int64_t> out;
  auto parse_ints = [&](const std::string& text, const std::string& where) {
    std::string cleaned = text;
    for (char& c : cleaned)
      if (c == ',' || c == '[' || c == ']' || c == '\n' || c == '\r' || c == '\t') c = ' ';
    std::istringstream in(cleaned);
    std::string word;
    while (in >> word) {
      std::size_t used = 0;
      try {
        out.push_back(std::stoll(word, &used));
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != word.size()) fail(2, where + ": '" + word + "' is not an integer token id");
    }
  };
  if (!list.empty()) parse_ints(list, "--tokens");
  if (!range.empty()) {
    const auto colon = range.find(':');
    try {
      if (colon == std::string::npos) throw std::invalid_argument("no colon");
      const std::int64_t a = std::stoll(range.substr(0, colon)),
                         b = std::stoll(range.substr(colon + 1));
      if (b < a || b - a > 100'000'000) throw std::out_of_range("range");
      for (std::int64_t t = a; t < b; ++t) out.push_back(t);
    } catch (const std::exception&) {
      fail(2, "--token-range: expected A:B with A <= B, got '" + range + "'");
    }
  }
  if (!file.empty()) {
    std::ifstream in(file == "-" ? "/dev/stdin" : file);
    if (!in) fail(2, "--token-file: cannot read '" + file + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    parse_ints(ss.str(), file);
  }
  return out;
}

}  // namespace kvctl
