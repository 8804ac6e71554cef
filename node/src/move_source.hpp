// The source side of one cross-node move, as the state machine peer_moves.hpp writes down: each
// state does its work and names what happened (a MoveEvent); next() holds every transition.
// One MoveSource per move, run on the caller's thread; it owns nothing shared.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvnode/node/peer_moves.hpp"
#include "peer_protocol.hpp"

namespace kvnode::node {

enum class MoveEvent : std::uint8_t {
  kOk,
  kRefused,        // the move cannot be: to this node, or tokens that do not hash
  kEmpty,          // the source holds none of the chunks
  kFrozen,         // the destination refused some chunks for a full sync, before the deadline
  kPeerLost,       // an ask went unanswered (peer lost, unreachable, past its deadline)
  kNothingToPush,  // no chunk of the batch got a page there
  kMore,           // the batch was confirmed whole and chunks remain
  kRunEnds,        // the confirmed run ends (a gap, or the last batch)
  kKeepSource,     // copy=true, or the destination holds none of what it confirmed
  kStopped,        // PeerMoves::stop(): the rest counted failed, nothing evicted
};
const char* to_string(MoveEvent e);

// Every transition of the move: the state after `s` once its work ended in `e`. kFailed for a
// pair that cannot happen (a bug; logged).
MoveState next(MoveState s, MoveEvent e);

class MoveSource {
 public:
  // `id`: unique among this node's moves (the destination keeps each move's pages apart).
  MoveSource(Engine& engine, transfer::PeerTransport& transport, const PeerMovesOptions& options,
             const StopSignal& stop, std::uint64_t id, std::string peer,
             const std::vector<std::int64_t>& tokens, bool copy);
  MoveResult run();

 private:
  using Clock = std::chrono::steady_clock;
  // A chunk of the current batch.
  enum class Fate : std::uint8_t {
    kPending,  // not yet settled (it may have a page there this round)
    kFrozen,   // refused for a full sync: asked again after kWaitThaw
    kSent,     // pushed and stored there
    kPresent,  // there already
    kFailed,   // not there: kept at the source
  };
  struct Push {
    std::size_t index = 0;  // in the batch
    gpu::PageId page = 0;   // there
    bool whole = false;
  };
  struct Confirmed {
    ChunkHash hash = 0;
    bool sent = false;  // counted in chunks_sent (else chunks_present)
  };

  MoveEvent act(MoveState s);
  MoveEvent lease_local();
  MoveEvent reserve();
  MoveEvent wait_thaw();
  MoveEvent push();
  MoveEvent finish();
  MoveEvent next_batch();
  MoveEvent check_holds();
  MoveEvent evict_source();
  MoveEvent stopped(MoveState s);
  void begin_batch();
  bool count_batch();  // counts the batch in order; whether the confirmed run broke in it
  ChunkHash hash_of(std::size_t index) const { return leases_[start_ + index].hash(); }
  void note(std::string error) { out_.error = std::move(error); }

  Engine& engine_;
  transfer::PeerTransport& transport_;
  const PeerMovesOptions& options_;
  const StopSignal& stop_;
  std::uint64_t id_;
  std::string peer_;
  const std::vector<std::int64_t>& tokens_;
  bool copy_;
  MoveResult out_;
  std::vector<Lease> leases_;  // the leading chunks held here, kept in place while read
  std::size_t start_ = 0;      // the batch: leases_[start_, start_ + fate_.size())
  std::vector<Fate> fate_;
  std::vector<Push> pushing_;  // this round's pages there
  Clock::time_point frozen_until_{};
  std::vector<Confirmed> confirmed_;  // the leading run the destination confirmed, in order
};

}  // namespace kvnode::node
