// What happens to a request between its headers and its handler: routes by exact path (a known
// path asked with another method is 405), the body's size against the per-request limit (413)
// and the in-flight budget (503), a POST without a length (411), a malformed Content-Length
// (400) or a compressed body (415), and the body read as JSON whatever its Content-Type says.
// A refused body is not handled: the answer says "Connection: close", a bounded part of the body
// is read and dropped (drain) so the client can read the answer, and the connection ends.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "connection.hpp"
#include "kvnode/httpd/server.hpp"

namespace kvnode::httpd {

// httplib's request parser and router, minus its accept loop (process_request and the listening
// socket are protected members).
class Engine final : public httplib::Server {
 public:
  using httplib::Server::process_request;
  int listening_socket() const { return svr_sock_; }
  int release_listening_socket() { return svr_sock_.exchange(INVALID_SOCKET); }
};

class RequestGate {
 public:
  RequestGate(Engine& engine, const Limits& limits);

  void route(const std::string& method, const std::string& path, Server::Handler handler);

  // Serves one request of `c`: false when the connection must close (client gone, bad stream).
  bool process(Connection& c, ConnectionStream& stream, bool last, bool& client_closes);
  // Returns the request's share of the body budget (and idle heap after a large body).
  void release(Connection& c);
  // Returns the request's share of the body budget only (idempotent).
  void return_budget(Connection& c);

  std::uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  void admit_body(Connection& c, httplib::Request& req);
  httplib::Server::HandlerResponse before_routing(const httplib::Request& req,
                                                  httplib::Response& res);

  Engine& engine_;
  const Limits& limits_;
  std::map<std::string, std::set<std::string>, std::less<>> methods_;  // path -> methods
  std::atomic<std::size_t> in_flight_{0};  // body bytes reserved by requests being read
  std::atomic<std::uint64_t> refused_{0};
};

}  // namespace kvnode::httpd
