// The local service's staging region and the holds on it. The region is POSIX shared memory of
// `slots` chunks that clients map; a hold is a client's unfinished reserve (slots it writes, each
// for a chunk) or lease (slots the node filled for it to read). A hold belongs to the connection
// that made it: only that one ends it, and its holds end when it closes. Slots return to the free
// list when their hold ends, committed or not, or expires. Socket thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/gpu/memory_region.hpp"
#include "kvnode/node/chunk_store.hpp"

namespace kvnode::node::local {

using Clock = std::chrono::steady_clock;
using ConnectionId = std::uint64_t;  // a local socket connection (as local_socket_server.hpp)

enum class HoldKind : std::uint8_t { kReserve, kLease };

struct Hold {
  HoldKind kind = HoldKind::kLease;
  ConnectionId owner = 0;                                   // the connection that made it
  std::vector<std::pair<ChunkHash, std::size_t>> writes{};  // reserve: (chunk, slot), in order
  std::vector<std::size_t> slots{};                         // every slot held
  std::uint64_t since = ChunkStore::kAnyAge;  // reserve: the put's tick (evict older only)
  Clock::time_point expires{};
};

class Staging {
 public:
  static Result<std::unique_ptr<Staging>> create(const std::string& name, std::size_t slots,
                                                 std::size_t chunk_bytes);

  std::size_t slot_count() const { return slot_count_; }
  std::size_t free_slots() const { return free_.size(); }
  const std::string& name() const { return region_.shared_name(); }
  std::byte* slot(std::size_t i) const { return region_.data() + i * chunk_bytes_; }
  std::int64_t offset(std::size_t i) const { return static_cast<std::int64_t>(i * chunk_bytes_); }

  // `n` free slots, or none when fewer are free.
  std::optional<std::vector<std::size_t>> take(std::size_t n);

  std::size_t holds() const { return holds_.size(); }
  std::uint64_t add_hold(Hold hold, Clock::time_point expires);
  const Hold* find(std::uint64_t id) const;
  // Takes a hold out (its slots stay taken until end_hold's caller gives them back).
  std::optional<Hold> remove(std::uint64_t id);
  void give_back(Hold& hold);
  // Ends every hold past its expiry: slots back, writes dropped. Returns how many ended.
  std::size_t expire(Clock::time_point now);
  // Ends every hold of `owner` (its connection closed): slots back, writes dropped.
  std::size_t drop_owner(ConnectionId owner);

 private:
  Staging(gpu::MemoryRegion region, std::size_t slots, std::size_t chunk_bytes);
  gpu::MemoryRegion region_;
  std::size_t slot_count_ = 0;
  std::size_t chunk_bytes_ = 0;
  std::vector<std::size_t> free_;
  std::map<std::uint64_t, Hold> holds_;
  std::uint64_t next_hold_ = 1;
};

}  // namespace kvnode::node::local
