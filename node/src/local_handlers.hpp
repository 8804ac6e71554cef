// The local socket's operations, one function each, on typed requests: serve() turns a decoded
// request (its op already a LocalOp) into the typed request of its op, checked, and calls that
// op's handler. Replies carry an ErrorCode with every error (a frozen store is kFrozen, a full
// staging region kNoRoom...), which the client hands back to the engine.
//
// Every handler but retrieve runs on the socket thread (memory copies; they share the staging
// region and holds). retrieve() crosses the network and runs on the service's executor only
// (serve() refuses it): it touches only the engine and PeerMoves, which are thread-safe. A hold
// belongs to the connection that made it: another connection's commit or release finds no such
// hold, and a closed connection's holds end at once (drop_holds_of).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kv_transfer.hpp"
#include "kvnode/client/local_protocol.hpp"
#include "kvnode/node/engine.hpp"
#include "kvnode/node/peer_moves.hpp"
#include "local_staging.hpp"

namespace kvnode::node::local {

namespace protocol = client::protocol;

struct HandlerOptions {
  std::string instance{};  // answered by info
  std::int64_t worker_id = 0;
  std::chrono::milliseconds hold_ttl{30'000};
  std::size_t max_holds = 4096;
  std::size_t max_kv_registrations = 64;  // per connection
  std::size_t max_kv_bytes = SIZE_MAX;    // host KV mapped, all connections together
};

// A request's chunks by hash (tokens hashed once, on decoding).
struct Chunks {
  std::vector<ChunkHash> hashes{};
  bool by_tokens = false;
  std::size_t tokens = 0;  // by tokens: how many were given
  bool peek = false;       // retrieve: who holds more, nothing pulled
};

struct PutRequest {
  Chunks chunks{};
  std::vector<std::byte> data{};  // one chunk's bytes per key, in order
  std::uint64_t since = 0;        // the put's tick from an earlier call (0: it begins now)
};

struct ReserveRequest {
  Chunks chunks{};
  std::uint64_t since = 0;
  ConnectionId owner = 0;  // the connection asking: the hold's owner
};

struct LeaseRequest {
  Chunks chunks{};
  ConnectionId owner = 0;
};

struct HoldRequest {
  std::uint64_t hold = 0;
  ConnectionId owner = 0;  // only the hold's owner ends it
};

struct LookupRequest {
  std::vector<std::int64_t> tokens{};
};

class LocalHandlers {
 public:
  // `staging` null: bytes travel inline only. `moves`/`locate` null: no retrieve.
  LocalHandlers(HandlerOptions options, Engine& engine, PeerMoves* moves, Locate locate,
                std::unique_ptr<Staging> staging);

  // Every op but retrieve (kInternal: it goes through retrieve_request() and the executor),
  // asked on connection `from`.
  protocol::Reply serve(ConnectionId from, protocol::Request request);
  // Retrieve's checked request, on the socket thread; then retrieve() on the executor.
  Result<Chunks> retrieve_request(const protocol::Request& request) const;

  protocol::Reply info() const;
  protocol::Reply hashes(const Chunks& chunks) const;
  protocol::Reply contains(const Chunks& chunks) const;
  protocol::Reply lookup(const LookupRequest& request);
  protocol::Reply put(const PutRequest& request);
  protocol::Reply get(const Chunks& chunks);
  protocol::Reply reserve(const ReserveRequest& request);
  protocol::Reply lease(const LeaseRequest& request);
  protocol::Reply commit(const HoldRequest& request);
  protocol::Reply abort(const HoldRequest& request);
  protocol::Reply release(const HoldRequest& request);
  protocol::Reply retrieve(const Chunks& chunks) const;  // any thread
  protocol::Reply peek(const Chunks& chunks) const;      // retrieve's peek: any thread

  // The engine's KV path (local_kv_handlers.cpp). register_kv maps the allocations (`fds` are
  // the request's descriptors, owned; unused ones close); a registration belongs to its
  // connection and ends with it. store and load run on the KV executor: kv_job() checks the
  // request on the socket thread and returns what the executor runs.
  // `pid` is the connected engine's (its own memory, kHostProcess allocations; 0: unknown).
  protocol::Reply register_kv(ConnectionId from, const protocol::Request& request,
                              std::vector<UniqueFd> fds, int pid = 0);
  // unregister_kv takes the registration out (no new job can name it) and hands it over: the
  // caller answers only once the jobs queued before are done and the mapping is gone, since the
  // engine may free or reuse its memory the moment the answer arrives. put_back_kv undoes it (the
  // caller could not queue that wait).
  Result<std::shared_ptr<KvRegistration>> unregister_kv(ConnectionId from, std::uint64_t kv);
  void put_back_kv(ConnectionId from, std::uint64_t kv, std::shared_ptr<KvRegistration> reg);
  Result<KvJob> kv_job(ConnectionId from, const protocol::Request& request) const;
  std::size_t kv_registrations() const { return registrations_.size(); }
  std::size_t mapped_kv_bytes() const;  // host memfds mapped by every registration now
  // A registration of `from`'s, or null.
  std::shared_ptr<KvRegistration> kv_registration(ConnectionId from, std::uint64_t kv) const {
    const auto it = registrations_.find({from, kv});
    return it == registrations_.end() ? nullptr : it->second;
  }

  // Holds past hold_ttl end (their client died): slots back, writes dropped.
  void expire_holds();
  // The holds and KV registrations of a connection that closed end now: slots back, writes
  // dropped, mappings closed (once the jobs using them end).
  void drop_holds_of(ConnectionId connection);

 private:
  // `bounded`: refused when there are more chunks than the pool has pages.
  Result<Chunks> chunks_of(const protocol::Request& request, bool bounded) const;
  Status put_one(ChunkHash hash, std::span<const std::byte> bytes, std::uint64_t since);
  Result<Hold> take_hold(const HoldRequest& request, HoldKind kind, const char* op);
  Result<std::size_t> store_writes(const Hold& hold);
  Status can_hold() const;

  HandlerOptions options_;
  Engine& engine_;
  PeerMoves* moves_;
  Locate locate_;
  std::unique_ptr<Staging> staging_;
  using Registrations =
      std::map<std::pair<ConnectionId, std::uint64_t>, std::shared_ptr<KvRegistration>>;
  // The registrations of one connection: a range of registrations_.
  std::pair<Registrations::iterator, Registrations::iterator> registrations_of(ConnectionId c) {
    return {registrations_.lower_bound({c, 0}), registrations_.lower_bound({c + 1, 0})};
  }
  Registrations registrations_;
  std::uint64_t next_registration_ = 1;
};

}  // namespace kvnode::node::local
