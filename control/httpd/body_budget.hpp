// The in-flight body budget of kvnode::httpd: bytes of the buffers that hold request bodies being
// read, charged as each buffer grows with the bytes that arrive and returned as it is freed, so a
// client holds about what it sent, not what it declared. When the budget is short, a body that
// needs more waits for others to give some back, and when every body holding budget is waiting,
// the youngest is refused (503) and gives its share back: a burst of large bodies serves the
// first ones whole instead of refusing all of them halfway. No wait lasts beyond its deadline; a
// new body never waits (503 at once).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <set>

namespace kvnode::httpd {

// One request's part of the budget.
struct BodyShare {
  std::size_t bytes = 0;
  std::uint64_t ticket = 0;  // its place in line while it holds bytes; 0: none
};

class BodyBudget {
 public:
  using Clock = std::chrono::steady_clock;

  // `limit` is read at each call (the server may adjust its limits before it starts); 0: the
  // bytes are counted and never refused.
  explicit BodyBudget(const std::size_t& limit) : limit_(limit) {}

  // Adds `bytes` to `share`; false: refused. Short of budget, a share that already holds bytes
  // waits until `wait_until` at most.
  bool charge(BodyShare& share, std::size_t bytes, Clock::time_point wait_until) {
    std::unique_lock lock(mutex_);
    if (fits(bytes)) return take(share, bytes);
    if (share.ticket == 0 || share.bytes + bytes > limit_) return false;
    waiting_[share.ticket] = false;
    for (;;) {
      const auto me = waiting_.find(share.ticket);
      if (me->second) return leave(me);
      if (fits(bytes)) {
        waiting_.erase(me);
        return take(share, bytes);
      }
      const auto youngest = std::prev(waiting_.end());
      if (waiting_.size() == line_.size() && !youngest->second) {
        // Every holder waits for another: the youngest is refused and gives its share back.
        youngest->second = true;
        freed_.notify_all();
        continue;
      }
      if (freed_.wait_until(lock, wait_until) == std::cv_status::timeout)
        return leave(waiting_.find(share.ticket));
    }
  }

  void release(BodyShare& share, std::size_t bytes) {
    bytes = std::min(bytes, share.bytes);
    if (bytes == 0) return;
    {
      std::lock_guard lock(mutex_);
      used_ -= bytes;
      share.bytes -= bytes;
      if (share.bytes == 0) {
        line_.erase(share.ticket);
        share.ticket = 0;
      }
    }
    freed_.notify_all();
  }

  std::size_t used() const {
    std::lock_guard lock(mutex_);
    return used_;
  }

 private:
  using Waiting = std::map<std::uint64_t, bool>;  // ticket -> refused; oldest first

  bool fits(std::size_t bytes) const { return limit_ == 0 || used_ + bytes <= limit_; }

  bool take(BodyShare& share, std::size_t bytes) {
    used_ += bytes;
    share.bytes += bytes;
    if (share.ticket == 0 && share.bytes > 0) {
      share.ticket = ++last_ticket_;
      line_.insert(share.ticket);
    }
    return true;
  }

  // A waiter gives up (refused or out of time); the caller releases its share.
  bool leave(Waiting::iterator me) {
    waiting_.erase(me);
    freed_.notify_all();  // the line has moved
    return false;
  }

  const std::size_t& limit_;
  mutable std::mutex mutex_;
  std::condition_variable freed_;
  std::size_t used_ = 0;
  std::set<std::uint64_t> line_;  // tickets of the shares holding bytes
  Waiting waiting_;               // the shares waiting for bytes
  std::uint64_t last_ticket_ = 0;
};

}  // namespace kvnode::httpd
