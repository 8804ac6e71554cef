// ZMTP 3.x for a PULL socket with the NULL mechanism: the greeting, the READY handshake and the
// frames, with every length checked against what is in hand before it is used.
#include "kvnode/zmtp/reader.hpp"

#include <algorithm>
#include <cctype>

namespace kvnode::zmtp {
namespace {

constexpr unsigned char kMore = 0x01, kLong = 0x02, kCommand = 0x04;
constexpr unsigned char kReservedFlags = 0xF8;
constexpr std::size_t kShortHeader = 2, kLongHeader = 9;
constexpr std::size_t kMechanismAt = 12, kMechanismBytes = 20;
constexpr std::size_t kMaxPingContext = 16;  // the spec's bound; a longer context is cut

// The peers a bound socket of ours pairs with (ZMTP's socket-type rules, as libzmq applies them).
bool pairs_with(SocketType ours, std::string_view peer) {
  switch (ours) {
    case SocketType::kPull:
      return peer == "PUSH";
    case SocketType::kRouter:
      return peer == "DEALER" || peer == "REQ" || peer == "ROUTER";
  }
  return false;
}

unsigned char byte_at(std::string_view s, std::size_t i) {
  return static_cast<unsigned char>(s[i]);
}

std::uint64_t big_endian(std::string_view s, std::size_t at, std::size_t bytes) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < bytes; ++i) v = (v << 8) | byte_at(s, at + i);
  return v;
}

void append_big_endian(std::string& out, std::uint64_t v, std::size_t bytes) {
  for (std::size_t i = bytes; i-- > 0;) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// A command frame: its name (length-prefixed) then data. Short form: our commands are small.
void append_command(std::string& out, std::string_view name, std::string_view data) {
  const std::size_t size = 1 + name.size() + data.size();
  out.push_back(static_cast<char>(kCommand));
  out.push_back(static_cast<char>(size));
  out.push_back(static_cast<char>(name.size()));
  out.append(name);
  out.append(data);
}

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 32))
    out.push_back(std::isprint(static_cast<unsigned char>(c)) ? c : '?');
  return out;
}

// The Socket-Type property of a READY command's metadata, or why there is none.
Result<std::string_view> socket_type(std::string_view props) {
  std::size_t at = 0;
  while (at < props.size()) {
    const std::size_t name_len = byte_at(props, at++);
    if (props.size() - at < name_len + 4) return make_error("READY: a property is cut short");
    const std::string_view name = props.substr(at, name_len);
    at += name_len;
    const std::uint64_t value_len = big_endian(props, at, 4);
    at += 4;
    if (props.size() - at < value_len) return make_error("READY: a property value is cut short");
    const std::string_view value = props.substr(at, value_len);
    at += value_len;
    if (equal_ignoring_case(name, "Socket-Type")) return value;
  }
  return make_error("READY names no Socket-Type");
}

}  // namespace

const char* to_string(SocketType type) {
  switch (type) {
    case SocketType::kPull:
      return "PULL";
    case SocketType::kRouter:
      return "ROUTER";
  }
  return "?";
}

std::array<char, kGreetingBytes> greeting() {
  std::array<char, kGreetingBytes> g{};
  g[0] = static_cast<char>(0xFF);
  g[8] = 1;  // padding: libzmq's "identity size + 1", read by ZMTP 1.0 peers only
  g[9] = 0x7F;
  g[10] = 3;  // version 3.1: PING and PONG
  g[11] = 1;
  constexpr std::string_view kNull = "NULL";
  std::copy(kNull.begin(), kNull.end(), g.begin() + kMechanismAt);
  return g;  // as-server 0 and the filler stay zero
}

