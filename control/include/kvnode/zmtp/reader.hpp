// The receiving side of ZMTP 3.x (ZeroMQ's wire protocol, rfc.zeromq.org/spec/23 and /37) for a
// bound PULL or ROUTER socket with the NULL mechanism, as bytes in and frames out: no sockets, no
// allocation beyond the replies it queues. zmtp::Server drives one per connection; the fuzzer
// drives it alone. Only what a peer of ours (libzmq 4.x, pyzmq: LMCache's workers) sends is
// accepted: its greeting (version 3.0 or 3.1, mechanism NULL), its READY naming a socket type
// that pairs with ours (PUSH for PULL; DEALER or REQ for ROUTER), then message frames and the
// PING, PONG and ERROR commands. Anything else ends the connection with the reason.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvnode/common/result.hpp"

namespace kvnode::zmtp {

inline constexpr std::size_t kGreetingBytes = 64;

enum class SocketType : std::uint8_t { kPull, kRouter };
const char* to_string(SocketType type);

// Our side's greeting: version 3.1, mechanism NULL, not the server of the handshake.
std::array<char, kGreetingBytes> greeting();

// Receives the message frames a Reader parses, in order; `more`: another frame of the same
// message follows. A view is valid during the call only.
class FrameSink {
 public:
  virtual void frame(std::string_view body, bool more) = 0;

 protected:
  ~FrameSink() = default;
};

class Reader {
 public:
  enum class Phase : std::uint8_t { kGreeting, kHandshake, kTraffic };

  // ours: the socket type we speak for. max_frame_bytes: a longer frame ends the connection
  // before any of it is buffered.
  Reader(SocketType ours, std::uint64_t max_frame_bytes)
      : ours_(ours), max_frame_(max_frame_bytes) {}

  // Parses the complete units at the front of `in`: message frames go to `sink`, what the peer
  // must be sent (our READY after its greeting, a PONG for each PING) is appended to `reply`.
  // Returns the bytes consumed (the caller keeps the rest for the next call), or why the
  // connection must end (kInvalid: the peer broke the protocol; kRefused: a peer we do not
  // serve, such as another socket type or a security mechanism; kPeerLost: it sent ERROR).
  Result<std::size_t> consume(std::string_view in, std::string& reply, FrameSink& sink);

  // Bytes the unit at the front of the unconsumed input needs in all (greeting, frame header
  // and body): the caller's buffer must hold at least this much for consume() to progress.
  std::uint64_t wanted(std::string_view unconsumed) const;

  Phase phase() const { return phase_; }

 private:
  Status on_greeting(std::string_view g, std::string& reply);
  Status on_command(std::string_view body, std::string& reply);

  SocketType ours_;
  std::uint64_t max_frame_;
  Phase phase_ = Phase::kGreeting;
};

}  // namespace kvnode::zmtp
