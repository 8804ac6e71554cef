#include "instance_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace kvnode::node {
namespace {

// The holder's pid as it wrote it ("" when unreadable or not written yet).
std::string read_pid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  std::string pid = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return pid;
}

}  // namespace

Result<InstanceLock> InstanceLock::acquire(const std::string& socket_path) {
  std::string path = socket_path + ".lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return make_error("cannot open the lock file " + path + ": " + std::strerror(errno));
  InstanceLock lock(fd, path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) return make_error("cannot lock " + path + ": " + std::strerror(err));
    const std::string pid = read_pid(fd);
    return make_error("another kvnode" + (pid.empty() ? std::string() : " (pid " + pid + ")") +
                      " is running with the local socket " + socket_path + " (it holds " + path +
                      "): the same instance and rank, or the same --local-socket; not starting, "
                      "and nothing of the running node was touched");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0)
    return make_error("cannot write " + path + ": " + std::strerror(errno));
  return lock;
}

InstanceLock::InstanceLock(InstanceLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

InstanceLock& InstanceLock::operator=(InstanceLock&& other) noexcept {
  std::swap(fd_, other.fd_);
  std::swap(path_, other.path_);
  return *this;
}

InstanceLock::~InstanceLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

}  // namespace kvnode::node
