// --help, the YAML keys and docs/operations.md must agree for kvnode and kvcontroller (issue 19
// item 14): every setting's key, flags and default, as the binaries print them, as the loaders
// accept them and as the docs' settings tables state them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kvnode/controller/config.hpp"
#include "kvnode/node/node_config.hpp"
#include "support/process.hpp"

namespace kvnode::node {
namespace {

using namespace std::chrono_literals;

struct Setting {
  std::set<std::string> flags;
  std::string default_text;  // "" = none stated
};
using Settings = std::map<std::string, Setting>;  // by key

std::string operations_doc() {
  const auto path = std::filesystem::path(__FILE__).parent_path() / "../../docs/operations.md";
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::set<std::string> flags_in(const std::string& text) {
  std::set<std::string> flags;
  const std::regex flag(R"(--[a-z0-9][a-z0-9-]*)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), flag); it != std::sregex_iterator();
       ++it)
    flags.insert(it->str());
  return flags;
}

std::string trim(std::string s) {
  const auto first = s.find_first_not_of(" `");
  const auto last = s.find_last_not_of(" `");
  return first == std::string::npos ? "" : s.substr(first, last - first + 1);
}

// The rows of the table under `heading`: | `key` | `--flag`, ... | default | meaning |
Settings docs_table(const std::string& doc, const std::string& heading) {
  Settings table;
  const auto at = doc.find("\n" + heading + "\n");
  if (at == std::string::npos) {
    ADD_FAILURE() << "docs/operations.md has no '" << heading << "'";
    return table;
  }
  std::istringstream lines(doc.substr(at + heading.size() + 2));
  std::string line;
  bool in_table = false;
  while (std::getline(lines, line)) {
    if (line.starts_with("#")) break;
    if (!line.starts_with("|")) {
      if (in_table) break;
      continue;
    }
    in_table = true;
    std::vector<std::string> cells;
    std::istringstream row(line.substr(1));
    for (std::string cell; std::getline(row, cell, '|');) cells.push_back(cell);
    if (cells.size() < 4 || !line.starts_with("| `")) continue;  // the header and its rule
    table[trim(cells[0])] = {flags_in(cells[1]), trim(cells[2])};
  }
  return table;
}

// --help's option entries ("  --port,--controller-port PORT" and its continuation lines) that
// name a key: "(key NAME" in the text. `default_of` reads the default from an entry.
template <class DefaultOf>
Settings help_settings(const std::string& help, DefaultOf default_of) {
  std::vector<std::string> entries;
  std::istringstream lines(help);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("  -"))
      entries.push_back(line.substr(2));
    else if (line.starts_with("      ") && !entries.empty())
      entries.back() += " " + trim(line);
  }
  Settings settings;
  const std::regex key(R"(\(key ([a-z0-9_]+))");
  for (const std::string& entry : entries) {
    std::smatch m;
    if (!std::regex_search(entry, m, key)) continue;
    const std::string names = entry.substr(0, entry.find(' '));
    settings[m[1]] = {flags_in(names), default_of(entry)};
  }
  return settings;
}

void expect_agree(const Settings& help, const Settings& docs, const std::vector<std::string>& keys,
                  const std::string& program) {
  const std::set<std::string> loader(keys.begin(), keys.end());
  std::set<std::string> help_keys, docs_keys;
  for (const auto& [k, s] : help) help_keys.insert(k);
  for (const auto& [k, s] : docs) docs_keys.insert(k);
  EXPECT_EQ(help_keys, loader) << program << ": --help and the loader's keys differ";
  EXPECT_EQ(docs_keys, loader) << program << ": docs/operations.md and the loader's keys differ";
  for (const auto& [key, shown] : help) {
    const auto documented = docs.find(key);
    if (documented == docs.end()) continue;
    EXPECT_EQ(documented->second.flags, shown.flags) << program << " " << key << ": flags";
    if (!shown.default_text.empty()) {
      EXPECT_EQ(documented->second.default_text, shown.default_text) << program << " " << key;
    }
  }
}

TEST(ConfigDocs, KvcontrollerHelpKeysAndDocsAgree) {
  const auto r = test::run_process({KVCONTROLLER_PATH, "--help"}, "", 30s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Settings help = help_settings(r.out, [](const std::string& entry) -> std::string {
    const auto at = entry.find(", default ");
    return at == std::string::npos ? "" : entry.substr(at + 10, entry.size() - at - 11);
  });
  expect_agree(help, docs_table(operations_doc(), "#### kvcontroller settings"),
               controller::config_keys(), "kvcontroller");
}

TEST(ConfigDocs, KvnodeHelpKeysAndDocsAgree) {
  const auto r = test::run_process({KVNODE_PATH, "--help"}, "", 30s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // CLI11 prints a default after the type: "--chunk-size UINT=256".
  const Settings help = help_settings(r.out, [](const std::string& entry) -> std::string {
    const std::string names_and_type = entry.substr(0, entry.find(' ', entry.find(' ') + 1));
    const auto eq = names_and_type.rfind('=');
    return eq == std::string::npos ? "" : names_and_type.substr(eq + 1);
  });
  std::vector<std::string> keys;
  for (const SettingName& s : node_settings()) keys.push_back(s.key);
  expect_agree(help, docs_table(operations_doc(), "#### kvnode settings"), keys, "kvnode");
}

}  // namespace
}  // namespace kvnode::node
