#include "kvnode/httpd/metrics.hpp"

#include <cstdint>

namespace kvnode::httpd {
namespace {

void add(std::string& out, const std::string& name, const char* type, const char* help,
         std::uint64_t value) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " +
         std::to_string(value) + "\n";
}

}  // namespace

std::string prometheus_text(const Counters& c, const std::string& prefix) {
  const std::string p = prefix + "_http_";
  std::string out;
  add(out, p + "connections_open", "gauge", "HTTP connections open now.", c.connections_open);
  add(out, p + "connections_refused_total", "counter",
      "HTTP connections answered 503 and closed: over the connection cap.", c.connections_refused);
  add(out, p + "requests_timed_out_total", "counter",
      "HTTP requests closed for headers or a body not sent in time or too slowly.",
      c.requests_timed_out);
  add(out, p + "bodies_refused_total", "counter",
      "HTTP request bodies refused (400, 411, 413, 415, 503).", c.bodies_refused);
  add(out, p + "headers_refused_total", "counter",
      "HTTP requests refused 431: request line and headers over 64 KiB.", c.headers_refused);
  add(out, p + "body_bytes_in_flight", "gauge",
      "Bytes of buffers holding HTTP request bodies being read (the in-flight body budget used).",
      c.body_bytes_in_flight);
  return out;
}

}  // namespace kvnode::httpd
