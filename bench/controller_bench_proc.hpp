// Process plumbing for bench_controller: child processes guarded by RAII with a pipe back to the
// parent, CPU time and RSS from /proc, and percentiles.
#pragma once

#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace bench {

// Writes one trivially copyable value to the parent's end of the pipe.
template <class T>
void report(int fd, const T& value) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (::write(fd, &value, sizeof(T)) != static_cast<ssize_t>(sizeof(T)))
    throw std::system_error(errno, std::generic_category(), "write to parent");
}

constexpr int kAnyCpu = -1;

inline cpu_set_t only_cpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return set;
}

// Keeps the calling thread on one CPU while it lives, then lets it run where it ran before.
class PinnedThread {
 public:
  explicit PinnedThread(int cpu) {
    if (::sched_getaffinity(0, sizeof saved_, &saved_) != 0)
      throw std::system_error(errno, std::generic_category(), "sched_getaffinity");
    const cpu_set_t set = only_cpu(cpu);
    if (::sched_setaffinity(0, sizeof set, &set) != 0)
      throw std::system_error(errno, std::generic_category(), "sched_setaffinity");
  }
  PinnedThread(const PinnedThread&) = delete;
  PinnedThread& operator=(const PinnedThread&) = delete;
  ~PinnedThread() { ::sched_setaffinity(0, sizeof saved_, &saved_); }

 private:
  cpu_set_t saved_{};
};

// This program run again as `<self> --child ARGS... FD`, FD being the write end of a pipe to the
// parent. Exec, not a bare fork: a forked copy shares the parent's heap (hundreds of MB of
// pre-encoded frames) copy-on-write and pays a page fault on many of its writes, which a real
// kvcontroller never does. The destructor kills and reaps it on every path, exceptions included.
// `cpu`: the one CPU the child and all its threads run on, or kAnyCpu.
class Child {
 public:
  explicit Child(std::vector<std::string> args, int cpu = kAnyCpu) {
    const cpu_set_t cpus = only_cpu(cpu == kAnyCpu ? 0 : cpu);  // before fork: the child only execs
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0)
      throw std::system_error(errno, std::generic_category(), "pipe");
    args.insert(args.begin(), {"bench_controller", "--child"});
    args.push_back(std::to_string(fds[1]));
    std::vector<char*> argv;  // built before fork: the child only execs
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      throw std::system_error(errno, std::generic_category(), "fork");
    }
    if (pid_ == 0) {
      // Inherited by the exec'd program and every thread it starts. On failure the parent sees a
      // child that exited (receive() throws, running() is false) rather than an unpinned one.
      if (cpu != kAnyCpu && ::sched_setaffinity(0, sizeof cpus, &cpus) != 0) ::_exit(126);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // die with the bench even if it is killed -9
      ::fcntl(fds[1], F_SETFD, 0);         // only this end survives the exec
      ::execv("/proc/self/exe", argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    fd_ = fds[0];
  }
  Child(Child&& o) noexcept : pid_(std::exchange(o.pid_, -1)), fd_(std::exchange(o.fd_, -1)) {}
  Child& operator=(Child&&) = delete;
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }

  pid_t pid() const { return pid_; }
  // False once the child has exited (it is reaped then, so pid() no longer names it).
  bool running() {
    if (pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == pid_) pid_ = -1;
    return pid_ > 0;
  }

  // Blocks until the child reports a T; throws when it exits or stays silent past the timeout.
  template <class T>
  T receive(std::chrono::milliseconds timeout = std::chrono::seconds(120)) {
    pollfd p{fd_, POLLIN, 0};
    T value;
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1 ||
        ::read(fd_, &value, sizeof(T)) != static_cast<ssize_t>(sizeof(T)))
      throw std::runtime_error("child " + std::to_string(pid_) + " exited or went silent");
    return value;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
};

// utime + stime of a process in seconds (/proc/<pid>/stat fields 14 and 15); still readable
// after it exits, until it is reaped.
inline double cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));  // comm may contain spaces
  std::string skip;
  for (int i = 3; i < 14; ++i) fields >> skip;
  double utime = 0, stime = 0;
  fields >> utime >> stime;
  return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// CPU time of the calling thread: in-process timings that the machine's other load cannot inflate.
inline double thread_cpu_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

// Resident memory of this process; freed heap pages are handed back first so only live memory
// counts (glibc keeps freed blocks below its mmap threshold mapped).
inline std::size_t rss_bytes() {
  ::malloc_trim(0);
  std::ifstream in("/proc/self/statm");
  std::size_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

// Nearest-rank percentile, p in (0, 1].
inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::clamp<std::size_t>(rank, 1, v.size()) - 1];
}
inline double median(std::vector<double> v) {
  return percentile(std::move(v), 0.5);
}

}  // namespace bench
