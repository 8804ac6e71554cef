// The HTTP server both daemons use (kvcontroller's API, kvnode's /health and /metrics): cpp-httplib
// parses requests and writes responses, but the connections are ours. One poller thread holds
// every idle connection in epoll (an idle or keep-alive connection costs no thread), and a
// request is handed to a fixed handler pool only once its headers are complete (the poller reads
// them), so idle or trickling clients cannot starve /health. A request with a body is read on its
// handler thread, so requests with a body may hold only a share of the threads (503 with
// Retry-After beyond): one without a body (a probe) always finds a thread. Bounded everywhere:
// connections (503 beyond), the time to send the headers and the body, keep-alive (time and
// requests), body size
// (413, from the declared length) and the memory of bodies being read at once (503: a body's
// buffer is charged as it grows with the bytes that arrive, so a slow client holds only about what
// it sent). A known path asked with another method is 405; JSON bodies are read whatever their
// Content-Type says (curl -d labels them a form).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kvnode/common/result.hpp"

namespace httplib {
struct Request;
struct Response;
class Server;
}  // namespace httplib

namespace kvnode::httpd {

struct Limits {
  std::size_t max_connections = 4096;  // open at once; one more is answered 503 and closed
  std::size_t handler_threads = 8;     // requests handled at once
  // Requests with a body (Content-Length > 0 or Transfer-Encoding) handled at once: one more is
  // answered 503 with Retry-After at once. 0: all handler threads but one (at least one), so a
  // request without a body never waits for a body to arrive.
  std::size_t body_handler_threads = 0;
  std::chrono::milliseconds idle_timeout{5000};    // a connection waiting for its next request
  std::chrono::milliseconds header_timeout{5000};  // request line and headers, from first byte
  std::chrono::milliseconds body_timeout{60000};   // the whole body
  std::chrono::milliseconds io_timeout{10000};     // one read or write making no progress
  // After body_grace a body must have kept this average rate (a trickle must not hold a handler
  // thread or its share of the body budget for the whole body_timeout); 0: no minimum.
  std::size_t min_body_bytes_per_second = 64 << 10;
  std::chrono::milliseconds body_grace{5000};
  std::size_t max_requests_per_connection = 1000;
  std::size_t max_body_bytes = std::size_t{64} << 20;  // per request: 413 beyond (declared)
  // The buffers of all bodies being read: 503 beyond. A body's buffer starts at 64 KiB (or its
  // length) and doubles as its bytes arrive, up to its length: it holds at most twice what was
  // received, and both the old and the new buffer are counted while one is copied to the next.
  // A body that cannot grow waits up to 5 s for others to give budget back (the youngest of the
  // bodies holding budget is refused when all of them wait).
  std::size_t max_bodies_in_flight_bytes = std::size_t{256} << 20;
  // After a body at least this large is freed, idle heap goes back to the kernel (the daemons
  // keep up to 64 MiB free per arena, which after large bodies is memory nobody uses).
  std::size_t trim_after_body_bytes = std::size_t{8} << 20;
};

struct Counters {
  std::uint64_t connections_open = 0;
  std::uint64_t connections_refused = 0;  // over max_connections
  std::uint64_t requests_timed_out = 0;   // headers or body not sent in time (or too slowly)
  std::uint64_t bodies_refused = 0;   // 400, 411, 413, 415 and 503 for a body (budget or threads)
  std::uint64_t headers_refused = 0;  // 431: request line and headers over 64 KiB
  std::uint64_t body_bytes_in_flight = 0;  // the body budget in use now (bytes of body buffers)
};

// The handler threads requests with a body may hold at once under `limits`.
std::size_t body_handler_threads(const Limits& limits);

// The most of the body budget one body of `length` bytes holds at once: its last two buffers
// while one is copied into the next (about 1.5 times `length` for a power of two, under 2 times).
std::size_t peak_body_bytes(std::size_t length);

// Test-only fault injection; the daemons never set it. Each hook is called where the server is
// about to allocate on a client's behalf and may throw (std::bad_alloc), as that allocation would.
struct FaultHooks {
  std::function<void(std::size_t bytes)> body_buffer;  // before a body's buffer grows to `bytes`
};

class Server {
 public:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

  // thread_name: what its threads are called (at most 15 characters).
  explicit Server(std::string thread_name, Limits limits = {});
  ~Server();  // stops
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Routes are exact paths. Register them before start().
  void get(const std::string& path, Handler handler);
  void post(const std::string& path, Handler handler);
  // For error and exception handlers and the logger; not for routes or timeouts.
  httplib::Server& raw();
  // Tests only, before start().
  void inject_faults(FaultHooks hooks);

  // Binds (port 0: ephemeral; no SO_REUSEPORT, so a port in use is an error naming its
  // holder) and serves on background threads; returns the bound port.
  Result<int> start(const std::string& host, int port);
  // Closes the listener and idle connections; requests being handled finish first.
  void stop();

  Counters counters() const;
  const Limits& limits() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvnode::httpd
