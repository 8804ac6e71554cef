#include "move_source.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "kvnode/keys/chunk_hash.hpp"
#include "peer_address.hpp"
#include "peer_client.hpp"

namespace kvnode::node {

using peer::FinishOutcome;
using peer::ReserveOutcome;

const char* to_string(MoveEvent e) {
  switch (e) {
    case MoveEvent::kOk:
      return "ok";
    case MoveEvent::kRefused:
      return "refused";
    case MoveEvent::kEmpty:
      return "empty";
    case MoveEvent::kFrozen:
      return "frozen";
    case MoveEvent::kPeerLost:
      return "peer_lost";
    case MoveEvent::kNothingToPush:
      return "nothing_to_push";
    case MoveEvent::kMore:
      return "more";
    case MoveEvent::kRunEnds:
      return "run_ends";
    case MoveEvent::kKeepSource:
      return "keep_source";
    case MoveEvent::kStopped:
      return "stopped";
  }
  return "unknown";
}

MoveState next(MoveState s, MoveEvent e) {
  using S = MoveState;
  using E = MoveEvent;
  if (e == E::kStopped && s != S::kDone) return S::kFailed;  // from any state
  switch (s) {
    case S::kLeaseLocal:
      if (e == E::kOk) return S::kReserve;
      if (e == E::kEmpty) return S::kDone;
      if (e == E::kRefused) return S::kFailed;
      break;
    case S::kReserve:
      if (e == E::kOk) return S::kPush;
      if (e == E::kFrozen) return S::kWaitThaw;
      if (e == E::kPeerLost) return S::kNextBatch;
      break;
    case S::kWaitThaw:
      if (e == E::kOk) return S::kReserve;
      break;
    case S::kPush:
      if (e == E::kOk) return S::kFinish;
      if (e == E::kNothingToPush) return S::kNextBatch;
      break;
    case S::kFinish:
      if (e == E::kOk || e == E::kPeerLost) return S::kNextBatch;
      if (e == E::kFrozen) return S::kWaitThaw;
      break;
    case S::kNextBatch:
      if (e == E::kMore) return S::kReserve;
      if (e == E::kRunEnds) return S::kCheckHolds;
      break;
    case S::kCheckHolds:
      if (e == E::kOk) return S::kEvictSource;
      if (e == E::kKeepSource) return S::kDone;
      break;
    case S::kEvictSource:
      if (e == E::kOk) return S::kDone;
      break;
    case S::kDone:
    case S::kFailed:
      return s;
  }
  spdlog::error("move: no transition from {} on {} (a bug)", to_string(s), to_string(e));
  return S::kFailed;
}

MoveSource::MoveSource(Engine& engine, transfer::PeerTransport& transport,
                       const PeerMovesOptions& options, const StopSignal& stop, std::uint64_t id,
                       std::string peer, const std::vector<std::int64_t>& tokens, bool copy)
    : engine_(engine),
      transport_(transport),
      options_(options),
      stop_(stop),
      id_(id),
      peer_(std::move(peer)),
      tokens_(tokens),
      copy_(copy) {}

MoveResult MoveSource::run() {
  MoveState s = MoveState::kLeaseLocal;
  for (;;) {
    if (options_.on_move_state) options_.on_move_state(s);
    if (s == MoveState::kDone || s == MoveState::kFailed) break;
    const MoveEvent e = stop_.stopped() ? stopped(s) : act(s);
    const MoveState n = next(s, e);
    if (n == MoveState::kFailed && s != MoveState::kLeaseLocal && e != MoveEvent::kStopped)
      note("internal: no transition from " + std::string(to_string(s)) + " on " + to_string(e));
    s = n;
  }
  return std::move(out_);
}

MoveEvent MoveSource::act(MoveState s) {
  switch (s) {
    case MoveState::kLeaseLocal:
      return lease_local();
    case MoveState::kReserve:
      return reserve();
    case MoveState::kWaitThaw:
      return wait_thaw();
    case MoveState::kPush:
      return push();
    case MoveState::kFinish:
      return finish();
    case MoveState::kNextBatch:
      return next_batch();
    case MoveState::kCheckHolds:
      return check_holds();
    case MoveState::kEvictSource:
      return evict_source();
    case MoveState::kDone:
    case MoveState::kFailed:
      break;
  }
  return MoveEvent::kOk;
}

void MoveSource::begin_batch() {
  fate_.assign(std::min(options_.batch, leases_.size() - start_), Fate::kPending);
  pushing_.clear();
  frozen_until_ = Clock::now() + options_.frozen_wait;
}

MoveEvent MoveSource::lease_local() {
  Result<std::vector<ChunkHash>> hashes = engine_.hashes(tokens_);
  if (!hashes) {
    note(hashes.error().message);
    return MoveEvent::kRefused;
  }
  if (names_own_listener(peer_, transport_.url())) {
    out_.refused = true;
    note("the destination " + peer_ + " is this node itself (its peer_init_url is " +
         transport_.url() + "); nothing moved, every chunk stays");
    return MoveEvent::kRefused;
  }
  // Leases keep the chunks from being evicted or freed while they are read.
  leases_ = engine_.lease_leading(*hashes);
  if (leases_.empty()) return MoveEvent::kEmpty;
  begin_batch();
  return MoveEvent::kOk;
}

MoveEvent MoveSource::reserve() {
  peer::ReserveRequest q;
  q.move = id_;
  std::vector<std::size_t> asked;  // batch indices, in q's order
  for (std::size_t i = 0; i < fate_.size(); ++i) {
    if (fate_[i] != Fate::kPending && fate_[i] != Fate::kFrozen) continue;
    q.hashes.push_back(hash_of(i));
    asked.push_back(i);
  }
  Result<peer::ReserveAnswer> a = peer::ask<peer::ReserveAnswer>(transport_, peer_, q);
  if (!a) {
    note(a.error().message);
    // Past its deadline the destination may have reserved them all the same: released now, not
    // at the end of its clock, so a move retried at once does not find these chunks busy.
    if (a.error().code == ErrorCode::kDeadline) peer::give_back(transport_, peer_, q);
    for (std::size_t i : asked) fate_[i] = Fate::kFailed;
    return MoveEvent::kPeerLost;
  }
  pushing_.clear();
  std::size_t frozen = 0, no_room = 0;
  for (std::size_t k = 0; k < asked.size(); ++k) {
    const std::size_t i = asked[k];
    const peer::Reserved& r = a->chunks[k];
    switch (r.outcome) {
      case ReserveOutcome::kPage:
        fate_[i] = Fate::kPending;
        pushing_.push_back({i, r.page, false});
        break;
      case ReserveOutcome::kHave:
        fate_[i] = Fate::kPresent;
        break;
      case ReserveOutcome::kFrozen:
        fate_[i] = Fate::kFrozen;
        ++frozen;
        break;
      case ReserveOutcome::kNoRoom:
      case ReserveOutcome::kBusy:
        fate_[i] = Fate::kFailed;
        ++no_room;
        break;
    }
  }
  if (no_room) note("the destination had no page for " + std::to_string(no_room) + " chunks");
  if (frozen == 0) return MoveEvent::kOk;
  if (Clock::now() < frozen_until_) return MoveEvent::kFrozen;
  for (Fate& f : fate_)
    if (f == Fate::kFrozen) f = Fate::kFailed;
  note("a full sync at the destination outlasted the move's wait");
  return MoveEvent::kOk;
}

MoveEvent MoveSource::wait_thaw() {
  const auto left = frozen_until_ - Clock::now();
  (void)stop_.wait_for(  // stop() wakes it: the next state sees the stop
      std::max(Clock::duration::zero(), std::min<Clock::duration>(options_.frozen_poll, left)));
  return MoveEvent::kOk;
}

MoveEvent MoveSource::push() {
  if (pushing_.empty()) return MoveEvent::kNothingToPush;
  std::vector<transfer::PageCopy> copies;
  for (const Push& p : pushing_) copies.push_back({leases_[start_ + p.index].page(), p.page});
  const transfer::TransferResult r = transport_.push(peer_, std::move(copies), {}).get();
  out_.bytes += r.stats.bytes;
  if (!r.ok()) note(std::string(transfer::to_string(r.failure)) + ": " + r.message);
  for (std::size_t k = 0; k < pushing_.size(); ++k)
    pushing_[k].whole = k < r.done.size() && r.done[k];
  return MoveEvent::kOk;
}

MoveEvent MoveSource::finish() {
  peer::FinishRequest q;
  q.move = id_;
  for (const Push& p : pushing_) q.chunks.push_back({hash_of(p.index), p.whole});
  Result<peer::FinishAnswer> a = peer::ask<peer::FinishAnswer>(transport_, peer_, q);
  // Unanswered, a chunk may or may not be stored there: it stays here either way.
  std::size_t frozen = 0;
  for (std::size_t k = 0; k < pushing_.size(); ++k) {
    Fate& f = fate_[pushing_[k].index];
    if (!a) {
      f = Fate::kFailed;
      continue;
    }
    switch (a->chunks[k]) {
      case FinishOutcome::kStored:
        f = Fate::kSent;
        break;
      case FinishOutcome::kFrozen:
        f = Fate::kFrozen;
        ++frozen;
        break;
      case FinishOutcome::kLost:
      case FinishOutcome::kReleased:
        f = Fate::kFailed;
        break;
    }
  }
  pushing_.clear();
  if (!a) {
    note(a.error().message);
    return MoveEvent::kPeerLost;
  }
  // A full sync began there after the reserve: those commits were refused; push them again.
  if (frozen && Clock::now() < frozen_until_) return MoveEvent::kFrozen;
  if (frozen) note("a full sync at the destination outlasted the move's wait");
  return MoveEvent::kOk;
}

MoveEvent MoveSource::next_batch() {
  const bool gap = count_batch();
  // The prefix breaks here: later batches could only scatter chunks no node holds a usable
  // prefix of, so they stay at the source.
  if (gap) {
    out_.chunks_failed += leases_.size() - start_;
    return MoveEvent::kRunEnds;
  }
  if (start_ == leases_.size()) return MoveEvent::kRunEnds;
  begin_batch();
  return MoveEvent::kMore;
}

bool MoveSource::count_batch() {
  // Walk the batch in order: what the destination now holds, and where the run breaks.
  bool gap = false;
  for (std::size_t i = 0; i < fate_.size(); ++i) {
    const Fate f = fate_[i];
    const bool there = f == Fate::kSent || f == Fate::kPresent;
    if (f == Fate::kSent)
      ++out_.chunks_sent;
    else if (there)
      ++out_.chunks_present;
    else
      ++out_.chunks_failed;
    gap = gap || !there;
    if (gap) continue;
    confirmed_.push_back({hash_of(i), f == Fate::kSent});
    out_.tokens_confirmed = keys::chunk_end_token(start_ + i, tokens_.size(), engine_.chunk_size());
  }
  start_ += fate_.size();
  fate_.clear();
  return gap;
}

MoveEvent MoveSource::stopped(MoveState s) {
  note("stopped: this node is shutting down; every chunk not confirmed stays here");
  switch (s) {
    case MoveState::kReserve:
    case MoveState::kWaitThaw:
    case MoveState::kPush:
    case MoveState::kFinish:
    case MoveState::kNextBatch:
      // The batch is not counted yet: what it settled stands, the rest failed. Pages reserved
      // there for it end on the destination's clock (an ask now could wait its whole deadline).
      (void)count_batch();
      out_.chunks_failed += leases_.size() - start_;
      break;
    case MoveState::kLeaseLocal:   // nothing leased: nothing tried
    case MoveState::kCheckHolds:   // every batch counted; the source evicts nothing
    case MoveState::kEvictSource:  // (a copy, in effect)
    case MoveState::kDone:
    case MoveState::kFailed:
      break;
  }
  return MoveEvent::kStopped;
}

MoveEvent MoveSource::check_holds() {
  leases_.clear();
  // The destination may have evicted a confirmed chunk since (its pool full, a later batch's
  // reservations): what it holds now, from the first, is what moved.
  std::size_t held = 0;
  for (std::size_t start = 0; start < confirmed_.size() && held == start; start += options_.batch) {
    peer::HoldsRequest q;
    for (std::size_t i = start; i < std::min(confirmed_.size(), start + options_.batch); ++i)
      q.hashes.push_back(confirmed_[i].hash);
    Result<peer::HoldsAnswer> a = peer::ask<peer::HoldsAnswer>(transport_, peer_, q);
    if (!a) {
      note("checking what the destination holds: " + a.error().message);
      break;
    }
    while (held - start < q.hashes.size() && a->held[held - start]) ++held;
  }
  if (held < confirmed_.size()) {
    spdlog::warn("move to {}: the destination no longer holds {} of the {} chunks it confirmed",
                 peer_, confirmed_.size() - held, confirmed_.size());
    for (std::size_t i = held; i < confirmed_.size(); ++i) {
      --(confirmed_[i].sent ? out_.chunks_sent : out_.chunks_present);
      ++out_.chunks_failed;
    }
    out_.tokens_confirmed =
        held == 0 ? 0 : keys::chunk_end_token(held - 1, tokens_.size(), engine_.chunk_size());
    confirmed_.resize(held);
  }
  return copy_ || confirmed_.empty() ? MoveEvent::kKeepSource : MoveEvent::kOk;
}

MoveEvent MoveSource::evict_source() {
  std::size_t later = 0, kept = 0;  // EVICT only the leading run the destination holds
  for (const Confirmed& c : confirmed_) {
    const ChunkStore::Removal r = engine_.remove_or_defer(c.hash);
    later += r == ChunkStore::Removal::kWhenThawed ? 1 : 0;
    kept += r == ChunkStore::Removal::kRefused ? 1 : 0;
  }
  if (later)
    spdlog::info("move to {}: a full sync runs here; {} moved chunks leave this node when it ends",
                 peer_, later);
  if (kept) spdlog::warn("move to {}: {} chunks stay here too (pinned or gone since)", peer_, kept);
  return MoveEvent::kOk;
}

}  // namespace kvnode::node
