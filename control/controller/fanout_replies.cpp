// The fan-out executor, receiving side: polling the DEALERs and the wake-up eventfd, matching
// replies to requests by id, failing the slots whose deadline passed, and keeping those requests
// for a while so that a late reply reaches the caller's callback and not a later call.
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "fanout_executor.hpp"

namespace kvnode::controller::fanout_detail {

// Reads one whole message; nullopt when none is waiting.
std::optional<Reply> receive(zmq::socket_t& socket) {
  zmq::message_t frame;
  if (!socket.recv(frame, zmq::recv_flags::dontwait)) return std::nullopt;
  std::array<zmq::message_t, 3> parts;
  std::size_t count = 0;
  for (;;) {
    const bool more = frame.more();
    if (count < parts.size()) parts[count] = std::move(frame);
    ++count;
    if (!more) break;
    // The remaining frames of a message arrive together with its first one.
    if (!socket.recv(frame, zmq::recv_flags::dontwait)) break;
  }
  Reply reply;
  if (count != 3 || parts[0].size() != kIdSize || parts[1].size() != 0) return reply;
  std::memcpy(&reply.id, parts[0].data(), kIdSize);
  reply.body = parts[2].to_string();
  return reply;
}

void Executor::expire_calls(Clock::time_point now) {
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const auto it = calls_.find(deadlines_.begin()->second);
    Call& call = it->second;
    for (std::size_t i = 0; i < call.request_ids.size(); ++i) {
      const auto id = call.request_ids[i];
      if (id == 0) continue;
      const auto p = pending_.find(id);
      remember_late(id, call.on_late, i, p->second.conn->serial, now);
      pending_.erase(p);
      shared_.timeouts.fetch_add(1, std::memory_order_relaxed);
      call.results[i] =
          make_error(ErrorCode::kDeadline, "no reply from " + call.endpoints[i] + " within " +
                                               std::to_string(call.budget.count()) + " ms");
    }
    call.missing = 0;
    complete(it);
  }
}

void Executor::remember_late(std::uint64_t id, const std::shared_ptr<const LateReplyFn>& on_late,
                             std::size_t index, std::uint64_t conn_serial, Clock::time_point now) {
  late_.emplace(id, Late{on_late, index, conn_serial});
  late_order_.push_back({now + late_window_, id});
  while (late_order_.size() > max_late_) forget_oldest_late();
}

// late_order_ is in expiry order, since every entry waits the same window.
void Executor::expire_late(Clock::time_point now) {
  while (!late_order_.empty() && late_order_.front().expiry <= now) forget_oldest_late();
}

void Executor::forget_oldest_late() {
  late_.erase(late_order_.front().request_id);
  late_order_.pop_front();
}

void Executor::on_reply(Conn& conn, Reply reply) {
  // Only an id sent on this socket says how far the worker has read; another is ignored.
  auto& in_flight = conn.in_flight;
  if (std::binary_search(in_flight.begin(), in_flight.end(), reply.id)) {
    while (!in_flight.empty() && in_flight.front() <= reply.id) in_flight.pop_front();
  }
  if (auto p = pending_.find(reply.id); p != pending_.end() && p->second.conn == &conn) {
    const auto pending = p->second;
    pending_.erase(p);
    settle(pending.call_id, pending.index, std::move(reply.body));
    return;
  }
  if (auto l = late_.find(reply.id); l != late_.end() && l->second.conn_serial == conn.serial) {
    const auto late = std::move(l->second);
    late_.erase(l);
    shared_.late_replies.fetch_add(1, std::memory_order_relaxed);
    if (late.on_late) notify_late(*late.on_late, late.index, std::move(reply.body));
    return;
  }
  shared_.dropped_replies.fetch_add(1, std::memory_order_relaxed);
}

// The callback is the caller's code; its failure must not take the executor down.
void Executor::notify_late(const LateReplyFn& fn, std::size_t index, std::string body) noexcept {
  try {
    fn(index, std::move(body));
  } catch (...) {
  }
}

void Executor::poll_once() {
  if (poll_dirty_) rebuild_poll_items();
  try {
    zmq::poll(items_.data(), items_.size(), poll_wait());
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return;
    throw;
  }
  if (items_[0].revents & ZMQ_POLLIN) shared_.wake.drain();
  for (std::size_t i = 1; i < items_.size(); ++i) {
    if (!(items_[i].revents & ZMQ_POLLIN)) continue;
    Conn& conn = *item_conns_[i - 1];
    for (int n = 0; n < kMaxRepliesPerWake; ++n) {
      auto reply = receive(conn.socket);
      if (!reply) break;
      on_reply(conn, std::move(*reply));
    }
  }
}

// Item 0 is the wake-up eventfd, item i the DEALER item_conns_[i - 1].
void Executor::rebuild_poll_items() {
  items_.clear();
  item_conns_.clear();
  items_.push_back({nullptr, shared_.wake.fd(), ZMQ_POLLIN, 0});
  for (auto& [key, conn] : conns_) {
    items_.push_back({conn.socket.handle(), 0, ZMQ_POLLIN, 0});
    item_conns_.push_back(&conn);
  }
  poll_dirty_ = false;
}

std::chrono::milliseconds Executor::poll_wait() const {
  if (deadlines_.empty()) return kMaxPollWait;
  // Round up: waking just before a deadline would only spin until it passes.
  const auto until =
      std::chrono::ceil<std::chrono::milliseconds>(deadlines_.begin()->first - Clock::now());
  return std::clamp(until, std::chrono::milliseconds{0}, kMaxPollWait);
}

}  // namespace kvnode::controller::fanout_detail
