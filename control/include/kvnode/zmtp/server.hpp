// A bound ZeroMQ PULL or ROUTER port served in the caller's thread: the listening TCP sockets and
// their peers' connections in one epoll set, each connection parsed by a zmtp::Reader.
//
// Why not libzmq's sockets: libzmq reads every connection in its own I/O thread and hands each
// message to the application thread through a pipe and an eventfd (and a reply back the same way):
// two or three thread wake-ups per message. Under LMCache's paced load (thousands of small
// messages a second) those wake-ups were half of kvcontroller's CPU. Read here, one wake-up takes
// whatever arrived since the last and a reply is written at once. Backpressure is TCP's: nothing
// is read faster than the caller handles it, and a peer that does not read its replies is not
// read from until it does.
//
// Limits: connections (one more is closed at accept), bytes buffered over all connections (a
// connection that would pass it is closed), a frame's size (checked from its header before any
// of it is buffered) and a message's, and the handshake's duration. Not thread-safe: one thread
// polls.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "kvnode/common/result.hpp"
#include "kvnode/zmtp/reader.hpp"

namespace kvnode::zmtp {

struct ServerLimits {
  std::uint64_t max_frame_bytes = std::uint64_t{64} << 20;  // also bounds a whole message
  std::size_t max_connections = 4096;
  std::size_t max_buffered_bytes = std::size_t{1} << 30;
  std::chrono::milliseconds handshake_timeout{30000};  // libzmq's ZMQ_HANDSHAKE_IVL default
};

struct ServerStats {
  std::uint64_t accepted = 0;
  std::uint64_t closed_by_peer = 0;
  std::uint64_t refused = 0;  // protocol errors, limits, handshakes that took too long
};

// Receives whole messages (their frames, valid during the call). On a ROUTER port the reply it
// returns goes to the peer that asked as [empty delimiter, reply]: what a REQ peer expects and
// a DEALER peer reads as its last frame. On a PULL port nothing is sent.
class MessageHandler {
 public:
  virtual std::optional<std::string> message(std::span<const std::string_view> frames) = 0;

 protected:
  ~MessageHandler() = default;
};

class Server {
 public:
  struct Impl;
  static Result<std::unique_ptr<Server>> create(SocketType type, const ServerLimits& limits);
  explicit Server(std::unique_ptr<Impl> impl);  // by create()
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Listens on host:port and returns the bound port. Port 0: any free one. Host: "*" or empty
  // for every IPv4 address, else an IPv4 address or name, or an IPv6 literal (IPv4 unless the
  // host has a ':', as libzmq resolves without ZMQ_IPV6).
  Result<int> listen(const std::string& host, int port);

  struct Polled {
    std::size_t messages = 0;  // passed to the handler
    std::size_t bytes = 0;     // read from the connections
    bool drained = true;       // false when a connection had more than one poll may read
  };
  // Waits up to `wait` for input, then reads what is ready without blocking, passes each whole
  // message to `handler` in order per connection, and writes the replies.
  Polled poll(std::chrono::milliseconds wait, MessageHandler& handler);

  std::size_t connections() const;
  const ServerStats& stats() const;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvnode::zmtp
