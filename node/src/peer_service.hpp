// The node's side of its peers' asks: the destination of their moves (reserve, finish, holds)
// and the holder for their retrieves (lease, unlease). It is the transfer plane's on_ask, so it
// answers on the plane's progress thread and never waits for anything but the store's lock.
//
// A reservation belongs to one move of one peer: only that move is given its page again, or may
// commit or release it. What a peer holds here is on a clock: a reservation it never finishes (it
// died, or its finish was lost) is aborted, and a lease it never drops is dropped, `ttl` after it
// was taken, so a vanished peer leaks neither pages nor pins. The ttl must exceed a push's deadline
// plus an ask's, or a late push could write a page already given to another chunk. Expired holds
// are swept at each ask and by expire().
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/node/engine.hpp"
#include "peer_protocol.hpp"

namespace kvnode::node {

class PeerService {
 public:
  // `engine` must outlive this.
  explicit PeerService(Engine& engine, std::chrono::milliseconds ttl = std::chrono::seconds(60));
  PeerService(const PeerService&) = delete;
  PeerService& operator=(const PeerService&) = delete;

  // PlaneOptions::on_ask: a peer's encoded request -> the encoded answer. kInvalid for a request
  // that does not decode (nothing changes then).
  Result<std::vector<std::byte>> on_ask(const std::string& peer,
                                        std::span<const std::byte> request);
  // The same, typed.
  peer::Answer answer(const std::string& peer, const peer::Request& request);

  // Outstanding holds, for tests and metrics.
  std::size_t reservations() const;
  std::size_t leases() const;
  // Gives back every hold past its deadline.
  void expire();

 private:
  using Clock = std::chrono::steady_clock;
  struct Reservation {
    std::string peer;        // the source's node
    std::uint64_t move = 0;  // and its move: the reservation is that move's alone
    gpu::PageId page = 0;
    Clock::time_point expires;
  };
  struct Held {
    Lease lease;
    Clock::time_point expires;
  };
  void expire_locked(Clock::time_point now);
  peer::ReserveAnswer reserve(const std::string& peer, const peer::ReserveRequest& r);
  peer::FinishAnswer finish(const std::string& peer, const peer::FinishRequest& r);
  peer::LeaseAnswer lease(const std::string& peer, const peer::LeaseRequest& r);
  peer::UnleaseAnswer unlease(const std::string& peer, const peer::UnleaseRequest& r);
  peer::HoldsAnswer holds(const peer::HoldsRequest& r);

  Engine& engine_;
  std::chrono::milliseconds ttl_;
  mutable std::mutex mutex_;
  std::map<ChunkHash, Reservation> reserved_;                 // pages a peer is pushing into
  std::map<std::pair<std::string, ChunkHash>, Held> leased_;  // chunks a peer is reading
};

}  // namespace kvnode::node
