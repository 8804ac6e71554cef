#include "local_handlers.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "kvnode/keys/chunk_hash.hpp"

namespace kvnode::node::local {
namespace {

using protocol::LocalOp;
using protocol::Reply;

Reply fail(ErrorCode code, std::string message) {
  return protocol::failure(make_error(code, std::move(message)));
}

// A put stores the longest prefix that fits: a chunk that finds no page (the rest of the pool is
// pinned, read, or this put's own) ends it quietly; a frozen store is an error to wait out.
bool ends_put_quietly(const Status& s) {
  return s.error().code != ErrorCode::kFrozen;
}

}  // namespace

LocalHandlers::LocalHandlers(HandlerOptions options, Engine& engine, PeerMoves* moves,
                             Locate locate, std::unique_ptr<Staging> staging)
    : options_(std::move(options)),
      engine_(engine),
      moves_(moves),
      locate_(std::move(locate)),
      staging_(std::move(staging)) {}

Reply LocalHandlers::serve(ConnectionId from, protocol::Request q) {
  switch (q.op) {
    case LocalOp::kInfo:
      return info();
    case LocalOp::kLookup:
      if (!q.by_tokens) return fail(ErrorCode::kInvalid, "request.tokens: lookup takes tokens");
      return lookup({std::move(q.tokens)});
    case LocalOp::kCommit:
      return commit({q.hold, from});
    case LocalOp::kAbort:
      return abort({q.hold, from});
    case LocalOp::kRelease:
      return release({q.hold, from});
    case LocalOp::kRetrieve:  // seconds on the network: never on the socket thread
      return fail(ErrorCode::kInternal, "retrieve is served by the retrieve executor only");
    case LocalOp::kStore:
    case LocalOp::kLoad:
    case LocalOp::kUnregisterKv:  // answered behind the jobs that use the registration
      return fail(ErrorCode::kInternal,
                  "store, load and unregister_kv are served by the KV executor only");
    case LocalOp::kRegisterKv:
      return register_kv(from, q, {});
    default:
      break;
  }
  const bool bounded = q.op != LocalOp::kHashes && q.op != LocalOp::kContains;
  Result<Chunks> chunks = chunks_of(q, bounded);
  if (!chunks) return protocol::failure(chunks.error());
  switch (q.op) {
    case LocalOp::kHashes:
      return hashes(*chunks);
    case LocalOp::kContains:
      return contains(*chunks);
    case LocalOp::kPut:
      return put({std::move(chunks).value(), std::move(q.data), q.since});
    case LocalOp::kGet:
      return get(*chunks);
    case LocalOp::kReserve:
      return reserve({std::move(chunks).value(), q.since, from});
    case LocalOp::kLease:
      return lease({std::move(chunks).value(), from});
    default:
      break;
  }
  return fail(ErrorCode::kInternal,
              std::string("request.op: '") + protocol::to_string(q.op) + "' has no handler");
}

Result<Chunks> LocalHandlers::chunks_of(const protocol::Request& q, bool bounded) const {
  Chunks c;
  c.by_tokens = q.by_tokens;
  c.tokens = q.tokens.size();
  if (q.by_tokens) {
    Result<std::vector<ChunkHash>> h = engine_.hashes(q.tokens);
    if (!h) return wrap_error("request.tokens: ", std::move(h).error());
    c.hashes = std::move(h).value();
  } else {
    c.hashes = q.hashes;
  }
  const std::size_t pages = engine_.pool().page_count();
  if (bounded && c.hashes.size() > pages)
    return make_error(ErrorCode::kInvalid, "request: " + std::to_string(c.hashes.size()) +
                                               " chunks, the pool holds " + std::to_string(pages));
  return c;
}

Result<Chunks> LocalHandlers::retrieve_request(const protocol::Request& q) const {
  if (!q.peek && (!moves_ || !locate_))
    return make_error(ErrorCode::kRefused,
                      "this node has no transfer plane or controller to retrieve with");
  Result<Chunks> c = chunks_of(q, /*bounded=*/true);
  if (c) c->peek = q.peek;
  return c;
}

Reply LocalHandlers::info() const {
  gpu::ChunkPool& pool = engine_.pool();
  Reply r;
  r.chunk_bytes = pool.page_bytes();
  r.chunk_size = engine_.chunk_size();
  r.save_unfull_chunk = engine_.save_unfull_chunk();
  r.binary_tokens = true;
  r.hash_generation = std::string(keys::hash_generation_name(engine_.hashing().generation));
  r.hash_init = engine_.hashing().init_hash.to_string();
  r.none_hash = engine_.hashing().none_hash;
  r.pages = pool.page_count();
  r.slots = staging_ ? staging_->slot_count() : 0;
  r.shm = staging_ ? staging_->name() : "";
  r.location = engine_.location();
  r.instance = options_.instance;
  r.worker_id = options_.worker_id;
  r.memory = std::string(gpu::to_string(pool.region().kind()));
  return r;
}

Reply LocalHandlers::hashes(const Chunks& chunks) const {
  Reply r;
  r.hashes = chunks.hashes;
  return r;
}

Reply LocalHandlers::contains(const Chunks& chunks) const {
  Reply r;
  r.present.reserve(chunks.hashes.size());
  for (ChunkHash h : chunks.hashes) r.present.push_back(engine_.contains(h));
  return r;
}

Reply LocalHandlers::lookup(const LookupRequest& request) {
  Reply r;
  r.tokens = engine_.lookup_tokens(request.tokens);
  return r;
}

// One chunk of a put, unless the store has it already (then it is refreshed: the put's own).
Status LocalHandlers::put_one(ChunkHash hash, std::span<const std::byte> bytes,
                              std::uint64_t since) {
  if (engine_.refresh(hash)) return {};
  return engine_.put(hash, bytes, since);
}

Reply LocalHandlers::put(const PutRequest& request) {
  const std::vector<ChunkHash>& keys = request.chunks.hashes;
  const std::size_t page = engine_.pool().page_bytes();
  if (request.data.size() != keys.size() * page)
    return fail(ErrorCode::kInvalid, "request.data: " + std::to_string(keys.size()) +
                                         " chunks need " + std::to_string(keys.size() * page) +
                                         " bytes, got " + std::to_string(request.data.size()));
  Reply r;
  r.since = request.since ? request.since : engine_.tick();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    Status s = put_one(keys[i], std::span(request.data).subspan(i * page, page), r.since);
    if (s) {
      ++r.count;
      continue;
    }
    if (!ends_put_quietly(s))
      return protocol::failure(
          Error{s.error().code, "chunk " + std::to_string(i) + ": " + s.error().message + " (" +
                                    std::to_string(r.count) + " stored before it)"});
    spdlog::warn("local put: stored {} of the {} chunks of this request: {}", r.count, keys.size(),
                 s.error().message);
    break;
  }
  return r;
}

