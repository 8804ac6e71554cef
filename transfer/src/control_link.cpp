#include "control_link.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvnode::transfer {
namespace {

// A peer whose host vanishes (no FIN) is noticed after about idle + interval * count = 11 s.
constexpr int kKeepIdleS = 5;
constexpr int kKeepIntervalS = 2;
constexpr int kKeepCount = 3;

void put_le(LinkBytes& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xff));
}

std::uint64_t get_le(const std::byte* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  return v;
}

std::string errno_text(int e) {
  return std::strerror(e);
}

}  // namespace

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

Result<Epoll> Epoll::create() {
  UniqueFd fd(epoll_create1(EPOLL_CLOEXEC));
  if (!fd.valid()) return make_error("epoll_create1: " + errno_text(errno));
  return Epoll(std::move(fd));
}

void Epoll::add(int fd, std::uint32_t events, std::uint64_t key) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = key;
  (void)epoll_ctl(fd_.get(), EPOLL_CTL_ADD, fd, &ev);
}

void Epoll::modify(int fd, std::uint32_t events, std::uint64_t key) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = key;
  (void)epoll_ctl(fd_.get(), EPOLL_CTL_MOD, fd, &ev);
}

void Epoll::remove(int fd) {
  (void)epoll_ctl(fd_.get(), EPOLL_CTL_DEL, fd, nullptr);
}

std::vector<std::uint64_t> Epoll::ready() {
  epoll_event events[64];
  const int n = epoll_wait(fd_.get(), events, 64, 0);
  std::vector<std::uint64_t> keys;
  for (int i = 0; i < n; ++i) keys.push_back(events[i].data.u64);
  return keys;
}

void tune_link_socket(int fd) {
  const int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &kKeepIdleS, sizeof(kKeepIdleS));
  (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &kKeepIntervalS, sizeof(kKeepIntervalS));
  (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &kKeepCount, sizeof(kKeepCount));
}

Result<SocketAddress> parse_address(const std::string& host, std::uint16_t port) {
  SocketAddress a;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&a.storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
  const std::string h = host.empty() ? "0.0.0.0" : host;
  if (inet_pton(AF_INET, h.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    a.length = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, h.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    a.length = sizeof(sockaddr_in6);
  } else {
    return make_error("'" + host + "' is not an IPv4 or IPv6 address");
  }
  return a;
}

LinkBytes frame_header(std::size_t length, std::uint16_t version) {
  LinkBytes h;
  put_le(h, kLinkMagic, 4);
  put_le(h, version, 2);
  put_le(h, 0, 2);  // flags: none defined
  put_le(h, length, 4);
  return h;
}

Result<ControlLink> ControlLink::dial(const std::string& host, std::uint16_t port,
                                      const LinkBytes& hello) {
  const std::string where = host + ":" + std::to_string(port);
  Result<SocketAddress> addr = parse_address(host, port);
  if (!addr) return make_error("dial " + where + ": " + addr.error().message);
  UniqueFd fd(::socket(addr->storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return make_error("dial " + where + ": socket: " + errno_text(errno));
  tune_link_socket(fd.get());
  // EINTR: the connect goes on in the background, as with EINPROGRESS; pump() reports its end.
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr->storage), addr->length) != 0 &&
      errno != EINPROGRESS && errno != EINTR)
    return make_error("dial " + where + ": " + errno_text(errno));
  ControlLink link(std::move(fd));
  link.send(hello);
  return link;
}

void ControlLink::send(const LinkBytes& body) {
  const LinkBytes header = frame_header(body.size());
  out_.insert(out_.end(), header.begin(), header.end());
  out_.insert(out_.end(), body.begin(), body.end());
}

Status ControlLink::flush() {
  while (sent_ < out_.size()) {
    const ssize_t n =
        ::send(fd_.get(), out_.data() + sent_, out_.size() - sent_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent_ += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return {};
    return make_error(errno_text(errno));
  }
  out_.clear();
  sent_ = 0;
  return {};
}

Status ControlLink::read_some() {
  for (;;) {
    // After the frame, the link is silent: a byte is read only to tell junk from end of stream.
    std::byte spare[64];
    std::byte* into = spare;
    std::size_t want = sizeof(spare);
    if (!frame_done_) {
      in_.resize(expected_);
      into = in_.data() + (expected_ - want_);
      want = want_;
    }
    const ssize_t n = ::recv(fd_.get(), into, want, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return {};
      return make_error(errno_text(errno));
    }
    if (n == 0)
      return make_error(frame_done_ ? "the peer closed the connection"
                                    : "the peer closed the connection before its descriptor");
    if (frame_done_) return make_error("the peer sent bytes after its descriptor");
    want_ -= static_cast<std::size_t>(n);
    if (want_ > 0) continue;
    if (expected_ == kLinkHeaderBytes) {
      if (get_le(in_.data(), 4) != kLinkMagic) return make_error("not a kvnode peer (bad magic)");
      if (const auto v = get_le(in_.data() + 4, 2); v != kLinkVersion)
        return make_error("unsupported handshake version " + std::to_string(v));
      const std::uint64_t length = get_le(in_.data() + 8, 4);
      if (length > kMaxDescriptorBytes)
        return make_error("a descriptor of " + std::to_string(length) + " bytes (at most " +
                          std::to_string(kMaxDescriptorBytes) + ")");
      expected_ = kLinkHeaderBytes + length;
      want_ = length;
      if (want_ > 0) continue;
    }
    frame_ = LinkBytes(in_.begin() + kLinkHeaderBytes, in_.end());
    frame_done_ = true;
    in_ = {};
  }
}

Status ControlLink::pump() {
  if (Status s = flush(); !s) return s;
  return read_some();
}

std::optional<LinkBytes> ControlLink::take_frame() {
  return std::exchange(frame_, std::nullopt);
}

}  // namespace kvnode::transfer
