// The daemon's local socket: how an inference engine on the same host reaches the node's chunks
// (kvnode::client::LocalClient is the other end). A plain AF_UNIX stream socket at <path>, owner
// only, with length-prefixed msgpack frames (client/include/kvnode/client/local_framing.hpp). One
// thread serves every connection (local_socket_server.hpp); retrieve, which crosses the network,
// runs on its own executor so the others are answered meanwhile. Every request gets an answer:
// ok, or an error with its code and a message naming the field (local_handlers.hpp).
//
// Data path: a staging region in POSIX shared memory (slots of one chunk each) that clients map.
// A put is reserve (slots) -> the client writes them -> commit (the daemon copies each slot into
// a pool page and only then makes the chunk readable); a get is lease (the daemon copies the
// leading stored chunks into slots) -> the client reads them -> release. Clients never map the
// pool itself: a buggy client can only spoil its own slots, the pool keeps its huge pages (shmem
// rarely has them; on this project's VMs 4 KiB shmem pages cut cma transfers tenfold), and the
// same path serves pinned and device pools (a device page is reached with cudaMemcpy).
//
// The engine's KV path: register_kv maps an engine's paged KV cache (memfd or CUDA IPC, see
// kvnode/client/kv_memory.hpp) for as long as the connection lives; store and load gather and
// scatter chunks by block table on a KV executor of their own (node/src/kv_transfer.hpp). A hold
// belongs to its connection: only that one commits or releases it, and its holds end (slots back,
// writes dropped) when the connection closes; one a client leaves unfinished on an open connection
// expires after hold_ttl. Without staging (slots = 0), bytes travel inline.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "kvnode/common/result.hpp"
#include "kvnode/node/peer_moves.hpp"

namespace kvnode::node {

struct LocalServiceOptions {
  std::string path{};      // the socket file
  std::string instance{};  // answered by info
  std::int64_t worker_id = 0;
  std::chrono::milliseconds hold_ttl{30'000};  // reserve/lease holds a client must finish by
  std::size_t max_holds = 4096;                // outstanding holds, all clients together
  std::size_t staging_slots = 0;      // chunks in the shared staging region; 0: inline only
  std::string staging_name{};         // its POSIX shm name ("/...")
  std::size_t max_connections = 256;  // beyond: a new connection is refused ("refused") and closed
  // A client stalled mid-request or in reading its reply is cut, and so is one that has not read
  // a whole reply within this time from its start.
  std::chrono::milliseconds stall_timeout{10'000};
  std::size_t max_queued_retrieves = 64;  // beyond: a retrieve is refused (kNoRoom)
  std::size_t max_kv_bytes = SIZE_MAX;    // engines' host KV mapped at once; beyond: kNoRoom
};

// The engine KV path's figures (for /metrics).
struct LocalKvCounters {
  std::uint64_t registrations = 0;  // KV caches mapped now
  std::uint64_t stores = 0, loads = 0;
  std::uint64_t chunks_stored = 0, chunks_loaded = 0;
};

class LocalService {
 public:
  // `engine` (and `moves`/`locate`, when given) must outlive the service. Retrieve needs both.
  static Result<std::unique_ptr<LocalService>> start(const LocalServiceOptions& options,
                                                     Engine& engine, PeerMoves* moves,
                                                     Locate locate);
  ~LocalService();  // stops the thread, drops every hold (uncommitted writes are aborted)
  LocalService(const LocalService&) = delete;
  LocalService& operator=(const LocalService&) = delete;

  const std::string& path() const;
  std::uint64_t requests() const;  // served, errors included
  std::uint64_t errors() const;
  std::uint64_t connections() const;        // open now
  std::uint64_t dropped_replies() const;    // answers made for clients that had left
  std::uint64_t retrieves_skipped() const;  // queued retrieves whose client left before they ran
  LocalKvCounters kv_counters() const;

  struct Impl;

 private:
  explicit LocalService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvnode::node
