// Chunks between nodes: cross-node moves (protocol reference §4.3) and P2P retrieval (§4.2), as
// two state machines over a transfer::PeerTransport (the UCX plane, or a test's fake). The peer
// messages are in node/src/peer_protocol.hpp, the destination's and holder's answers in
// peer_service.hpp, the machines in move_source.hpp and retrieve.hpp.
//
// Guarantees: no chunk is reported present (ADMIT) anywhere before all its bytes are there; a
// failed move keeps every chunk at the source; with copy=false the source evicts only the
// leading run of chunks the destination says it holds when the move ends (LMCache evicts
// whatever happened, §6 D4); whatever a peer reserved or leased is given back, by the protocol
// or by the peer's clock (60 s) when the other side vanished.
//
// MOVE (source side; each state names the messages it sends):
//   kLeaseLocal --refused (to itself, bad tokens)--> kFailed         nothing tried
//   kLeaseLocal --nothing held--> kDone
//   kLeaseLocal --ok: leases on the leading chunks, batches of 256--> kReserve
//   kReserve    Reserve{move, hashes} -> per chunk kPage | kHave | kNoRoom | kFrozen | kBusy
//     --some kFrozen, before the batch's 20 s deadline--> kWaitThaw
//     --answered--> kPush          (kFrozen past the deadline, kNoRoom, kBusy: failed)
//     --peer lost / deadline--> kNextBatch (the batch failed; after a deadline, a Finish of
//       none whole gives back what the lost answer reserved, so a retried move finds them free)
//   kWaitThaw   sleeps 100 ms (never past the deadline; stop() wakes it) --> kReserve (the same
//               batch; the pages it holds come back the same)
//   kPush       push(kPage chunks) -> per chunk done or not
//     --something pushed--> kFinish      --nothing to push--> kNextBatch
//   kFinish     Finish{move, hash + whole} -> per chunk kStored | kFrozen | kLost | kReleased
//     --some kFrozen, before the deadline--> kWaitThaw (then push those again)
//     --answered, or peer lost--> kNextBatch (unanswered chunks failed)
//   kNextBatch  counts the batch in order (sent, present, failed); the confirmed run extends
//     --no gap and chunks left--> kReserve (next batch)
//     --a gap, or the last batch--> kCheckHolds (chunks after a gap: failed, never sent)
//   kCheckHolds Holds{confirmed} per batch, until the first chunk not held
//     --copy, or nothing held--> kDone    --else--> kEvictSource
//     (peer lost: held = what earlier answers showed; dropped chunks count failed)
//   kEvictSource remove_or_defer(the held run) --> kDone (a full sync here defers the EVICT)
//
// RETRIEVE (requester side):
//   kLocate       every chunk local --> kDone; nobody holds more (or lookup failed) --> kFailed
//                 else the controller names a holder and how many --> kLeaseRemote
//   kLeaseRemote  Lease{hashes} -> pages of the leading chunks leased --> kReserveLocal
//                 (peer lost, or it holds none: --> kDone; after a deadline an Unlease gives back
//                 what the lost answer leased, else leases expire there)
//   kReserveLocal pages here, evicting only chunks older than the retrieve; stops at the first
//                 refusal --> kPull, or --none--> kUnlease (the run ends)
//   kPull         pull(the reserved) -> per chunk done or not --> kCommitLocal
//   kCommitLocal  commits the leading chunks pulled whole (ADMIT here); aborts the rest
//                 (a full sync here refuses the commit: aborted) --> kUnlease
//   kUnlease      Unlease{hashes} (an error is ignored: the leases expire)
//                 --every chunk of the batch stored, more to pull--> kLeaseRemote  --else--> kDone
//
// Faults: a peer lost in any state ends the batch loop with what was confirmed before it; a
// reservation or lease whose answer was lost (deadline) expires at the peer; a destination frozen
// by a full sync is waited for up to 20 s per batch, its refused commits pushed again; a
// destination that ran out of room takes what fits; a confirmed chunk the destination evicted
// before the end is not evicted at the source. Results count every leased chunk exactly once.
//
// Stop (PeerMoves::stop(), the node shutting down): each machine checks it as it enters a state
// and, once set, goes to kFailed from any state: a move counts every chunk not yet confirmed as
// failed and evicts nothing (its chunks stay here); a retrieve aborts the pages it reserved here.
// What either holds at the peer ends on the peer's clock. Only a call in flight (an ask, a push
// or pull, each with its deadline) is waited for.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/node/engine.hpp"
#include "kvnode/transfer/peer_transport.hpp"
#include "kvnode/wire/messages.hpp"

