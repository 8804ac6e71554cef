// A GPU test that needs a second process (CUDA IPC handles cannot be opened by the process that
// made them) runs one of its own binary's tests as a child: spawned from /proc/self/exe with a
// gtest filter and a marker in its environment, talking over two pipes the child finds at fixed
// descriptors. The parent's side is RAII: a test that fails half-way closes the child's pipe,
// which ends its wait, and reaps it.
#pragma once

#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/common/unique_fd.hpp"

extern char** environ;

namespace kvnode::gpu::test {

inline constexpr int kToParentFd = 100;  // where the child finds its ends of the two pipes
inline constexpr int kFromParentFd = 101;

inline bool write_all(int fd, const void* p, std::size_t n) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, b, n);
    if (w <= 0) return false;
    b += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

// Reads n bytes, giving up after `timeout_ms` without any (a hung child fails the test).
inline bool read_all(int fd, void* p, std::size_t n, int timeout_ms) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, timeout_ms) <= 0) return false;
    const ssize_t r = ::read(fd, b, n);
    if (r <= 0) return false;
    b += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

// The child process and the parent's ends of its pipes.
struct SelfChild {
  pid_t pid = -1;
  UniqueFd from_child, to_child;
  SelfChild() = default;
  SelfChild(SelfChild&& o) noexcept
      : pid(std::exchange(o.pid, -1)),
        from_child(std::move(o.from_child)),
        to_child(std::move(o.to_child)) {}
  SelfChild& operator=(SelfChild&&) = delete;
  ~SelfChild() {
    to_child.reset();
    if (pid > 0) ::waitpid(pid, nullptr, 0);
  }
  int wait() {
    int status = 0;
    ::waitpid(std::exchange(pid, -1), &status, 0);
    return status;
  }
};

// Runs this binary's tests matching `gtest_filter` as a child with `env_marker`=1 set.
inline Result<SelfChild> spawn_self_child(const std::string& gtest_filter, const char* env_marker) {
  int up[2], down[2];
  if (::pipe2(up, O_CLOEXEC) != 0) return make_error(ErrorCode::kIo, "pipe2 failed");
  const UniqueFd child_up(up[1]);
  SelfChild child;
  child.from_child.reset(up[0]);
  if (::pipe2(down, O_CLOEXEC) != 0) return make_error(ErrorCode::kIo, "pipe2 failed");
  const UniqueFd child_down(down[0]);
  child.to_child.reset(down[1]);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, child_up.get(), kToParentFd);
  posix_spawn_file_actions_adddup2(&actions, child_down.get(), kFromParentFd);
  posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);  // keep ctest's log
  std::string filter = "--gtest_filter=" + gtest_filter;
  std::string exe = "/proc/self/exe";
  std::vector<char*> argv{exe.data(), filter.data(), nullptr};
  std::string marker = std::string(env_marker) + "=1";
  std::vector<char*> env{marker.data()};
  for (char** e = environ; *e != nullptr; ++e)  // GTEST_OUTPUT would overwrite the parent's
    if (std::strncmp(*e, "GTEST_", 6) != 0) env.push_back(*e);
  env.push_back(nullptr);
  const int rc = posix_spawn(&child.pid, exe.c_str(), &actions, nullptr, argv.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    child.pid = -1;
    return make_error(ErrorCode::kIo, std::string("posix_spawn: ") + std::strerror(rc));
  }
  return child;
}

}  // namespace kvnode::gpu::test
