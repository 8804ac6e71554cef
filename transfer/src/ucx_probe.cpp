// probe_ucx(): starts a throw-away UCP context and asks it what it would use.
#include "kvnode/transfer/ucx_probe.hpp"

#include <ucp/api/ucp.h>
#include <ucs/memory/memory_type.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace kvnode::transfer {

namespace {

struct ConfigDeleter {
  void operator()(ucp_config_t* config) const noexcept { ucp_config_release(config); }
};
struct ContextDeleter {
  void operator()(ucp_context_h context) const noexcept { ucp_cleanup(context); }
};
struct FileDeleter {
  void operator()(std::FILE* file) const noexcept { std::fclose(file); }
};
struct FreeDeleter {
  void operator()(char* p) const noexcept { std::free(p); }
};
using Config = std::unique_ptr<ucp_config_t, ConfigDeleter>;
using Context = std::unique_ptr<std::remove_pointer_t<ucp_context_h>, ContextDeleter>;

// Runs `print` against an in-memory FILE and returns what it wrote.
std::string capture(const std::function<void(std::FILE*)>& print) {
  char* raw = nullptr;
  std::size_t size = 0;
  {
    std::unique_ptr<std::FILE, FileDeleter> file(open_memstream(&raw, &size));
    if (!file) return {};
    print(file.get());
  }  // fclose publishes raw/size
  const std::unique_ptr<char, FreeDeleter> buffer(raw);
  return buffer ? std::string(buffer.get(), size) : std::string();
}

// ucp_context_print_info lists lines like "#      resource 1  :  md 1  dev 1  flags -- tcp/eth0";
// the last word is "transport/device".
std::vector<std::string> parse_resources(const std::string& info) {
  std::vector<std::string> out;
  std::istringstream lines(info);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(" resource ") == std::string::npos || line.find(':') == std::string::npos) {
      continue;
    }
    const auto end = line.find_last_not_of(" \t");
    const auto begin = line.find_last_of(" \t", end);
    if (end == std::string::npos || begin == std::string::npos) continue;
    const std::string word = line.substr(begin + 1, end - begin);
    if (word.find('/') != std::string::npos) out.push_back(word);
  }
  return out;
}

std::vector<std::string> transports_from_env() {
  const char* tls = std::getenv("UCX_TLS");
  return {tls != nullptr && *tls != '\0' ? std::string("UCX_TLS=") + tls : "default"};
}

}  // namespace

std::vector<std::string> ucx_memory_type_names(std::uint64_t mask) {
  std::vector<std::string> out;
  for (int t = 0; t < UCS_MEMORY_TYPE_LAST; ++t) {
    if (mask & (std::uint64_t{1} << t)) out.emplace_back(ucs_memory_type_names[t]);
  }
  return out;
}

UcxProbe probe_ucx() {
  UcxProbe probe;
  probe.version = ucp_get_version_string();

  ucp_config_t* raw_config = nullptr;
  if (const ucs_status_t st = ucp_config_read(nullptr, nullptr, &raw_config); st != UCS_OK) {
    probe.note = std::string("ucp_config_read failed: ") + ucs_status_string(st);
    return probe;
  }
  const Config config(raw_config);

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_AM;
  ucp_context_h raw_context = nullptr;
  if (const ucs_status_t st = ucp_init(&params, config.get(), &raw_context); st != UCS_OK) {
    probe.note = std::string("ucp_init failed: ") + ucs_status_string(st);
    return probe;
  }
  const Context context(raw_context);  // destroyed before config: reverse order

  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (const ucs_status_t st = ucp_context_query(context.get(), &attr); st == UCS_OK) {
    probe.memory_type_mask = attr.memory_types;
    probe.memory_types = ucx_memory_type_names(attr.memory_types);
  } else {
    probe.note = std::string("ucp_context_query failed: ") + ucs_status_string(st);
  }

  probe.transports =
      parse_resources(capture([&](std::FILE* f) { ucp_context_print_info(context.get(), f); }));
  if (probe.transports.empty()) probe.transports = transports_from_env();
  return probe;
}

}  // namespace kvnode::transfer
