// What the node needs from a transfer plane, and nothing more: name itself, copy pages to and
// from a peer's pool, and exchange a small request with the peer's node. TransferPlane (UCX) is
// the implementation a node runs; tests put an in-process fake behind the same seam
// (tests/node/fake_transport.hpp) to drive the move and retrieve protocols through faults that
// a real network produces only by chance. Results are futures: a caller on its own thread waits,
// the transport's thread never blocks on it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/gpu/chunk_pool.hpp"

namespace kvnode::transfer {

enum class Protocol { kAuto, kRma, kActiveMessage };
const char* to_string(Protocol p);

struct PageCopy {
  gpu::PageId local = 0;
  gpu::PageId remote = 0;
};

enum class Failure : std::uint8_t {
  kNone,
  kInvalid,    // the request itself is wrong (page outside a pool, a page written twice)
  kConnect,    // the peer could not be reached or its handshake was refused
  kRejected,   // the peer refused part of the request (and logged why)
  kPeerLost,   // the peer died or the connection broke
  kTimeout,    // the deadline passed
  kCancelled,  // cancel(), or the plane stopped
  kReset,      // another transfer's failure reset this peer's session; safe to retry
};
const char* to_string(Failure f);
inline constexpr std::size_t kFailureCount = static_cast<std::size_t>(Failure::kReset) + 1;

struct TransferStats {
  std::uint64_t bytes = 0;  // moved, counting only chunks done
  std::uint32_t chunks = 0;
  std::uint32_t ops = 0;                 // UCX operations posted after coalescing
  std::chrono::nanoseconds queued{0};    // submit -> posted (includes connecting)
  std::chrono::nanoseconds post{0};      // time spent posting
  std::chrono::nanoseconds complete{0};  // submit -> reported
  Protocol protocol = Protocol::kAuto;   // the one used
  std::string transport;                 // e.g. "cma", "tcp", "rc_mlx5"
};

struct TransferResult {
  Failure failure = Failure::kNone;
  std::string message;             // empty on success
  std::vector<std::uint8_t> done;  // per requested chunk, in request order: 1 once in place
  TransferStats stats;
  bool ok() const { return failure == Failure::kNone; }
};

struct TransferOptions {
  std::optional<std::chrono::milliseconds> deadline;  // default: PlaneOptions::default_deadline
};

class PeerTransport {
 public:
  virtual ~PeerTransport() = default;
  virtual std::string url() const = 0;  // host:port where peers reach this node
  // Reads remote pages of `peer` into local pages.
  virtual std::future<TransferResult> pull(const std::string& peer, std::vector<PageCopy> pages,
                                           TransferOptions options) = 0;
  // Writes local pages into remote pages of `peer`; done means the bytes are in the peer's pool.
  virtual std::future<TransferResult> push(const std::string& peer, std::vector<PageCopy> pages,
                                           TransferOptions options) = 0;
  // A small request to the peer's node and its answer (at most 8 KiB each way). Error codes:
  // kInvalid (a request over 8 KiB, a peer that is not host:port), kPeerLost (the peer could not
  // be reached, or the session broke before the answer), kDeadline (no answer in time),
  // kRefused (the peer's node answers no asks), else the code the peer's handler failed with.
  virtual std::future<Result<std::vector<std::byte>>> ask(const std::string& peer,
                                                          std::vector<std::byte> request,
                                                          TransferOptions options) = 0;
};

}  // namespace kvnode::transfer
