// What kvbench's parts share to run their peers: child processes that are stopped and reaped when
// their handle goes, free loopback ports, and percentiles.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kvnode::bench {

// A child process started from argv (argv[0] a path) with `env` (nullptr: this process's
// environment); SIGTERM'd (SIGKILL after 5 s) and reaped when the handle goes.
class Child {
 public:
  explicit Child(std::vector<std::string> argv, const std::vector<std::string>* env = nullptr);
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child();
  bool started() const { return pid_ > 0; }
  bool alive();  // false once it exited (then reaped)

 private:
  pid_t pid_ = -1;
};

// A TCP port on 127.0.0.1 that was free a moment ago (0 when none could be found).
std::uint16_t free_port();

// The q-quantile (0..1, nearest rank) of `v`; 0 when empty.
double percentile(std::vector<double> v, double q);
inline double median(std::vector<double> v) {
  return percentile(std::move(v), 0.5);
}

}  // namespace kvnode::bench
