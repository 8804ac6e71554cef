#include "local_staging.hpp"

#include <spdlog/spdlog.h>

namespace kvnode::node::local {

Result<std::unique_ptr<Staging>> Staging::create(const std::string& name, std::size_t slots,
                                                 std::size_t chunk_bytes) {
  gpu::RegionOptions ro;
  ro.shared_name = name;
  ro.huge_pages = false;  // shmem: the system's setting decides
  Result<gpu::MemoryRegion> region = gpu::MemoryRegion::allocate(slots * chunk_bytes, ro);
  if (!region) return wrap_error("local staging region: ", std::move(region).error());
  return std::unique_ptr<Staging>(new Staging(std::move(region).value(), slots, chunk_bytes));
}

Staging::Staging(gpu::MemoryRegion region, std::size_t slots, std::size_t chunk_bytes)
    : region_(std::move(region)), slot_count_(slots), chunk_bytes_(chunk_bytes) {
  for (std::size_t i = slots; i-- > 0;) free_.push_back(i);
}

std::optional<std::vector<std::size_t>> Staging::take(std::size_t n) {
  if (n > free_.size()) return std::nullopt;
  std::vector<std::size_t> out(free_.end() - static_cast<std::ptrdiff_t>(n), free_.end());
  free_.resize(free_.size() - n);
  return out;
}

std::uint64_t Staging::add_hold(Hold hold, Clock::time_point expires) {
  hold.expires = expires;
  const std::uint64_t id = next_hold_++;
  holds_.emplace(id, std::move(hold));
  return id;
}

const Hold* Staging::find(std::uint64_t id) const {
  auto it = holds_.find(id);
  return it == holds_.end() ? nullptr : &it->second;
}

std::optional<Hold> Staging::remove(std::uint64_t id) {
  auto it = holds_.find(id);
  if (it == holds_.end()) return std::nullopt;
  Hold out = std::move(it->second);
  holds_.erase(it);
  return out;
}

void Staging::give_back(Hold& hold) {
  free_.insert(free_.end(), hold.slots.begin(), hold.slots.end());
  hold.slots.clear();
  hold.writes.clear();
}

std::size_t Staging::expire(Clock::time_point now) {
  std::size_t ended = 0;
  for (auto it = holds_.begin(); it != holds_.end();) {
    if (it->second.expires > now) {
      ++it;
      continue;
    }
    spdlog::warn("local client hold {} expired unfinished ({} writes dropped)", it->first,
                 it->second.writes.size());
    give_back(it->second);
    it = holds_.erase(it);
    ++ended;
  }
  return ended;
}

std::size_t Staging::drop_owner(ConnectionId owner) {
  std::size_t ended = 0;
  for (auto it = holds_.begin(); it != holds_.end();) {
    if (it->second.owner != owner) {
      ++it;
      continue;
    }
    give_back(it->second);
    it = holds_.erase(it);
    ++ended;
  }
  return ended;
}

}  // namespace kvnode::node::local
