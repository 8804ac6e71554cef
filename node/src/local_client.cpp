#include "kvnode/node/local_client.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <zmq.hpp>

#include "local_protocol.hpp"
#include "local_socket_check.hpp"

namespace kvnode::node {

// The daemon's staging region mapped into this process.
class SharedPool {
 public:
  static Result<SharedPool> open(const std::string& name, std::size_t bytes) {
    const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) return make_error("shm_open " + name + ": " + std::strerror(errno));
    struct stat st {};
    void* p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) >= bytes)
      p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int err = errno;
    close(fd);
    if (p == MAP_FAILED)
      return make_error("shared pool " + name + " (" + std::to_string(bytes) + " bytes): " +
                        (static_cast<std::size_t>(st.st_size) < bytes ? "smaller than the daemon says"
                                                                      : std::strerror(err)));
    return SharedPool(static_cast<std::byte*>(p), bytes);
  }
  SharedPool(SharedPool&& o) noexcept : base_(std::exchange(o.base_, nullptr)), bytes_(o.bytes_) {}
  SharedPool& operator=(SharedPool&&) = delete;
  ~SharedPool() {
    if (base_) munmap(base_, bytes_);
  }
  // The page at a daemon-given offset, checked against the mapping.
  std::byte* at(std::int64_t offset, std::size_t n) const {
    if (offset < 0 || static_cast<std::size_t>(offset) > bytes_ || n > bytes_ - static_cast<std::size_t>(offset))
      return nullptr;
    return base_ + offset;
  }

 private:
  SharedPool(std::byte* base, std::size_t bytes) : base_(base), bytes_(bytes) {}
  std::byte* base_;
  std::size_t bytes_;
};

struct LocalClient::Impl {
  std::string path;
  LocalClientOptions options;
  zmq::context_t context{1};
  std::optional<zmq::socket_t> socket;
  NodeInfo info;
  std::optional<SharedPool> pool;
  std::size_t slots = 0;  // chunks per shared-memory round trip

  void open_socket() {
    socket.emplace(context, zmq::socket_type::req);
    socket->set(zmq::sockopt::linger, 0);
    socket->set(zmq::sockopt::rcvtimeo, static_cast<int>(options.timeout.count()));
    socket->set(zmq::sockopt::sndtimeo, static_cast<int>(options.timeout.count()));
    socket->connect("ipc://" + path);
  }

  // One request, one reply. A timeout leaves a REQ socket stuck: it is rebuilt for the next call.
  Result<local::Reply> call(const local::Request& q) {
    try {
      const std::vector<std::byte> bytes = local::encode(q);
      if (!socket->send(zmq::buffer(bytes), zmq::send_flags::none)) {
        open_socket();
        return make_error("kvnode at " + path + " did not take the request in time");
      }
      zmq::message_t reply;
      if (!socket->recv(reply, zmq::recv_flags::none)) {
        open_socket();
        return make_error("kvnode at " + path + " did not answer '" + q.op + "' within " +
                          std::to_string(options.timeout.count()) + " ms");
      }
      Result<local::Reply> r = local::decode_reply(std::span(static_cast<const std::byte*>(reply.data()), reply.size()));
      if (!r) return r.error();
      if (!r->ok) return make_error(r->error);
      return r;
    } catch (const zmq::error_t& e) {
      return make_error("local socket " + path + ": " + e.what());
    }
  }

  local::Request request(const char* op, const ChunkKeys& keys) {
    local::Request q;
    q.op = op;
    q.by_tokens = keys.tokens;
    (keys.tokens ? q.tokens : q.hashes) = keys.values;
    return q;
  }

  local::Request finish(const char* op, std::uint64_t hold) {
    local::Request q;
    q.op = op;
    q.hold = hold;
    return q;
  }

  // Put and get go by chunk hash: tokens are hashed by the daemon first, so rounds split cleanly.
  Result<std::vector<std::int64_t>> hashes_of(const ChunkKeys& keys) {
    if (!keys.tokens) return keys.values;
    Result<local::Reply> r = call(request("hashes", keys));
    if (!r) return r.error();
    return std::move(r->hashes);
  }

