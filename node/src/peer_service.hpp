// The node's side of its peers' asks: the destination of their moves (reserve, finish, holds)
// and the holder for their retrieves (lease, unlease). It is the transfer plane's on_ask, so it
// answers on the plane's progress thread and never waits for anything but the store's lock.
//
// A reservation belongs to one move of one peer: only that move is given its page again, or may
// commit or release it. What a peer holds here is on a clock: a reservation it never finishes (it
// died, or its finish was lost) is aborted, and a lease it never drops is dropped, `ttl` after it
// was taken, so a vanished peer leaks neither pages nor pins. The ttl must exceed a push's deadline
// plus an ask's, or a late push could write a page already given to another chunk. Expired holds
// are swept at each ask and by the service's own sweeper thread every ttl/4, so they end even when
// no peer asks again (a 2-node cluster whose other node died).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvnode/common/log_throttle.hpp"
#include "kvnode/common/result.hpp"
#include "kvnode/node/engine.hpp"
#include "peer_protocol.hpp"

namespace kvnode::node {

struct PeerServiceOptions {
  std::chrono::milliseconds ttl{60'000};  // how long a peer's hold lives unless renewed
  // Called for each chunk of a reserve between the check that it is here and its reservation
  // (tests make a local writer win the race there).
  std::function<void(ChunkHash)> before_reserve{};
  // The clock holds are timed by (unset: steady_clock; tests move time). The sweeper still wakes
  // every ttl/4 of real time.
  std::function<std::chrono::steady_clock::time_point()> now{};
};

class PeerService {
 public:
  // `engine` must outlive this.
  explicit PeerService(Engine& engine, PeerServiceOptions options = {});
  ~PeerService();
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
  // What one sweep gave back, per peer.
  struct Expired {
    std::map<std::string, std::size_t> reservations{};
    std::map<std::string, std::size_t> leases{};
  };
  // Gives back every hold past its deadline (the sweeper does this every ttl/4); logs one line
  // per peer.
  Expired expire();

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
  Clock::time_point now() const { return options_.now ? options_.now() : Clock::now(); }
  Expired expire_locked(Clock::time_point at);
  void sweep();
  peer::ReserveAnswer reserve(const std::string& peer, const peer::ReserveRequest& r);
  peer::ReserveOutcome refused(ChunkHash h, ErrorCode code, std::size_t& unexpected);
  peer::FinishAnswer finish(const std::string& peer, const peer::FinishRequest& r);
  peer::LeaseAnswer lease(const std::string& peer, const peer::LeaseRequest& r);
  peer::UnleaseAnswer unlease(const std::string& peer, const peer::UnleaseRequest& r);
  peer::HoldsAnswer holds(const peer::HoldsRequest& r);

  Engine& engine_;
  PeerServiceOptions options_;
  mutable std::mutex mutex_;
  std::map<ChunkHash, Reservation> reserved_;                 // pages a peer is pushing into
  std::map<std::pair<std::string, ChunkHash>, Held> leased_;  // chunks a peer is reading
  LogThrottle bad_requests_{std::chrono::seconds(1)};
  std::condition_variable wake_;  // stops the sweeper at once
  bool stopping_ = false;
  std::thread sweeper_;  // last: started once everything it reads exists
};

}  // namespace kvnode::node
