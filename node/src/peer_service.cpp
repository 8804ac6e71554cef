#include "peer_service.hpp"

#include <spdlog/spdlog.h>

#include <type_traits>

namespace kvnode::node {

using peer::FinishOutcome;
using peer::ReserveOutcome;

PeerService::PeerService(Engine& engine, std::chrono::milliseconds ttl)
    : engine_(engine), ttl_(ttl) {}

Result<std::vector<std::byte>> PeerService::on_ask(const std::string& peer,
                                                   std::span<const std::byte> request) {
  Result<peer::Request> r = peer::decode_request(request);
  if (!r) {
    spdlog::warn("a bad request from {}: {}", peer, r.error().message);
    return wrap_error("bad request: ", std::move(r).error());
  }
  return peer::encode(answer(peer, *r));
}

peer::Answer PeerService::answer(const std::string& peer, const peer::Request& request) {
  std::lock_guard lock(mutex_);
  expire_locked(Clock::now());
  return std::visit(
      [&](const auto& r) -> peer::Answer {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, peer::ReserveRequest>) return reserve(peer, r);
        if constexpr (std::is_same_v<T, peer::FinishRequest>) return finish(peer, r);
        if constexpr (std::is_same_v<T, peer::LeaseRequest>) return lease(peer, r);
        if constexpr (std::is_same_v<T, peer::UnleaseRequest>) return unlease(peer, r);
        if constexpr (std::is_same_v<T, peer::HoldsRequest>) return holds(r);
      },
      request);
}

peer::ReserveAnswer PeerService::reserve(const std::string& peer, const peer::ReserveRequest& r) {
  peer::ReserveAnswer out;
  const auto expires = Clock::now() + ttl_;
  for (ChunkHash h : r.hashes) {
    // Asked again by the move that holds it (retrying after a full sync): the same page, on a
    // new clock. Any other writer must not share it: its finish could free the page under a
    // push still writing it.
    if (auto it = reserved_.find(h); it != reserved_.end()) {
      if (it->second.peer != peer || it->second.move != r.move) {
        out.chunks.push_back({ReserveOutcome::kBusy, 0});
        continue;
      }
      it->second.expires = expires;
      out.chunks.push_back({ReserveOutcome::kPage, it->second.page});
      continue;
    }
    if (engine_.contains(h)) {
      out.chunks.push_back({ReserveOutcome::kHave, 0});
      continue;
    }
    Result<gpu::PageId> page = engine_.reserve(h);
    if (page) {
      reserved_[h] = Reservation{peer, r.move, *page, expires};
      out.chunks.push_back({ReserveOutcome::kPage, *page});
      continue;
    }
    switch (page.error().code) {
      case ErrorCode::kFrozen:
        out.chunks.push_back({ReserveOutcome::kFrozen, 0});
        break;
      case ErrorCode::kRefused:
        out.chunks.push_back({ReserveOutcome::kBusy, 0});
        break;
      default:
        out.chunks.push_back({ReserveOutcome::kNoRoom, 0});
        break;
    }
  }
  return out;
}

peer::FinishAnswer PeerService::finish(const std::string& peer, const peer::FinishRequest& r) {
  peer::FinishAnswer out;
  for (const peer::FinishItem& c : r.chunks) {
    const auto it = reserved_.find(c.hash);
    const bool mine = it != reserved_.end() && it->second.peer == peer && it->second.move == r.move;
    if (mine) reserved_.erase(it);
    if (!c.whole) {
      if (mine) engine_.abort(c.hash);
      out.chunks.push_back(FinishOutcome::kReleased);
      continue;
    }
    if (!mine) {  // expired (and aborted), or never reserved: stored only if someone else did
      out.chunks.push_back(engine_.contains(c.hash) ? FinishOutcome::kStored
                                                    : FinishOutcome::kLost);
      continue;
    }
    const Status stored = engine_.commit(c.hash);
    if (stored)
      out.chunks.push_back(FinishOutcome::kStored);
    else if (stored.error().code == ErrorCode::kFrozen)  // the store gave the page back
      out.chunks.push_back(FinishOutcome::kFrozen);
    else
      out.chunks.push_back(FinishOutcome::kLost);
  }
  return out;
}

peer::LeaseAnswer PeerService::lease(const std::string& peer, const peer::LeaseRequest& r) {
  peer::LeaseAnswer out;
  const auto expires = Clock::now() + ttl_;
  for (ChunkHash h : r.hashes) {
    std::optional<Lease> lease = engine_.lease(h);
    if (!lease) break;  // the leading run ends here
    out.pages.push_back(lease->page());
    const auto key = std::make_pair(peer, h);
    leased_.erase(key);  // a lease taken again replaces the old (one per peer and chunk)
    leased_.emplace(key, Held{std::move(*lease), expires});
  }
  return out;
}

peer::UnleaseAnswer PeerService::unlease(const std::string& peer, const peer::UnleaseRequest& r) {
  for (ChunkHash h : r.hashes) leased_.erase({peer, h});
  return {};
}

peer::HoldsAnswer PeerService::holds(const peer::HoldsRequest& r) {
  peer::HoldsAnswer out;
  for (ChunkHash h : r.hashes) out.held.push_back(engine_.contains(h) ? 1 : 0);
  return out;
}

void PeerService::expire() {
  std::lock_guard lock(mutex_);
  expire_locked(Clock::now());
}

void PeerService::expire_locked(Clock::time_point now) {
  for (auto it = reserved_.begin(); it != reserved_.end();) {
    if (it->second.expires > now) {
      ++it;
      continue;
    }
    spdlog::warn("move from {}: reservation of chunk {} expired", it->second.peer, it->first);
    engine_.abort(it->first);
    it = reserved_.erase(it);
  }
  for (auto it = leased_.begin(); it != leased_.end();) {
    if (it->second.expires > now) {
      ++it;
      continue;
    }
    spdlog::warn("retrieval by {}: lease of chunk {} expired", it->first.first, it->first.second);
    it = leased_.erase(it);
  }
}

std::size_t PeerService::reservations() const {
  std::lock_guard lock(mutex_);
  return reserved_.size();
}

std::size_t PeerService::leases() const {
  std::lock_guard lock(mutex_);
  return leased_.size();
}

}  // namespace kvnode::node
