// One running kvnode per local socket: an flock-ed file next to the socket (the socket's path is
// per instance and rank by default, and the shared staging region is named after it). A second
// node for the same socket is refused before it registers, binds or unlinks anything, so the
// running node keeps its socket, its staging region and its registration.
#pragma once

#include <string>

#include "kvnode/common/result.hpp"

namespace kvnode::node {

class InstanceLock {
 public:
  // Takes `<socket_path>.lock` and writes our pid into it. Fails, naming the holder's pid and the
  // socket, when another process holds it.
  static Result<InstanceLock> acquire(const std::string& socket_path);

  InstanceLock(InstanceLock&& other) noexcept;
  InstanceLock& operator=(InstanceLock&& other) noexcept;
  InstanceLock(const InstanceLock&) = delete;
  InstanceLock& operator=(const InstanceLock&) = delete;
  ~InstanceLock();  // releases the lock; the file stays (unlinking it would race a new owner)

  const std::string& path() const { return path_; }

 private:
  InstanceLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

}  // namespace kvnode::node
