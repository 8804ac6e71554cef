#include "kvnode/node/local_service.hpp"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <zmq.hpp>

#include "local_protocol.hpp"

namespace kvnode::node {

using Clock = std::chrono::steady_clock;

// A client's unfinished reserve or lease: the staging slots it holds (and, writing, the chunk
// each slot is for). The slots return when the hold ends, committed or not.
struct Hold {
  bool writing = false;
  std::vector<std::pair<ChunkHash, std::size_t>> writes;  // (chunk, slot)
  std::vector<std::size_t> slots;                         // every slot held
  std::uint64_t since = ChunkStore::kAnyAge;              // writing: the put's tick (evict older only)
  Clock::time_point expires;
};

struct LocalService::Impl {
  LocalServiceOptions options;
  Engine& engine;
  PeerMoves* moves;
  Locate locate;
  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::router};
  std::map<std::uint64_t, Hold> holds;
  std::optional<gpu::MemoryRegion> staging;
  std::vector<std::size_t> free_slots;
  std::uint64_t next_hold = 1;
  ino_t socket_inode = 0;  // of the socket file this service bound
  dev_t socket_device = 0;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> requests{0}, errors{0};
  std::thread thread;

  Impl(const LocalServiceOptions& o, Engine& e, PeerMoves* m, Locate l)
      : options(o), engine(e), moves(m), locate(std::move(l)) {}

  ~Impl() {
    stop = true;
    if (thread.joinable()) thread.join();
    holds.clear();
    socket.close();
    // libzmq leaves the socket file behind; remove it unless a newer daemon bound the path since.
    struct stat now {};
    if (socket_inode != 0 && ::stat(options.path.c_str(), &now) == 0 && now.st_ino == socket_inode &&
        now.st_dev == socket_device)
      ::unlink(options.path.c_str());
  }

  std::size_t chunk_bytes() { return engine.store().pool().page_bytes(); }
  std::byte* slot(std::size_t i) { return staging->data() + i * chunk_bytes(); }
  std::int64_t slot_offset(std::size_t i) { return static_cast<std::int64_t>(i * chunk_bytes()); }

  // One chunk of a put, unless the store has it already (then it is refreshed: the put's own).
  Status put_one(ChunkHash hash, std::span<const std::byte> bytes, std::uint64_t since) {
    if (engine.store().refresh(hash)) return {};
    return engine.put(hash, bytes, since);
  }

  // A put stores the longest prefix that fits: a chunk that finds no page (the rest of the pool
  // is pinned, read, or this put's own) ends it quietly; a frozen store is an error to wait out.
  static bool ends_put_quietly(const Status& s) { return s.error().message != ChunkStore::kFrozenText; }

  // Ends a hold: with commit, each written slot becomes a stored chunk (ADMIT once whole), in
  // order until one cannot be stored; either way its slots return. Returns the chunks stored
  // (the leading writes), or an error (frozen).
  Result<std::size_t> end_hold(Hold& h, bool commit) {
    std::size_t stored = 0;
    std::string error;
    for (const auto& [hash, index] : h.writes) {
      if (!commit) break;
      Status s = put_one(hash, std::span<const std::byte>(slot(index), chunk_bytes()), h.since);
      if (s) {
        ++stored;
        continue;
      }
      if (ends_put_quietly(s))
        spdlog::warn("local put: stored {} of the {} chunks of this request: {}", stored, h.writes.size(),
                     s.error().message);
      else
        error = s.error().message + " (" + std::to_string(stored) + " stored before it)";
      break;
    }
    free_slots.insert(free_slots.end(), h.slots.begin(), h.slots.end());
    h.slots.clear();
    h.writes.clear();
    if (!error.empty()) return make_error(error);
    return stored;
  }

  void expire_holds() {
    const auto now = Clock::now();
    for (auto it = holds.begin(); it != holds.end();) {
      if (it->second.expires > now) {
        ++it;
        continue;
      }
      spdlog::warn("local client hold {} expired unfinished ({} writes dropped)", it->first,
                   it->second.writes.size());
      (void)end_hold(it->second, false);
      it = holds.erase(it);
    }
  }