  // Chunks per request: the staging slots, or what fits a quarter of an inline message; never
  // more than the pool holds (the daemon refuses such a request whole).
  std::size_t round_chunks() const {
    const std::size_t n = pool ? slots : std::max<std::size_t>(1, local::kMaxInlineBytes / 4 / info.chunk_bytes);
    return std::max<std::size_t>(1, std::min(n, info.pages));
  }
};

Result<std::unique_ptr<LocalClient>> LocalClient::connect(const std::string& socket_path,
                                                          LocalClientOptions options) {
  if (Status reachable = check_local_socket(socket_path); !reachable) return reachable.error();
  auto impl = std::make_unique<Impl>();
  impl->path = socket_path;
  impl->options = options;
  try {
    impl->open_socket();
  } catch (const zmq::error_t& e) {
    return make_error("local socket " + socket_path + ": " + e.what());
  }
  local::Request q;
  q.op = "info";
  Result<local::Reply> r = impl->call(q);
  if (!r) return r.error();
  if (r->chunk_bytes == 0 || r->pages == 0 || (r->slots != 0 && r->chunk_bytes > SIZE_MAX / r->slots))
    return make_error("kvnode at " + socket_path + " answered an inconsistent pool geometry");
  impl->info = NodeInfo{r->chunk_bytes, r->chunk_size, r->pages, r->shm, r->location, r->instance, r->worker_id};
  if (options.use_shared_memory && !r->shm.empty() && r->slots > 0) {
    impl->slots = r->slots;
    Result<SharedPool> pool = SharedPool::open(r->shm, r->slots * r->chunk_bytes);
    if (!pool) return make_error("kvnode at " + socket_path + ": " + pool.error().message +
                                 " (use_shared_memory=false sends bytes inline)");
    impl->pool.emplace(std::move(pool).value());
  }
  return std::unique_ptr<LocalClient>(new LocalClient(std::move(impl)));
}

LocalClient::LocalClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LocalClient::~LocalClient() = default;
const NodeInfo& LocalClient::info() const { return impl_->info; }
bool LocalClient::shared_memory() const { return impl_->pool.has_value(); }

Result<std::size_t> LocalClient::put(const ChunkKeys& keys, std::span<const std::byte> data, PutSeries* series) {
  Impl& m = *impl_;
  const std::size_t chunk = m.info.chunk_bytes;
  Result<std::vector<std::int64_t>> hashed = m.hashes_of(keys);
  if (!hashed) return hashed.error();
  const std::vector<std::int64_t>& all = *hashed;
  if (data.size() != all.size() * chunk)
    return make_error(std::to_string(all.size()) + " chunks need " + std::to_string(all.size() * chunk) +
                      " bytes, got " + std::to_string(data.size()));
  std::size_t stored = 0;
  // Every round of this put evicts only chunks stored before its first (the node's tick then).
  PutSeries own;
  PutSeries& put_series = series ? *series : own;
  const std::size_t round = m.round_chunks();
  for (std::size_t first = 0; first < all.size(); first += round) {
    const std::size_t n = std::min(round, all.size() - first);
    local::Request q;
    q.hashes.assign(all.begin() + static_cast<std::ptrdiff_t>(first), all.begin() + static_cast<std::ptrdiff_t>(first + n));
    q.since = put_series.since;
    const std::span<const std::byte> bytes = data.subspan(first * chunk, n * chunk);
    if (!m.pool) {
      q.op = "put";
      q.data.assign(bytes.begin(), bytes.end());
      Result<local::Reply> r = m.call(q);
      if (!r) return make_error(r.error().message + " (" + std::to_string(stored) + " chunks stored before)");
      if (put_series.since == 0) put_series.since = r->since;
      stored += std::min<std::size_t>(r->count, n);
      if (r->count < n) break;  // the node is full: the stored prefix ends here
      continue;
    }
    q.op = "reserve";
    Result<local::Reply> r = m.call(q);
    if (!r) return make_error(r.error().message + " (" + std::to_string(stored) + " chunks stored before)");
    if (r->offsets.size() != n) {
      (void)m.call(m.finish("abort", r->hold));
      return make_error("the daemon answered " + std::to_string(r->offsets.size()) + " slots for " + std::to_string(n) + " chunks");
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (r->offsets[i] < 0) continue;  // stored already
      std::byte* slot = m.pool->at(r->offsets[i], chunk);
      if (!slot) {
        (void)m.call(m.finish("abort", r->hold));
        return make_error("the daemon answered a slot outside its staging region");
      }
      std::memcpy(slot, bytes.data() + i * chunk, chunk);
    }
    if (put_series.since == 0) put_series.since = r->since;
    Result<local::Reply> done = m.call(m.finish("commit", r->hold));
    if (!done) return make_error(done.error().message + " (" + std::to_string(stored) + " chunks stored before)");
    // The daemon stores the writes in order until one finds no room: the prefix ends there.
    std::size_t writes = 0, prefix = 0;
    for (; prefix < n; ++prefix) {
      if (r->offsets[prefix] >= 0 && writes++ >= done->count) break;
    }
    stored += prefix;
    if (prefix < n) break;
  }
  return stored;
}

