#include "port_holder.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "connection.hpp"

namespace kvnode::httpd {
namespace {

constexpr const char* kTcpListen = "0A";  // st column of /proc/net/tcp: TCP_LISTEN

struct Listener {
  std::string address;  // ip:port
  std::string inode;
};

// /proc/net/tcp prints addresses as the kernel's 32-bit words in hex, host byte order.
std::string ip_from_hex(const std::string& hex) {
  const bool v6 = hex.size() == 32;
  unsigned char bytes[16] = {};
  for (std::size_t word = 0; word < hex.size() / 8; ++word) {
    const std::uint32_t v =
        static_cast<std::uint32_t>(std::stoul(hex.substr(word * 8, 8), nullptr, 16));
    std::memcpy(bytes + word * 4, &v, 4);
  }
  char text[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(v6 ? AF_INET6 : AF_INET, bytes, text, sizeof(text));
  return v6 ? "[" + std::string(text) + "]" : std::string(text);
}

std::vector<Listener> listeners_on(int port) {
  std::vector<Listener> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // column names
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      const auto colon = local.find(':');
      if (state != kTcpListen || colon == std::string::npos) continue;
      if (std::stoi(local.substr(colon + 1), nullptr, 16) != port) continue;
      out.push_back({ip_from_hex(local.substr(0, colon)) + ":" + std::to_string(port), inode});
    }
  }
  return out;
}

// "pid N name" of the process holding socket `inode`, when its descriptors are readable.
std::string owner_of(const std::string& inode) {
  const std::string target = "socket:[" + inode + "]";
  std::error_code ec;
  for (const auto& proc : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = proc.path().filename();
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    for (const auto& fd : std::filesystem::directory_iterator(proc.path() / "fd", ec)) {
      std::error_code link_ec;
      if (std::filesystem::read_symlink(fd.path(), link_ec).string() != target) continue;
      std::string name;
      std::getline(std::ifstream(proc.path() / "comm"), name);
      return "pid " + pid + " " + name;
    }
  }
  return {};
}

// The errno of binding host:port as the server would (SO_REUSEADDR, no SO_REUSEPORT); 0 if it
// binds.
int probe_bind(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0)
    return EADDRNOTAVAIL;
  int error = EADDRNOTAVAIL;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    UniqueFd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (s.get() < 0) continue;
    const int yes = 1;
    ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    error = ::bind(s.get(), a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (error == 0 || error == EADDRINUSE) break;
  }
  ::freeaddrinfo(found);
  return error;
}

}  // namespace

std::string bind_failure(const std::string& host, int port) {
  const int error = probe_bind(host, port);
  if (error == 0) return "the address could not be bound (it binds now: retry)";
  if (error != EADDRINUSE) return std::strerror(error);
  std::string holders;
  for (const Listener& l : listeners_on(port)) {
    const std::string owner = owner_of(l.inode);
    holders += (holders.empty() ? "" : "; ") + l.address + (owner.empty() ? "" : ", " + owner);
  }
  return "port " + std::to_string(port) + " in use" +
         (holders.empty() ? "" : " (held by " + holders + ")");
}

}  // namespace kvnode::httpd
