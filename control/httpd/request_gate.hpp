// What happens to a request between its headers and its handler: routes by exact path (a known
// path asked with another method is 405, an unknown one 404), the declared body size against the
// per-request limit (413), a POST without a length (411), a malformed Content-Length (400) or a
// compressed body (415), and the body read as JSON whatever its Content-Type says. The body is
// read here, not by httplib, into a buffer that doubles as the bytes arrive; the in-flight budget
// is charged for that buffer as it grows (body_budget.hpp: a body may wait for budget, else 503),
// so a slow client holds only about what it sent. A body too slow (the minimum rate) is answered
// 408. A refused body is not handled: the answer says "Connection: close", a bounded part of the
// body is read and dropped (drain) so the client can read the answer, and the connection ends.
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
  std::size_t in_flight() const { return budget_.used(); }
  void inject_faults(FaultHooks hooks) { faults_ = std::move(hooks); }

 private:
  void admit_body(Connection& c, httplib::Request& req);
  httplib::Server::HandlerResponse before_routing(const httplib::Request& req,
                                                  httplib::Response& res);
  // A POST: its body read under the budget, then `handler`.
  void serve_post(Connection& c, const Server::Handler& handler, const httplib::Request& req,
                  httplib::Response& res, const httplib::ContentReader& reader);
  // Reads the body of `req` into `body`; false (and `res` says why) when it was not all read.
  bool read_body(Connection& c, const httplib::ContentReader& reader, std::string& body,
                 httplib::Response& res);
  // Makes room in `body` for `more` bytes, charging the budget first; false (c.refusal_status
  // says why) when the budget or the body limit refuses.
  bool make_room(Connection& c, std::string& body, std::size_t more);
  // Adds `bytes` to the request's share of the budget (waiting up to kBudgetPatience when it
  // already holds some); false when the budget cannot take them.
  bool charge(Connection& c, std::size_t bytes);
  void uncharge(Connection& c, std::size_t bytes);
  std::string over_budget() const;  // the 503's detail

  Engine& engine_;
  const Limits& limits_;
  std::map<std::string, std::set<std::string>, std::less<>> methods_;  // path -> methods
  BodyBudget budget_{limits_.max_bodies_in_flight_bytes};
  std::atomic<std::uint64_t> refused_{0};
  FaultHooks faults_;  // tests only
};

}  // namespace kvnode::httpd
