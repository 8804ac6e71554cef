// Reads a YAML config file, errors as values: kvcontroller's and kvnode's --config share it, so a
// file neither can read fails with the same message. Header-only: its users link yaml-cpp.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

#include "kvnode/common/result.hpp"

namespace kvnode::controller {

// The file's root node; errors read "<path>: cannot read the config file" or "<path>: <parse
// error with its line and column>".
inline Result<YAML::Node> load_yaml_file(const std::string& path) {
  try {
    return YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return make_error(path + ": cannot read the config file");
  } catch (const YAML::Exception& e) {
    return make_error(path + ": " + e.what());
  }
}

}  // namespace kvnode::controller
