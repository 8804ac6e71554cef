#include "peer_address.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace kvnode::node {
namespace {

struct HostPort {
  std::string host;
  std::string port;
};

std::optional<HostPort> split(const std::string& url) {
  const auto colon = url.rfind(':');
  if (colon == std::string::npos || colon + 1 == url.size()) return std::nullopt;
  std::string host = url.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return HostPort{host, url.substr(colon + 1)};
}

// An address without its port, IPv4-mapped IPv6 folded to IPv4, so equal hosts compare equal.
struct Address {
  int family = AF_UNSPEC;
  std::array<unsigned char, 16> bytes{};
  bool operator==(const Address&) const = default;
};

Address address_of(const sockaddr* sa) {
  Address a;
  if (sa->sa_family == AF_INET) {
    a.family = AF_INET;
    std::memcpy(a.bytes.data(), &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, 4);
  } else if (sa->sa_family == AF_INET6) {
    const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) {
      a.family = AF_INET;
      std::memcpy(a.bytes.data(), v6.s6_addr + 12, 4);
    } else {
      a.family = AF_INET6;
      std::memcpy(a.bytes.data(), v6.s6_addr, 16);
    }
  }
  return a;
}

bool wildcard(const Address& a) {
  return std::all_of(a.bytes.begin(), a.bytes.end(), [](unsigned char b) { return b == 0; });
}

struct AddrInfoFree {
  void operator()(addrinfo* p) const { freeaddrinfo(p); }
};

// Every address `host` resolves to, with the sockaddr to bind-test it.
std::vector<std::pair<Address, sockaddr_storage>> resolve(const std::string& host,
                                                          const std::string& port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* raw = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &raw) != 0) return {};
  const std::unique_ptr<addrinfo, AddrInfoFree> list(raw);
  std::vector<std::pair<Address, sockaddr_storage>> out;
  for (const addrinfo* p = list.get(); p; p = p->ai_next) {
    if (p->ai_addrlen > sizeof(sockaddr_storage)) continue;
    sockaddr_storage ss{};
    std::memcpy(&ss, p->ai_addr, p->ai_addrlen);
    out.emplace_back(address_of(p->ai_addr), ss);
  }
  return out;
}

// Whether this host owns the address: binding a socket to it (port 0) works only for a local one.
bool local(const sockaddr_storage& ss) {
  sockaddr_storage probe = ss;
  socklen_t len = 0;
  if (probe.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&probe)->sin_port = 0;
    len = sizeof(sockaddr_in);
  } else if (probe.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&probe)->sin6_port = 0;
    len = sizeof(sockaddr_in6);
  } else {
    return false;
  }
  const int fd = ::socket(probe.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool ok = ::bind(fd, reinterpret_cast<const sockaddr*>(&probe), len) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

bool names_own_listener(const std::string& url, const std::string& own) {
  const std::optional<HostPort> target = split(url), self = split(own);
  if (!target || !self) return false;
  const auto targets = resolve(target->host, target->port);
  const auto selves = resolve(self->host, self->port);
  if (targets.empty() || selves.empty()) return false;
  // Ports compare as numbers ("08200" is 8200): getaddrinfo parsed them into the sockaddrs.
  const auto port_of = [](const sockaddr_storage& ss) {
    return ss.ss_family == AF_INET ? reinterpret_cast<const sockaddr_in*>(&ss)->sin_port
                                   : reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port;
  };
  if (port_of(targets.front().second) != port_of(selves.front().second)) return false;
  for (const auto& [self_addr, self_ss] : selves) {
    for (const auto& [addr, ss] : targets) {
      if (addr == self_addr) return true;
      // A wildcard destination (0.0.0.0, ::) means this host: connect() takes it for loopback, so
      // it reaches a loopback-bound listener as well as a wildcard one.
      if (wildcard(addr)) return true;
      // A wildcard listener takes its own family (:: takes IPv4 too, as the mapped addresses).
      const bool family = addr.family == self_addr.family || self_addr.family == AF_INET6;
      if (wildcard(self_addr) && family && local(ss)) return true;
    }
  }
  return false;
}

}  // namespace kvnode::node
