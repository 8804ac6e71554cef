// The client's end of the local socket: connect (failing at once, with the reason a person can
// act on: no file, not a socket, owner-only, nothing listening) and one frame out, one frame in,
// each within a deadline. Errors carry codes: kDeadline when time ran out, kPeerLost when the node
// closed the connection or is gone; the caller drops the connection on either. send_frame's
// kPeerLost means the frame did not go out whole, so the node cannot have acted on it (it acts
// on whole frames only): the request may be sent again on a new connection.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/common/unique_fd.hpp"

namespace kvnode::client::detail {

using Clock = std::chrono::steady_clock;

Result<UniqueFd> connect_unix(const std::string& path, Clock::time_point deadline);
// `fds` (at most kMaxKvFds) travel with the frame's first bytes (SCM_RIGHTS); the caller keeps
// its own copies.
Status send_frame(int fd, std::span<const std::byte> body, Clock::time_point deadline,
                  std::span<const int> fds = {});
// An idle connection can carry a request: false when the node closed it (end of stream, an
// error) or bytes nobody asked for wait on it. Never blocks.
bool idle_and_open(int fd);
Result<std::vector<std::byte>> receive_frame(int fd, Clock::time_point deadline);

}  // namespace kvnode::client::detail
