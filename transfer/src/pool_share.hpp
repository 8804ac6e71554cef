// Hands our pool's memory to peer planes on this host (region_share.hpp maps it there). The
// server listens on an abstract Unix socket: Linux-only, scoped to the network namespace, and
// nothing is left on disk when the process dies. Its name and a random token travel in our
// descriptor (descriptor.hpp); a client must run as our user (SO_PEERCRED; root too) and send the
// token within a second, then gets the pool's export: a memfd by SCM_RIGHTS for host and pinned
// pools, the CUDA IPC handle for a device pool. Anything else is closed without an answer.
// One thread serves, one client at a time with a deadline each, so a silent client delays
// others by at most that deadline and cannot hold descriptors.
//
// Frames (little-endian, fixed size; kShareVersion changes with any of them):
//   request: magic "KVPS" | u16 version | u16 0 | 16-byte token
//   answer:  magic "KVPA" | u16 version | u8 kind (gpu::MemoryKind) | u8 0 | i32 device |
//            u64 bytes | u64 mapped | 64-byte IPC handle   (+ the memfd as SCM_RIGHTS, host kinds)
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "descriptor.hpp"
#include "kvnode/common/result.hpp"
#include "kvnode/gpu/region_share.hpp"

namespace kvnode::transfer {

inline constexpr std::uint16_t kShareVersion = 1;

class PoolShareServer {
 public:
  // Binds "\0kvnode-pool-<random>" and starts the serving thread. `what` is given to every
  // client that proves itself (its fd duplicated into each answer by SCM_RIGHTS).
  static Result<std::unique_ptr<PoolShareServer>> start(gpu::RegionExport what);
  ~PoolShareServer();  // stops the thread and closes the socket
  PoolShareServer(const PoolShareServer&) = delete;
  PoolShareServer& operator=(const PoolShareServer&) = delete;

  const std::string& name() const;  // the abstract name without its leading NUL byte
  const ShareToken& token() const;
  std::uint64_t served() const;   // exports handed out
  std::uint64_t refused() const;  // clients closed without one (wrong user, token, frame, time)

  struct State;

 private:
  explicit PoolShareServer(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

// Connects to a peer's share socket, proves itself and returns what the peer exported (not yet
// mapped: gpu::MappedRegion::import does that). Errors: kPeerLost (no such socket: another
// network namespace, or the peer is gone), kRefused (closed without an answer), kDeadline,
// kInvalid (a malformed answer, a host kind without its descriptor). Blocks for at most `timeout`.
Result<gpu::RegionExport> fetch_pool_share(const std::string& name, const ShareToken& token,
                                           std::chrono::milliseconds timeout);

}  // namespace kvnode::transfer
