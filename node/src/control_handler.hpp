// The controller's requests to this worker (what the worker agent receives on its port), each
// turned into the engine's or the mover's operation and its LMCache reply: clear, pin, health,
// move; compression and check-finish get an ErrorMsg saying why not, never a silent 0.
// Stateless past its construction, so callable from any thread: the agent answers a move on its
// move thread while health, clear and pin are answered on the port's.
#pragma once

#include "kvnode/node/engine.hpp"
#include "kvnode/node/peer_moves.hpp"
#include "kvnode/wire/messages.hpp"

namespace kvnode::node {

class ControlHandler {
 public:
  // `engine` and `moves` must outlive this; without `moves` a move is answered an ErrorMsg.
  ControlHandler(Engine& engine, PeerMoves* moves) : engine_(engine), moves_(moves) {}
  wire::Msg operator()(const wire::Msg& request) const;

 private:
  Engine& engine_;
  PeerMoves* moves_;
};

}  // namespace kvnode::node
