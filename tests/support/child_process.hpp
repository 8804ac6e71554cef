// Test support: a long-running child process (a server under test) with its output in a file.
// The destructor stops and reaps a child that is still running (SIGTERM, so a daemon removes its
// socket files and shared memory; SIGKILL after 5 s), so a failed assertion or an exception never
// leaves a stray process behind.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace kvnode::test {

class ChildProcess {
 public:
  // Starts argv[0] (a path) with stdin from /dev/null and stdout+stderr into one log file.
  explicit ChildProcess(const std::vector<std::string>& argv) {
    char dir_template[] = "/tmp/kvnode-child-XXXXXX";
    if (mkdtemp(dir_template) == nullptr) return;
    dir_ = dir_template;
    log_path_ = dir_ + "/output";

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = -1;
    if (posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ) == 0) pid_ = pid;
    posix_spawn_file_actions_destroy(&actions);
  }

  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  ~ChildProcess() {
    if (running()) {
      kill(pid_, SIGCONT);  // a stopped child must run to exit
      (void)stop(SIGTERM, std::chrono::seconds(5));
    }
    if (!log_path_.empty()) unlink(log_path_.c_str());
    if (!dir_.empty()) rmdir(dir_.c_str());
  }

  bool started() const { return pid_ > 0 || exit_status_.has_value(); }
  pid_t pid() const { return pid_; }
  // Sends a signal (SIGSTOP, SIGCONT, ...) to a child that is still running.
  void signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }

  // True while the child runs; reaps it (keeping its status) once it has exited.
  bool running() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_status_ = status;
      pid_ = -1;
    }
    return pid_ > 0;
  }

  // Sends `signal` and waits up to `timeout` for the exit. Returns the exit code, or nullopt when
  // the child did not exit in time (it is then killed) or died from a signal.
  std::optional<int> stop(int signal, std::chrono::milliseconds timeout) {
    if (running()) kill(pid_, signal);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (running() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (running()) {
      kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
      pid_ = -1;
      return std::nullopt;
    }
    if (exit_status_ && WIFEXITED(*exit_status_)) return WEXITSTATUS(*exit_status_);
    return std::nullopt;
  }

  // How the child ended, in words (for failure messages); empty while it runs.
  std::string describe_exit() {
    if (running() || !exit_status_) return {};
    if (WIFEXITED(*exit_status_))
      return "exited with code " + std::to_string(WEXITSTATUS(*exit_status_));
    if (WIFSIGNALED(*exit_status_))
      return "killed by signal " + std::to_string(WTERMSIG(*exit_status_));
    return "ended with status " + std::to_string(*exit_status_);
  }

  std::string output() const {
    std::ifstream in(log_path_, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_status_;
  std::string dir_;
  std::string log_path_;
};

}  // namespace kvnode::test
