// The local socket out of descriptors, with a real kvnode under a low RLIMIT_NOFILE: clients that
// connect past the limit wait in the backlog and accepting pauses, with one warning per 10 s (not
// one per 100 ms tick, as before: 10 lines a second for as long as the backlog held a
// connection), and once descriptors are free again the waiting clients are served.
#include <sys/socket.h>
#include <sys/un.h>

#include <regex>

#include "node_process.hpp"

namespace kvnode::node {
namespace {

using namespace proc;

int connect_to(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(LocalSocketEmfile, OutOfDescriptorsItWarnsOncePerPeriodAndServesAgainAfter) {
  auto ctl = start_controller();
  NodeProcessOptions limited;
  limited.launcher = {"/usr/bin/prlimit", "--nofile=80:80", "--"};
  NodeProcess node("emfile", ctl->ports().pull, ctl->ports().reply, limited);
  ASSERT_TRUE(node.up()) << node.log();
  // More connections than the node has descriptors left: the last ones wait in the backlog.
  std::vector<int> held;
  for (int i = 0; i < 110; ++i)
    if (const int fd = connect_to(node.socket()); fd >= 0) held.push_back(fd);
  ASSERT_GT(held.size(), 80u) << "the backlog takes the rest";
  std::this_thread::sleep_for(3s);  // 30 ticks out of descriptors
  const std::string log = node.log();
  const std::size_t warnings = count(log, "local socket: accept: ");
  EXPECT_GE(warnings, 1u) << log;
  EXPECT_LE(warnings, 2u) << "one per 10 s, not one per tick\n" << log;
  for (int fd : held) ::close(fd);
  // Served again: kvctl reaches it.
  test::ProcessResult put;
  EXPECT_TRUE(eventually(
      [&] {
        put = kvctl({"put", "--node", node.socket(), "--token-range", "0:64", "--seed", "1"});
        return put.exit_code == 0;
      },
      20s))
      << put.out << put.err << node.log();
  EXPECT_TRUE(node.running()) << node.describe_exit();
}

}  // namespace
}  // namespace kvnode::node
