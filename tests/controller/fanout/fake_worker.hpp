// Stand-ins for LMCache workers in the fan-out tests: a REP socket on an ephemeral 127.0.0.1 port,
// served by its own thread, that answers "echo:<payload>" after a delay chosen per request, or
// stops answering altogether (a hung worker).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <zmq.hpp>

namespace kvnode::controller::testing {

class FakeWorker {
 public:
  // How long to wait before answering a payload; nullopt: never answer again.
  using Policy =
      std::function<std::optional<std::chrono::milliseconds>(const std::string& payload)>;

  static Policy answer_now() {
    return [](const std::string&) { return std::chrono::milliseconds{0}; };
  }
  static Policy never_answer() {
    return [](const std::string&) { return std::nullopt; };
  }

  // bind_to names a fixed endpoint when a worker comes back where an earlier one lived.
  explicit FakeWorker(zmq::context_t& ctx, Policy policy = answer_now(),
                      const std::string& bind_to = "tcp://127.0.0.1:*")
      : socket_(ctx, zmq::socket_type::rep), policy_(std::move(policy)) {
    socket_.set(zmq::sockopt::linger, 0);
    bind(bind_to);
    endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this] { serve(); });
  }

  ~FakeWorker() {
    stop_ = true;
    thread_.join();
  }

  FakeWorker(const FakeWorker&) = delete;
  FakeWorker& operator=(const FakeWorker&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  int answered() const { return answered_; }

 private:
  // A port just released by a closed socket can stay busy for a moment (ZMQ closes it on its
  // I/O thread), so a fixed endpoint is retried briefly.
  void bind(const std::string& to) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (;;) {
      try {
        socket_.bind(to);
        return;
      } catch (const zmq::error_t& e) {
        if (e.num() != EADDRINUSE || std::chrono::steady_clock::now() > give_up) throw;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }

  void serve() {
    while (!stop_) {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(20));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      zmq::message_t request;
      (void)socket_.recv(request);
      const auto payload = request.to_string();
      const auto delay = policy_(payload);
      if (!delay) {
        wait_for_stop();
        return;
      }
      if (!sleep_unless_stopped(*delay)) return;
      (void)socket_.send(zmq::buffer("echo:" + payload), zmq::send_flags::none);
      ++answered_;
    }
  }

  bool sleep_unless_stopped(std::chrono::milliseconds delay) {
    const auto until = std::chrono::steady_clock::now() + delay;
    while (std::chrono::steady_clock::now() < until) {
      if (stop_) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return !stop_;
  }

  void wait_for_stop() {
    while (!stop_) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  zmq::socket_t socket_;  // the serving thread's alone once it runs
  std::string endpoint_;
  Policy policy_;
  std::atomic<bool> stop_{false};
  std::atomic<int> answered_{0};
  std::thread thread_;
};

// An endpoint where nothing listens: a port the kernel handed out and that was closed again.
inline std::string unused_endpoint(zmq::context_t& ctx) {
  zmq::socket_t probe(ctx, zmq::socket_type::rep);
  probe.set(zmq::sockopt::linger, 0);
  probe.bind("tcp://127.0.0.1:*");
  return probe.get(zmq::sockopt::last_endpoint);
}

}  // namespace kvnode::controller::testing
