// Chunks between nodes over the transfer plane: cross-node moves (protocol reference §4.3) and
// P2P retrieval (§4.2). Moves, with kvnode's guarantees:
// the destination reserves pages for the chunks it lacks, the source pushes into them, the
// destination commits (ADMIT) only chunks whose bytes arrived whole, and with copy=false the
// source evicts only the leading chunks the destination says it still holds when the move ends
// (a later batch there may have evicted an earlier one). LMCache evicts whatever happened (§6
// D4); a failed move here loses nothing.
//
// Retrieval: the requester asks the controller who holds the chunks it lacks, the holder leases
// them (so they stay put while read), the requester pulls them into pages it reserved and
// commits those that arrived whole (ADMIT from the requester), then the holder drops the leases.
//
// The two nodes agree through the plane's ask(): small fixed-format messages (an op byte, a
// count, 64-bit values; every length checked). Reservations a source never commits or releases
// expire (the source may have died), so a destination never leaks pages to a vanished peer.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/node/engine.hpp"
#include "kvnode/transfer/plane.hpp"

namespace kvnode::node {

struct RetrieveResult {
  std::size_t tokens = 0;         // leading tokens now held locally
  std::size_t chunks_local = 0;   // held before
  std::size_t chunks_pulled = 0;  // pulled from the peer and stored
  std::string peer;               // who had them ("" when nobody)
  std::string error;
};

// Who holds the leading chunks of a request: (peer_init_url, leading hits there), from the
// controller's BatchedP2PLookupMsg.
using Locate = std::function<Result<std::pair<std::string, std::size_t>>(const std::vector<ChunkHash>&)>;

// A Locate that asks the controller over `call` (the worker agent's DEALER): BatchedP2PLookupMsg
// with this worker's instance and TP rank, so the holder found serves the same rank.
Locate locate_through(std::function<Result<wire::Msg>(const wire::Msg&)> call, std::string instance,
                      std::int64_t rank);

struct MoveResult {
  std::size_t chunks_sent = 0;       // pushed and committed at the destination
  std::size_t chunks_present = 0;    // the destination had them already
  std::size_t chunks_failed = 0;     // not confirmed: kept at the source
  std::size_t tokens_confirmed = 0;  // the leading tokens the destination now holds
  std::size_t bytes = 0;
  std::string error;                 // why chunks failed, when some did
  bool refused = false;              // the move itself was wrong (to this node): nothing tried
};

class PeerMoves {
 public:
  // `engine` and `plane` must outlive this; attach on_ask() to the plane's PlaneOptions::on_ask.
  PeerMoves(Engine& engine, transfer::TransferPlane* plane,
            std::chrono::seconds reservation_ttl = std::chrono::seconds(60));
  void set_plane(transfer::TransferPlane* plane) { plane_ = plane; }

  // The source side of MoveWorkerMsg: the leading chunks of `tokens` go to the node at
  // `peer_url`. Batches of kBatch chunks stream one after another. Refused when `peer_url` is
  // this node's own listener: every chunk would count as "already there" and, with copy off,
  // be evicted from the only node holding it.
  MoveResult move(const std::string& peer_url, const std::vector<std::int64_t>& tokens, bool copy);
  // Engine::on_control's Move: the reply the controller gets (num_tokens the destination holds).
  wire::Msg on_move(const wire::MoveWorkerMsg& m);
  // P2P retrieval of the chunks of `tokens` this node lacks, from the node `locate` names.
  RetrieveResult retrieve(const std::vector<std::int64_t>& tokens, const Locate& locate);
  // The same by chunk hashes (tokens stays 0): the leading chunks of `hashes`.
  RetrieveResult retrieve_chunks(const std::vector<ChunkHash>& hashes, const Locate& locate);

  // The destination side: answers a peer's reserve / commit / release.
  Result<std::vector<std::byte>> on_ask(const std::string& peer, const std::vector<std::byte>& request);

  static constexpr std::size_t kBatch = 256;

 private:
  struct Reservation {
    std::string peer;
    std::chrono::steady_clock::time_point expires;
  };
  void expire_reservations();
  Result<std::vector<std::int64_t>> ask(const std::string& peer_url, std::uint8_t op,
                                        const std::vector<std::int64_t>& values);
  struct BatchOutcome {
    std::vector<std::int64_t> state;  // per chunk: 1 stored there, -1 was there, -3 frozen, 0 not
    std::size_t bytes = 0;
    std::string error;
  };
  BatchOutcome send_batch(const std::string& peer_url, std::span<const Lease> leases,
                          std::chrono::steady_clock::time_point frozen_until);

  Engine& engine_;
  transfer::TransferPlane* plane_;
  std::chrono::seconds ttl_;
  std::mutex mutex_;
  std::map<ChunkHash, Reservation> reserved_;  // destination: pages reserved for a peer
  struct Held {
    Lease lease;
    std::chrono::steady_clock::time_point expires;
  };
  std::map<std::pair<std::string, ChunkHash>, Held> leased_;  // holder: chunks a peer is reading
};

}  // namespace kvnode::node
