#include "retrieve.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "peer_client.hpp"

namespace kvnode::node {

const char* to_string(RetrieveEvent e) {
  switch (e) {
    case RetrieveEvent::kOk:
      return "ok";
    case RetrieveEvent::kAllLocal:
      return "all_local";
    case RetrieveEvent::kNobody:
      return "nobody";
    case RetrieveEvent::kPeerLost:
      return "peer_lost";
    case RetrieveEvent::kNoRoom:
      return "no_room";
    case RetrieveEvent::kMore:
      return "more";
    case RetrieveEvent::kRunEnds:
      return "run_ends";
    case RetrieveEvent::kStopped:
      return "stopped";
  }
  return "unknown";
}

RetrieveState next(RetrieveState s, RetrieveEvent e) {
  using S = RetrieveState;
  using E = RetrieveEvent;
  if (e == E::kStopped && s != S::kDone) return S::kFailed;  // from any state
  switch (s) {
    case S::kLocate:
      if (e == E::kOk) return S::kLeaseRemote;
      if (e == E::kAllLocal) return S::kDone;
      if (e == E::kNobody) return S::kFailed;
      break;
    case S::kLeaseRemote:
      if (e == E::kOk) return S::kReserveLocal;
      if (e == E::kPeerLost) return S::kDone;
      break;
    case S::kReserveLocal:
      if (e == E::kOk) return S::kPull;
      if (e == E::kNoRoom) return S::kUnlease;
      break;
    case S::kPull:
      if (e == E::kOk) return S::kCommitLocal;
      break;
    case S::kCommitLocal:
      if (e == E::kOk) return S::kUnlease;
      break;
    case S::kUnlease:
      if (e == E::kMore) return S::kLeaseRemote;
      if (e == E::kRunEnds) return S::kDone;
      break;
    case S::kDone:
    case S::kFailed:
      return s;
  }
  spdlog::error("retrieve: no transition from {} on {} (a bug)", to_string(s), to_string(e));
  return S::kFailed;
}

Retrieve::Retrieve(Engine& engine, transfer::PeerTransport& transport,
                   const PeerMovesOptions& options, const StopSignal& stop,
                   const std::vector<ChunkHash>& wanted, const Locate& locate)
    : engine_(engine),
      transport_(transport),
      options_(options),
      stop_(stop),
      wanted_(wanted),
      locate_(locate) {}

RetrieveResult Retrieve::run() {
  RetrieveState s = RetrieveState::kLocate;
  for (;;) {
    if (options_.on_retrieve_state) options_.on_retrieve_state(s);
    if (s == RetrieveState::kDone || s == RetrieveState::kFailed) break;
    const RetrieveEvent e = stop_.stopped() ? stopped(s) : act(s);
    const RetrieveState n = next(s, e);
    if (n == RetrieveState::kFailed && s != RetrieveState::kLocate && e != RetrieveEvent::kStopped)
      out_.error =
          "internal: no transition from " + std::string(to_string(s)) + " on " + to_string(e);
    s = n;
  }
  return std::move(out_);
}

RetrieveEvent Retrieve::act(RetrieveState s) {
  switch (s) {
    case RetrieveState::kLocate:
      return locate();
    case RetrieveState::kLeaseRemote:
      return lease_remote();
    case RetrieveState::kReserveLocal:
      return reserve_local();
    case RetrieveState::kPull:
      return pull();
    case RetrieveState::kCommitLocal:
      return commit_local();
    case RetrieveState::kUnlease:
      return unlease();
    case RetrieveState::kDone:
    case RetrieveState::kFailed:
      break;
  }
  return RetrieveEvent::kOk;
}

RetrieveEvent Retrieve::locate() {
  out_.chunks_local = engine_.leading(wanted_);
  held_ = out_.chunks_local;
  if (held_ == wanted_.size()) return RetrieveEvent::kAllLocal;
  // Pages for the pulled chunks evict only chunks older than this retrieve: never the local
  // prefix (refreshed now) nor what an earlier batch pulled.
  since_ = engine_.tick();
  for (std::size_t i = 0; i < held_; ++i) (void)engine_.refresh(wanted_[i]);
  // Ask for the run this node lacks, from its first missing chunk: the controller counts hits
  // from the first hash asked and leaves the asker out, so asking for the whole prefix finds
  // nobody when this node holds its start.
  const std::vector<ChunkHash> missing(wanted_.begin() + static_cast<std::ptrdiff_t>(held_),
                                       wanted_.end());
  Result<std::pair<std::string, std::size_t>> where = locate_(missing);
  if (!where || where->second == 0 || where->first.empty()) {
    out_.error = where ? "no peer holds more of it" : where.error().message;
    return RetrieveEvent::kNobody;
  }
  out_.peer = where->first;
  end_ = std::min(held_ + where->second, wanted_.size());
  return RetrieveEvent::kOk;
}

RetrieveEvent Retrieve::lease_remote() {
  asked_ = std::min(options_.batch, end_ - held_);
  stored_ = 0;
  peer::LeaseRequest q;
  q.hashes.assign(wanted_.begin() + static_cast<std::ptrdiff_t>(held_),
                  wanted_.begin() + static_cast<std::ptrdiff_t>(held_ + asked_));
  Result<peer::LeaseAnswer> a = peer::ask<peer::LeaseAnswer>(transport_, out_.peer, q);
  // Past its deadline the holder may have leased them all the same: unleased now, not at the end
  // of its clock, so those chunks can be evicted there again.
  if (!a && a.error().code == ErrorCode::kDeadline) peer::give_back(transport_, out_.peer, q);
  if (!a || a->pages.empty()) {
    out_.error = a ? "the peer no longer holds them" : a.error().message;
    return RetrieveEvent::kPeerLost;
  }
  remote_ = std::move(a->pages);
  leased_.assign(q.hashes.begin(), q.hashes.begin() + static_cast<std::ptrdiff_t>(remote_.size()));
  return RetrieveEvent::kOk;
}

RetrieveEvent Retrieve::reserve_local() {
  copies_.clear();
  for (std::size_t i = 0; i < leased_.size(); ++i) {
    Result<gpu::PageId> page = engine_.reserve(leased_[i], since_);
    if (!page) {  // no room (or a full sync runs here): pull what fits
      if (i == 0) out_.error = "no page here: " + page.error().message;
      break;
    }
    copies_.push_back({*page, remote_[i]});
  }
  return copies_.empty() ? RetrieveEvent::kNoRoom : RetrieveEvent::kOk;
}

RetrieveEvent Retrieve::pull() {
  pulled_ = transport_.pull(out_.peer, copies_, {}).get();
  if (!pulled_.ok())
    out_.error = std::string(transfer::to_string(pulled_.failure)) + ": " + pulled_.message;
  return RetrieveEvent::kOk;
}

RetrieveEvent Retrieve::commit_local() {
  // Only the leading chunks pulled whole become readable; a commit refused (a full sync began
  // here: the store gave the page back) ends the run too.
  for (std::size_t i = 0; i < copies_.size(); ++i) {
    const bool whole = i < pulled_.done.size() && pulled_.done[i] && stored_ == i;
    if (!whole) {
      engine_.abort(leased_[i]);
      continue;
    }
    const Status committed = engine_.commit(leased_[i]);
    if (committed)
      ++stored_;
    else
      out_.error = "storing a pulled chunk: " + committed.error().message;
  }
  held_ += stored_;
  out_.chunks_pulled += stored_;
  return RetrieveEvent::kOk;
}

RetrieveEvent Retrieve::unlease() {
  peer::UnleaseRequest q{leased_};
  // Unanswered, the holder's leases expire on its clock.
  Result<peer::UnleaseAnswer> a = peer::ask<peer::UnleaseAnswer>(transport_, out_.peer, q);
  if (!a) spdlog::info("retrieve from {}: unlease: {}", out_.peer, a.error().message);
  return stored_ == asked_ && held_ < end_ ? RetrieveEvent::kMore : RetrieveEvent::kRunEnds;
}

RetrieveEvent Retrieve::stopped(RetrieveState s) {
  out_.error = "stopped: this node is shutting down";
  // Reserved here for the batch and not committed yet: given back. Leases at the holder end on
  // its clock (an ask now could wait its whole deadline).
  if (s == RetrieveState::kPull || s == RetrieveState::kCommitLocal)
    for (std::size_t i = 0; i < copies_.size(); ++i) engine_.abort(leased_[i]);
  return RetrieveEvent::kStopped;
}

}  // namespace kvnode::node