  void run() {
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    while (!stop) {
      expire_holds();
      if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) == 0) continue;
      // A multipart message arrives whole: read every part, keep at most a few (an envelope).
      std::vector<zmq::message_t> frames;
      bool overflow = false;
      try {
        for (;;) {
          zmq::message_t frame;
          if (!socket.recv(frame, zmq::recv_flags::dontwait)) break;
          const bool more = frame.more();
          if (frames.size() < 4) {
            frames.push_back(std::move(frame));
          } else {
            overflow = true;
          }
          if (!more) break;
        }
      } catch (const zmq::error_t& e) {
        spdlog::warn("local socket: {}", e.what());
        continue;
      }
      if (overflow) {
        spdlog::warn("local socket: dropped a message of more than 4 parts");
        ++errors;
        continue;
      }
      // REQ sends [identity][empty][payload]; anything else is not a client we can answer well.
      if (frames.size() < 2) continue;
      const zmq::message_t& payload = frames.back();
      local::Reply reply = serve(std::span(static_cast<const std::byte*>(payload.data()), payload.size()));
      ++requests;
      if (!reply.ok) ++errors;
      const std::vector<std::byte> out = local::encode(reply);
      try {
        for (std::size_t i = 0; i + 1 < frames.size(); ++i)
          socket.send(zmq::buffer(frames[i].data(), frames[i].size()), zmq::send_flags::sndmore);
        socket.send(zmq::buffer(out), zmq::send_flags::dontwait);
      } catch (const zmq::error_t& e) {
        spdlog::warn("local socket reply: {}", e.what());
      }
    }
  }

  local::Reply fail(const std::string& why) {
    local::Reply r;
    r.ok = false;
    r.error = why;
    return r;
  }

  Result<std::vector<ChunkHash>> keys_of(const local::Request& q) {
    if (!q.by_tokens) return q.hashes;
    return engine.hashes(q.tokens);
  }

  // n staging slots, or none when fewer are free.
  std::optional<std::vector<std::size_t>> take_slots(std::size_t n) {
    if (n > free_slots.size()) return std::nullopt;
    std::vector<std::size_t> out(free_slots.end() - static_cast<std::ptrdiff_t>(n), free_slots.end());
    free_slots.resize(free_slots.size() - n);
    return out;
  }

  std::uint64_t add_hold(Hold h) {
    h.expires = Clock::now() + options.hold_ttl;
    const std::uint64_t id = next_hold++;
    holds.emplace(id, std::move(h));
    return id;
  }

  local::Reply serve(std::span<const std::byte> bytes) {
    Result<local::Request> decoded = local::decode_request(bytes);
    if (!decoded) return fail(decoded.error().message);
    const local::Request& q = *decoded;
    ChunkStore& store = engine.store();
    gpu::ChunkPool& pool = store.pool();

    if (q.op == "info") {
      local::Reply r;
      r.chunk_bytes = pool.page_bytes();
      r.chunk_size = engine.chunk_size();
      r.pages = pool.page_count();
      r.slots = staging ? options.staging_slots : 0;
      r.shm = staging ? staging->shared_name() : "";
      r.location = store.location();
      r.instance = options.instance;
      r.worker_id = options.worker_id;
      return r;
    }
    if (q.op == "commit" || q.op == "abort" || q.op == "release") {
      auto it = holds.find(q.hold);
      if (it == holds.end()) return fail("request.hold: no such hold (finished, or expired after " +
                                         std::to_string(options.hold_ttl.count()) + " ms)");
      if (it->second.writing != (q.op != "release"))
        return fail("request.hold: a " + std::string(it->second.writing ? "reserve" : "lease") +
                    " hold cannot be ended by " + q.op);
      Result<std::size_t> stored = end_hold(it->second, q.op == "commit");
      holds.erase(it);
      if (!stored) return fail(stored.error().message);
      local::Reply r;
      r.count = *stored;
      return r;
    }
    if (q.op == "lookup") {
      if (!q.by_tokens) return fail("request.tokens: lookup takes tokens");
      local::Reply r;
      r.tokens = engine.lookup_tokens(q.tokens);
      return r;
    }
    Result<std::vector<ChunkHash>> keys = keys_of(q);
    if (!keys) return fail("request.tokens: " + keys.error().message);
    if (keys->size() > pool.page_count() && q.op != "contains" && q.op != "hashes")
      return fail("request: " + std::to_string(keys->size()) + " chunks, the pool holds " +
                  std::to_string(pool.page_count()));

    if (q.op == "hashes") {
      local::Reply r;
      r.hashes = std::move(keys).value();
      return r;
    }
    if (q.op == "contains") {
      local::Reply r;
      r.present.reserve(keys->size());
      for (ChunkHash h : *keys) r.present.push_back(store.contains(h));
      return r;
    }
    if (q.op == "put") {
      if (q.data.size() != keys->size() * pool.page_bytes())
        return fail("request.data: " + std::to_string(keys->size()) + " chunks need " +
                    std::to_string(keys->size() * pool.page_bytes()) + " bytes, got " +
                    std::to_string(q.data.size()));
      local::Reply r;
      r.since = q.since ? q.since : store.tick();
      for (std::size_t i = 0; i < keys->size(); ++i) {
        Status s = put_one((*keys)[i], std::span(q.data).subspan(i * pool.page_bytes(), pool.page_bytes()), r.since);
        if (s) {
          ++r.count;
          continue;
        }
        if (!ends_put_quietly(s))
          return fail("chunk " + std::to_string(i) + ": " + s.error().message + " (" + std::to_string(r.count) +
                      " stored before it)");
        spdlog::warn("local put: stored {} of the {} chunks of this request: {}", r.count, keys->size(),
                     s.error().message);
        break;
      }
      return r;
    }
    if (q.op == "get") {
      if (keys->size() * pool.page_bytes() > local::kMaxInlineBytes)
        return fail("request: more than " + std::to_string(local::kMaxInlineBytes >> 20) +
                    " MiB inline; use the shared-memory path (lease)");
      std::vector<Lease> leases = store.lease_leading(*keys);
      local::Reply r;
      r.count = leases.size();
      r.data.resize(leases.size() * pool.page_bytes());
      for (std::size_t i = 0; i < leases.size(); ++i)
        std::memcpy(r.data.data() + i * pool.page_bytes(), pool.page(leases[i].page()), pool.page_bytes());
      return r;
    }
    if (q.op == "reserve" || q.op == "lease") {
      if (!staging) return fail("this node has no shared staging region: use put/get");
      if (holds.size() >= options.max_holds)
        return fail("too many unfinished holds (" + std::to_string(holds.size()) + "); commit or release them");
      if (engine.frozen() && q.op == "reserve") return fail(ChunkStore::kFrozenText);
      Hold h;
      local::Reply r;
      std::vector<Lease> leases;
      std::vector<bool> present;  // reserve: chunks stored already (refreshed: this put's own now)
      std::size_t wanted = 0;
      if (q.op == "lease") {
        leases = store.lease_leading(*keys);
        wanted = leases.size();
      } else {
        r.since = q.since ? q.since : store.tick();
        for (ChunkHash c : *keys) present.push_back(store.refresh(c));
        wanted = static_cast<std::size_t>(std::count(present.begin(), present.end(), false));
      }
      std::optional<std::vector<std::size_t>> slots = take_slots(wanted);
      if (!slots)
        return fail("request: " + std::to_string(wanted) + " chunks need staging slots, " +
                    std::to_string(free_slots.size()) + " of " + std::to_string(options.staging_slots) +
                    " are free (send fewer chunks per request)");
      h.slots = *slots;
      h.writing = q.op == "reserve";
      std::size_t next = 0;
      if (h.writing) {
        h.since = r.since;
        for (std::size_t i = 0; i < keys->size(); ++i) {
          if (present[i]) {
            r.offsets.push_back(-1);
            continue;
          }
          h.writes.emplace_back((*keys)[i], h.slots[next]);
          r.offsets.push_back(slot_offset(h.slots[next++]));
        }
      } else {
        for (const Lease& l : leases) {
          std::memcpy(slot(h.slots[next]), pool.page(l.page()), pool.page_bytes());
          r.offsets.push_back(slot_offset(h.slots[next++]));
        }
        r.count = leases.size();
      }
      r.hold = add_hold(std::move(h));
      return r;
    }
    if (q.op == "retrieve") {
      if (!moves || !locate) return fail("this node has no transfer plane or controller to retrieve with");
      const RetrieveResult got = moves->retrieve_chunks(*keys, locate);
      local::Reply r;
      r.count = got.chunks_local + got.chunks_pulled;
      r.pulled = got.chunks_pulled;
      r.peer = got.peer;
      if (q.by_tokens && r.count > 0)
        r.tokens = keys::chunk_end_token(r.count - 1, q.tokens.size(), engine.chunk_size());
      return r;
    }
    return fail("request.op: unknown operation '" + q.op +
                "' (info, hashes, contains, lookup, put, get, reserve, commit, abort, lease, release, retrieve)");
  }
};

