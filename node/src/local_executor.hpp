// The local service's long operations (retrieve: it crosses the network, seconds) run here, one
// after another on their own thread, so the socket thread keeps answering every other request
// meanwhile. The queue is bounded: a job beyond it is refused, and the caller answers at once.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace kvnode::node::local {

class SerialExecutor {
 public:
  explicit SerialExecutor(std::size_t max_queued) : max_queued_(max_queued) {
    thread_ = std::thread([this] { run(); });
  }
  // Queued jobs are dropped; a running one ends first.
  ~SerialExecutor() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
      queue_.clear();
    }
    ready_.notify_all();
    thread_.join();
  }
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // False when the queue is full.
  bool submit(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      if (stop_ || queue_.size() >= max_queued_) return false;
      queue_.push_back(std::move(job));
    }
    ready_.notify_one();
    return true;
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job();
    }
  }

  const std::size_t max_queued_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kvnode::node::local
