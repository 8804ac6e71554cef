// Test support: the conformance vectors in ../shared (read in place, never copied) and hex helpers.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

namespace kvnode::test {

// Parses ../shared/conformance/<name> keeping key order (encoding tests need it; compare values
// as nlohmann::json, which ignores order); nullopt when the shared folder is absent.
inline std::optional<nlohmann::ordered_json> load_conformance(const std::string& name) {
  const std::filesystem::path path =
      std::filesystem::path(KVNODE_SHARED_DIR) / "conformance" / name;
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::ordered_json::parse(ss.str());
}

#define KVNODE_LOAD_CONFORMANCE_OR_SKIP(var, name)                                 \
  auto var##_opt = ::kvnode::test::load_conformance(name);                         \
  if (!var##_opt)                                                                  \
    GTEST_SKIP() << "conformance file " name " not found under " KVNODE_SHARED_DIR \
                 << "/conformance; skipping";                                      \
  const nlohmann::ordered_json& var = *var##_opt

inline std::string from_hex(std::string_view hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

inline std::string to_hex(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

}  // namespace kvnode::test
