// A DEALER to one of the controller's ROUTERs, with a monitor that reports when its TCP
// connection drops. A request in flight when that happens has no reply coming (the controller
// died or restarted), so exchange() fails it at once instead of after the request timeout; the
// caller's retry then reaches the controller that came back. A refused connect fails it at
// once too: nothing listens there, so no reply can come.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <zmq.hpp>

#include "kvnode/common/result.hpp"
#include "kvnode/wire/codec.hpp"

namespace kvnode::agent {

class ControllerLink {
 public:
  // `endpoint` is a ZMQ endpoint ("tcp://host:port"); `name` makes the monitor's inproc address
  // unique within the context. Sends block at most `timeout`.
  ControllerLink(zmq::context_t& ctx, const std::string& endpoint, const std::string& name,
                 std::chrono::milliseconds timeout);

  // Sends the request and waits for the reply: until `timeout`, until `stop()` says so, or until
  // the connection drops while the request is out.
  Result<wire::Msg> exchange(const wire::Msg& request, std::chrono::milliseconds timeout,
                             const std::function<bool()>& stop);

 private:
  // Drains the monitor: why the request out cannot be answered (a disconnect, or a refused
  // connect), or nullopt.
  std::optional<std::string> failure();

  zmq::socket_t monitor_;  // PAIR on the DEALER's monitor endpoint; closed after the DEALER
  zmq::socket_t dealer_;
  std::string endpoint_;
};

}  // namespace kvnode::agent
