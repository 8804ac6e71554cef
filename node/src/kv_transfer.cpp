#include "kv_transfer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "kvnode/client/kv_runs.hpp"
#include "kvnode/gpu/cuda_ipc.hpp"
#include "kvnode/gpu/stream_copy.hpp"

namespace kvnode::node::local {
namespace {

// Tokens [first, first + count) of chunk i.
struct ChunkSpan {
  std::size_t first = 0;
  std::size_t count = 0;
};
ChunkSpan chunk_span(std::size_t i, std::size_t chunk_size, std::size_t total) {
  const std::size_t first = i * chunk_size;
  return {first, std::min(chunk_size, total - first)};
}

std::size_t tokens_of(std::size_t chunks, std::size_t chunk_size, std::size_t total) {
  return std::min(total, chunks * chunk_size);
}

using Direction = KvJobKind;

// The copies of chunk i between the cache and `page` (an address the copier can use).
// check_job() and the registration made every run valid, so an error here is a bug; it still
// fails the request: a chunk whose copies were not all planned must never be committed.
Status add_segments(const client::KvLayout& layout, const KvJob& job, std::size_t i,
                    std::size_t chunk_size, std::byte* page, Direction d,
                    std::vector<gpu::CopySegment>& out) {
  const ChunkSpan s = chunk_span(i, chunk_size, job.total_tokens);
  const Result<std::size_t> bytes = client::chunk_bytes(layout, s.count);
  if (!bytes) return wrap_error("kv copy plan: ", bytes.error());
  const Status st = client::for_each_run(
      layout, job.block_ids, s.first, s.count, *bytes, [&](const client::KvRun& r) {
        if (d == Direction::kStore) {
          out.push_back({r.cache, page + r.chunk_offset, r.bytes});
        } else {
          out.push_back({page + r.chunk_offset, r.cache, r.bytes});
        }
      });
  if (!st) return Error{ErrorCode::kInternal, "kv copy plan: " + st.error().message};
  return {};
}

// Host KV copied by this thread: each run where it is found (kv_runs.hpp), no segment planned.
// An HND cache has a run per head row, 256 bytes: planning them as segments took 30 % of a
// store. `stream`: the request is large enough to stream its stores (stream_fence() after).
template <Direction kDirection>
Status copy_host_chunk(const client::KvLayout& layout, const KvJob& job, std::size_t i,
                       std::size_t chunk_size, std::byte* page, bool stream) {
  const ChunkSpan s = chunk_span(i, chunk_size, job.total_tokens);
  const Result<std::size_t> bytes = client::chunk_bytes(layout, s.count);
  if (!bytes) return wrap_error("kv copy: ", bytes.error());
  const Status st = client::visit_runs(
      layout, job.block_ids, s.first, s.count, *bytes, [&](const client::KvRun& r) {
        std::byte* dst = kDirection == Direction::kStore ? page + r.chunk_offset : r.cache;
        const std::byte* src = kDirection == Direction::kStore ? r.cache : page + r.chunk_offset;
        if (stream)
          gpu::stream_copy(dst, src, r.bytes);
        else
          std::memcpy(dst, src, r.bytes);
      });
  if (!st) return Error{ErrorCode::kInternal, "kv copy: " + st.error().message};
  return {};
}

// Whether this job's copies run inline (host KV and pool, memcpy, no CUDA events to honour).
bool copies_inline(const KvRegistration& reg, const KvJob& job) {
  return !reg.uses_gpu() && reg.engine_pid() == 0 && !job.wait_event && !job.done_event;
}

}  // namespace

Status check_job(const KvJob& job, std::size_t chunk_size) {
  const std::size_t n = job.hashes.size();
  if (n == 0) return {};
  if (job.total_tokens <= (n - 1) * chunk_size || job.total_tokens > n * chunk_size)
    return make_error(ErrorCode::kInvalid,
                      "request.num_tokens: " + std::to_string(job.total_tokens) + " tokens for " +
                          std::to_string(n) + " chunks of " + std::to_string(chunk_size));
  const client::KvLayout& l = job.registration->kernel_layout();
  const std::size_t blocks = (job.total_tokens + l.block_size - 1) / l.block_size;
  if (job.block_ids.size() < blocks)
    return make_error(ErrorCode::kInvalid,
                      "request.block_ids: " + std::to_string(job.block_ids.size()) + " blocks of " +
                          std::to_string(l.block_size) + " tokens, the chunks cover " +
                          std::to_string(job.total_tokens) + " tokens");
  for (std::size_t i = 0; i < blocks; ++i)
    if (job.block_ids[i] >= l.num_blocks)
      return make_error(ErrorCode::kInvalid, "request.block_ids[" + std::to_string(i) +
                                                 "]: " + std::to_string(job.block_ids[i]) +
                                                 " is out of range (num_blocks " +
                                                 std::to_string(l.num_blocks) + ")");
  return {};
}

KvTransfers::KvTransfers(Engine& engine, PeerMoves* moves, Locate locate)
    : engine_(engine),
      moves_(moves),
      locate_(std::move(locate)),
      host_copier_(gpu::make_host_segment_copier()) {}

KvTransfers::~KvTransfers() = default;

Result<gpu::SegmentCopier*> KvTransfers::copier_for(const KvRegistration& r, bool store) {
  if (r.engine_pid() != 0) return r.process_copier(store);
  if (!r.uses_gpu()) return host_copier_.get();
  if (!cuda_copier_) {
    Result<std::unique_ptr<gpu::SegmentCopier>> c =
        gpu::make_cuda_segment_copier(engine_.pool().region().device());
    if (!c) return wrap_error("the GPU copy kernel: ", c.error());
    cuda_copier_ = std::move(c).value();
  }
  return cuda_copier_.get();
}

Result<std::byte*> KvTransfers::kernel_page(gpu::PageId page) {
  gpu::ChunkPool& pool = engine_.pool();
  if (pool.region().kind() != gpu::MemoryKind::kPinnedHost) return pool.page(page);
  if (!pool_kernel_base_) {
    Result<std::byte*> base = gpu::device_pointer_of_pinned(pool.region().data());
    if (!base) return base.error();
    pool_kernel_base_ = *base;
  }
  return pool_kernel_base_ + (pool.page(page) - pool.region().data());
}

Status KvTransfers::copy(gpu::SegmentCopier& copier, const KvJob& job,
                         const std::vector<gpu::CopySegment>& segments) {
  if (job.wait_event)
    if (Status s = copier.wait(*job.wait_event); !s) return wrap_error("wait_event: ", s.error());
  if (Status s = copier.copy(segments); !s) return s;
  if (job.done_event)
    if (Status s = copier.record(*job.done_event); !s) return wrap_error("done_event: ", s.error());
  return {};
}

Result<KvOutcome> KvTransfers::run(const KvJob& job,
                                   const std::function<void(const KvOutcome&)>& queued) {
  return job.kind == KvJobKind::kStore ? store(job, queued) : load(job, queued);
}

Result<KvOutcome> KvTransfers::store(const KvJob& job,
                                     const std::function<void(const KvOutcome&)>& queued) {
  const KvRegistration& reg = *job.registration;
  Result<gpu::SegmentCopier*> copier = copier_for(reg, true);
  if (!copier) return copier.error();
  const client::KvLayout& layout = reg.uses_gpu() ? reg.kernel_layout() : reg.host_layout();
  const std::size_t cs = engine_.chunk_size();
  const std::uint64_t since = engine_.tick();  // evict only what was stored before this store
  std::vector<gpu::CopySegment> segments;
  std::vector<std::pair<std::size_t, ChunkHash>> written;  // (index, chunk) reserved, in order
  std::size_t planned = 0;  // leading chunks stored already or being written
  Status status;            // ok until something fails
  const bool here = copies_inline(reg, job);
  const bool stream = job.hashes.size() * engine_.pool().page_bytes() >= gpu::kStreamCopyBytes;
  for (; planned < job.hashes.size(); ++planned) {
    const ChunkHash h = job.hashes[planned];
    if (engine_.refresh(h)) continue;  // stored already: kept, and this store's own now
    Result<gpu::PageId> page = engine_.reserve(h, since);
    if (!page) {
      if (page.error().code == ErrorCode::kFrozen) status = page.error();
      break;  // no room (or another writer has it): the stored prefix ends here
    }
    Result<std::byte*> at = reg.uses_gpu() ? kernel_page(*page) : engine_.pool().page(*page);
    if (!at) {
      engine_.abort(h);
      status = at.error();
      break;
    }
    written.emplace_back(planned, h);
    status = here ? copy_host_chunk<Direction::kStore>(layout, job, planned, cs, *at, stream)
                  : add_segments(layout, job, planned, cs, *at, Direction::kStore, segments);
    if (!status) break;  // aborted with the others below
  }
  if (here && stream) gpu::stream_fence();
  if (status && !here) status = copy(**copier, job, segments);
  if (status && job.done_event) queued({planned, tokens_of(planned, cs, job.total_tokens), 0, ""});
  if (Status landed = (*copier)->synchronize(); status && !landed) status = landed;
  if (!status) {
    // Copies that may still run (they never landed) keep their pages: reserved for ever rather
    // than handed to another chunk under a kernel still writing them.
    if (status.error().code != ErrorCode::kDeadline)
      for (const auto& [index, h] : written) engine_.abort(h);
    return status.error();
  }
  // Committed in order once whole. A commit refused (a full sync froze the store meanwhile:
  // the store gave that page back) ends the stored prefix there; the later writes are dropped.
  std::size_t stored = planned;
  for (std::size_t w = 0; w < written.size(); ++w) {
    if (Status c = engine_.commit(written[w].second); c)
      continue;
    else
      status = c;
    stored = written[w].first;
    for (std::size_t rest = w + 1; rest < written.size(); ++rest)
      engine_.abort(written[rest].second);
    break;
  }
  if (!status)
    return Error{status.error().code, status.error().message + " (" + std::to_string(stored) +
                                          " chunks stored before it)"};
  return KvOutcome{stored, tokens_of(stored, cs, job.total_tokens), 0, ""};
}

Result<KvOutcome> KvTransfers::load(const KvJob& job,
                                    const std::function<void(const KvOutcome&)>& queued) {
  const KvRegistration& reg = *job.registration;
  Result<gpu::SegmentCopier*> copier = copier_for(reg, false);
  if (!copier) return copier.error();
  KvOutcome out;
  if (job.retrieve && moves_ && locate_) {
    const RetrieveResult got = moves_->retrieve_chunks(job.hashes, locate_);
    out.pulled = got.chunks_pulled;
    out.peer = got.peer;
    if (!got.error.empty()) spdlog::info("load: retrieve from peers: {}", got.error);
  }
  const client::KvLayout& layout = reg.uses_gpu() ? reg.kernel_layout() : reg.host_layout();
  const std::size_t cs = engine_.chunk_size();
  std::vector<Lease> leases = engine_.lease_leading(job.hashes);
  std::vector<gpu::CopySegment> segments;
  const bool here = copies_inline(reg, job);
  const bool stream = leases.size() * engine_.pool().page_bytes() >= gpu::kStreamCopyBytes;
  for (std::size_t i = 0; i < leases.size(); ++i) {
    Result<std::byte*> at =
        reg.uses_gpu() ? kernel_page(leases[i].page()) : engine_.pool().page(leases[i].page());
    if (!at) return at.error();
    if (Status st = here ? copy_host_chunk<Direction::kLoad>(layout, job, i, cs, *at, stream)
                         : add_segments(layout, job, i, cs, *at, Direction::kLoad, segments);
        !st)
      return st.error();
  }
  if (here && stream) gpu::stream_fence();
  out.chunks = leases.size();
  out.tokens = tokens_of(out.chunks, cs, job.total_tokens);
  Status s = here ? Status{} : copy(**copier, job, segments);
  if (s && job.done_event) queued(out);
  if (Status done = (*copier)->synchronize(); !done && s) s = done;
  if (!s) {
    // Copies that never landed may still read these pages: they stay leased for ever.
    if (s.error().code == ErrorCode::kDeadline)
      for (Lease& l : leases) quarantine_.push_back(std::move(l));
    return s.error();
  }
  return out;  // the leases end here, after the copies landed
}

}  // namespace kvnode::node::local
