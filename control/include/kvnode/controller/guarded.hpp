// A value behind a reader/writer lock, reachable only through read() and write(), so no caller
// can touch it unlocked. Lookups share the lock; ingest, registration and heartbeats take it
// exclusively for one short step at a time (ingest applies a batch in slices).
// Readers come first: a reader that finds the lock taken spins for a few microseconds (a
// writer's step is shorter than a thread wake-up on a busy machine) before it sleeps, and a
// writer lets announced readers in before it takes the lock again. Spinning yields the CPU every
// microsecond or two: with more busy threads than cores the thread being waited for may be
// queued behind the spinner on its own CPU (measured on 2 cores: lookups under ingest met
// p50 <= 1.3x a bare echo in 9 of 12 cases with the yield, 5 of 12 with a plain spin).
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <utility>

namespace kvnode::controller {

template <class T>
class Guarded {
 public:
  template <class... Args>
  explicit Guarded(Args&&... args) : value_(std::forward<Args>(args)...) {}

  template <class F>
  decltype(auto) read(F&& f) const {
    std::shared_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) {
      waiting_readers_.fetch_add(1, std::memory_order_relaxed);
      if (!spin([&] { return lock.try_lock(); })) lock.lock();
      waiting_readers_.fetch_sub(1, std::memory_order_relaxed);
    }
    return std::forward<F>(f)(std::as_const(value_));
  }
  template <class F>
  decltype(auto) write(F&& f) {
    spin([&] { return waiting_readers_.load(std::memory_order_relaxed) == 0; });
    std::unique_lock lock(mutex_);
    return std::forward<F>(f)(value_);
  }

 private:
  static constexpr auto kSpin = std::chrono::microseconds(50);

  // Polls until done() or kSpin passes; true when done() said so.
  template <class Done>
  static bool spin(Done&& done) {
    if (done()) return true;
    const auto until = std::chrono::steady_clock::now() + kSpin;
    for (unsigned i = 1;; ++i) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      if (done()) return true;
      if (i % 64 == 0) {
        if (std::chrono::steady_clock::now() > until) return false;
        std::this_thread::yield();
      }
    }
  }

  mutable std::shared_mutex mutex_;
  mutable std::atomic<int> waiting_readers_{0};
  T value_;
};

}  // namespace kvnode::controller
