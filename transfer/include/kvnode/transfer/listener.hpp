// The first contact between two nodes. A node's Listener is bound at its peer_init_url
// (host:port, what it registers with the controller); a peer calls handshake() there with its
// own descriptor and gets the listener's back. Descriptors are opaque bytes here (the plane puts
// the worker address, pool rkey and page geometry in them). The sockaddr endpoint this runs over
// is tcp-only in UCX 1.13, so the data path then connects to the worker address it learned.
// The Listener's worker is progressed by its owner thread, through progress().
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "kvnode/transfer/ucx_handles.hpp"

namespace kvnode::transfer {

class Listener {
 public:
  // port 0 picks a free one (see port()).
  static Result<std::unique_ptr<Listener>> bind(const ucx::Worker& worker, const std::string& host,
                                                std::uint16_t port, ucx::Bytes descriptor);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  std::uint16_t port() const { return port_; }
  // Progresses the worker and sends the replies its callbacks queued; returns events handled.
  unsigned progress();
  std::size_t handshakes() const { return handshakes_; }

 private:
  explicit Listener(const ucx::Worker& worker, ucx::Bytes descriptor)
      : worker_(worker), descriptor_(std::move(descriptor)) {}
  static void on_connection(ucp_conn_request_h request, void* arg);
  static ucs_status_t on_hello(void* arg, const void* header, std::size_t header_length,
                               void* data, std::size_t length, const ucp_am_recv_param_t* param);

  const ucx::Worker& worker_;
  ucx::Bytes descriptor_;
  ucp_listener_h listener_ = nullptr;
  std::uint16_t port_ = 0;
  std::vector<ucp_ep_h> accepted_;   // closed (forced) with the listener
  std::deque<ucp_ep_h> replies_;     // hello senders waiting for the descriptor
  std::vector<ucs_status_ptr_t> sends_;
  std::size_t handshakes_ = 0;
};

// Connects to host:port, sends `descriptor`, returns the listener's. The worker is progressed
// here until the reply comes or the deadline passes.
Result<ucx::Bytes> handshake(const ucx::Worker& worker, const std::string& host, std::uint16_t port,
                             const ucx::Bytes& descriptor,
                             std::chrono::steady_clock::time_point deadline);

}  // namespace kvnode::transfer
