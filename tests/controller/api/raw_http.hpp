// Raw TCP clients for the kvnode::httpd tests, for what httplib::Client cannot do: send a request's
// headers and then trickle its body at a chosen rate, and see when and how the server answers or
// closes. Each descriptor is owned (closed on destruction); every wait is bounded.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvnode/common/unique_fd.hpp"

namespace kvnode::httpd::testing {

using Clock = std::chrono::steady_clock;

inline UniqueFd connect_to(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return UniqueFd();
  return fd;
}

// False when the server closed or reset the connection before taking every byte.
inline bool send_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

// Whether the server has written something or closed (a read would not block).
inline bool server_spoke(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

// What the server sends until it closes the connection or `patience` runs out.
inline std::string read_until_closed(int fd, std::chrono::milliseconds patience) {
  std::string reply;
  const auto until = Clock::now() + patience;
  while (Clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    reply.append(buf, static_cast<std::size_t>(n));
  }
  return reply;
}

inline std::string status_line(const std::string& reply) {
  return reply.substr(0, reply.find("\r\n"));
}

inline std::string post_head(const std::string& path, std::size_t length) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(length) + "\r\n\r\n";
}

}  // namespace kvnode::httpd::testing
