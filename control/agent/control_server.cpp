#include "control_server.hpp"

#include <spdlog/spdlog.h>

#include <exception>
#include <list>
#include <optional>
#include <string>
#include <utility>

#include "kvnode/wire/codec.hpp"

namespace kvnode::agent {
namespace {

constexpr auto kSlice = std::chrono::milliseconds(50);  // how often the thread checks for stop
// How long the last replies (of moves finished or refused while stopping) may take to leave.
constexpr auto kStopLinger = std::chrono::milliseconds(1000);
// Control requests are small (a move's token list is the largest); more is hostile.
constexpr std::int64_t kMaxRequestBytes = 64LL << 20;
constexpr std::size_t kMaxRequestFrames = 64;

template <class T>
bool holds(const wire::Msg& m) {
  return std::holds_alternative<T>(m);
}

bool is_control(const wire::Msg& m) {
  return holds<wire::ClearWorkerMsg>(m) || holds<wire::PinWorkerMsg>(m) ||
         holds<wire::CompressWorkerMsg>(m) || holds<wire::DecompressWorkerMsg>(m) ||
         holds<wire::MoveWorkerMsg>(m) || holds<wire::HealthWorkerMsg>(m) ||
         holds<wire::CheckFinishWorkerMsg>(m);
}

}  // namespace

bool runs_long(const wire::Msg& request) {
  return holds<wire::MoveWorkerMsg>(request);
}

Result<std::unique_ptr<ControlServer>> ControlServer::start(zmq::context_t& ctx, int port,
                                                            std::size_t max_queued_moves,
                                                            Handler control) {
  Result<std::unique_ptr<MoveExecutor>> moves = MoveExecutor::start(max_queued_moves, control);
  if (!moves) return moves.error();
  try {
    // A ROUTER, not a REP: libzmq's REP loses a later client's reply after a message without the
    // REQ envelope. The ROUTER answers every request with the envelope it came with.
    zmq::socket_t socket(ctx, zmq::socket_type::router);
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::maxmsgsize, kMaxRequestBytes);
    socket.bind(port ? "tcp://*:" + std::to_string(port) : std::string("tcp://*:*"));
    const std::string bound = socket.get(zmq::sockopt::last_endpoint);
    const int bound_port = std::stoi(bound.substr(bound.rfind(':') + 1));
    return std::unique_ptr<ControlServer>(new ControlServer(
        std::move(socket), bound_port, std::move(moves).value(), std::move(control)));
  } catch (const zmq::error_t& e) {
    return make_error(ErrorCode::kIo, "worker agent: cannot bind the REP port " +
                                          std::to_string(port) + ": " + e.what());
  }
}

ControlServer::ControlServer(zmq::socket_t socket, int port, std::unique_ptr<MoveExecutor> moves,
                             Handler control)
    : socket_(std::move(socket)),
      port_(port),
      control_(std::move(control)),
      moves_(std::move(moves)) {
  thread_ = std::thread([this] { serve(); });
}

ControlServer::~ControlServer() {
  stop();
}

void ControlServer::stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

ControlStats ControlServer::stats() const {
  const MoveExecutor::Load load = moves_->load();
  return ControlStats{requests_.load(), errors_.load(), moves_refused_.load(), load.running,
                      load.queued};
}

void ControlServer::serve() {
  // zmq::poll takes a raw descriptor next to the socket: the executor's wake-up.
  zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                             {nullptr, moves_->wake_fd(), ZMQ_POLLIN, 0}};
  while (!stopping_) {
    try {
      if (zmq::poll(items, 2, kSlice) == 0) continue;
      if (items[1].revents & ZMQ_POLLIN) send_finished();
      if (items[0].revents & ZMQ_POLLIN) take_request();
    } catch (const std::exception& e) {  // zmq errors, and bad_alloc from a hostile request
      spdlog::warn("worker agent: control socket: {}", e.what());
    } catch (...) {
      spdlog::warn("worker agent: control socket: an exception that is not a std::exception");
    }
  }
  try {
    finish();
  } catch (const std::exception& e) {
    spdlog::warn("worker agent: control socket while stopping: {}", e.what());
  } catch (...) {
    spdlog::warn("worker agent: control socket while stopping: an unknown exception");
  }
}

