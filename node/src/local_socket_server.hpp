// The local socket's transport: an AF_UNIX stream socket (owner-only) served by one epoll thread
// that accepts connections, reads whole frames (local_framing.hpp), hands each request to the
// service, and writes the replies. What it guards against, so one client cannot cost the others:
// a declared length over kMaxMessageBytes closes that connection at once (nothing allocated); a
// connection stalled mid-frame, or not reading its reply, is cut after stall_timeout, and so is
// one that has not read its whole reply within stall_timeout of its start (a reader trickling a
// byte now and then cannot hold a 256 MiB reply forever); beyond max_connections a new
// connection is answered one refusal frame (code "refused") and closed; out of descriptors,
// accepting pauses for a tick. One request per connection at a time: the next is read once the
// reply is written.
//
// A reply comes back from on_request at once, or later through post() from any thread (a
// retrieve on its executor); a reply for a connection that closed meanwhile is dropped (and
// counted). is_waiting() tells that executor whether anyone still waits before it runs a job.
// on_close tells the service a connection is gone (its holds end).
//
// Descriptors a client passes (SCM_RIGHTS: the memfds and VMM fds of a KV registration) arrive
// with their frame and go to on_request with it, owned; more than kMaxKvFds for one frame, or a
// truncated control message (the kernel dropped some), cuts the connection, and any the service
// does not take are closed.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/common/unique_fd.hpp"

namespace kvnode::node::local {

using ConnectionId = std::uint64_t;  // never reused within a server

struct SocketServerOptions {
  std::string path{};
  std::size_t max_connections = 256;
  std::chrono::milliseconds stall_timeout{10'000};  // mid-frame, or a reply not read
  std::chrono::milliseconds tick{100};              // on_tick's period
};

struct SocketServerHandlers {
  // A whole request; its reply now, or nullopt when it comes later through post().
  std::function<std::optional<std::vector<std::byte>>(ConnectionId, std::vector<std::byte>,
                                                      std::vector<UniqueFd>)>
      on_request{};
  std::function<void()> on_tick{};               // on the socket thread, every tick
  std::function<void(ConnectionId)> on_close{};  // on the socket thread, once per connection
};

struct SocketServerCounters {
  std::uint64_t accepted = 0;
  std::uint64_t refused = 0;  // over max_connections
  std::uint64_t cut = 0;      // oversized frame or stalled
  std::uint64_t open = 0;
  std::uint64_t dropped = 0;  // replies posted for connections that had closed
};

class LocalSocketServer {
 public:
  // Binds and listens at options.path (a stale socket file there is replaced; any other file is
  // an error) with mode 0600; serving starts with serve().
  static Result<std::unique_ptr<LocalSocketServer>> listen(const SocketServerOptions& options);
  // Starts the socket thread. Call once.
  Status serve(SocketServerHandlers handlers);
  // Joins the socket thread (no handler runs after it returns), closes every connection and the
  // listener, and removes the socket file unless another process bound the path since. Once
  // stopped, post() and cut() only queue. Idempotent; not from two threads at once.
  void stop();
  ~LocalSocketServer();  // stop()
  LocalSocketServer(const LocalSocketServer&) = delete;
  LocalSocketServer& operator=(const LocalSocketServer&) = delete;

  // The reply to a request on_request deferred. Any thread.
  void post(ConnectionId connection, std::vector<std::byte> reply);
  // Closes a connection whose deferred reply cannot be made (out of memory). Any thread.
  void cut(ConnectionId connection);
  // Whether `connection` is open and waits for a deferred reply. Any thread.
  bool is_waiting(ConnectionId connection) const;
  // The process at the other end of `connection` (SO_PEERCRED at accept), 0 if unknown or
  // closed. On the socket thread only (from a handler).
  int peer_pid(ConnectionId connection) const;
  SocketServerCounters counters() const;

  struct Impl;

 private:
  explicit LocalSocketServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvnode::node::local