Reply LocalHandlers::get(const Chunks& chunks) {
  gpu::ChunkPool& pool = engine_.pool();
  if (chunks.hashes.size() * pool.page_bytes() > protocol::kMaxInlineBytes)
    return fail(ErrorCode::kInvalid, "request: more than " +
                                         std::to_string(protocol::kMaxInlineBytes >> 20) +
                                         " MiB inline; use the shared-memory path (lease)");
  const std::vector<Lease> leases = engine_.lease_leading(chunks.hashes);
  Reply r;
  r.count = leases.size();
  r.data.resize(leases.size() * pool.page_bytes());
  for (std::size_t i = 0; i < leases.size(); ++i) {
    const std::span<std::byte> out(r.data.data() + i * pool.page_bytes(), pool.page_bytes());
    if (Status s = pool.read(leases[i].page(), out); !s) return protocol::failure(s.error());
  }
  return r;
}

Status LocalHandlers::can_hold() const {
  if (!staging_)
    return make_error(ErrorCode::kRefused, "this node has no shared staging region: use put/get");
  if (staging_->holds() >= options_.max_holds)
    return make_error(ErrorCode::kNoRoom, "too many unfinished holds (" +
                                              std::to_string(staging_->holds()) +
                                              "); commit or release them");
  return {};
}

