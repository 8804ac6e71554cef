// The plane's dialling side: the initiator session for a peer url, made on the first transfer or
// ask that names it; the hello out and the welcome in over its control link; and redials.
#include <spdlog/spdlog.h>

#include "plane_impl.hpp"

namespace kvnode::transfer {

SessionSetup TransferPlane::Impl::session_setup(std::string peer) const {
  SessionSetup setup;
  setup.context = &*context_;
  setup.peer = std::move(peer);
  setup.pool = pool_;
  setup.protocol = options_.protocol;
  setup.staging = staging();
  setup.pool_copier = pool_copier();
  setup.ask_handler = &ask_handler_;
  return setup;
}

Result<InitiatorSession*> TransferPlane::Impl::session_for(const std::string& peer) {
  if (const auto found = initiators_.find(peer); found != initiators_.end())
    return found->second.get();
  if (Result<std::pair<std::string, std::uint16_t>> hp = split_url(peer); !hp) return hp.error();
  Result<std::unique_ptr<InitiatorSession>> session =
      InitiatorSession::create(session_setup(peer), pool_descriptor_);
  if (!session) return session.error();
  InitiatorSession& s = **session;
  if (Status dialed = dial_peer(s); !dialed) return dialed.error();
  watch(s.event_fd(), true);
  initiators_[peer] = std::move(session).value();
  return &s;
}

Status TransferPlane::Impl::dial_peer(InitiatorSession& s) {
  if (Status dialed = s.dial(); !dialed) return dialed;
  links_->add(s.link_fd(), s.link_events(), 0);
  return {};
}

// The initiators' control links: hellos out, welcomes in, then liveness. Pumped when any is
// ready (links_ says which have something, not whose; there are few).
unsigned TransferPlane::Impl::check_links() {
  if (initiators_.empty() || links_->ready().empty()) return 0;
  unsigned n = 0;
  for (auto it = initiators_.begin(); it != initiators_.end();) {
    InitiatorSession& s = *it->second;
    ++it;  // welcomed() may reset s
    if (!s.has_link() || s.broken()) continue;
    ++n;
    if (std::optional<LinkBytes> welcome = s.pump_link()) {
      welcomed(s, *welcome);
      continue;
    }
    if (!s.broken()) links_->modify(s.link_fd(), s.link_events(), 0);
  }
  return n;
}

void TransferPlane::Impl::welcomed(InitiatorSession& s, const LinkBytes& welcome) {
  Result<PeerDescriptor> peer = decode_descriptor(welcome);
  Status connected = peer ? Status{} : Status{peer.error()};
  if (peer) {
    const bool same_host = peer->host == pool_descriptor_.host;
    connected = s.connect(std::move(peer).value(), same_host);
  }
  if (!connected) {
    spdlog::warn("transfer plane: cannot open a session with {}: {}", s.peer(),
                 connected.error().message);
    return reset(s, Failure::kConnect, 0,
                 "session with " + s.peer() + ": " + connected.error().message);
  }
  links_->modify(s.link_fd(), s.link_events(), 0);
  spdlog::info("transfer plane: session with {} open ({} over {})", s.peer(),
               to_string(s.protocol()), s.transport());
  if (s.remote().host == pool_descriptor_.host) request_mapping(s);
  {
    std::lock_guard lock(counters_mutex_);
    ++counters_.sessions_opened;
  }
  s.post_waiting();
}

}  // namespace kvnode::transfer
