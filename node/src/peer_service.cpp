#include "peer_service.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <type_traits>

namespace kvnode::node {
namespace {

using peer::FinishOutcome;
using peer::ReserveOutcome;

void log_expired(const PeerService::Expired& e) {
  for (const auto& [peer, n] : e.reservations)
    spdlog::warn("move from {}: {} reservations expired unfinished (it died, or lost its finish)",
                 peer, n);
  for (const auto& [peer, n] : e.leases)
    spdlog::warn("retrieval by {}: {} leases expired (it died, or lost its unlease)", peer, n);
}

}  // namespace

PeerService::PeerService(Engine& engine, PeerServiceOptions options)
    : engine_(engine), options_(std::move(options)) {
  sweeper_ = std::thread([this] { sweep(); });
}

PeerService::~PeerService() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  sweeper_.join();
}

void PeerService::sweep() {
  const auto period = std::max<Clock::duration>(options_.ttl / 4, std::chrono::milliseconds(1));
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, period, [this] { return stopping_; })) {
    const Expired e = expire_locked(now());
    lock.unlock();  // the log's I/O outside the lock the progress thread answers under
    log_expired(e);
    lock.lock();
  }
}

Result<std::vector<std::byte>> PeerService::on_ask(const std::string& peer,
                                                   std::span<const std::byte> request) {
  Result<peer::Request> r = peer::decode_request(request);
  if (!r) {
    std::size_t n = 0;
    {
      std::lock_guard lock(mutex_);
      n = bad_requests_.pass(Clock::now());
    }
    if (n)
      spdlog::warn("{} bad peer requests since the last report; the latest, from {}: {}", n, peer,
                   r.error().message);
    return wrap_error("bad request: ", std::move(r).error());
  }
  return peer::encode(answer(peer, *r));
}

peer::Answer PeerService::answer(const std::string& peer, const peer::Request& request) {
  Expired expired;
  peer::Answer out;
  {
    std::lock_guard lock(mutex_);
    expired = expire_locked(now());
    out = std::visit(
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
  log_expired(expired);
  return out;
}

peer::ReserveAnswer PeerService::reserve(const std::string& peer, const peer::ReserveRequest& r) {
  peer::ReserveAnswer out;
  const auto expires = now() + options_.ttl;
  std::size_t unexpected = 0;
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
    if (engine_.contains(h)) {  // first: readable here is kHave even during a full sync
      out.chunks.push_back({ReserveOutcome::kHave, 0});
      continue;
    }
    if (options_.before_reserve) options_.before_reserve(h);
    Result<gpu::PageId> page = engine_.reserve(h);
    if (page) {
      reserved_[h] = Reservation{peer, r.move, *page, expires};
      out.chunks.push_back({ReserveOutcome::kPage, *page});
      continue;
    }
    out.chunks.push_back({refused(h, page.error().code, unexpected), 0});
  }
  if (unexpected)
    spdlog::error("reserve for {}: the store refused {} chunks with an unexpected code (a bug)",
                  peer, unexpected);
  return out;
}

peer::ReserveOutcome PeerService::refused(ChunkHash h, ErrorCode code, std::size_t& unexpected) {
  switch (code) {
    case ErrorCode::kFrozen:
      return ReserveOutcome::kFrozen;
    case ErrorCode::kRefused:
      // Being written by another writer, or readable since the check above (a local put
      // committed in between): the chunk is there then, and the source's run goes on.
      return engine_.contains(h) ? ReserveOutcome::kHave : ReserveOutcome::kBusy;
    case ErrorCode::kNoRoom:
      return ReserveOutcome::kNoRoom;
    default:
      // The store refuses a reservation only with the codes above. Anything else is a bug there;
      // kNoRoom is the outcome the source counts as failed without waiting or asking again, so
      // the chunk stays at the source (a new outcome would change the wire for what cannot be).
      ++unexpected;
      return ReserveOutcome::kNoRoom;
  }
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
  const auto expires = now() + options_.ttl;
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

PeerService::Expired PeerService::expire() {
  Expired e;
  {
    std::lock_guard lock(mutex_);
    e = expire_locked(now());
  }
  log_expired(e);
  return e;
}

PeerService::Expired PeerService::expire_locked(Clock::time_point at) {
  Expired out;
  for (auto it = reserved_.begin(); it != reserved_.end();) {
    if (it->second.expires > at) {
      ++it;
      continue;
    }
    ++out.reservations[it->second.peer];
    engine_.abort(it->first);
    it = reserved_.erase(it);
  }
  for (auto it = leased_.begin(); it != leased_.end();) {
    if (it->second.expires > at) {
      ++it;
      continue;
    }
    ++out.leases[it->first.first];
    it = leased_.erase(it);
  }
  return out;
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
