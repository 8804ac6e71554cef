// What kvcontroller's config tests share: loading a command line with an injected environment,
// its config or its error, and a YAML file that lives as long as the object.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include "kvnode/controller/config.hpp"

namespace kvnode::controller::config_test {

using EnvMap = std::map<std::string, std::string>;

inline EnvLookup env_of(EnvMap vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

inline Result<ConfigOrExit> load(std::vector<std::string> args, EnvMap env = {}) {
  args.insert(args.begin(), "kvcontroller");
  return load_config(args, env_of(std::move(env)));
}

// The config of a command line that must load; fails the test otherwise.
inline ControllerConfig loaded(std::vector<std::string> args, EnvMap env = {}) {
  auto result = load(std::move(args), std::move(env));
  if (!result) {
    ADD_FAILURE() << "unexpected error: " << result.error().message;
    return {};
  }
  if (!result->config) {
    ADD_FAILURE() << "unexpected exit: " << result->message;
    return {};
  }
  return *result->config;
}

// The error message of a command line that must fail ("" and a test failure if it loads).
inline std::string error_of(std::vector<std::string> args, EnvMap env = {}) {
  auto result = load(std::move(args), std::move(env));
  if (result) {
    ADD_FAILURE() << "expected an error";
    return "";
  }
  return result.error().message;
}

// A YAML file that lives as long as the object.
class TempYaml {
 public:
  explicit TempYaml(const std::string& text) {
    char name[] = "/tmp/kvcontroller-config-XXXXXX";
    const int fd = mkstemp(name);
    path_ = name;
    EXPECT_GE(fd, 0);
    EXPECT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    close(fd);
  }
  ~TempYaml() { unlink(path_.c_str()); }
  TempYaml(const TempYaml&) = delete;
  TempYaml& operator=(const TempYaml&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace kvnode::controller::config_test
