#include "peer_client.hpp"

#include <spdlog/spdlog.h>

#include <optional>

namespace kvnode::node::peer {

Result<Answer> exchange(transfer::PeerTransport& transport, const std::string& peer,
                        const Request& request) {
  Result<std::vector<std::byte>> bytes = transport.ask(peer, encode(request), {}).get();
  if (!bytes)
    return wrap_error(std::string(to_string(op_of(request))) + " at " + peer + ": ",
                      std::move(bytes).error());
  Result<Answer> answer = decode_answer(*bytes);
  if (!answer)
    return wrap_error(std::string("the ") + to_string(op_of(request)) + " answer of " + peer + ": ",
                      std::move(answer).error());
  if (Status s = answers(request, *answer); !s) return wrap_error(peer + ": ", s.error());
  return answer;
}

void give_back(transfer::PeerTransport& transport, const std::string& peer, const Request& lost) {
  std::optional<Request> undo;
  if (const auto* r = std::get_if<ReserveRequest>(&lost)) {
    FinishRequest f;  // none whole: the move's reservations are released, nothing is committed
    f.move = r->move;
    for (ChunkHash h : r->hashes) f.chunks.push_back({h, false});
    undo = std::move(f);
  } else if (const auto* l = std::get_if<LeaseRequest>(&lost)) {
    undo = UnleaseRequest{l->hashes};
  }
  if (!undo) return;
  if (Result<Answer> a = exchange(transport, peer, *undo); !a)
    spdlog::info("giving back a lost {}'s holds at {}: {} (they end on its clock)",
                 to_string(op_of(lost)), peer, a.error().message);
}

}  // namespace kvnode::node::peer
