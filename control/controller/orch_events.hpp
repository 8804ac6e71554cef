// The records check_finish reports: one EventRecord per fan-out call, keyed by event_id, at most
// `capacity` of them (the oldest dropped first). An event id may be reused (OrchMsgs on the PULL
// socket carry the sender's ids); each put() returns a ticket so that a late update from an
// earlier call with the same id cannot overwrite the newer call's record.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "kvnode/controller/orchestrator.hpp"

namespace kvnode::controller {

class EventLog {
 public:
  using Ticket = std::uint64_t;

  explicit EventLog(std::size_t capacity);

  // Inserts or replaces the record of event_id; the ticket identifies this call's record.
  Ticket put(const std::string& event_id, EventRecord record);
  // Replaces the record only if it is still the one `ticket` put; false otherwise.
  bool update(const std::string& event_id, Ticket ticket, EventRecord record);
  std::optional<EventRecord> get(const std::string& event_id) const;
  std::size_t size() const;

 private:
  struct Entry {
    EventRecord record;
    Ticket ticket = 0;
  };
  void drop_oldest_locked();

  const std::size_t capacity_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Entry> entries_;
  // Insertion order; an id put twice appears twice and only its latest ticket counts.
  std::deque<std::pair<std::string, Ticket>> order_;
  Ticket next_ticket_ = 1;
};

}  // namespace kvnode::controller
