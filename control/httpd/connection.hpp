// One client connection of kvnode::httpd::Server and the httplib::Stream over it. The poller
// reads the request line and headers into `buffer` without blocking, so a handler thread only
// ever sees complete headers. The socket is non-blocking; every body read and answer write waits
// at most until the connection's current deadline, at most io_timeout without progress, and a
// body must keep a minimum rate, so a client that trickles a body holds a handler briefly.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "body_budget.hpp"
#include "kvnode/common/unique_fd.hpp"

namespace kvnode::httpd {

using Clock = std::chrono::steady_clock;

struct Connection {
  // kIdle: in epoll, no byte of a request yet; kHeaders: in epoll, part of the headers
  // buffered (closed at header_deadline); kBusy: queued for or held by a handler; kDraining: in
  // epoll, refused by the poller, its body read and dropped until drain_deadline.
  enum class State { kIdle, kHeaders, kBusy, kDraining };

  Connection(UniqueFd socket, std::uint64_t connection_id);

  UniqueFd fd;
  std::uint64_t id;
  State state = State::kIdle;
  Clock::time_point idle_deadline;    // while kIdle: closed when it passes
  Clock::time_point header_deadline;  // while kHeaders: closed when it passes
  std::size_t requests = 0;
  bool body_slot = false;      // kBusy with a body: holds one of the body handler threads
  std::size_t drain_left = 0;  // kDraining: body bytes still to drop
  Clock::time_point drain_deadline;
  std::string remote_ip, local_ip;
  int remote_port = 0, local_port = 0;

  // The request being handled (kBusy).
  Clock::time_point deadline;  // end of the current phase (headers, then body)
  bool timed_out = false;
  bool close_after = false;       // answered without reading the body: the stream is out of step
  BodyShare budget;               // the in-flight budget this request's body buffers hold
  std::size_t declared_body = 0;  // its Content-Length
  std::size_t unread_body = 0;    // a refused body still on its way
  int refusal_status = 0;         // set before routing: answer this instead of routing
  std::string refusal_detail;
  // Body reads (everything httplib reads past the buffered headers): counted against a cap and
  // a minimum rate once body_started is set.
  bool body_started = false;
  Clock::time_point body_start;
  std::size_t body_read = 0;
  std::size_t body_cap = 0;                   // 0: none
  std::size_t min_body_bytes_per_second = 0;  // 0: none
  std::chrono::milliseconds body_grace{0};    // before the rate applies

  // Bytes received and not yet read by httplib: headers read by the poller, and whatever came
  // with them. Empty (no memory) while idle.
  std::string buffer;
  std::size_t begin = 0;
  bool buffered() const { return begin < buffer.size(); }
  // Whether the first `within` buffered bytes hold a whole request line and headers.
  bool has_headers(std::size_t within) const;
  // For whole buffered headers: the body they announce (its Content-Length; SIZE_MAX when
  // chunked or unreadable), or none (no body framing, or Content-Length 0).
  std::optional<std::size_t> announced_body() const;
  // The bytes buffered past the headers (the start of the body).
  std::size_t buffered_past_headers() const;
  void drop_consumed();
  // kDraining: reads and drops what has arrived; false when done (drain_left read, the client
  // closed or the socket failed).
  bool drop_arrived();
};

// A complete answer that closes the connection: `status` ("503 Service Unavailable"), then
// `extra_headers` (each ending in CRLF), with {"detail": detail} as its body.
std::string closing_answer(std::string_view status, const std::string& detail,
                           std::string_view extra_headers = {});

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
  // Counts body bytes read; false beyond the body cap.
  bool count_body(std::size_t n);

  Connection& c_;
  std::chrono::milliseconds io_timeout_;
};

}  // namespace kvnode::httpd
