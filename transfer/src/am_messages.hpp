// The plane's own messages, sent as UCX active messages between the two workers of a session
// (namespace am, apart from kvnode::wire, the controller protocol's codec). Headers are
// fixed-size little-endian records; a handler accepts one only when its length is exact, and
// every page range in it is checked against the pool before any byte is touched.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>

namespace kvnode::transfer::am {

static_assert(std::endian::native == std::endian::little, "headers are sent as little-endian");

// Who sends what: the initiator is the side that dialled (its plane started the transfer), the
// acceptor the side that serves its pool. (The hello and welcome go over the control link, not
// as active messages: control_link.hpp.)
enum AmId : unsigned {
  kPullRequest = 10,  // initiator -> acceptor: runs to send back; data: RunRequest[count]
  kPullData = 11,     // acceptor -> initiator: one run's bytes
  kPullReject = 12,   // acceptor -> initiator: a run it will not send; data: the reason
  kPushData = 13,     // initiator -> acceptor: one run's bytes for the acceptor's pool
  kPushAck = 14,      // acceptor -> initiator: a pushed run is in place (or why not)
  kWritten = 15,      // initiator -> acceptor after an RMA push and flush; data: RunRequest[count]
  kAsk = 16,          // a small request for the peer's node (reserve pages, commit, release)
  kAnswer = 17,       // its answer
  kRead = 18,         // initiator -> acceptor after an RMA pull (get); data: RunRequest[count]
};

// Asks and answers are small and go eagerly; larger ones are refused before they are sent.
constexpr std::size_t kMaxAskBytes = 8 << 10;

// How a kAnswer ends its ask. Read off the wire: any other value is treated as kHandlerFailed.
enum class AnswerCode : std::uint32_t {
  kAnswered = 0,       // data: the answer
  kNoHandler = 1,      // the peer's node answers no asks
  kHandlerFailed = 2,  // data: the reason; AskHeader::error: the handler's ErrorCode
};

struct AskHeader {
  std::uint64_t id = 0;
  AnswerCode code = AnswerCode::kAnswered;  // kAnswer only
  std::uint32_t error = 0;  // kHandlerFailed: the ErrorCode the peer's handler returned
};

// The most runs one request message carries, so it always goes eagerly (12 B each).
constexpr std::uint32_t kMaxRunsPerMessage = 256;

struct RunRequest {       // a run of pages in the receiver's pool
  std::uint32_t run = 0;  // index of the run in its transfer
  std::uint32_t first = 0;
  std::uint32_t count = 0;
};

struct PullRequest {
  std::uint64_t transfer = 0;
  std::uint32_t count = 0;  // RunRequests in the data
};

// The verdict on one run, in a kPushAck or kPullReject (kPullData carries kOk).
enum class RunCode : std::uint32_t { kOk = 0, kOutOfPool = 1, kBadLength = 2, kMalformed = 3 };

struct RunHeader {  // kPullData, kPullReject, kPushAck
  std::uint64_t transfer = 0;
  std::uint32_t run = 0;
  RunCode code = RunCode::kOk;
};

struct PushHeader {
  std::uint64_t transfer = 0;
  RunRequest target;
};

template <class T>
std::optional<T> read(const void* header, std::size_t length) {
  if (length != sizeof(T) || header == nullptr) return std::nullopt;
  T out;
  std::memcpy(&out, header, sizeof(T));
  return out;
}

}  // namespace kvnode::transfer::am
