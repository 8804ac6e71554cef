// The HTTP listener's counters as Prometheus text, for both daemons' /metrics.
#pragma once

#include <string>

#include "kvnode/httpd/server.hpp"

namespace kvnode::httpd {

// `prefix` names the daemon ("kvnode", "kvcontroller"): <prefix>_http_connections_open etc.
std::string prometheus_text(const Counters& counters, const std::string& prefix);

}  // namespace kvnode::httpd
