// The plane's own messages, sent as UCX active messages on a session's workers. Headers are
// fixed-size little-endian records; a handler accepts one only when its length is exact, and
// every page range in it is checked against the pool before any byte is touched.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>

namespace kvnode::transfer::wire {

static_assert(std::endian::native == std::endian::little, "headers are sent as little-endian");

// (The hello and welcome go over the control link, not as active messages: control_link.hpp.)
enum AmId : unsigned {
  kPullRequest = 10,  // initiator -> server: runs to send back; data: RunRequest[count]
  kPullData = 11,     // server -> initiator: one run's bytes
  kPullReject = 12,   // server -> initiator: a run it will not send; data: the reason
  kPushData = 13,     // initiator -> server: one run's bytes for the server's pool
  kPushAck = 14,      // server -> initiator: a pushed run is in place (or why not)
  kWritten = 15,      // initiator -> server after an RMA push and flush; data: RunRequest[count]
  kAsk = 16,          // a small request for the peer's node (reserve pages, commit, release)
  kAnswer = 17,       // its answer
  kRead = 18,         // initiator -> server after an RMA pull (get); data: RunRequest[count]
};

// Asks and answers are small and go eagerly; larger ones are refused before they are sent.
constexpr std::size_t kMaxAskBytes = 8 << 10;

struct AskHeader {
  std::uint64_t id = 0;
  std::uint32_t code = 0;  // kAnswer: 0 answered, 1 no handler, 2 the handler failed
  std::uint32_t reserved = 0;
};

// The most runs one request message carries, so it always goes eagerly (12 B each).
constexpr std::uint32_t kMaxRunsPerMessage = 256;

struct RunRequest {  // a run of pages in the receiver's pool
  std::uint32_t run = 0;  // index of the run in its transfer
  std::uint32_t first = 0;
  std::uint32_t count = 0;
};

struct PullRequest {
  std::uint64_t transfer = 0;
  std::uint32_t count = 0;  // RunRequests in the data
};

struct RunHeader {  // kPullData, kPullReject, kPushAck
  std::uint64_t transfer = 0;
  std::uint32_t run = 0;
  std::uint32_t code = 0;  // kPushAck / kPullReject: 0 ok, else a RejectCode
};

struct PushHeader {
  std::uint64_t transfer = 0;
  RunRequest target;
};

enum RejectCode : std::uint32_t { kOk = 0, kOutOfPool = 1, kBadLength = 2, kMalformed = 3 };

template <class T>
std::optional<T> read(const void* header, std::size_t length) {
  if (length != sizeof(T) || header == nullptr) return std::nullopt;
  T out;
  std::memcpy(&out, header, sizeof(T));
  return out;
}

}  // namespace kvnode::transfer::wire
