// Test peers that speak the controller protocol from the outside over real ZMQ sockets: a
// worker's DEALER (request/reply), its PUSH (events) and a started in-process controller on
// ephemeral loopback ports.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "kvnode/controller/controller.hpp"
#include "kvnode/wire/codec.hpp"
#include "support/eventually.hpp"

namespace kvnode::test {

inline controller::ControllerConfig loopback_config() {
  controller::ControllerConfig c;
  c.controller_host = "127.0.0.1";
  c.controller_port = 0;
  c.controller_monitor_ports = {0, 0, 0};
  c.log_level = "warn";
  return c;
}

inline std::unique_ptr<controller::Controller> start_controller(
    const controller::ControllerConfig& c = loopback_config()) {
  auto started = controller::Controller::start(c);
  if (!started) ADD_FAILURE() << started.error().message;
  return started ? std::move(started).value() : nullptr;
}

inline std::string tcp(int port) {
  return "tcp://127.0.0.1:" + std::to_string(port);
}

// A DEALER as LMCache's worker uses it: sends ["", payload], reads the last frame.
class Dealer {
 public:
  Dealer(zmq::context_t& ctx, int port) : socket_(ctx, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::rcvtimeo, 5000);
    socket_.connect(tcp(port));
  }
  // Sends the given frames as one message and returns the last frame of the reply ("" on
  // timeout, which fails the test).
  std::string request_frames(const std::vector<std::string>& frames) {
    for (std::size_t i = 0; i < frames.size(); ++i)
      socket_.send(zmq::buffer(frames[i]),
                   i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    std::vector<zmq::message_t> reply;
    zmq::message_t part;
    do {
      if (!socket_.recv(part)) {
        ADD_FAILURE() << "no reply within 5 s";
        return {};
      }
      reply.push_back(std::move(part));
    } while (reply.back().more());
    last_reply_frames_ = reply.size();
    return reply.back().to_string();
  }
  std::string request(const std::string& payload) { return request_frames({"", payload}); }
  wire::Msg call(const wire::Msg& msg) {
    auto decoded = wire::decode(request(wire::encode(msg)));
    EXPECT_TRUE(decoded) << decoded.error().message;
    return decoded ? std::move(decoded).value() : wire::Msg{wire::ErrorMsg{"undecodable"}};
  }
  template <class T>
  T call_as(const wire::Msg& msg) {
    wire::Msg reply = call(msg);
    if (const auto* err = std::get_if<wire::ErrorMsg>(&reply)) ADD_FAILURE() << err->error;
    return std::holds_alternative<T>(reply) ? std::get<T>(reply) : T{};
  }
  std::size_t last_reply_frames() const { return last_reply_frames_; }

 private:
  zmq::socket_t socket_;
  std::size_t last_reply_frames_ = 0;
};

class Pusher {
 public:
  Pusher(zmq::context_t& ctx, int port) : socket_(ctx, zmq::socket_type::push) {
    socket_.set(zmq::sockopt::linger, 2000);
    socket_.connect(tcp(port));
  }
  // One multipart message, each frame one encoded message (as LMCache's worker sends).
  void send_frames(const std::vector<std::string>& frames) {
    for (std::size_t i = 0; i < frames.size(); ++i)
      socket_.send(zmq::buffer(frames[i]),
                   i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  void send(const wire::Msg& msg) { send_frames({wire::encode(msg)}); }

 private:
  zmq::socket_t socket_;
};

}  // namespace kvnode::test
