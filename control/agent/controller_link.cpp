#include "controller_link.hpp"

#include <cstdint>
#include <cstring>

namespace kvnode::agent {

namespace {
constexpr auto kSlice = std::chrono::milliseconds(50);  // how often a wait checks stop()
}

ControllerLink::ControllerLink(zmq::context_t& ctx, const std::string& endpoint,
                               const std::string& name, std::chrono::milliseconds timeout)
    : dealer_(ctx, zmq::socket_type::dealer) {
  dealer_.set(zmq::sockopt::linger, 0);
  dealer_.set(zmq::sockopt::sndtimeo, static_cast<int>(timeout.count()));
  const std::string monitor_address = "inproc://kvnode-agent-link-" + name;
  // Without a monitor the link still works; a dropped connection then costs the timeout.
  // CONNECT_RETRIED: nothing accepts connections there (refused), which a request would
  // otherwise learn only at its timeout.
  if (zmq_socket_monitor(dealer_.handle(), monitor_address.c_str(),
                         ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECT_RETRIED) == 0) {
    monitor_ = zmq::socket_t(ctx, zmq::socket_type::pair);
    monitor_.set(zmq::sockopt::linger, 0);
    monitor_.connect(monitor_address);
  }
  dealer_.connect(endpoint);
  endpoint_ = endpoint;
}

std::optional<std::string> ControllerLink::failure() {
  std::optional<std::string> why;
  zmq::message_t frame;
  while (monitor_ && monitor_.recv(frame, zmq::recv_flags::dontwait)) {
    // An event is two frames: 2 bytes of event id and 4 of value, then the peer's address.
    if (frame.size() >= sizeof(std::uint16_t)) {
      std::uint16_t event = 0;
      std::memcpy(&event, frame.data(), sizeof event);
      if (event == ZMQ_EVENT_DISCONNECTED)
        why = "the connection to the controller dropped with the request out";
      else if (event == ZMQ_EVENT_CONNECT_RETRIED && !why)
        why = "cannot connect to the controller at " + endpoint_ + " (connection refused)";
    }
    while (frame.more() && monitor_.recv(frame, zmq::recv_flags::dontwait)) {
    }
  }
  return why;
}

Result<wire::Msg> ControllerLink::exchange(const wire::Msg& request,
                                           std::chrono::milliseconds timeout,
                                           const std::function<bool()>& stop) {
  const std::string payload = wire::encode(request);
  try {
    (void)failure();  // a drop before this request does not concern it: ZMQ resends after
                      // reconnecting
    if (!dealer_.send(zmq::message_t(), zmq::send_flags::sndmore) ||
        !dealer_.send(zmq::buffer(payload), zmq::send_flags::none))
      return make_error(ErrorCode::kDeadline, "send timed out");
    const auto give_up = std::chrono::steady_clock::now() + timeout;
    zmq::pollitem_t items[] = {{dealer_.handle(), 0, ZMQ_POLLIN, 0},
                               {monitor_.handle(), 0, ZMQ_POLLIN, 0}};
    const int n = monitor_ ? 2 : 1;
    for (;;) {
      zmq::poll(items, n, kSlice);
      if (items[0].revents & ZMQ_POLLIN) break;
      if (n == 2 && (items[1].revents & ZMQ_POLLIN))
        if (std::optional<std::string> why = failure())
          return make_error(ErrorCode::kPeerLost, std::move(*why));
      if (stop()) return make_error(ErrorCode::kRefused, "stopping");
      if (std::chrono::steady_clock::now() > give_up)
        return make_error(ErrorCode::kDeadline, "no reply within the request timeout");
    }
    zmq::message_t frame;
    std::string last;
    do {
      if (!dealer_.recv(frame, zmq::recv_flags::none))
        return make_error(ErrorCode::kPeerLost, "receive failed");
      last = frame.to_string();
    } while (frame.more());
    return wire::decode(last);  // the last frame, as LMCache reads it
  } catch (const zmq::error_t& e) {
    return make_error(ErrorCode::kIo, std::string("zmq: ") + e.what());
  }
}

}  // namespace kvnode::agent
