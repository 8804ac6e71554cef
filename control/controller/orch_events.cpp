#include "orch_events.hpp"

#include <algorithm>

namespace kvnode::controller {

EventLog::EventLog(std::size_t capacity) : capacity_(std::max<std::size_t>(capacity, 1)) {}

EventLog::Ticket EventLog::put(const std::string& event_id, EventRecord record) {
  std::lock_guard lock(mutex_);
  const Ticket ticket = next_ticket_++;
  entries_[event_id] = Entry{std::move(record), ticket};
  order_.emplace_back(event_id, ticket);
  while (entries_.size() > capacity_) drop_oldest_locked();
  // Reused ids leave stale order entries behind; compact so order_ stays O(capacity).
  if (order_.size() > 2 * capacity_) {
    std::erase_if(order_, [&](const auto& item) {
      auto it = entries_.find(item.first);
      return it == entries_.end() || it->second.ticket != item.second;
    });
  }
  return ticket;
}

bool EventLog::update(const std::string& event_id, Ticket ticket, EventRecord record) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(event_id);
  if (it == entries_.end() || it->second.ticket != ticket) return false;
  it->second.record = std::move(record);
  return true;
}

std::optional<EventRecord> EventLog::get(const std::string& event_id) const {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(event_id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.record;
}

std::size_t EventLog::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

void EventLog::drop_oldest_locked() {
  while (!order_.empty()) {
    auto [id, ticket] = std::move(order_.front());
    order_.pop_front();
    auto it = entries_.find(id);
    if (it != entries_.end() && it->second.ticket == ticket) {
      entries_.erase(it);
      return;
    }
  }
}

}  // namespace kvnode::controller