namespace kvnode::node {

enum class MoveState : std::uint8_t {
  kLeaseLocal,
  kReserve,
  kWaitThaw,
  kPush,
  kFinish,
  kNextBatch,
  kCheckHolds,
  kEvictSource,
  kDone,
  kFailed,
};
enum class RetrieveState : std::uint8_t {
  kLocate,
  kLeaseRemote,
  kReserveLocal,
  kPull,
  kCommitLocal,
  kUnlease,
  kDone,
  kFailed,
};
const char* to_string(MoveState s);
const char* to_string(RetrieveState s);

struct RetrieveResult {
  std::size_t tokens = 0;         // leading tokens now held locally
  std::size_t chunks_local = 0;   // held before
  std::size_t chunks_pulled = 0;  // pulled from the peer and stored
  std::string peer{};             // who had them ("" when nobody)
  std::string error{};
};

// Who holds the leading chunks of a request: (peer_init_url, leading hits there), from the
// controller's BatchedP2PLookupMsg.
using Locate =
    std::function<Result<std::pair<std::string, std::size_t>>(const std::vector<ChunkHash>&)>;

// A Locate that asks the controller over `call` (the worker agent's DEALER): BatchedP2PLookupMsg
// with this worker's instance and TP rank, so the holder found serves the same rank.
Locate locate_through(std::function<Result<wire::Msg>(const wire::Msg&)> call, std::string instance,
                      std::int64_t rank);

struct MoveResult {
  std::size_t chunks_sent = 0;       // pushed and stored at the destination
  std::size_t chunks_present = 0;    // the destination had them already
  std::size_t chunks_failed = 0;     // not confirmed: kept at the source
  std::size_t tokens_confirmed = 0;  // the leading tokens the destination now holds
  std::size_t bytes = 0;
  std::string error{};   // why chunks failed, when some did
  bool refused = false;  // the move itself was wrong (to this node): nothing tried
};

struct PeerMovesOptions {
  std::size_t batch = 256;  // chunks per round trip (at most peer::kMaxChunks)
  // How long a batch waits for a destination in a full sync (a node's first comes seconds
  // after it starts) before its chunks count as failed, and how often it asks again.
  std::chrono::milliseconds frozen_wait{20'000};
  std::chrono::milliseconds frozen_poll{100};
  // Called as a move or a retrieve enters each state (tests inject faults there).
  std::function<void(MoveState)> on_move_state{};
  std::function<void(RetrieveState)> on_retrieve_state{};
};

// Ends running moves and retrieves early: set once (stop()), checked at every state; a wait for a
// destination's full sync to end is woken at once.
class StopSignal {
 public:
  void stop();
  bool stopped() const { return stopped_.load(); }
  // Waits `d`, or less once stopped; whether it is stopped.
  bool wait_for(std::chrono::steady_clock::duration d) const;

 private:
  std::atomic<bool> stopped_{false};
  mutable std::mutex mutex_;
  mutable std::condition_variable wake_;
};

// The facade the node's control handler and local service call. Thread-safe: each move and
// retrieve runs its own machine on the caller's thread.
class PeerMoves {
 public:
  // `engine` and `transport` must outlive this. The destination side (peer asks) is a
  // PeerService on the transport's on_ask.
  PeerMoves(Engine& engine, transfer::PeerTransport& transport, PeerMovesOptions options = {});

  // The source side of MoveWorkerMsg: the leading chunks of `tokens` go to the node at
  // `peer_url`. Refused when `peer_url` is this node's own listener: every chunk would count as
  // "already there" and, with copy off, be evicted from the only node holding it.
  MoveResult move(const std::string& peer_url, const std::vector<std::int64_t>& tokens, bool copy);
  // The control handler's Move: the reply the controller gets (num_tokens the destination holds).
  wire::Msg on_move(const wire::MoveWorkerMsg& m);
  // P2P retrieval of the chunks of `tokens` this node lacks, from the node `locate` names.
  RetrieveResult retrieve(const std::vector<std::int64_t>& tokens, const Locate& locate);
  // The same by chunk hashes (tokens stays 0): the leading chunks of `hashes`.
  RetrieveResult retrieve_chunks(const std::vector<ChunkHash>& hashes, const Locate& locate);
  // Ends every running move and retrieve at its next state and every later one at its first (the
  // node is stopping): what was not confirmed stays where it was. Any thread; returns at once.
  void stop() { stop_.stop(); }

  static constexpr std::size_t kBatch = 256;

 private:
  Engine& engine_;
  transfer::PeerTransport& transport_;
  PeerMovesOptions options_;
  std::atomic<std::uint64_t> next_move_;  // ids of this node's moves, from a random start
  StopSignal stop_;
};

}  // namespace kvnode::node
