// The first contact between two nodes. A node's Listener is bound at its peer_init_url
// (host:port, what it registers with the controller); a peer dials there with its own
// descriptor (hello) and gets an answer (welcome). Descriptors are opaque bytes here (the plane
// puts the worker address, pool rkey and page geometry in them). The sockaddr endpoint this runs
// over is tcp-only in UCX 1.13, so the data path then connects to the worker address it learned;
// the plane keeps the tcp endpoint open as the session's liveness channel, since it reports a
// dead peer at once whatever transport the data path uses.
// The Listener's worker is progressed by its owner thread, through progress().
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvnode/transfer/ucx_handles.hpp"

namespace kvnode::transfer {

inline constexpr unsigned kHelloAmId = 7;    // a peer's descriptor
inline constexpr unsigned kWelcomeAmId = 8;  // the answer, sent with a reply endpoint

struct ListenerHooks {
  // The answer to a peer's hello; `control` is the endpoint it came on, open until drop().
  std::function<ucx::Bytes(const ucx::Bytes& hello, ucp_ep_h control)> answer;
  // An accepted endpoint failed (the peer is gone); the listener closes it after this returns.
  std::function<void(ucp_ep_h control)> lost;
};

class Listener {
 public:
  // port 0 picks a free one (see port()).
  static Result<std::unique_ptr<Listener>> bind(const ucx::Worker& worker, const std::string& host,
                                                std::uint16_t port, ListenerHooks hooks);
  // Answers every hello with the same descriptor.
  static Result<std::unique_ptr<Listener>> bind(const ucx::Worker& worker, const std::string& host,
                                                std::uint16_t port, ucx::Bytes descriptor);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  std::uint16_t port() const { return port_; }
  // Progresses the worker and sends the replies its callbacks queued; returns events handled.
  unsigned progress();
  std::size_t handshakes() const { return handshakes_; }
  // Closes one accepted endpoint (the plane ended that peer's session).
  void drop(ucp_ep_h control);

 private:
  struct Hello {
    ucp_ep_h ep;
    ucx::Bytes body;
  };
  Listener(const ucx::Worker& worker, ListenerHooks hooks)
      : worker_(worker), hooks_(std::move(hooks)) {}
  static void on_connection(ucp_conn_request_h request, void* arg);
  static void on_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t on_hello(void* arg, const void* header, std::size_t header_length,
                               void* data, std::size_t length, const ucp_am_recv_param_t* param);

  const ucx::Worker& worker_;
  ListenerHooks hooks_;
  ucp_listener_h listener_ = nullptr;
  std::uint16_t port_ = 0;
  std::vector<ucp_ep_h> accepted_;   // closed (forced) with the listener
  std::deque<Hello> hellos_;         // waiting for an answer
  std::deque<ucp_ep_h> lost_;        // failed, to report and close outside UCX's callback
  struct Send {
    ucs_status_ptr_t request;
    std::unique_ptr<ucx::Bytes> body;
  };
  std::vector<Send> sends_;
  std::size_t handshakes_ = 0;
};

// The dialing side, asynchronous: opens the tcp control endpoint to host:port and sends `hello`
// with a reply endpoint. The answer arrives as kWelcomeAmId on `worker`, with reply_ep equal to
// `ep`. `on_error` is the endpoint's error handler. The caller owns ep and the send request,
// and keeps `hello` alive until the send completes.
struct Dialed {
  ucp_ep_h ep = nullptr;
  ucs_status_ptr_t send = nullptr;
};
Result<Dialed> dial(const ucx::Worker& worker, const std::string& host, std::uint16_t port,
                    const ucx::Bytes& hello, ucp_err_handler_cb_t on_error, void* arg);

// Connects to host:port, sends `descriptor`, returns the listener's. The worker is progressed
// here until the reply comes or the deadline passes.
Result<ucx::Bytes> handshake(const ucx::Worker& worker, const std::string& host, std::uint16_t port,
                             const ucx::Bytes& descriptor,
                             std::chrono::steady_clock::time_point deadline);

}  // namespace kvnode::transfer
