// A value behind a reader/writer lock, reachable only through read() and write(), so no caller
// can touch it unlocked. Lookups share the lock; ingest, registration and heartbeats take it
// exclusively for one message at a time, which bounds how long a lookup can wait.
#pragma once

#include <mutex>
#include <shared_mutex>
#include <utility>

namespace kvnode::controller {

template <class T>
class Guarded {
 public:
  template <class... Args>
  explicit Guarded(Args&&... args) : value_(std::forward<Args>(args)...) {}

  template <class F>
  decltype(auto) read(F&& f) const {
    std::shared_lock lock(mutex_);
    return std::forward<F>(f)(std::as_const(value_));
  }
  template <class F>
  decltype(auto) write(F&& f) {
    std::unique_lock lock(mutex_);
    return std::forward<F>(f)(value_);
  }

 private:
  mutable std::shared_mutex mutex_;
  T value_;
};

}  // namespace kvnode::controller
