// LMCache's controller HTTP API (protocol reference §3.10) over cpp-httplib: the POST endpoints
// map JSON bodies to orchestrator messages (event_id = prefix + uuid4, as LMCache does) and back;
// GET /controller/workers, /controller/key-stats and /metrics read the registry. Errors are
// {"detail": "..."} with 400 for bad input, 404 for an unknown instance, 500 for worker failures
// and 504 for a missed deadline.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "kvnode/common/result.hpp"
#include "kvnode/controller/guarded.hpp"
#include "kvnode/controller/metrics.hpp"
#include "kvnode/controller/orchestrator.hpp"
#include "kvnode/controller/registry.hpp"

namespace kvnode::controller {

class HttpApi {
 public:
  // Requests served at once: a fan-out blocks its handler thread for up to its deadline.
  static constexpr std::size_t kHandlerThreads = 8;

  HttpApi(Orchestrator& orchestrator, const Guarded<Registry>& registry, Metrics& metrics);
  ~HttpApi();  // stops the server

  // Binds (port 0 = ephemeral) and serves on a background thread; returns the bound port.
  Result<int> start(const std::string& host, int port);
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvnode::controller