Result<std::size_t> LocalClient::get(const ChunkKeys& keys, std::span<std::byte> out) {
  Impl& m = *impl_;
  const std::size_t chunk = m.info.chunk_bytes;
  Result<std::vector<std::int64_t>> hashed = m.hashes_of(keys);
  if (!hashed) return hashed.error();
  const std::vector<std::int64_t>& all = *hashed;
  const std::size_t fits = std::min(all.size(), out.size() / chunk);
  std::size_t read = 0;
  const std::size_t round = m.round_chunks();
  while (read < fits) {
    const std::size_t n = std::min(round, fits - read);
    local::Request q;
    q.op = m.pool ? "lease" : "get";
    q.hashes.assign(all.begin() + static_cast<std::ptrdiff_t>(read), all.begin() + static_cast<std::ptrdiff_t>(read + n));
    Result<local::Reply> r = m.call(q);
    if (!r) return r.error();
    std::size_t got = 0;
    if (!m.pool) {
      if (r->data.size() != r->count * chunk || r->count > n) return make_error("the daemon answered a short chunk");
      if (!r->data.empty())  // an empty answer may have no buffer: memcpy from null is UB
        std::memcpy(out.data() + read * chunk, r->data.data(), r->data.size());
      got = r->count;
    } else {
      std::string error;
      if (r->offsets.size() > n) error = "the daemon answered more chunks than asked";
      for (std::size_t i = 0; error.empty() && i < r->offsets.size(); ++i) {
        const std::byte* slot = m.pool->at(r->offsets[i], chunk);
        if (!slot) {
          error = "the daemon answered a slot outside its staging region";
        } else {
          std::memcpy(out.data() + (read + i) * chunk, slot, chunk);
        }
      }
      Result<local::Reply> done = m.call(m.finish("release", r->hold));
      if (!error.empty()) return make_error(error);
      if (!done) return done.error();
      got = r->offsets.size();
    }
    read += got;
    if (got < n) break;  // the stored prefix ends here
  }
  if (read == fits && fits < all.size()) {
    Result<std::vector<bool>> more = contains(ChunkKeys::of_hashes({all[fits]}));
    if (more && !more->empty() && (*more)[0])
      return make_error("the buffer holds " + std::to_string(fits) + " chunks; more are stored");
  }
  return read;
}

Result<std::vector<bool>> LocalClient::contains(const ChunkKeys& keys) {
  Result<local::Reply> r = impl_->call(impl_->request("contains", keys));
  if (!r) return r.error();
  return std::move(r->present);
}

Result<std::vector<std::int64_t>> LocalClient::hashes(const std::vector<std::int64_t>& tokens) {
  return impl_->hashes_of(ChunkKeys::of_tokens(tokens));
}

Result<std::size_t> LocalClient::lookup(const std::vector<std::int64_t>& tokens) {
  Result<local::Reply> r = impl_->call(impl_->request("lookup", ChunkKeys::of_tokens(tokens)));
  if (!r) return r.error();
  return r->tokens;
}

Result<RetrieveReply> LocalClient::retrieve(const ChunkKeys& keys) {
  Result<local::Reply> r = impl_->call(impl_->request("retrieve", keys));
  if (!r) return r.error();
  return RetrieveReply{r->count, r->pulled, r->tokens, r->peer};
}

}  // namespace kvnode::node
