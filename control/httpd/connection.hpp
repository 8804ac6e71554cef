// One client connection of kvnode::httpd::Server and the httplib::Stream over it. The socket is
// non-blocking; every read and write waits at most until the connection's current deadline (the
// end of the header or body phase) and at most io_timeout without progress, so a client that
// trickles bytes holds a handler thread for a bounded time.
#pragma once

#include <httplib.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvnode::httpd {

using Clock = std::chrono::steady_clock;

// Owns a descriptor; closes it once.
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& other) noexcept;
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

struct Connection {
  enum class State { kIdle, kBusy };

  Connection(UniqueFd socket, std::uint64_t connection_id);

  UniqueFd fd;
  std::uint64_t id;
  State state = State::kIdle;
  Clock::time_point idle_deadline;  // while kIdle: closed when it passes
  std::size_t requests = 0;
  std::string remote_ip, local_ip;
  int remote_port = 0, local_port = 0;

  // The request being handled (kBusy).
  Clock::time_point deadline;  // end of the current phase (headers, then body)
  bool timed_out = false;
  bool close_after = false;       // answered without reading the body: the stream is out of step
  std::size_t reserved_body = 0;  // bytes of the in-flight budget this request holds
  std::size_t declared_body = 0;  // its Content-Length
  std::size_t unread_body = 0;    // a refused body still on its way
  int refusal_status = 0;         // set before routing: answer this instead of routing
  std::string refusal_detail;

  // Bytes received and not yet read by httplib (it reads the headers one byte at a time).
  std::array<char, 16384> buffer{};
  std::size_t begin = 0, end = 0;
  bool buffered() const { return begin < end; }
};

class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(Connection& c, std::chrono::milliseconds io_timeout)
      : c_(c), io_timeout_(io_timeout) {}

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return c_.fd.get(); }

 private:
  // Waits for `events` until the deadline or io_timeout; false (and timed_out) when neither came.
  bool wait(short events) const;

  Connection& c_;
  std::chrono::milliseconds io_timeout_;
};

}  // namespace kvnode::httpd
