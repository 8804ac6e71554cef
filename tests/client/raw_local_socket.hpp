// Test support: a raw connection to a node's local socket, to send what a broken or hostile
// client would (garbage, a huge declared length, half a frame, nothing at all) and to read the
// node's frames. The framing is written out here (4-byte little-endian length, then the bytes),
// not taken from the code under test.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

namespace kvnode::test {

class RawLocalSocket {
 public:
  explicit RawLocalSocket(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  RawLocalSocket(const RawLocalSocket&) = delete;
  RawLocalSocket& operator=(const RawLocalSocket&) = delete;
  ~RawLocalSocket() { close(); }

  bool connected() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  static std::string header(std::uint32_t length) {
    std::string h(4, '\0');
    for (int i = 0; i < 4; ++i)
      h[static_cast<std::size_t>(i)] = static_cast<char>(length >> (8 * i));
    return h;
  }
  // Bytes as they are (no framing).
  bool send_raw(const std::string& bytes) {
    std::size_t sent = 0;
    while (fd_ >= 0 && sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<std::size_t>(n);
    }
    return fd_ >= 0;
  }
  bool send_frame(const std::string& payload) {
    return send_raw(header(static_cast<std::uint32_t>(payload.size())) + payload);
  }

  // One whole frame's payload; nullopt when the node closed the connection or said nothing in
  // time.
  std::optional<std::string> read_frame(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    std::string h;
    if (!read_exactly(h, 4, until)) return std::nullopt;
    std::uint32_t length = 0;
    for (int i = 0; i < 4; ++i)
      length |=
          static_cast<std::uint32_t>(static_cast<unsigned char>(h[static_cast<std::size_t>(i)]))
          << (8 * i);
    std::string body;
    if (!read_exactly(body, length, until)) return std::nullopt;
    return body;
  }

  // Up to `max` bytes (discarded) that arrived within `timeout`: how many (0: none came);
  // nullopt once the node closed the connection and nothing is left to read.
  std::optional<std::size_t> read_up_to(std::size_t max, std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return std::size_t{0};
    std::string buf(max, '\0');
    const ssize_t n = ::recv(fd_, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n > 0) return static_cast<std::size_t>(n);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return std::size_t{0};
    return std::nullopt;
  }

  // The node closed this connection within `timeout`, seen without reading a byte (what it
  // sent stays unread).
  bool hung_up_within(std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLRDHUP, 0};
    return ::poll(&p, 1, static_cast<int>(timeout.count())) > 0 &&
           (p.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
  }

  // The node closed this connection within `timeout` (end of stream, or reset).
  bool closed_within(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return true;
    }
  }

 private:
  bool read_exactly(std::string& out, std::size_t n, std::chrono::steady_clock::time_point until) {
    out.clear();
    while (out.size() < n) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      std::string buf(std::min<std::size_t>(n - out.size(), 1 << 20), '\0');
      const ssize_t got = ::recv(fd_, buf.data(), buf.size(), 0);
      if (got <= 0) return false;
      out.append(buf, 0, static_cast<std::size_t>(got));
    }
    return true;
  }

  int fd_ = -1;
};

}  // namespace kvnode::test