// A request arrives as [identity, envelope..., "", payload] from a REQ, or [identity, payload]
// from a DEALER that skips the delimiter. The reply goes back with everything up to and including
// the first empty frame (just the identity when there is none), so REQ and DEALER peers both get
// their answer; the payload is the last frame, as LMCache reads it.
void ControlServer::take_request() {
  Frames head;  // every frame before the payload (bounded)
  zmq::message_t frame;
  while (socket_.recv(frame, zmq::recv_flags::none) && frame.more())
    if (head.size() < kMaxRequestFrames) head.push_back(std::move(frame));
  if (head.empty()) return;  // a ROUTER always prepends the identity
  std::size_t envelope = 1;
  for (std::size_t i = 1; i < head.size(); ++i)
    if (head[i].size() == 0) {
      envelope = i + 1;
      break;
    }
  head.erase(head.begin() + static_cast<std::ptrdiff_t>(envelope), head.end());

  // From here on the request has an envelope to answer with: whatever fails is answered.
  std::optional<wire::Msg> reply;
  try {
    reply = dispatch(head, frame);
  } catch (const std::exception& e) {  // out of memory, most likely
    reply = wire::ErrorMsg{std::string(kWorkerErrorPrefix) + e.what()};
  } catch (...) {
    reply = wire::ErrorMsg{std::string(kUnknownExceptionText)};
  }
  if (reply) send(head, *reply);
}

// The reply to send now, or nothing when the request went to the move executor (`head`, its
// envelope, then waits in waiting_ for the move's reply).
std::optional<wire::Msg> ControlServer::dispatch(Frames& head, const zmq::message_t& payload) {
  Result<wire::Msg> request = wire::decode(payload.to_string_view());
  if (!request) return wire::ErrorMsg{std::string(kWorkerErrorPrefix) + request.error().message};
  if (!is_control(*request)) {
    return wire::ErrorMsg{"Unknown message: " + wire::python_class_text(wire::tag_of(*request))};
  }
  if (!runs_long(*request)) return reply_or_error(control_, *request);
  // The envelope waits before the move is queued: once queued, its reply has somewhere to go.
  const std::uint64_t ticket = next_ticket_++;
  const auto waiting = waiting_.emplace(ticket, Frames{}).first;
  bool queued = false;
  try {
    queued = moves_->submit(ticket, std::move(*request));
  } catch (...) {
    waiting_.erase(waiting);
    throw;
  }
  if (!queued) {
    waiting_.erase(waiting);
    const MoveExecutor::Load load = moves_->load();
    moves_refused_.fetch_add(1, std::memory_order_relaxed);
    return wire::ErrorMsg{busy_text(load.running, load.queued)};
  }
  waiting->second = std::move(head);  // no allocation: a vector's move
  return std::nullopt;
}

void ControlServer::send_finished() {
  for (MoveExecutor::Job& done : moves_->take_finished()) {
    auto it = waiting_.find(done.ticket);
    if (it == waiting_.end()) continue;  // cannot happen: every ticket queued has an envelope
    send(it->second, done.reply);
    waiting_.erase(it);
  }
}

void ControlServer::finish() {
  socket_.set(zmq::sockopt::linger, static_cast<int>(kStopLinger.count()));
  const std::list<MoveExecutor::Job> never_started = moves_->stop();  // waits for the running one
  send_finished();
  for (const MoveExecutor::Job& job : never_started) {
    auto it = waiting_.find(job.ticket);
    if (it == waiting_.end()) continue;
    send(it->second, wire::ErrorMsg{std::string(kStoppingText)});
    waiting_.erase(it);
  }
}

// Sends `reply` with `envelope`; never throws, so one reply that cannot leave does not take those
// after it down too. A reply that cannot be encoded (out of memory) leaves as an ErrorMsg if one
// still can.
void ControlServer::send(Frames& envelope, const wire::Msg& reply) noexcept {
  try {
    bool failed = std::holds_alternative<wire::ErrorMsg>(reply);
    std::string payload;  // encoded before the first frame goes out
    try {
      payload = wire::encode(reply);
    } catch (const std::exception& e) {
      spdlog::warn("worker agent: cannot encode a {} reply: {}", wire::tag_of(reply), e.what());
      payload = wire::encode(
          wire::ErrorMsg{std::string(kWorkerErrorPrefix) + "cannot encode the reply: " + e.what()});
      failed = true;
    }
    // Counted before it leaves: a caller that has its answer sees it counted.
    requests_.fetch_add(1, std::memory_order_relaxed);
    if (failed) errors_.fetch_add(1, std::memory_order_relaxed);
    for (zmq::message_t& frame : envelope) socket_.send(frame, zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(payload), zmq::send_flags::none);
  } catch (const std::exception& e) {
    spdlog::warn("worker agent: a control reply was lost: {}", e.what());
  } catch (...) {
    spdlog::warn("worker agent: a control reply was lost to an unknown exception");
  }
}

}  // namespace kvnode::agent