Reply LocalHandlers::reserve(const ReserveRequest& request) {
  if (Status s = can_hold(); !s) return protocol::failure(s.error());
  if (engine_.frozen())
    return fail(ErrorCode::kFrozen, "frozen: a full sync is running; ask again shortly");
  const std::vector<ChunkHash>& keys = request.chunks.hashes;
  Reply r;
  r.since = request.since ? request.since : engine_.tick();
  std::vector<bool> present;  // stored already: refreshed, this put's own now
  present.reserve(keys.size());
  for (ChunkHash c : keys) present.push_back(engine_.refresh(c));
  const auto wanted = static_cast<std::size_t>(std::count(present.begin(), present.end(), false));
  std::optional<std::vector<std::size_t>> slots = staging_->take(wanted);
  if (!slots)
    return fail(ErrorCode::kNoRoom, "request: " + std::to_string(wanted) +
                                        " chunks need staging slots, " +
                                        std::to_string(staging_->free_slots()) + " of " +
                                        std::to_string(staging_->slot_count()) +
                                        " are free (send fewer chunks per request)");
  Hold h;
  h.kind = HoldKind::kReserve;
  h.owner = request.owner;
  h.slots = std::move(*slots);
  h.since = r.since;
  std::size_t next = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (present[i]) {
      r.offsets.push_back(-1);
      continue;
    }
    h.writes.emplace_back(keys[i], h.slots[next]);
    r.offsets.push_back(staging_->offset(h.slots[next++]));
  }
  r.hold = staging_->add_hold(std::move(h), Clock::now() + options_.hold_ttl);
  return r;
}

Reply LocalHandlers::lease(const LeaseRequest& request) {
  if (Status s = can_hold(); !s) return protocol::failure(s.error());
  gpu::ChunkPool& pool = engine_.pool();
  const std::vector<Lease> leases = engine_.lease_leading(request.chunks.hashes);
  std::optional<std::vector<std::size_t>> slots = staging_->take(leases.size());
  if (!slots)
    return fail(ErrorCode::kNoRoom, "request: " + std::to_string(leases.size()) +
                                        " chunks need staging slots, " +
                                        std::to_string(staging_->free_slots()) + " of " +
                                        std::to_string(staging_->slot_count()) +
                                        " are free (send fewer chunks per request)");
  Hold h;
  h.kind = HoldKind::kLease;
  h.owner = request.owner;
  h.slots = std::move(*slots);
  Reply r;
  for (std::size_t i = 0; i < leases.size(); ++i) {
    const std::span<std::byte> slot(staging_->slot(h.slots[i]), pool.page_bytes());
    if (Status s = pool.read(leases[i].page(), slot); !s) {  // a device pool: cudaMemcpy
      staging_->give_back(h);
      return protocol::failure(s.error());
    }
    r.offsets.push_back(staging_->offset(h.slots[i]));
  }
  r.count = leases.size();
  r.hold = staging_->add_hold(std::move(h), Clock::now() + options_.hold_ttl);
  return r;
}

Result<Hold> LocalHandlers::take_hold(const HoldRequest& request, HoldKind kind, const char* op) {
  const Hold* found = staging_ ? staging_->find(request.hold) : nullptr;
  // Another connection's hold is not this one's to end: answered as absent, so a client cannot
  // learn (or probe for) the holds of others.
  if (!found || found->owner != request.owner)
    return make_error(ErrorCode::kNotFound,
                      "request.hold: no such hold on this connection (finished, or expired after " +
                          std::to_string(options_.hold_ttl.count()) + " ms)");
  if (found->kind != kind)
    return make_error(ErrorCode::kInvalid,
                      std::string("request.hold: a ") +
                          (found->kind == HoldKind::kReserve ? "reserve" : "lease") +
                          " hold cannot be ended by " + op);
  return std::move(*staging_->remove(request.hold));
}

