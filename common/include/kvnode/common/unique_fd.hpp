// File descriptors as RAII values: UniqueFd closes what it owns, once; EventFd is a non-blocking
// eventfd that any thread signals to wake a poll or epoll loop. The one copy of each in the tree
// (the transfer plane, the controller's fan-out, the HTTP server and the local socket use these).
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <utility>

#include "kvnode/common/result.hpp"

namespace kvnode {

class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  explicit operator bool() const noexcept { return valid(); }
  // Closes what it held and owns `fd` from now on.
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  // Gives up ownership without closing.
  int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

class EventFd {
 public:
  static Result<EventFd> create() {
    UniqueFd fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!fd) return make_error(ErrorCode::kIo, "eventfd: out of descriptors or memory");
    return EventFd(std::move(fd));
  }
  int fd() const noexcept { return fd_.get(); }
  // A failed write means the counter is saturated: a wake-up is already pending.
  void signal() const noexcept {
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto written = ::write(fd_.get(), &one, sizeof one);
  }
  // One read resets the counter.
  void drain() const noexcept {
    std::uint64_t count = 0;
    [[maybe_unused]] const auto got = ::read(fd_.get(), &count, sizeof count);
  }

 private:
  explicit EventFd(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

}  // namespace kvnode
