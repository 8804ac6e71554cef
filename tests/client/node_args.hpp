// The command line of a kvnode the client tests start: no reachable controller (the local socket
// serves without one), loopback tcp for the plane, a small pool of `chunk_bytes` pages.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kvnode::test {

inline std::vector<std::string> client_test_node_args(const std::string& instance,
                                                      const std::string& socket,
                                                      std::size_t chunk_bytes,
                                                      std::size_t chunk_tokens) {
  return {KVNODE_PATH,
          "--instance-id",
          instance,
          "--controller-pull-url",
          "127.0.0.1:1",
          "--controller-reply-url",
          "127.0.0.1:2",
          "--chunk-bytes",
          std::to_string(chunk_bytes),
          "--chunk-size",
          std::to_string(chunk_tokens),
          "--max-local-cpu-size",
          "0.01",
          "--http-port",
          "-1",
          "--local-socket",
          socket,
          "--local-staging-mb",
          "1",
          "--full-sync-startup-delay",
          "0",
          "--ucx-tls",
          "tcp",
          "--ucx-net-devices",
          "lo",
          "--log-level",
          "warn"};
}

}  // namespace kvnode::test