Status Reader::on_greeting(std::string_view g, std::string& reply) {
  if (byte_at(g, 0) != 0xFF || (byte_at(g, 9) & 1) == 0)
    return make_error(ErrorCode::kRefused, "not a ZMTP 3 peer (no ZMTP 2+ signature)");
  if (byte_at(g, 10) < 3)
    return make_error(ErrorCode::kRefused, "ZMTP " + std::to_string(byte_at(g, 10)) +
                                               ".x peer (libzmq 3 or older): ZMTP 3 is required");
  std::string_view mechanism = g.substr(kMechanismAt, kMechanismBytes);
  mechanism = mechanism.substr(0, mechanism.find('\0'));
  if (mechanism != "NULL")
    return make_error(ErrorCode::kRefused,
                      "security mechanism '" + printable(mechanism) + "': only NULL is served");
  const std::string_view ours = to_string(ours_);
  std::string props;
  props.push_back(static_cast<char>(std::string_view("Socket-Type").size()));
  props.append("Socket-Type");
  append_big_endian(props, ours.size(), 4);
  props.append(ours);
  append_command(reply, "READY", props);
  phase_ = Phase::kHandshake;
  return {};
}

Status Reader::on_command(std::string_view body, std::string& reply) {
  if (body.empty() || body.size() - 1 < byte_at(body, 0))
    return make_error("a command's name is cut short");
  const std::string_view name = body.substr(1, byte_at(body, 0));
  const std::string_view data = body.substr(1 + name.size());
  if (name == "ERROR") {
    const std::string_view reason = data.empty() ? data : data.substr(1, byte_at(data, 0));
    return make_error(ErrorCode::kPeerLost, "the peer sent ERROR: " + printable(reason));
  }
  if (phase_ == Phase::kHandshake) {
    if (name != "READY")
      return make_error("expected READY, got the command '" + printable(name) + "'");
    auto type = socket_type(data);
    if (!type) return type.error();
    if (!pairs_with(ours_, *type))
      return make_error(ErrorCode::kRefused, std::string("a ") + to_string(ours_) +
                                                 " socket does not pair with '" + printable(*type) +
                                                 "'");
    phase_ = Phase::kTraffic;
    return {};
  }
  if (name == "PING") {  // TTL (2 bytes), then the context to echo
    const std::string_view context = data.size() > 2 ? data.substr(2, kMaxPingContext) : "";
    append_command(reply, "PONG", context);
  }
  return {};  // PONG, and commands of later revisions, need nothing from a PULL socket
}

std::uint64_t Reader::wanted(std::string_view in) const {
  if (phase_ == Phase::kGreeting) return kGreetingBytes;
  if (in.empty()) return kShortHeader;
  const bool long_frame = (byte_at(in, 0) & kLong) != 0;
  const std::size_t header = long_frame ? kLongHeader : kShortHeader;
  if (in.size() < header) return header;
  const std::uint64_t size = long_frame ? big_endian(in, 1, 8) : byte_at(in, 1);
  return size > max_frame_ ? header : header + size;  // too long: consume() refuses it
}

Result<std::size_t> Reader::consume(std::string_view in, std::string& reply, FrameSink& sink) {
  std::size_t pos = 0;
  while (pos < in.size()) {
    const std::string_view rest = in.substr(pos);
    if (phase_ == Phase::kGreeting) {
      if (rest.size() < kGreetingBytes) break;
      if (Status s = on_greeting(rest.substr(0, kGreetingBytes), reply); !s) return s.error();
      pos += kGreetingBytes;
      continue;
    }
    const unsigned char flags = byte_at(rest, 0);
    if (flags & kReservedFlags)
      return make_error("a frame with reserved flag bits set (" + std::to_string(flags) + ")");
    const bool command = (flags & kCommand) != 0;
    if (command && (flags & kMore)) return make_error("a command frame marked 'more'");
    const std::size_t header = (flags & kLong) ? kLongHeader : kShortHeader;
    if (rest.size() < header) break;
    const std::uint64_t size = (flags & kLong) ? big_endian(rest, 1, 8) : byte_at(rest, 1);
    if (size > max_frame_)
      return make_error("a frame of " + std::to_string(size) + " bytes, over the limit of " +
                        std::to_string(max_frame_));
    if (size > rest.size() - header) break;
    const std::string_view body = rest.substr(header, size);
    if (command) {
      if (Status s = on_command(body, reply); !s) return s.error();
    } else if (phase_ != Phase::kTraffic) {
      return make_error("a message before the handshake's READY");
    } else {
      sink.frame(body, (flags & kMore) != 0);
    }
    pos += header + size;
  }
  return pos;
}

}  // namespace kvnode::zmtp
