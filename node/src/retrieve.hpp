// The requester side of one P2P retrieve, as the state machine peer_moves.hpp writes down: each
// state does its work and names what happened (a RetrieveEvent); next() holds every transition.
// One Retrieve per request, run on the caller's thread; it owns nothing shared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvnode/node/peer_moves.hpp"
#include "peer_protocol.hpp"

namespace kvnode::node {

enum class RetrieveEvent : std::uint8_t {
  kOk,
  kAllLocal,  // every chunk asked for is here already
  kNobody,    // the lookup failed, or no peer holds more of the prefix
  kPeerLost,  // the holder did not answer, or holds none of the batch now
  kNoRoom,    // no page here for the batch's first chunk
  kMore,      // the batch was stored whole and the holder has more
  kRunEnds,   // the leading run ends here
  kStopped,   // PeerMoves::stop(): the pages reserved here given back
};
const char* to_string(RetrieveEvent e);

// Every transition of the retrieve: the state after `s` once its work ended in `e`. kFailed for a
// pair that cannot happen (a bug; logged).
RetrieveState next(RetrieveState s, RetrieveEvent e);

class Retrieve {
 public:
  Retrieve(Engine& engine, transfer::PeerTransport& transport, const PeerMovesOptions& options,
           const StopSignal& stop, const std::vector<ChunkHash>& wanted, const Locate& locate);
  RetrieveResult run();

 private:
  RetrieveEvent act(RetrieveState s);
  RetrieveEvent locate();
  RetrieveEvent lease_remote();
  RetrieveEvent reserve_local();
  RetrieveEvent pull();
  RetrieveEvent commit_local();
  RetrieveEvent unlease();
  RetrieveEvent stopped(RetrieveState s);

  Engine& engine_;
  transfer::PeerTransport& transport_;
  const PeerMovesOptions& options_;
  const StopSignal& stop_;
  const std::vector<ChunkHash>& wanted_;
  const Locate& locate_;
  RetrieveResult out_;
  std::size_t held_ = 0;                    // leading chunks of wanted_ held here
  std::size_t end_ = 0;                     // where the holder's run ends
  std::size_t asked_ = 0;                   // chunks the batch asked the holder for
  std::uint64_t since_ = 0;                 // pages here come from chunks stamped at or before this
  std::vector<ChunkHash> leased_;           // the batch's chunks leased there, in order
  std::vector<gpu::PageId> remote_;         // their pages there
  std::vector<transfer::PageCopy> copies_;  // a leading part of leased_, with pages here
  transfer::TransferResult pulled_;
  std::size_t stored_ = 0;  // of the batch
};

}  // namespace kvnode::node
