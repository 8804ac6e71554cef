// The plane's serving side: a peer's hello, answered with an acceptor session of our own (or a
// refusal), and the end of that peer's link.
#include <spdlog/spdlog.h>

#include "plane_impl.hpp"

namespace kvnode::transfer {

ListenerAnswer TransferPlane::Impl::answer(const LinkBytes& hello, LinkId link) {
  Result<PeerDescriptor> peer = decode_descriptor(hello);
  if (!peer) {
    spdlog::warn("transfer plane: refused a hello: {}", peer.error().message);
    return {encode_refusal(peer.error().message), false};
  }
  const std::string name = peer->node.empty() ? "unnamed peer" : peer->node;
  if (acceptors_.size() >= options_.max_sessions) {
    const std::string why = "too many sessions: this node serves at most " +
                            std::to_string(options_.max_sessions) + " peers at once";
    spdlog::warn("transfer plane: refused {}: {}", name, why);
    return {encode_refusal(why), false};
  }
  Result<std::unique_ptr<AcceptorSession>> session =
      AcceptorSession::create(session_setup(name), link);
  if (!session) return {encode_refusal(session.error().message), false};
  const bool same_host = peer->host == pool_descriptor_.host;
  if (Status s = (*session)->connect(std::move(peer).value(), same_host); !s) {
    spdlog::warn("transfer plane: refused {}: {}", name, s.error().message);
    return {encode_refusal(s.error().message), false};
  }
  watch((*session)->event_fd(), true);
  // Our pool's share goes only to a peer of this host: a hello from elsewhere does not learn
  // where it is handed out, nor the token.
  const PeerDescriptor ours = (*session)->local_descriptor(pool_descriptor_);
  LinkBytes out = encode(same_host ? ours : without_share(ours));
  acceptors_[link] = std::move(session).value();
  return {std::move(out), true};
}

void TransferPlane::Impl::lost(LinkId link, const std::string& why) {
  const auto it = acceptors_.find(link);
  if (it == acceptors_.end()) return;
  it->second->mark_broken("the peer " + it->second->peer() + " went away (" + why + ")");
}

}  // namespace kvnode::transfer