// Each written slot becomes a stored chunk (ADMIT once whole), in order until one cannot be
// stored. Returns the chunks stored (the leading writes), or an error (frozen).
Result<std::size_t> LocalHandlers::store_writes(const Hold& hold) {
  const std::size_t page = engine_.pool().page_bytes();
  std::size_t stored = 0;
  for (const auto& [hash, index] : hold.writes) {
    Status s = put_one(hash, std::span<const std::byte>(staging_->slot(index), page), hold.since);
    if (s) {
      ++stored;
      continue;
    }
    if (!ends_put_quietly(s))
      return Error{s.error().code,
                   s.error().message + " (" + std::to_string(stored) + " stored before it)"};
    spdlog::warn("local put: stored {} of the {} chunks of this request: {}", stored,
                 hold.writes.size(), s.error().message);
    break;
  }
  return stored;
}

Reply LocalHandlers::commit(const HoldRequest& request) {
  Result<Hold> hold = take_hold(request, HoldKind::kReserve, "commit");
  if (!hold) return protocol::failure(hold.error());
  Result<std::size_t> stored = store_writes(*hold);
  staging_->give_back(*hold);
  if (!stored) return protocol::failure(stored.error());
  Reply r;
  r.count = *stored;
  return r;
}

Reply LocalHandlers::abort(const HoldRequest& request) {
  Result<Hold> hold = take_hold(request, HoldKind::kReserve, "abort");
  if (!hold) return protocol::failure(hold.error());
  staging_->give_back(*hold);
  return Reply{};
}

Reply LocalHandlers::release(const HoldRequest& request) {
  Result<Hold> hold = take_hold(request, HoldKind::kLease, "release");
  if (!hold) return protocol::failure(hold.error());
  staging_->give_back(*hold);
  return Reply{};
}

Reply LocalHandlers::peek(const Chunks& chunks) const {
  Reply r;
  const std::size_t n = chunks.hashes.size();
  while (r.count < n && engine_.contains(chunks.hashes[r.count])) ++r.count;
  auto tokens_of = [&](std::size_t count) -> std::uint64_t {
    if (!chunks.by_tokens || count == 0) return 0;
    return keys::chunk_end_token(count - 1, chunks.tokens, engine_.chunk_size());
  };
  r.tokens = tokens_of(r.count);
  if (r.count == n || !locate_) return r;
  // A failed lookup is no peer: the caller asked how much it could get, not whether it can.
  Result<std::pair<std::string, std::size_t>> holder = locate_(chunks.hashes);
  if (!holder) {
    spdlog::debug("peek: {}", holder.error().message);
    return r;
  }
  const std::size_t hits = std::min(holder->second, n);
  if (hits > r.count) {
    r.peer = holder->first;
    r.peer_tokens = tokens_of(hits);
    r.peer_chunks = hits;
  }
  return r;
}

Reply LocalHandlers::retrieve(const Chunks& chunks) const {
  if (chunks.peek) return peek(chunks);
  const RetrieveResult got = moves_->retrieve_chunks(chunks.hashes, locate_);
  Reply r;
  r.count = got.chunks_local + got.chunks_pulled;
  r.pulled = got.chunks_pulled;
  r.peer = got.peer;
  if (chunks.by_tokens && r.count > 0)
    r.tokens = keys::chunk_end_token(r.count - 1, chunks.tokens, engine_.chunk_size());
  return r;
}

void LocalHandlers::expire_holds() {
  if (staging_) staging_->expire(Clock::now());
}

void LocalHandlers::drop_holds_of(ConnectionId connection) {
  const auto [first, last] = registrations_of(connection);
  if (first != last) {
    spdlog::info("local client connection {} closed: {} KV registrations unmapped", connection,
                 std::distance(first, last));
    registrations_.erase(first, last);
  }
  if (!staging_) return;
  if (const std::size_t ended = staging_->drop_owner(connection); ended > 0)
    spdlog::info("local client connection {} closed with {} holds unfinished; their slots return",
                 connection, ended);
}

}  // namespace kvnode::node::local
