// The first contact between two planes, over a plain tcp connection the plane owns (UCX 1.13's
// sockaddr listener leaks a descriptor per connection that is not UCX, and aborts the process
// once they run out). Each side sends one frame: the dialer its descriptor (hello), the listener
// its own (welcome). Then the connection stays open and silent as the session's liveness
// channel: end of stream, an error or any further byte means the peer is gone or broken, and
// the kernel tells us at once when the peer process dies.
//
// A frame is a 12-byte header (magic, version, flags, length; little-endian) and `length` bytes
// of descriptor. A connection whose first bytes are not such a header is dropped as soon as the
// header is read, without reading anything more.
#pragma once

#include <sys/epoll.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/common/unique_fd.hpp"

namespace kvnode::transfer {

inline constexpr std::uint32_t kLinkMagic = 0x314e564b;  // "KVN1" as bytes on the wire
inline constexpr std::uint16_t kLinkVersion = 1;
inline constexpr std::size_t kLinkHeaderBytes = 12;
inline constexpr std::size_t kMaxDescriptorBytes = 64 << 10;  // a descriptor is a few hundred

using LinkBytes = std::vector<std::byte>;

// An epoll set, level-triggered; `key` comes back with each ready descriptor.
class Epoll {
 public:
  static Result<Epoll> create();
  int fd() const { return fd_.get(); }
  void add(int fd, std::uint32_t events, std::uint64_t key);
  void modify(int fd, std::uint32_t events, std::uint64_t key);
  void remove(int fd);
  // Ready keys, without waiting.
  std::vector<std::uint64_t> ready();

 private:
  explicit Epoll(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

// An IPv4 or IPv6 literal and a port.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
};
Result<SocketAddress> parse_address(const std::string& host, std::uint16_t port);
// A peer url, "host:port" (host may be a bracketed IPv6 literal), as host and port.
Result<std::pair<std::string, std::uint16_t>> split_url(const std::string& url);

// Both ends of a link: no Nagle delay for the small frames, and tcp keepalive (about 11 s) so a
// peer whose host vanishes without a FIN ends the session on either side, not never.
void tune_link_socket(int fd);

// The 12-byte frame header for a body of `length` bytes.
LinkBytes frame_header(std::size_t length, std::uint16_t version = kLinkVersion);

class ControlLink {
 public:
  // Starts a non-blocking connect to host:port and queues `hello`: pump() carries it on.
  static Result<ControlLink> dial(const std::string& host, std::uint16_t port,
                                  const LinkBytes& hello);
  explicit ControlLink(UniqueFd accepted) : fd_(std::move(accepted)) {}

  int fd() const { return fd_.get(); }
  // Queues one frame.
  void send(const LinkBytes& body);
  // Sends and reads what the socket allows now. An error ends the link: the peer closed it, sent
  // something that is not a frame, or the connection failed; the message says which.
  Status pump();
  // The peer's frame, once whole (then taken; a second frame is an error).
  std::optional<LinkBytes> take_frame();
  bool wants_write() const { return sent_ < out_.size(); }
  // Epoll interest for the link's current state.
  std::uint32_t events() const { return EPOLLIN | EPOLLRDHUP | (wants_write() ? EPOLLOUT : 0u); }
  bool has_frame() const { return frame_done_; }

 private:
  Status flush();
  Status read_some();

  UniqueFd fd_;
  LinkBytes out_;
  std::size_t sent_ = 0;
  LinkBytes in_;                             // header, then body, of the frame being read
  std::size_t expected_ = kLinkHeaderBytes;  // bytes of in_ when the part being read is whole
  std::size_t want_ = kLinkHeaderBytes;      // of which still to read
  bool frame_done_ = false;                  // the peer's one frame has come
  std::optional<LinkBytes> frame_;
};

}  // namespace kvnode::transfer
