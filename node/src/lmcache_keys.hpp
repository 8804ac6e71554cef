// LMCache engine config keys (lmcache/v1/config.py, with its aliases and deprecated names):
// kvnode reads LMCache's YAML files as they are, so these keys are accepted even where kvnode has
// no use for them. node_config.cpp decides what an unknown key is (a typo, or a newer key).
#pragma once

#include <span>
#include <string_view>

namespace kvnode::node {

// Every LMCache key, those kvnode reads included.
std::span<const std::string_view> lmcache_engine_keys();

// An LMCache key, or one of its EC overrides (`ec:` mapping, `ec_<key>`), which LMCache also
// reads from the same file.
bool is_lmcache_engine_key(std::string_view key);

}  // namespace kvnode::node
