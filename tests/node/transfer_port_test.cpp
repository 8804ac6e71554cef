// A kvnode's transfer port (p2p_init_port) against clients that are not peers, all real
// processes: junk and silent connections, with the node short of descriptors, cost nothing that
// lasts and the node keeps serving moves; a port that is taken stops the start with a message
// that says so.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "node_process.hpp"
#include "node_rig.hpp"
#include "support/child_process.hpp"
#include "support/process.hpp"
#include "support/tcp_client.hpp"

namespace kvnode::node {
namespace {

using namespace rig;
using proc::kvctl;

// The pid of the running process whose command line holds `word` (the test's unique instance
// id), or -1.
int pid_with(const std::string& word) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline", std::ios::binary);
    const std::string cmdline((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
    if (cmdline.find(KVNODE_PATH) != std::string::npos && cmdline.find(word) != std::string::npos)
      return std::stoi(name);
  }
  return -1;
}

std::size_t descriptors(int pid) {
  std::error_code ec;
  std::size_t n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

// Accepted or waiting connections at local `port` (ESTABLISHED or CLOSE-WAIT, IPv4): what a
// listener holds or has yet to take off its backlog.
std::size_t connections_at(int port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // the header
  std::size_t n = 0;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    const int local_port = std::stoi(local.substr(local.find(':') + 1), nullptr, 16);
    if (local_port == port && (state == "01" || state == "08")) ++n;
  }
  return n;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The probe, scaled to a test: the receiving node runs with 80 descriptors (about 35 in
// use once started), 300 clients send 4 KiB of random bytes and close, then 100 connect and say
// nothing (more than the node has descriptors for; a node whose descriptors all went would
// fail elsewhere, in ZeroMQ). Before the plane owned its listening socket, UCX's listener kept junk
// connections in CLOSE-WAIT, logged an error per accept() retry once the descriptors ran out, and
// the node could no longer take a move.
TEST(TransferPort, JunkAndDescriptorExhaustionLeaveNothingBehindAndMovesStillWork) {
  const std::vector<int> ports = free_ports(4);
  const int http = ports[0], pull = ports[1], reply = ports[2], hb = ports[3];
  test::ChildProcess controller({KVCONTROLLER_PATH, "--host", "127.0.0.1", "--port",
                                 std::to_string(http), "--chunk-size", "16", "--monitor-ports",
                                 "{\"pull\": " + std::to_string(pull) +
                                     ", \"reply\": " + std::to_string(reply) +
                                     ", \"heartbeat\": " + std::to_string(hb) + "}"});
  proc::NodeProcess a("A", pull, reply);
  proc::NodeProcessOptions limited;
  limited.launcher = {"/usr/bin/prlimit", "--nofile=80:80", "--"};
  proc::NodeProcess b("B", pull, reply, limited);
  const std::string a_id = a.instance(), b_id = b.instance();
  const std::string sock_a = a.socket(), sock_b = b.socket();
  const int b_port = b.p2p_port();
  const std::string ctl = "127.0.0.1:" + std::to_string(http);
  ASSERT_TRUE(a.up()) << a.log();
  ASSERT_TRUE(b.up()) << b.log();
  ASSERT_TRUE(eventually(
      [&] {
        const auto r = kvctl({"workers", "--controller", ctl, "--json"});
        return r.out.find('"' + a_id + '"') != std::string::npos &&
               r.out.find('"' + b_id + '"') != std::string::npos;
      },
      30s))
      << controller.output();
  const int b_pid = pid_with(b_id);
  ASSERT_GT(b_pid, 0);
  // Settled: registered and its first full sync done, so the agent's request socket to the
  // controller (opened by the sync, kept for later calls) is counted. A little slack for UCX and
  // ZeroMQ.
  ASSERT_TRUE(eventually(
      [&] {
        const std::string log = b.log();
        const auto sync = log.find("worker agent: full sync ");
        return sync != std::string::npos && log.find(" done", sync) != std::string::npos;
      },
      30s))
      << b.log();
  const std::size_t baseline = descriptors(b_pid) + 2;

  std::mt19937 random(11);
  std::vector<std::byte> junk(4096);
  for (int i = 0; i < 300; ++i) {
    for (std::byte& byte : junk) byte = static_cast<std::byte>(random());
    const int fd = test::connect_loopback(b_port);
    if (fd < 0) continue;
    (void)::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    ::close(fd);
  }
  // A junk connection is closed and forgotten.
  EXPECT_TRUE(eventually([&] { return connections_at(b_port) == 0; }, 20s))
      << connections_at(b_port) << " connections left at the transfer port after the junk";
  EXPECT_LE(descriptors(b_pid), baseline);
  std::vector<int> silent;
  for (int i = 0; i < 100; ++i)
    if (const int fd = test::connect_loopback(b_port); fd >= 0) silent.push_back(fd);
  // The listener keeps its share of the descriptors (a quarter: 20) and refuses the rest.
  EXPECT_TRUE(eventually(
      [&] { return b.log().find("transfer listener: refused") != std::string::npos; }, 20s))
      << b.log();
  ASSERT_TRUE(b.running()) << b.describe_exit() << "\n" << b.log();
  for (int fd : silent) ::close(fd);
  // What they cost comes back (the node's other sockets may have come and gone meanwhile).
  EXPECT_TRUE(eventually([&] { return connections_at(b_port) == 0; }, 20s))
      << connections_at(b_port) << " connections left at the transfer port\n"
      << b.log();
  EXPECT_LE(descriptors(b_pid), baseline + 8);

  // The node still takes a move, and holds every byte of it.
  const std::string tokens = "0:160";
  auto put = kvctl({"put", "--node", sock_a, "--token-range", tokens, "--seed", "5"});
  ASSERT_EQ(put.exit_code, 0) << put.out << put.err;
  ASSERT_TRUE(eventually(
      [&] {
        const auto r = kvctl({"lookup", "--controller", ctl, "--token-range", tokens});
        return r.out.find(a_id + "  LocalCPUBackend  160 tokens") != std::string::npos;
      },
      30s));
  auto moved = kvctl({"move", "--controller", ctl, "--from", a_id, "--to", b_id, "--token-range",
                      tokens, "--copy", "--json"});
  ASSERT_EQ(moved.exit_code, 0) << moved.out << moved.err << b.log();
  EXPECT_NE(moved.out.find("\"num_tokens\":160"), std::string::npos) << moved.out << b.log();
  auto verify = kvctl({"verify", "--node", sock_b, "--token-range", tokens, "--seed", "5"});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;

  // Degraded, not flooded: a few lines said what happened, none came from UCX's listener.
  ASSERT_TRUE(b.running()) << b.describe_exit() << "\n" << b.log();
  const std::string log = b.log();
  EXPECT_EQ(count(log, "accept() failed"), 0u) << log.substr(0, 4000);
  EXPECT_LE(count(log, "transfer listener:"), 6u) << log;
}

TEST(TransferPort, APortInUseStopsTheStartAndSaysSo) {
  const int holder = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::bind(holder, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(holder, 4), 0);
  ASSERT_EQ(::getsockname(holder, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string port = std::to_string(ntohs(a.sin_port));
  const test::ProcessResult r = test::run_process({KVNODE_PATH,
                                                   "--instance-id",
                                                   "port-taken-" + std::to_string(getpid()),
                                                   "--controller-pull-url",
                                                   "127.0.0.1:1",
                                                   "--controller-reply-url",
                                                   "127.0.0.1:2",
                                                   "--p2p-host",
                                                   "127.0.0.1",
                                                   "--p2p-init-ports",
                                                   port,
                                                   "--chunk-bytes",
                                                   "262144",
                                                   "--max-local-cpu-size",
                                                   "0.01",
                                                   "--http-port",
                                                   "-1",
                                                   "--local-socket",
                                                   "off",
                                                   "--ucx-tls",
                                                   "tcp",
                                                   "--ucx-net-devices",
                                                   "lo"},
                                                  {}, std::chrono::seconds(30));
  ::close(holder);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("cannot listen at 127.0.0.1:" + port + ": port in use"),
            std::string::npos)
      << r.out << r.err;
}

}  // namespace
}  // namespace kvnode::node
