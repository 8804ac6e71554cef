// LMCache's controller HTTP API (protocol reference §3.10) over cpp-httplib: the POST endpoints
// map JSON bodies to orchestrator messages (event_id = prefix + uuid4, as LMCache does) and back;
// GET /controller/workers, /controller/key-stats and /metrics read the registry. Errors are
// {"detail": "..."} with 400 for bad input, 404 for an unknown instance, 500 for worker failures
// and 504 for a missed deadline; 405 for a known path asked with another method, 413 and 503
// for a body over its limit or the in-flight budget (kvnode::httpd::Server's limits).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "kvnode/common/result.hpp"
#include "kvnode/controller/guarded.hpp"
#include "kvnode/controller/metrics.hpp"
#include "kvnode/controller/orchestrator.hpp"
#include "kvnode/controller/registry.hpp"
#include "kvnode/httpd/server.hpp"

namespace kvnode::controller {

class HttpApi {
 public:
  // Requests served at once: a fan-out blocks its handler thread for up to its deadline. Idle
  // connections take none (kvnode::httpd::Server).
  static constexpr std::size_t kHandlerThreads = 16;

  static httpd::Limits default_limits() {
    httpd::Limits l;
    l.handler_threads = kHandlerThreads;
    return l;
  }

  HttpApi(Orchestrator& orchestrator, const Guarded<Registry>& registry, Metrics& metrics,
          httpd::Limits limits = default_limits());
  ~HttpApi();  // stops the server

  // Binds (port 0 = ephemeral) and serves on a background thread; returns the bound port.
  Result<int> start(const std::string& host, int port);
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvnode::controller
