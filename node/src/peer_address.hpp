// Whether a peer url names this node's own transfer listener. Strings cannot tell: 127.0.0.1,
// localhost, the host's interface addresses and a wildcard bind (0.0.0.0, ::) all reach the same
// listener, so both sides are resolved to addresses and compared with the port.
#pragma once

#include <string>

namespace kvnode::node {

// `url` and `own` are host:port or [v6]:port; `own` is the listener's (its peer_init_url). True
// when a connection to `url` would reach `own`: the same port and an address `own` is bound to
// (for a wildcard bind, any address of this host), or a wildcard address (0.0.0.0, ::: this host
// to connect()). A url that does not resolve is not this node.
bool names_own_listener(const std::string& url, const std::string& own);

}  // namespace kvnode::node
