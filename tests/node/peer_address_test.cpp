// names_own_listener: whether a move's destination url is this node's own transfer listener,
// compared after resolution (issue 19 item 1: a move to itself evicted what it "moved").
#include "peer_address.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <memory>
#include <optional>
#include <string>

namespace kvnode::node {
namespace {

// A non-loopback IPv4 address of this host, when it has one.
std::optional<std::string> interface_address() {
  ifaddrs* raw = nullptr;
  if (getifaddrs(&raw) != 0) return std::nullopt;
  const std::unique_ptr<ifaddrs, decltype(&freeifaddrs)> list(raw, &freeifaddrs);
  for (const ifaddrs* a = raw; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    const in_addr ip = reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr;
    if ((ntohl(ip.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN] = {};
    if (inet_ntop(AF_INET, &ip, text, sizeof(text))) return std::string(text);
  }
  return std::nullopt;
}

TEST(PeerAddress, TheSameListenerWhateverTheSpelling) {
  EXPECT_TRUE(names_own_listener("127.0.0.1:18200", "127.0.0.1:18200"));
  EXPECT_TRUE(names_own_listener("localhost:18200", "127.0.0.1:18200"));
  EXPECT_TRUE(names_own_listener("127.0.0.1:018200", "127.0.0.1:18200"));
  EXPECT_TRUE(names_own_listener("[::1]:18200", "[::1]:18200"));
  // A wildcard bind is reached at any address of this host, in its family.
  EXPECT_TRUE(names_own_listener("127.0.0.1:18200", "0.0.0.0:18200"));
  EXPECT_TRUE(names_own_listener("localhost:18200", "0.0.0.0:18200"));
  EXPECT_TRUE(names_own_listener("0.0.0.0:18200", "0.0.0.0:18200"));
  EXPECT_TRUE(names_own_listener("127.0.0.1:18200", "[::]:18200"));
  // A wildcard destination is this host: connect() reaches a loopback bind through it.
  EXPECT_TRUE(names_own_listener("0.0.0.0:18200", "127.0.0.1:18200"));
  EXPECT_TRUE(names_own_listener("[::]:18200", "127.0.0.1:18200"));
  EXPECT_TRUE(names_own_listener("[::ffff:127.0.0.1]:18200", "127.0.0.1:18200"));
  if (const auto ip = interface_address()) {
    EXPECT_TRUE(names_own_listener(*ip + ":18200", "0.0.0.0:18200")) << *ip;
    EXPECT_FALSE(names_own_listener(*ip + ":18200", "127.0.0.1:18200"))
        << *ip << " does not reach a loopback bind";
  }
}

TEST(PeerAddress, AnotherListenerIsNotThisOne) {
  EXPECT_FALSE(names_own_listener("127.0.0.1:18201", "127.0.0.1:18200"));  // another port
  EXPECT_FALSE(
      names_own_listener("127.0.0.2:18200", "127.0.0.1:18200"));  // another loopback address
  EXPECT_FALSE(
      names_own_listener("192.0.2.1:18200", "0.0.0.0:18200"));  // TEST-NET-1: not this host
  EXPECT_FALSE(names_own_listener("no-such-host.invalid:18200", "0.0.0.0:18200"));
  EXPECT_FALSE(names_own_listener("127.0.0.1", "127.0.0.1:18200"));  // no port
  EXPECT_FALSE(names_own_listener("", "127.0.0.1:18200"));
}

}  // namespace
}  // namespace kvnode::node
