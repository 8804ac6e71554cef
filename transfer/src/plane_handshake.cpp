// The plane's handshakes: dialing a peer with our descriptor (hello) and reading its welcome on
// the initiator side; answering a peer's hello with a session of our own on the acceptor side.
#include <spdlog/spdlog.h>

#include <thread>

#include "plane_impl.hpp"

namespace kvnode::transfer {

Result<std::pair<std::string, std::uint16_t>> split_url(const std::string& url) {
  const auto colon = url.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == url.size())
    return make_error("peer '" + url + "': expected host:port");
  const std::string port_text = url.substr(colon + 1);
  if (port_text.size() > 5 || port_text.find_first_not_of("0123456789") != std::string::npos)
    return make_error("peer '" + url + "': bad port");
  const unsigned long port = std::stoul(port_text);
  if (port == 0 || port > 65535) return make_error("peer '" + url + "': port out of range");
  std::string host = url.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return std::make_pair(host, static_cast<std::uint16_t>(port));
}

Result<Session*> TransferPlane::Impl::session_for(const std::string& peer) {
  if (const auto found = initiators_.find(peer); found != initiators_.end())
    return found->second.get();
  Result<std::pair<std::string, std::uint16_t>> hp = split_url(peer);
  if (!hp) return hp.error();
  Result<std::unique_ptr<Session>> session = Session::create(
      *context_, Session::Role::kInitiator, peer, pool_, options_.protocol, staging());
  if (!session) return session.error();
  Session& s = **session;
  s.set_ask_handler(&ask_handler_);
  s.hello_body = encode(s.local_descriptor(pool_descriptor_));  // read by UCX until sent
  if (Status dialed = dial_peer(s); !dialed) return dialed.error();
  watch(s.event_fd(), true);
  initiators_[peer] = std::move(session).value();
  return &s;
}

Status TransferPlane::Impl::dial_peer(Session& s) {
  Result<std::pair<std::string, std::uint16_t>> hp = split_url(s.peer());
  if (!hp) return hp.error();
  s.link.reset();  // closing the descriptor takes it out of links_
  Result<ControlLink> link = ControlLink::dial(hp->first, hp->second, s.hello_body);
  if (!link) return link.error();
  s.link.emplace(std::move(link).value());
  links_->add(s.link->fd(), s.link->events(), 0);
  ++s.dials;
  s.clear_broken();
  return {};
}

// The initiators' control links: hellos out, welcomes in, then liveness. Pumped when any is
// ready (links_ says which have something, not whose; there are few).
unsigned TransferPlane::Impl::check_links() {
  if (initiators_.empty() || links_->ready().empty()) return 0;
  unsigned n = 0;
  for (auto it = initiators_.begin(); it != initiators_.end();) {
    Session& s = *it->second;
    ++it;  // welcomed() may reset s
    if (!s.link || s.broken()) continue;
    ++n;
    const Status pumped = s.link->pump();
    if (std::optional<ucx::Bytes> welcome = s.link->take_frame()) {
      welcomed(s, *welcome);  // read first: a refusal may come just before the link closes
      continue;
    }
    if (!pumped)
      s.mark_broken("the connection to " + s.peer() + " failed: " + pumped.error().message);
    else
      links_->modify(s.link->fd(), s.link->events(), 0);
  }
  return n;
}

void TransferPlane::Impl::welcomed(Session& s, const ucx::Bytes& welcome) {
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
  links_->modify(s.link->fd(), s.link->events(), 0);
  spdlog::info("transfer plane: session with {} open ({} over {})", s.peer(),
               to_string(s.protocol()), s.transport());
  {
    std::lock_guard lock(counters_mutex_);
    ++counters_.sessions_opened;
  }
  s.post_waiting();
}

// ---- Handshakes -------------------------------------------------------------------------------

ListenerAnswer TransferPlane::Impl::answer(const ucx::Bytes& hello, LinkId link) {
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
  Result<std::unique_ptr<Session>> session = Session::create(
      *context_, Session::Role::kAcceptor, name, pool_, options_.protocol, staging());
  if (!session) return {encode_refusal(session.error().message), false};
  const bool same_host = peer->host == pool_descriptor_.host;
  (*session)->set_ask_handler(&ask_handler_);
  if (Status s = (*session)->connect(std::move(peer).value(), same_host); !s) {
    spdlog::warn("transfer plane: refused {}: {}", name, s.error().message);
    return {encode_refusal(s.error().message), false};
  }
  (*session)->link_id = link;
  watch((*session)->event_fd(), true);
  ucx::Bytes out = encode((*session)->local_descriptor(pool_descriptor_));
  acceptors_[link] = std::move(session).value();
  return {std::move(out), true};
}

void TransferPlane::Impl::lost(LinkId link, const std::string& why) {
  const auto it = acceptors_.find(link);
  if (it == acceptors_.end()) return;
  it->second->mark_broken("the peer " + it->second->peer() + " went away (" + why + ")");
}
}  // namespace kvnode::transfer
