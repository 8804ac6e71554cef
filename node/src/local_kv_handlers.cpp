// The local socket's KV-path operations: register_kv / unregister_kv (socket thread) and the
// checked store / load job the KV executor runs.
#include <spdlog/spdlog.h>

#include "kvnode/keys/chunk_hash.hpp"
#include "local_handlers.hpp"

namespace kvnode::node::local {

protocol::Reply LocalHandlers::register_kv(ConnectionId from, const protocol::Request& q,
                                           std::vector<UniqueFd> fds, int pid) {
  if (!q.kv_layout)
    return protocol::failure(make_error(ErrorCode::kInvalid, "request.kv_layout: missing"));
  if (q.fds != fds.size())
    return protocol::failure(
        make_error(ErrorCode::kInvalid, "request.fds: " + std::to_string(q.fds) + " declared, " +
                                            std::to_string(fds.size()) + " came with the request"));
  const auto [first, last] = registrations_of(from);
  if (static_cast<std::size_t>(std::distance(first, last)) >= options_.max_kv_registrations)
    return protocol::failure(
        make_error(ErrorCode::kNoRoom, "this connection holds " +
                                           std::to_string(options_.max_kv_registrations) +
                                           " KV registrations already (unregister one first)"));
  // Host memory the node would map (memfds; device memory and an engine's own memory are not
  // mapped here): refused past the cap, before anything is mapped or faulted in.
  std::size_t asked = 0;
  for (const client::WireAllocation& a : q.kv_layout->allocations)
    if (a.kind == client::KvMemoryKind::kHostFd) asked += a.bytes;
  const std::size_t held = mapped_kv_bytes();
  if (asked > options_.max_kv_bytes || held > options_.max_kv_bytes - asked)
    return protocol::failure(make_error(
        ErrorCode::kNoRoom,
        "kv_layout: mapping " + std::to_string(asked >> 20) + " MiB more of engines' host KV (" +
            std::to_string(held >> 20) + " MiB mapped now) would pass this node's cap of " +
            std::to_string(options_.max_kv_bytes >> 20) +
            " MiB (--max-kv-registration-gb; unregister a cache or register a smaller one)"));
  gpu::ChunkPool& pool = engine_.pool();
  KvPoolFacts facts;
  facts.pool_kind = pool.region().kind();
  facts.device = pool.region().device();
  facts.page_bytes = pool.page_bytes();
  facts.chunk_size = engine_.chunk_size();
  Result<std::shared_ptr<KvRegistration>> reg =
      KvRegistration::map(*q.kv_layout, std::move(fds), facts, pid);
  if (!reg) return protocol::failure(reg.error());
  const std::uint64_t id = next_registration_++;
  spdlog::info(
      "local client connection {}: KV cache {} registered ({} layers, {} blocks, {} MiB, "
      "copies by {})",
      from, id, (*reg)->kernel_layout().layers.size(), (*reg)->kernel_layout().num_blocks,
      (*reg)->mapped_bytes() >> 20,
      (*reg)->uses_gpu()     ? "the GPU"
      : (*reg)->engine_pid() ? "process_vm_readv/writev"
                             : "memcpy");
  registrations_.emplace(std::make_pair(from, id), std::move(reg).value());
  protocol::Reply r;
  r.kv = id;
  return r;
}

std::size_t LocalHandlers::mapped_kv_bytes() const {
  std::size_t total = 0;
  for (const auto& [key, reg] : registrations_) total += reg->mapped_host_bytes();
  return total;
}

Result<std::shared_ptr<KvRegistration>> LocalHandlers::unregister_kv(ConnectionId from,
                                                                     std::uint64_t kv) {
  const auto it = registrations_.find({from, kv});
  if (it == registrations_.end())
    return make_error(ErrorCode::kNotFound, "request.kv: no KV registration " + std::to_string(kv) +
                                                " on this connection");
  std::shared_ptr<KvRegistration> reg = std::move(it->second);
  registrations_.erase(it);
  return reg;
}

void LocalHandlers::put_back_kv(ConnectionId from, std::uint64_t kv,
                                std::shared_ptr<KvRegistration> reg) {
  registrations_.emplace(std::make_pair(from, kv), std::move(reg));
}

Result<KvJob> LocalHandlers::kv_job(ConnectionId from, const protocol::Request& q) const {
  const auto it = registrations_.find({from, q.kv});
  if (it == registrations_.end())
    return make_error(ErrorCode::kNotFound, "request.kv: no KV registration " +
                                                std::to_string(q.kv) + " on this connection");
  // A store longer than the pool stores its longest prefix and a load copies what is held, so
  // neither is bounded by the pool; a retrieve across the network is.
  Result<Chunks> chunks = chunks_of(q, /*bounded=*/q.retrieve);
  if (!chunks) return chunks.error();
  KvJob job;
  job.kind = q.op == protocol::LocalOp::kStore ? KvJobKind::kStore : KvJobKind::kLoad;
  job.registration = it->second;
  const std::size_t cs = engine_.chunk_size();
  const std::size_t n = chunks->hashes.size();
  if (chunks->by_tokens) {
    if (q.num_tokens != 0)
      return make_error(ErrorCode::kInvalid, "request.num_tokens: only with hashes");
    job.total_tokens = std::min(chunks->tokens, n * cs);  // a tail too short for a chunk: none
  } else {
    job.total_tokens = q.num_tokens != 0 ? q.num_tokens : n * cs;
  }
  job.hashes = std::move(chunks->hashes);
  job.block_ids = q.block_ids;
  job.retrieve = q.retrieve;
  if (job.retrieve && job.kind == KvJobKind::kStore)
    return make_error(ErrorCode::kInvalid, "request.retrieve: only with load");
  auto event = [](const std::vector<std::byte>& bytes) {
    std::optional<gpu::IpcHandle> h;
    if (bytes.size() == gpu::kIpcHandleBytes) {
      h.emplace();
      std::copy(bytes.begin(), bytes.end(), h->begin());
    }
    return h;
  };
  job.wait_event = event(q.wait_event);
  job.done_event = event(q.done_event);
  if ((job.wait_event || job.done_event) && !job.registration->uses_gpu())
    return make_error(ErrorCode::kInvalid,
                      "request.wait_event/done_event: CUDA events need GPU copies; this "
                      "registration's copies are memcpy (host KV and a host pool)");
  if (Status s = check_job(job, cs); !s) return s.error();
  return job;
}

}  // namespace kvnode::node::local
