// Why an HTTP listener could not bind, in words an operator can act on: the errno of a probe bind
// and, for a port in use, who listens there ("0.0.0.0:9000, pid 4242 kvcontroller"), read from
// /proc/net/tcp{,6} and the owners' descriptors (processes of other users stay unnamed).
#pragma once

#include <string>

namespace kvnode::httpd {

// e.g. "port in use (held by 0.0.0.0:9000, pid 4242 kvcontroller)" or "Cannot assign requested
// address".
std::string bind_failure(const std::string& host, int port);

}  // namespace kvnode::httpd
