#include "port_probe.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "kvnode/common/unique_fd.hpp"

namespace kvnode::controller {
namespace {

// Sockets open at once: bounds the descriptors a probe round takes from the process.
constexpr std::size_t kBatch = 256;

// A worker's address as a sockaddr; false when it is not a numeric IPv4/IPv6 address.
bool to_sockaddr(const WorkerEndpoint& ep, sockaddr_storage& out, socklen_t& len) {
  std::string ip = ep.ip;
  if (ip.size() > 2 && ip.front() == '[' && ip.back() == ']') ip = ip.substr(1, ip.size() - 2);
  if (ep.port <= 0 || ep.port > 65535) return false;
  std::memset(&out, 0, sizeof(out));
  auto* v4 = reinterpret_cast<sockaddr_in*>(&out);
  if (::inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<std::uint16_t>(ep.port));
    len = sizeof(sockaddr_in);
    return true;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&out);
  if (::inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<std::uint16_t>(ep.port));
    len = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

// Starts a non-blocking connect; an invalid descriptor when it failed at once (refused, bad
// address). `done` is set when it already succeeded.
UniqueFd start_connect(const WorkerEndpoint& ep, bool& done) {
  done = false;
  sockaddr_storage addr;
  socklen_t len = 0;
  if (!to_sockaddr(ep, addr, len)) return UniqueFd();
  UniqueFd fd(::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return UniqueFd();
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0) {
    done = true;
    return fd;
  }
  return errno == EINPROGRESS ? std::move(fd) : UniqueFd();
}

}  // namespace

std::vector<ProbeOutcome> probe_ports(const std::vector<WorkerEndpoint>& endpoints,
                                      std::chrono::milliseconds timeout) {
  std::vector<ProbeOutcome> out;
  out.reserve(endpoints.size());
  for (std::size_t first = 0; first < endpoints.size(); first += kBatch) {
    const std::size_t last = std::min(endpoints.size(), first + kBatch);
    std::vector<UniqueFd> fds;
    std::vector<pollfd> waiting;
    std::vector<std::size_t> waiting_index;
    for (std::size_t i = first; i < last; ++i) {
      bool done = false;
      UniqueFd fd = start_connect(endpoints[i], done);
      out.push_back(ProbeOutcome{endpoints[i], done});
      if (fd.get() >= 0 && !done) {
        waiting.push_back(pollfd{fd.get(), POLLOUT, 0});
        waiting_index.push_back(out.size() - 1);
      }
      fds.push_back(std::move(fd));
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::size_t pending = waiting.size();
    while (pending > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      const int n = ::poll(waiting.data(), waiting.size(), static_cast<int>(left.count()));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      for (std::size_t k = 0; k < waiting.size(); ++k) {
        if (waiting[k].fd < 0 || waiting[k].revents == 0) continue;
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(waiting[k].fd, SOL_SOCKET, SO_ERROR, &err, &len);
        out[waiting_index[k]].reachable = err == 0;
        waiting[k].fd = -1;  // poll ignores it from now on
        --pending;
      }
    }
  }
  return out;
}

}  // namespace kvnode::controller
