// Issue 19 items 9 and 13: kvctl against a node's local socket that it cannot use says why at
// once (it used to wait 15 s for an 'info' answer): the file does not exist, the socket is
// owner-only and we are someone else, nothing listens on it, the path is not a socket.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>

namespace kvnode::node {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct KvctlRun {
  int exit_code = -1;
  std::string output;
  Clock::duration took{};
};

// Runs `kvctl get --node path` (as `uid` when set) and collects what it says.
KvctlRun kvctl_get(const std::string& path, std::optional<uid_t> uid = std::nullopt) {
  int pipe_fds[2];
  EXPECT_EQ(::pipe(pipe_fds), 0);
  const auto start = Clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipe_fds[1], 1);
    ::dup2(pipe_fds[1], 2);
    ::close(pipe_fds[0]);
    if (uid && (::setgid(*uid) != 0 || ::setuid(*uid) != 0)) ::_exit(99);
    ::execl(KVCTL_PATH, "kvctl", "get", "--node", path.c_str(), "--token-range", "0:256",
            static_cast<char*>(nullptr));
    ::_exit(98);
  }
  ::close(pipe_fds[1]);
  KvctlRun r;
  char buf[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) > 0;)
    r.output.append(buf, static_cast<std::size_t>(n));
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.took = Clock::now() - start;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// A listening unix socket with the node's permissions (owner-only), removed at the end.
class OwnerOnlySocket {
 public:
  explicit OwnerOnlySocket(std::string path) : path_(std::move(path)) {
    ::unlink(path_.c_str());
    fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path_.c_str(), sizeof(a.sun_path) - 1);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd_, 4), 0);
    EXPECT_EQ(::chmod(path_.c_str(), 0600), 0);
  }
  ~OwnerOnlySocket() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  void stop_listening() {
    ::close(fd_);
    fd_ = -1;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

TEST(LocalSocketErrors, AMissingSocketFileIsSaidAtOnce) {
  const std::string path = "/tmp/kvnode-missing-" + std::to_string(::getpid()) + ".sock";
  const KvctlRun r = kvctl_get(path);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("no kvnode local socket at " + path + ": the file does not exist"),
            std::string::npos)
      << r.output;
  EXPECT_LT(r.took, 5s);
}

TEST(LocalSocketErrors, AnotherUserIsToldTheSocketIsOwnerOnly) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  const std::string path = "/tmp/kvnode-owner-only-" + std::to_string(::getpid()) + ".sock";
  OwnerOnlySocket socket(path);
  const KvctlRun r = kvctl_get(path, 65534);  // nobody
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(
      r.output.find("permission denied on " + path + " (the socket is owner-only: run as root)"),
      std::string::npos)
      << r.output;
  EXPECT_LT(r.took, 5s);
}

TEST(LocalSocketErrors, AStaleSocketFileIsSaidAtOnce) {
  const std::string path = "/tmp/kvnode-stale-" + std::to_string(::getpid()) + ".sock";
  OwnerOnlySocket socket(path);
  socket.stop_listening();
  const KvctlRun r = kvctl_get(path);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("nothing listens on " + path), std::string::npos) << r.output;
  EXPECT_LT(r.took, 5s);
}

TEST(LocalSocketErrors, APathThatIsNoSocketIsSaidAtOnce) {
  const std::string path = "/tmp/kvnode-not-a-socket-" + std::to_string(::getpid()) + ".sock";
  std::ofstream(path) << "a file";
  const KvctlRun r = kvctl_get(path);
  ::unlink(path.c_str());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(path + " is not a socket"), std::string::npos) << r.output;
  EXPECT_LT(r.took, 5s);
}

}  // namespace
}  // namespace kvnode::node
