// The worker's control port (LMCache's REP port; a ROUTER here, so REQ and DEALER peers both get
// replies): every control request gets an answer, an ErrorMsg for what the worker cannot do.
// Quick requests (health, clear, pin, ...) are answered on the socket's thread; those that
// runs_long() (moves) go to a MoveExecutor, and their reply leaves with the request's envelope
// when the handler returns, so a health check never waits behind a move. The socket stays with
// its one thread: the executor's replies come back through an outbox and an eventfd polled next
// to the socket.
//
// Stopping: a move already running finishes (its handler returns) and is answered; moves still
// queued never start and are answered with an ErrorMsg saying the node is stopping (kStoppingText).
// A move beyond the queue bound is answered at once with busy_text() (move_executor.hpp).
//
// A handler that throws (anything, not only a std::exception) gets its request answered with an
// ErrorMsg, and the port keeps serving; so does a reply that cannot be encoded, when memory allows.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "kvnode/common/result.hpp"
#include "kvnode/wire/messages.hpp"
#include "move_executor.hpp"

namespace kvnode::agent {

// True for the control requests that run on the move executor rather than the socket's thread.
bool runs_long(const wire::Msg& request);

struct ControlStats {
  std::uint64_t requests = 0;       // answered
  std::uint64_t errors = 0;         // answered with an ErrorMsg
  std::uint64_t moves_refused = 0;  // answered "busy": the move queue was full
  std::uint64_t moves_running = 0;
  std::uint64_t moves_queued = 0;
};

class ControlServer {
 public:
  using Handler = ControlHandler;

  // Binds `port` (0: a free one) on every interface and starts serving. `control` may be unset
  // (every request is then answered with an ErrorMsg) and may run on two threads at once.
  // `max_queued_moves`: moves that may wait behind the running one before "busy" answers.
  static Result<std::unique_ptr<ControlServer>> start(zmq::context_t& ctx, int port,
                                                      std::size_t max_queued_moves,
                                                      Handler control);
  ~ControlServer();  // stop()
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  int port() const { return port_; }
  ControlStats stats() const;
  void stop();

 private:
  using Frames = std::vector<zmq::message_t>;
  ControlServer(zmq::socket_t socket, int port, std::unique_ptr<MoveExecutor> moves,
                Handler control);
  void serve();
  void take_request();
  std::optional<wire::Msg> dispatch(Frames& head, const zmq::message_t& payload);
  void send_finished();
  void finish();  // on the way out: answers what is queued or running
  void send(Frames& envelope, const wire::Msg& reply) noexcept;

  zmq::socket_t socket_;  // the serving thread's alone
  const int port_;
  const Handler control_;
  std::unique_ptr<MoveExecutor> moves_;
  std::map<std::uint64_t, Frames> waiting_;  // a queued move's envelope, by ticket (socket thread)
  std::uint64_t next_ticket_ = 0;
  std::atomic<std::uint64_t> requests_{0}, errors_{0}, moves_refused_{0};
  std::atomic<bool> stopping_{false};
  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace kvnode::agent
