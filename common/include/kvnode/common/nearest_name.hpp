// "Did you mean ...?" for misspelled config keys and flags: the known name nearest by edit
// distance, when it is near enough to be a plausible typo rather than a different word.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvnode {

// Levenshtein distance (insert, delete, substitute; each costs 1).
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The known name nearest to `name`, if at most a third of its letters (and at least 2) differ;
// ties go to the first in `known`.
template <class Names>
std::optional<std::string> nearest_name(std::string_view name, const Names& known) {
  const std::size_t limit = std::max<std::size_t>(2, name.size() / 3);
  std::optional<std::string> best;
  std::size_t best_distance = limit + 1;
  for (const auto& candidate : known) {
    const std::size_t d = edit_distance(name, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = std::string(candidate);
    }
  }
  return best;
}

// Whether `name` is at most `max_distance` edits from a known name: a slip of the keyboard rather
// than a name of its own.
template <class Names>
bool within_edits(std::string_view name, const Names& known, std::size_t max_distance) {
  for (const auto& candidate : known)
    if (edit_distance(name, candidate) <= max_distance) return true;
  return false;
}

// Every long flag of a CLI11 app (or subcommand), "--name", for the hints below. A template so
// that common/ needs no CLI11.
template <class App>
std::vector<std::string> long_flag_names(const App& app) {
  std::vector<std::string> flags;
  for (const auto* option : app.get_options())
    for (const std::string& name : option->get_lnames()) flags.push_back("--" + name);
  return flags;
}

// "unknown key 'chunk_sise' (did you mean 'chunk_size'?)", or without the hint when none is near.
template <class Names>
std::string unknown_name_message(std::string_view what, std::string_view name, const Names& known) {
  std::string message = "unknown " + std::string(what) + " '" + std::string(name) + "'";
  if (auto hint = nearest_name(name, known)) message += " (did you mean '" + *hint + "'?)";
  return message;
}

// For the first command-line argument no option took: "unknown flag '--prot' (did you mean
// '--port'?); see kvcontroller --help", or "unexpected argument 'x'; see ...".
template <class Flags>
std::string unknown_argument_message(std::string_view argument, const Flags& flags,
                                     std::string_view program) {
  const std::string see = "; see " + std::string(program) + " --help";
  if (!argument.starts_with("-"))
    return "unexpected argument '" + std::string(argument) + "'" + see;
  return unknown_name_message("flag", argument.substr(0, argument.find('=')), flags) + see;
}

}  // namespace kvnode
