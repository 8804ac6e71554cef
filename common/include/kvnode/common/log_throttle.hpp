// One log line a period for a flood of one kind (a peer sending bad requests, a listener out of
// descriptors): pass() says whether to write the line now and how many events it stands for (this
// one and those kept quiet since the last line). The first event always passes.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <utility>

namespace kvnode {

class LogThrottle {
 public:
  using Clock = std::chrono::steady_clock;
  explicit LogThrottle(Clock::duration period) : period_(period) {}
  // 0: stay quiet. Not thread-safe (the caller's lock or thread).
  std::size_t pass(Clock::time_point now) {
    ++quiet_;
    if (last_ && now - *last_ < period_) return 0;
    last_ = now;
    return std::exchange(quiet_, 0);
  }

 private:
  Clock::duration period_;
  std::optional<Clock::time_point> last_{};
  std::size_t quiet_ = 0;
};

}  // namespace kvnode
