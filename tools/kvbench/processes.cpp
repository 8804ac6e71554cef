#include "processes.hpp"

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

extern char** environ;

namespace kvnode::bench {

Child::Child(std::vector<std::string> argv, const std::vector<std::string>* env) {
  std::vector<std::string> env_copy = env ? *env : std::vector<std::string>{};
  std::vector<char*> args, envp;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  for (std::string& e : env_copy) envp.push_back(e.data());
  envp.push_back(nullptr);
  if (args.size() < 2 ||
      posix_spawn(&pid_, args[0], nullptr, nullptr, args.data(), env ? envp.data() : environ) != 0)
    pid_ = -1;
}

Child::~Child() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  ::kill(pid_, SIGCONT);
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
       std::chrono::steady_clock::now() < until;
       std::this_thread::sleep_for(std::chrono::milliseconds(10)))
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
  ::kill(pid_, SIGKILL);  // stuck: it must not hang kvbench
  ::waitpid(pid_, nullptr, 0);
}

bool Child::alive() {
  if (pid_ <= 0) return false;
  if (::waitpid(pid_, nullptr, WNOHANG) == 0) return true;
  pid_ = -1;
  return false;
}

std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  std::uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = q * static_cast<double>(v.size() - 1) + 0.5;
  return v[std::min(v.size() - 1, static_cast<std::size_t>(rank))];
}

}  // namespace kvnode::bench
