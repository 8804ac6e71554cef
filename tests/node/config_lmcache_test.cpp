// kvnode reads the LMCache engine files deployed today (review of issue 19 item 14): every key of
// every LMCache v1 release loads, LMCache's aliases of the keys kvnode reads set those settings,
// list-valued ports take LMCache's other spellings, and an unknown key is refused only when it
// looks like a typo (a key of a newer LMCache is ignored with a warning).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "kvnode/node/node_config.hpp"
#include "lmcache_keys.hpp"
#include "node_rig.hpp"
#include "support/child_process.hpp"

namespace kvnode::node {
namespace {

using namespace std::chrono_literals;

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

constexpr const char* kUrls =
    "controller_pull_url: 10.0.0.1:8300\ncontroller_reply_url: 10.0.0.1:8400\n";

ConfigOrExit loaded(const std::string& path) {
  auto r = load_node_config({"kvnode", "--config", path});
  if (!r) {
    ADD_FAILURE() << r.error().message;
    return {};
  }
  return *r;
}

std::string error_of(const std::string& path) {
  auto r = load_node_config({"kvnode", "--config", path});
  return r ? std::string("accepted") : r.error().message;
}

// Every key kvnode knows as LMCache's, at once; none is refused or warned about.
TEST(NodeConfigLmcache, AFileHoldingEveryLmcacheKeyLoads) {
  std::string text = kUrls;
  for (std::string_view key : lmcache_engine_keys())
    if (key != "controller_pull_url" && key != "controller_reply_url" && key != "controller_url")
      text += std::string(key) + ": ~\n";
  const ConfigOrExit c = loaded(write_file("kvnode_every_key.yaml", text));
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
}

// Keys of LMCache v1 releases before _CONFIG_DEFINITIONS (lookup_url, distributed_url,
// error_handling, blend_recompute_ratio): such a file exited 2.
TEST(NodeConfigLmcache, KeysOfEarlierReleasesLoad) {
  const ConfigOrExit c = loaded(write_file("kvnode_old_release.yaml", std::string(kUrls) + R"(
enable_p2p: true
lookup_url: "localhost:8100"
distributed_url: "localhost:8200"
error_handling: false
enable_blending: false
blend_recompute_ratio: 0.15
)"));
  ASSERT_TRUE(c.config);
  EXPECT_TRUE(c.warnings.empty());
}

TEST(NodeConfigLmcache, ATypoIsRefusedANewerKeyIsIgnoredWithOneWarning) {
  const std::string typo = write_file("kvnode_typo3.yaml", std::string(kUrls) + "lookup_ur: x\n");
  EXPECT_EQ(error_of(typo), typo + ": unknown key 'lookup_ur' (did you mean 'lookup_url'?)");
  const std::string own =
      write_file("kvnode_own.yaml", std::string(kUrls) + "kvnode_something_new: 1\n");
  EXPECT_EQ(error_of(own), own + ": unknown key 'kvnode_something_new'");
  const std::string newer =
      write_file("kvnode_newer.yaml",
                 std::string(kUrls) + "some_future_lmcache_feature: true\nchunk_size: 64\n");
  const ConfigOrExit c = loaded(newer);
  ASSERT_TRUE(c.config);
  EXPECT_EQ(c.config->chunk_size, 64u);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_EQ(c.warnings[0], newer +
                               ": unknown key 'some_future_lmcache_feature' ignored (not "
                               "kvnode's, nor LMCache's as far as kvnode knows)");
}

// LMCache maps controller_url to controller_pull_url and lmcache_worker_port to
// lmcache_worker_ports; kvnode ignored both (no controller; a random REP port).
TEST(NodeConfigLmcache, LmcacheAliasesSetTheSettingTheyName) {
  const ConfigOrExit c = loaded(write_file("kvnode_alias.yaml", R"(
controller_url: 10.0.0.1:8300
controller_reply_url: 10.0.0.1:8400
lmcache_worker_port: 8500
)"));
  ASSERT_TRUE(c.config);
  EXPECT_EQ(c.config->controller_pull_url, "10.0.0.1:8300");
  EXPECT_EQ(c.config->lmcache_worker_ports, std::vector<int>{8500});
  const ConfigOrExit same = loaded(write_file(
      "kvnode_alias_same.yaml", std::string(kUrls) +
                                    "controller_url: 10.0.0.1:8300\nlmcache_worker_port: 8500\n"
                                    "lmcache_worker_ports: [8500]\n"));
  EXPECT_TRUE(same.config) << "two spellings that agree load";
  const std::string both =
      write_file("kvnode_alias_both.yaml", std::string(kUrls) + "controller_url: 10.0.0.2:8300\n");
  EXPECT_EQ(error_of(both), both +
                                ": 'controller_pull_url' and 'controller_url' both set "
                                "controller_pull_url ('10.0.0.1:8300' and '10.0.0.2:8300'); "
                                "keep one");
}

// LMCache's _to_int_list: a list, one integer, or "a,b".
TEST(NodeConfigLmcache, PortListsTakeOneIntegerOrACommaSeparatedString) {
  const ConfigOrExit c = loaded(write_file(
      "kvnode_port_forms.yaml",
      std::string(kUrls) + "lmcache_worker_ports: 8500\np2p_init_ports: \"8200, 8201\"\n"));
  ASSERT_TRUE(c.config);
  EXPECT_EQ(c.config->lmcache_worker_ports, std::vector<int>{8500});
  EXPECT_EQ(c.config->p2p_init_ports, (std::vector<int>{8200, 8201}));
  const std::string bad =
      write_file("kvnode_port_bad.yaml", std::string(kUrls) + "p2p_init_ports: \"8200,x\"\n");
  EXPECT_EQ(error_of(bad), bad +
                               ": p2p_init_ports: expected a list of integers, one integer or "
                               "\"a,b\", got '8200,x'");
  auto flags = load_node_config({"kvnode", "--config", bad, "--p2p-init-ports", "8300,8301"});
  ASSERT_TRUE(flags) << flags.error().message;
  EXPECT_EQ(flags->config->p2p_init_ports, (std::vector<int>{8300, 8301}));
}

bool accepts_connections(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// The process: an LMCache file spelling the controller and the REP port by their aliases starts a
// node that serves on that port (it exited 2, and then bound a random port); the unknown key is
// warned about on stderr.
TEST(KvnodeProcess, AnLmcacheFileWithAliasesBindsTheNamedPort) {
  auto ctl = rig::start_controller();
  const std::vector<int> ports = rig::free_ports(2);
  const std::string yaml =
      write_file("kvnode_proc_alias.yaml",
                 "controller_url: 127.0.0.1:" + std::to_string(ctl->ports().pull) +
                     "\ncontroller_reply_url: 127.0.0.1:" + std::to_string(ctl->ports().reply) +
                     "\nlmcache_worker_port: " + std::to_string(ports[0]) + "\np2p_init_ports: \"" +
                     std::to_string(ports[1]) + "\"\nsome_future_lmcache_feature: 1\n");
  test::ChildProcess node({KVNODE_PATH, "--config", yaml, "--instance-id", "alias-node",
                           "--chunk-bytes", "65536", "--max-local-cpu-size", "0.01", "--http-port",
                           "-1", "--local-socket", "off", "--ucx-tls", "tcp", "--ucx-net-devices",
                           "lo"});
  EXPECT_TRUE(
      rig::eventually([&] { return !node.running() || accepts_connections(ports[0]); }, 30s));
  ASSERT_TRUE(node.running()) << node.describe_exit() << "\n" << node.output();
  EXPECT_TRUE(accepts_connections(ports[0])) << node.output();
  EXPECT_NE(node.output().find("kvnode: warning: " + yaml +
                               ": unknown key 'some_future_lmcache_feature' ignored"),
            std::string::npos)
      << node.output();
  EXPECT_EQ(node.stop(SIGTERM, 10s), 0) << node.output();
}

}  // namespace
}  // namespace kvnode::node
