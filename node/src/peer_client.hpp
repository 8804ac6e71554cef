// The asking side of the peer protocol: one request to a peer's node through
// transfer::PeerTransport::ask() and its checked, typed answer. The messages and their codec are
// in peer_protocol.hpp; the machines that ask (move_source, retrieve) call only these.
#pragma once

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/transfer/peer_transport.hpp"
#include "peer_protocol.hpp"

namespace kvnode::node::peer {

// Sends `request` to `peer`, waits for its answer and checks it answers the request. Errors: the
// transport's (kPeerLost: unreachable or lost; kDeadline: no answer in time), or kInvalid.
Result<Answer> exchange(transfer::PeerTransport& transport, const std::string& peer,
                        const Request& request);
template <class A>
Result<A> ask(transfer::PeerTransport& transport, const std::string& peer, const Request& request) {
  Result<Answer> a = exchange(transport, peer, request);
  if (!a) return std::move(a).error();
  return std::get<A>(std::move(a).value());  // exchange() checked the op
}

// Gives back, best effort, what a request whose answer was lost may have taken at `peer`: the
// reservations of a ReserveRequest (a finish of none whole), the leases of a LeaseRequest (an
// unlease). Without it they would block the same chunks until the peer's clock ends them. An
// error is only logged: the peer's clock remains the fallback.
void give_back(transfer::PeerTransport& transport, const std::string& peer, const Request& lost);

}  // namespace kvnode::node::peer