Result<std::unique_ptr<LocalService>> LocalService::start(const LocalServiceOptions& options, Engine& engine,
                                                           PeerMoves* moves, Locate locate) {
  auto impl = std::make_unique<Impl>(options, engine, moves, std::move(locate));
  if (options.staging_slots > 0) {
    if (engine.store().pool().region().kind() == gpu::MemoryKind::kDevice)
      return make_error("local clients of a device pool need the GPU client path; set staging off");
    gpu::RegionOptions ro;
    ro.shared_name = options.staging_name;
    ro.huge_pages = false;  // shmem: the system's setting decides
    Result<gpu::MemoryRegion> region =
        gpu::MemoryRegion::allocate(options.staging_slots * engine.store().pool().page_bytes(), ro);
    if (!region) return make_error("local staging region: " + region.error().message);
    impl->staging.emplace(std::move(region).value());
    for (std::size_t i = options.staging_slots; i-- > 0;) impl->free_slots.push_back(i);
  }
  try {
    impl->socket.set(zmq::sockopt::linger, 0);
    impl->socket.set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(local::kMaxMessageBytes));
    impl->socket.set(zmq::sockopt::sndhwm, 64);
    impl->socket.bind("ipc://" + options.path);
  } catch (const zmq::error_t& e) {
    return make_error("local socket ipc://" + options.path + ": " + e.what());
  }
  // Owner only, like the staging region: chunks are the engine's data.
  chmod(options.path.c_str(), 0600);
  if (struct stat st {}; ::stat(options.path.c_str(), &st) == 0) {
    impl->socket_inode = st.st_ino;
    impl->socket_device = st.st_dev;
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<LocalService>(new LocalService(std::move(impl)));
}

LocalService::LocalService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LocalService::~LocalService() = default;
const std::string& LocalService::path() const { return impl_->options.path; }
std::uint64_t LocalService::requests() const { return impl_->requests; }
std::uint64_t LocalService::errors() const { return impl_->errors; }

}  // namespace kvnode::node
