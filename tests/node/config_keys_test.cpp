// kvnode's and kvctl's command lines and kvnode's YAML keys (issue 19, items 13 and 14): a key
// that is neither kvnode's nor LMCache's is refused with the nearest known one, LMCache's other
// keys still load, an unknown flag is named with a hint and the --help to read.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "kvnode/node/node_config.hpp"
#include "support/process.hpp"

namespace kvnode::node {
namespace {

using namespace std::chrono_literals;

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

std::string error_of(const std::vector<std::string>& argv) {
  auto r = load_node_config(argv);
  return r ? std::string("accepted") : r.error().message;
}

constexpr const char* kUrls =
    "controller_pull_url: 10.0.0.1:8300\ncontroller_reply_url: 10.0.0.1:8400\n";

TEST(NodeConfigKeys, AMisspeltKeyIsRefusedWithTheNearestKnownOne) {
  const std::string lmcache =
      write_file("kvnode_typo.yaml", std::string(kUrls) + "chunk_sise: 256\n");
  EXPECT_EQ(error_of({"kvnode", "--config", lmcache}),
            lmcache + ": unknown key 'chunk_sise' (did you mean 'chunk_size'?)");
  const std::string own =
      write_file("kvnode_typo2.yaml", std::string(kUrls) + "kvnode_chunk_byte: 1\n");
  EXPECT_EQ(error_of({"kvnode", "--config", own}),
            own + ": unknown key 'kvnode_chunk_byte' (did you mean 'kvnode_chunk_bytes'?)");
  const std::string far = write_file("kvnode_far.yaml", std::string(kUrls) + "kvnode_zzz: 1\n");
  EXPECT_EQ(error_of({"kvnode", "--config", far}), far + ": unknown key 'kvnode_zzz'");
  const std::string type = write_file("kvnode_type.yaml", std::string(kUrls) + "chunk_size: abc\n");
  EXPECT_EQ(error_of({"kvnode", "--config", type}),
            type + ": chunk_size: expected a non-negative integer, got 'abc'");
}

// An engine's LMCache file holds many keys kvnode has no use for: they still load.
TEST(NodeConfigKeys, LmcacheKeysKvnodeDoesNotUseStillLoad) {
  const std::string yaml = write_file("kvnode_lmcache_full.yaml", std::string(kUrls) + R"(
chunk_size: 256
local_cpu: true
max_local_cpu_size: 0.5
local_disk: "file:///tmp/lmcache/"
max_local_disk_size: 5
remote_url: "lm://localhost:65432"
remote_serde: naive
save_decode_cache: false
save_unfull_chunk: true
enable_controller: true
enable_p2p: true
p2p_lookup_ports: [8201]
lmcache_worker_heartbeat_delay_time: 10
transfer_channel: nixl
nixl_backends: [UCX]
nixl_buffer_device: cpu
controller_url: "10.0.0.1:8300"  # LMCache's alias of controller_pull_url: must agree
extra_config: {enable_nixl_storage: false, anything: [1, 2]}
ec_chunk_size: 128
ec: {max_local_cpu_size: 1}
lmcache_instance_id: full
)");
  auto r = load_node_config({"kvnode", "--config", yaml});
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->config->lmcache_instance_id, "full");
}

TEST(NodeConfigKeys, EverySettingHasAKeyAndAFlag) {
  const std::vector<SettingName> settings = node_settings();
  ASSERT_EQ(settings.size(), 33u)
      << "10 LMCache keys, 2 shared with kvcontroller (hash_generation, hash_init) and 21 kvnode_* "
         "keys";
  for (const SettingName& s : settings) {
    EXPECT_FALSE(s.key.empty());
    EXPECT_EQ(s.flag.rfind("--", 0), 0u) << s.key << ": " << s.flag;
  }
}

TEST(KvnodeProcess, UnknownFlagOrKeyExitsTwoNamingItAndTheHelp) {
  auto flag = test::run_process({KVNODE_PATH, "--chunk-sise", "3"}, "", 30s);
  EXPECT_EQ(flag.exit_code, 2);
  EXPECT_EQ(
      flag.err,
      "kvnode: unknown flag '--chunk-sise' (did you mean '--chunk-size'?); see kvnode --help\n");
  auto bogus = test::run_process({KVNODE_PATH, "--bogus"}, "", 30s);
  EXPECT_EQ(bogus.exit_code, 2);
  EXPECT_EQ(bogus.err, "kvnode: unknown flag '--bogus'; see kvnode --help\n");
  const std::string yaml =
      write_file("kvnode_proc_typo.yaml", std::string(kUrls) + "p2p_hots: x\n");
  auto key = test::run_process({KVNODE_PATH, "--config", yaml}, "", 30s);
  EXPECT_EQ(key.exit_code, 2);
  EXPECT_EQ(key.err, "kvnode: " + yaml + ": unknown key 'p2p_hots' (did you mean 'p2p_host'?)\n");
}

TEST(KvctlProcess, UnknownFlagIsNamedNotAMissingSubcommand) {
  auto top = test::run_process({KVCTL_PATH, "--bogus"}, "", 30s);
  EXPECT_EQ(top.exit_code, 2);
  EXPECT_EQ(top.err, "kvctl: unknown flag '--bogus'; see kvctl --help\n");
  auto before = test::run_process({KVCTL_PATH, "--verison", "workers"}, "", 30s);
  EXPECT_EQ(before.exit_code, 2);
  EXPECT_EQ(before.err,
            "kvctl: unknown flag '--verison' (did you mean '--version'?); see kvctl --help\n");
  auto sub = test::run_process({KVCTL_PATH, "lookup", "--tokns", "1"}, "", 30s);
  EXPECT_EQ(sub.exit_code, 2);
  EXPECT_EQ(sub.err,
            "kvctl: unknown flag '--tokns' (did you mean '--tokens'?); see kvctl lookup --help\n");
  auto nested = test::run_process({KVCTL_PATH, "keys", "hash", "--bogus"}, "", 30s);
  EXPECT_EQ(nested.exit_code, 2);
  EXPECT_EQ(nested.err, "kvctl: unknown flag '--bogus'; see kvctl keys hash --help\n");
  auto missing = test::run_process({KVCTL_PATH}, "", 30s);
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_EQ(missing.err, "kvctl: A subcommand is required; see kvctl --help\n");
}

}  // namespace
}  // namespace kvnode::node
