#include "connection.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <system_error>
#include <utility>

namespace kvnode::httpd {
namespace {

void address_of(const sockaddr_storage& a, std::string& ip, int& port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    ::inet_ntop(AF_INET, &v4.sin_addr, text, sizeof(text));
    port = ntohs(v4.sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    ::inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof(text));
    port = ntohs(v6.sin6_port);
  }
  ip = text;
}

}  // namespace

Connection::Connection(UniqueFd socket, std::uint64_t connection_id)
    : fd(std::move(socket)), id(connection_id) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0)
    address_of(a, remote_ip, remote_port);
  len = sizeof(a);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0)
    address_of(a, local_ip, local_port);
}

bool Connection::has_headers(std::size_t within) const {
  const std::size_t end = buffer.find("\r\n\r\n", begin);
  return end != std::string::npos && end - begin <= within;
}

std::optional<std::size_t> Connection::announced_body() const {
  const std::size_t end = buffer.find("\r\n\r\n", begin);
  if (end == std::string::npos) return std::nullopt;
  const std::string_view head(buffer.data() + begin, end - begin);
  std::optional<std::size_t> body;
  // Header lines after the request line; names compared without case, values trimmed.
  for (std::size_t at = head.find("\r\n"); at != std::string_view::npos;) {
    const std::size_t from = at + 2;
    at = head.find("\r\n", from);
    const std::string_view line = head.substr(from, at == std::string_view::npos ? at : at - from);
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string name(line.substr(0, colon));
    for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t'))
      value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    std::size_t length = SIZE_MAX;  // chunked, or a length the request gate will refuse
    if (name == "content-length") {
      std::uint64_t n = 0;
      const auto [stop, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec == std::errc() && stop == value.data() + value.size()) length = n;
      if (length == 0) continue;
    } else if (name != "transfer-encoding") {
      continue;
    }
    body = std::max(body.value_or(0), length);
  }
  return body;
}

std::size_t Connection::buffered_past_headers() const {
  const std::size_t end = buffer.find("\r\n\r\n", begin);
  return end == std::string::npos ? 0 : buffer.size() - (end + 4);
}

void Connection::drop_consumed() {
  if (!buffered()) {
    std::string().swap(buffer);  // an idle connection holds no buffer
  } else {
    buffer.erase(0, begin);
  }
  begin = 0;
}

bool Connection::drop_arrived() {
  std::array<char, 16 << 10> sink{};
  for (;;) {
    const ssize_t n = ::recv(fd.get(), sink.data(), sink.size(), MSG_DONTWAIT);
    if (n > 0) {
      drain_left -= std::min(drain_left, static_cast<std::size_t>(n));
      if (drain_left == 0) return false;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

std::string closing_answer(std::string_view status, const std::string& detail,
                           std::string_view extra_headers) {
  const std::string body = R"({"detail":")" + detail + R"("})";  // ours: nothing to escape
  return "HTTP/1.1 " + std::string(status) +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n" + std::string(extra_headers) + "Connection: close\r\n\r\n" + body;
}

bool ConnectionStream::wait(short events) const {
  auto limit = std::min(c_.deadline, Clock::now() + io_timeout_);
  if (c_.body_started && c_.min_body_bytes_per_second > 0 && (events & POLLIN) != 0) {
    // The body so far buys time at the minimum rate: a trickle runs out of it soon.
    const auto earned =
        std::chrono::milliseconds(c_.body_read * 1000 / c_.min_body_bytes_per_second);
    limit = std::min(limit, c_.body_start + c_.body_grace + earned);
  }
  for (;;) {
    const auto now = Clock::now();
    if (now >= limit) {
      c_.timed_out = true;
      return false;
    }
    pollfd p{c_.fd.get(), events, 0};
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(limit - now).count();
    const int n = ::poll(&p, 1, static_cast<int>(ms));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

bool ConnectionStream::is_readable() const {
  return c_.buffered() || wait(POLLIN);
}

bool ConnectionStream::is_writable() const {
  return wait(POLLOUT);
}

ssize_t ConnectionStream::read(char* ptr, size_t size) {
  if (size == 0) return 0;
  if (c_.buffered()) {
    const std::size_t n = std::min(size, c_.buffer.size() - c_.begin);
    std::memcpy(ptr, c_.buffer.data() + c_.begin, n);
    c_.begin += n;
    if (c_.body_started && !count_body(n)) return -1;
    return static_cast<ssize_t>(n);
  }
  for (;;) {
    const ssize_t n = ::recv(c_.fd.get(), ptr, size, MSG_DONTWAIT);
    if (n > 0) {
      if (c_.body_started && !count_body(static_cast<std::size_t>(n))) return -1;
      return n;
    }
    if (n == 0) return 0;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    if (!wait(POLLIN)) return -1;
  }
}

bool ConnectionStream::count_body(std::size_t n) {
  c_.body_read += n;
  return c_.body_cap == 0 || c_.body_read <= c_.body_cap;
}

ssize_t ConnectionStream::write(const char* ptr, size_t size) {
  for (;;) {
    const ssize_t n = ::send(c_.fd.get(), ptr, size, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    if (!wait(POLLOUT)) return -1;
  }
}

void ConnectionStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  ip = c_.remote_ip;
  port = c_.remote_port;
}

void ConnectionStream::get_local_ip_and_port(std::string& ip, int& port) const {
  ip = c_.local_ip;
  port = c_.local_port;
}

}  // namespace kvnode::httpd
