// The demo's flow as a test, all real processes: kvcontroller, two kvnode, and kvctl for every
// step (put through node A's local socket, lookup, move through the controller, lookup, verify
// every byte at B), with copy=false and copy=true, over tcp, over UCX's default transports, and
// same-host (A maps B's pool and copies).
#include <gtest/gtest.h>
#include <unistd.h>

#include "node_rig.hpp"
#include "support/child_process.hpp"
#include "support/process.hpp"

namespace kvnode::node {
namespace {

using namespace rig;

struct FlowCase {
  const char* name;
  const char* tls;  // nullptr: UCX's default
  bool copy;
  bool same_host = false;  // --same-host auto (else off: UCX carries every move)
};

class CliFlowTest : public ::testing::TestWithParam<FlowCase> {};

TEST_P(CliFlowTest, PutLookupMoveLookupVerify) {
  const FlowCase& p = GetParam();
  const std::string tag = std::to_string(getpid()) + "-" + p.name;
  const int http = free_port(), pull = free_port(), reply = free_port(), hb = free_port();
  const int a_http = p.same_host ? free_port() : -1;  // A's /metrics, for its same-host bytes
  test::ChildProcess controller({KVCONTROLLER_PATH, "--host", "127.0.0.1", "--port",
                                 std::to_string(http), "--chunk-size", "16", "--monitor-ports",
                                 "{\"pull\": " + std::to_string(pull) +
                                     ", \"reply\": " + std::to_string(reply) +
                                     ", \"heartbeat\": " + std::to_string(hb) + "}"});
  auto node = [&](const std::string& name, int http_port) {
    std::vector<std::string> args = {KVNODE_PATH,
                                     "--instance-id",
                                     name + "-" + tag,
                                     "--controller-pull-url",
                                     "127.0.0.1:" + std::to_string(pull),
                                     "--controller-reply-url",
                                     "127.0.0.1:" + std::to_string(reply),
                                     "--chunk-bytes",
                                     "262144",
                                     "--chunk-size",
                                     "16",
                                     "--max-local-cpu-size",
                                     "0.01",
                                     "--heartbeat-time",
                                     "0.5",
                                     "--full-sync-startup-delay",
                                     "0",
                                     "--http-port",
                                     std::to_string(http_port),
                                     "--local-socket",
                                     "/tmp/kvnode-flow-" + name + "-" + tag + ".sock",
                                     "--local-staging-mb",
                                     "1",
                                     "--same-host",
                                     p.same_host ? "auto" : "off"};
    if (p.tls) args.insert(args.end(), {"--ucx-tls", p.tls, "--ucx-net-devices", "lo"});
    return std::make_unique<test::ChildProcess>(args);
  };
  auto a = node("A", a_http);
  auto b = node("B", -1);
  const std::string a_id = "A-" + tag, b_id = "B-" + tag;
  const std::string ctl = "127.0.0.1:" + std::to_string(http);
  const std::string tokens = "0:320";  // 20 chunks of 16 tokens, 5 MiB
  auto kvctl = [](std::vector<std::string> args) {
    args.insert(args.begin(), KVCTL_PATH);
    return test::run_process(args, {}, std::chrono::seconds(60));
  };
  auto lookup_names = [&](const std::string& who) {
    return eventually(
        [&] {
          auto r = kvctl({"lookup", "--controller", ctl, "--token-range", tokens});
          return r.exit_code == 0 &&
                 r.out.find(who + "  LocalCPUBackend  320 tokens") != std::string::npos;
        },
        30s);
  };

  const std::string sock_a = "/tmp/kvnode-flow-A-" + tag + ".sock",
                    sock_b = "/tmp/kvnode-flow-B-" + tag + ".sock";
  ASSERT_TRUE(eventually(
      [&] { return access(sock_a.c_str(), F_OK) == 0 && access(sock_b.c_str(), F_OK) == 0; }, 30s))
      << a->output() << b->output();
  // Both registered: a move to an instance the controller does not know yet is a 404.
  ASSERT_TRUE(eventually(
      [&] {
        const auto r = kvctl({"workers", "--controller", ctl, "--json"});
        return r.out.find('"' + a_id + '"') != std::string::npos &&
               r.out.find('"' + b_id + '"') != std::string::npos;
      },
      30s))
      << controller.output();
  auto put = kvctl({"put", "--node", sock_a, "--token-range", tokens, "--seed", "9"});
  ASSERT_EQ(put.exit_code, 0) << put.out << put.err;
  EXPECT_NE(put.out.find("stored 20 chunks"), std::string::npos) << put.out;
  ASSERT_TRUE(lookup_names(a_id)) << controller.output();

  // Same-host: A maps B's pool once its first session with B opens (a warm-up move of one other
  // chunk opens it); the move below then copies through the mapping.
  const std::string same_host_bytes = "kvnode_transfer_same_host_bytes_total";
  double mapped_before = 0;
  if (p.same_host) {
    auto warm = kvctl({"put", "--node", sock_a, "--token-range", "100000:100016"});
    ASSERT_EQ(warm.exit_code, 0) << warm.out << warm.err;
    warm = kvctl({"move", "--controller", ctl, "--from", a_id, "--to", b_id, "--token-range",
                  "100000:100016", "--copy"});
    ASSERT_EQ(warm.exit_code, 0) << warm.out << warm.err << a->output();
    ASSERT_TRUE(eventually([&] {
      return a->output().find("copy through its mapped pool") != std::string::npos;
    })) << a->output();
    mapped_before = node_metric(a_http, same_host_bytes);
    ASSERT_GE(mapped_before, 0) << "A's /metrics has no " << same_host_bytes;
  }

  std::vector<std::string> move = {"move", "--controller",  ctl,    "--from", a_id, "--to",
                                   b_id,   "--token-range", tokens, "--json"};
  if (p.copy) move.push_back("--copy");
  auto moved = kvctl(move);
  ASSERT_EQ(moved.exit_code, 0) << moved.out << moved.err << a->output();
  EXPECT_NE(moved.out.find("\"num_tokens\":320"), std::string::npos) << moved.out;
  if (p.same_host) {
    EXPECT_GE(node_metric(a_http, same_host_bytes) - mapped_before, 20.0 * 262144)
        << "the move copied through B's mapped pool";
  }
  ASSERT_TRUE(lookup_names(b_id));

  auto verify_b = kvctl({"verify", "--node", sock_b, "--token-range", tokens, "--seed", "9"});
  EXPECT_EQ(verify_b.exit_code, 0) << verify_b.out << verify_b.err;
  EXPECT_NE(verify_b.out.find("verified 20 of 20 chunks"), std::string::npos) << verify_b.out;
  // The wrong seed is caught: verify can fail.
  auto wrong = kvctl({"verify", "--node", sock_b, "--token-range", tokens, "--seed", "10"});
  EXPECT_EQ(wrong.exit_code, 1) << wrong.out;
  EXPECT_NE(wrong.out.find("20 mismatched"), std::string::npos) << wrong.out;

  // copy=true keeps A's chunks; copy=false leaves A none of them, at once or, when the move fell
  // into A's first full sync (a fresh controller asks every worker for one), when that sync ends.
  if (p.copy) {
    auto at_a = kvctl({"get", "--node", sock_a, "--token-range", tokens});
    EXPECT_EQ(at_a.exit_code, 0) << at_a.out << at_a.err;
    EXPECT_NE(at_a.out.find("read 20 of 20"), std::string::npos) << at_a.out;
  } else {
    test::ProcessResult at_a;
    EXPECT_TRUE(eventually(
        [&] {
          at_a = kvctl({"get", "--node", sock_a, "--token-range", tokens});
          return at_a.exit_code == 1 && at_a.out.find("read 0 of 20") != std::string::npos;
        },
        30s))
        << at_a.out << a->output();
  }
  // Bad input to kvctl: exit 2 with the reason.
  auto bad = kvctl({"put", "--node", sock_a, "--token-range", "9:1"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--token-range"), std::string::npos) << bad.err;
}

INSTANTIATE_TEST_SUITE_P(Transports, CliFlowTest,
                         ::testing::Values(FlowCase{"tcp_move", "tcp", false},
                                           FlowCase{"tcp_copy", "tcp", true},
                                           FlowCase{"default_move", nullptr, false},
                                           FlowCase{"default_copy", nullptr, true},
                                           FlowCase{"same_host_move", nullptr, false, true},
                                           FlowCase{"same_host_copy", nullptr, true, true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kvnode::node
