// Clients that POST a body at a set rate (issue 19 item 6's slow-body attack and the minimum-rate
// cut): each sends its headers at once and then its body in small sends from one background
// thread, and records what the server answers and when it spoke (answered or closed).
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "raw_http.hpp"

namespace kvnode::httpd::testing {

class Trickle {
 public:
  Trickle() : thread_([this] { run(); }) {}
  ~Trickle() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    thread_.join();
  }
  Trickle(const Trickle&) = delete;
  Trickle& operator=(const Trickle&) = delete;

  // Starts a POST of `declared` bytes sent at `bytes_per_second`; returns its index.
  std::size_t start(int port, const std::string& path, std::size_t declared,
                    std::size_t bytes_per_second) {
    auto b = std::make_unique<Body>();
    b->fd = connect_to(port);
    b->declared = declared;
    b->rate = bytes_per_second;
    b->start = Clock::now();
    if (!b->fd || !send_all(b->fd.get(), post_head(path, declared))) b->closed = true;
    std::lock_guard lock(mutex_);
    bodies_.push_back(std::move(b));
    return bodies_.size() - 1;
  }

  // How long after its start the server first answered or closed body `i`; none yet.
  std::optional<std::chrono::milliseconds> spoke_after(std::size_t i) const {
    std::lock_guard lock(mutex_);
    const Body& b = *bodies_.at(i);
    if (!b.spoke) return std::nullopt;
    return std::chrono::duration_cast<std::chrono::milliseconds>(*b.spoke - b.start);
  }
  std::string reply(std::size_t i) const {
    std::lock_guard lock(mutex_);
    return bodies_.at(i)->reply;
  }
  std::size_t sent(std::size_t i) const {
    std::lock_guard lock(mutex_);
    return bodies_.at(i)->sent;
  }
  std::size_t spoken() const {
    std::lock_guard lock(mutex_);
    return static_cast<std::size_t>(std::count_if(
        bodies_.begin(), bodies_.end(), [](const auto& b) { return b->spoke.has_value(); }));
  }
  // Closes every connection (the clients go away).
  void close_all() {
    std::lock_guard lock(mutex_);
    for (auto& b : bodies_) {
      b->fd.reset();
      b->closed = true;
    }
  }

 private:
  struct Body {
    UniqueFd fd;
    std::size_t declared = 0, rate = 0, sent = 0;
    Clock::time_point start;
    std::optional<Clock::time_point> spoke;
    std::string reply;
    bool closed = false;
  };
  static constexpr auto kTick = std::chrono::milliseconds(10);

  void run() {
    const std::string padding(1 << 16, ' ');
    for (;;) {
      {
        std::lock_guard lock(mutex_);
        if (stop_) return;
        const auto now = Clock::now();
        for (auto& b : bodies_) {
          if (b->closed) continue;
          listen(*b, now);
          if (b->closed) continue;
          const auto elapsed = std::chrono::duration<double>(now - b->start).count();
          const auto due = std::min(b->declared, static_cast<std::size_t>(elapsed * b->rate));
          while (b->sent < due) {
            const std::size_t n = std::min(due - b->sent, padding.size());
            const ssize_t put = ::send(b->fd.get(), padding.data(), n, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (put <= 0) {
              if (put < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
              b->closed = true;  // reset: the server gave up on it
              if (!b->spoke) b->spoke = now;
              break;
            }
            b->sent += static_cast<std::size_t>(put);
          }
        }
      }
      std::this_thread::sleep_for(kTick);  // the trickle's pace
    }
  }

  // Reads what the server wrote to `b` so far; notes when it first spoke.
  static void listen(Body& b, Clock::time_point now) {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(b.fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (!b.spoke) b.spoke = now;
      if (n <= 0) {
        b.closed = true;
        return;
      }
      b.reply.append(buf, static_cast<std::size_t>(n));
    }
  }

  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Body>> bodies_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace kvnode::httpd::testing
