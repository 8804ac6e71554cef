#include "line_input.hpp"

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>

namespace kvctl {

void for_each_line(const std::string& path, BlankLines blanks,
                   const std::function<void(std::size_t, std::string_view)>& fn) {
  std::ifstream file;
  if (path != "-") {
    file.open(path);
    if (!file) {
      std::cerr << "kvctl: cannot open " << path << "\n";
      throw CLI::RuntimeError(2);
    }
  }
  std::istream& in = path == "-" ? std::cin : file;
  std::string line;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (blanks == BlankLines::kSkip && line.find_first_not_of(" \t") == std::string::npos) continue;
    fn(number, line);
  }
}

kvnode::Result<std::string> hex_decode(std::string_view hex) {
  while (!hex.empty() && (hex.back() == ' ' || hex.back() == '\t' || hex.back() == '\n'))
    hex.remove_suffix(1);
  while (!hex.empty() && (hex.front() == ' ' || hex.front() == '\t')) hex.remove_prefix(1);
  if (hex.size() % 2 != 0) return kvnode::make_error("invalid hex: odd number of digits");
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(hex.size() / 2);
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0)
      return kvnode::make_error("invalid hex: bad digit at offset " +
                                std::to_string(hi < 0 ? i : i + 1));
    out.push_back(static_cast<char>(hi << 4 | lo));
  }
  return out;
}

std::string hex_encode(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

}  // namespace kvctl
