// Session, the receiving half: the active-message handlers UCX calls inside ucp_worker_progress
// (they check and record what came, and never send; progress() answers).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "session.hpp"

namespace kvnode::transfer {
namespace {

bool rendezvous(const ucp_am_recv_param_t* p) {
  return p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
}

}  // namespace

// ---- Active-message handlers (inside ucp_worker_progress: record, never send) -----------------

ucs_status_t Session::on_pull_request(void* arg, const void* header, std::size_t header_length,
                                      void* data, std::size_t length,
                                      const ucp_am_recv_param_t* p) {
  auto* s = static_cast<Session*>(arg);
  const auto h = wire::read<wire::PullRequest>(header, header_length);
  if (!h || rendezvous(p) || h->count == 0 || h->count > wire::kMaxRunsPerMessage ||
      length != h->count * sizeof(wire::RunRequest)) {
    ++s->serve_.rejected;
    spdlog::warn("malformed pull request from {} dropped", s->peer_);
    return UCS_OK;
  }
  Deferred d(OpKind::kServeSend);
  d.transfer = h->transfer;
  d.runs.resize(h->count);
  std::memcpy(d.runs.data(), data, length);
  s->deferred_.push_back(std::move(d));
  return UCS_OK;
}

ucs_status_t Session::on_pull_data(void* arg, const void* header, std::size_t header_length,
                                   void* data, std::size_t length, const ucp_am_recv_param_t* p) {
  auto* s = static_cast<Session*>(arg);
  const auto h = wire::read<wire::RunHeader>(header, header_length);
  Xfer* x = h ? s->find(h->transfer) : nullptr;
  // Only a run we asked for, still open, of exactly its size: never trust the peer's numbers.
  if (!x || !x->pull || h->run >= x->run_state.size() || x->run_state[h->run] != 0) return UCS_OK;
  const Run& run = x->plan.runs[h->run];
  if (length != s->span_bytes(run.count)) {
    x->fail_run(h->run, Failure::kRejected,
                "the peer sent " + std::to_string(length) + " bytes for a run of " +
                    std::to_string(s->span_bytes(run.count)));
    return UCS_OK;
  }
  if (rendezvous(p)) {
    Deferred d(OpKind::kPullRecv);
    d.desc = data;
    d.length = length;
    d.run = *h;
    s->deferred_.push_back(std::move(d));
    return UCS_INPROGRESS;  // keeps `data` for ucp_am_recv_data_nbx
  }
  if (s->staging_) {
    s->start_copy(Copy{0, CopyKind::kPullLanded, x->id, h->run, std::nullopt, {}, {}},
                  s->pool_.page(run.local), data, length);
    return UCS_OK;
  }
  std::memcpy(s->pool_.page(run.local), data, length);
  x->finish_run(h->run);
  return UCS_OK;
}

ucs_status_t Session::on_run_answer(void* arg, const void* header, std::size_t header_length,
                                    void* data, std::size_t length, const ucp_am_recv_param_t* p) {
  auto* s = static_cast<Session*>(arg);
  const auto h = wire::read<wire::RunHeader>(header, header_length);
  Xfer* x = h ? s->find(h->transfer) : nullptr;
  if (!x || h->run >= x->run_state.size()) return UCS_OK;
  if (h->code == wire::kOk) {
    if (!x->pull) x->finish_run(h->run);  // a pull run ends only with its bytes
    return UCS_OK;
  }
  std::string why = "the peer refused";
  if (!rendezvous(p) && length > 0)
    why += ": " + std::string(static_cast<const char*>(data), std::min<std::size_t>(length, 512));
  spdlog::warn("transfer {} to {}: run {} {}", x->id, s->peer_, h->run, why);
  x->fail_run(h->run, Failure::kRejected, why);
  return UCS_OK;
}

ucs_status_t Session::on_push_data(void* arg, const void* header, std::size_t header_length,
                                   void* data, std::size_t length, const ucp_am_recv_param_t* p) {
  auto* s = static_cast<Session*>(arg);
  const auto h = wire::read<wire::PushHeader>(header, header_length);
  if (!h) {
    ++s->serve_.rejected;
    spdlog::warn("malformed push from {} dropped", s->peer_);
    return UCS_OK;
  }
  const wire::RunRequest& t = h->target;
  const bool in_pool =
      t.count > 0 && t.first < s->pool_.pages && t.count <= s->pool_.pages - t.first;
  if (!in_pool || length != s->span_bytes(t.count) || (s->staging_ && t.count != 1)) {
    ++s->serve_.rejected;
    spdlog::warn("push {} from {} rejected: pages {}+{} ({} bytes) do not fit this pool of {} x {}",
                 h->transfer, s->peer_, t.first, t.count, length, s->pool_.pages,
                 s->pool_.page_bytes);
    Deferred d(OpKind::kAck);
    d.run = wire::RunHeader{h->transfer, t.run, in_pool ? wire::kBadLength : wire::kOutOfPool};
    s->deferred_.push_back(std::move(d));
    return UCS_OK;  // drops the data
  }
  if (rendezvous(p)) {
    Deferred d(OpKind::kServeRecv);
    d.desc = data;
    d.length = length;
    d.push = *h;
    s->deferred_.push_back(std::move(d));
    return UCS_INPROGRESS;
  }
  if (s->staging_) {
    s->start_copy(
        Copy{0, CopyKind::kServeLanded, 0, 0, std::nullopt, {h->transfer, t.run, wire::kOk}, t},
        s->pool_.page(t.first), data, length);
    return UCS_OK;
  }
  std::memcpy(s->pool_.page(t.first), data, length);
  s->serve_.bytes += length;
  std::vector<gpu::PageId> pages(t.count);
  for (std::uint32_t i = 0; i < t.count; ++i) pages[i] = t.first + i;
  s->written_.push_back(std::move(pages));
  Deferred d(OpKind::kAck);
  d.run = wire::RunHeader{h->transfer, t.run, wire::kOk};
  s->deferred_.push_back(std::move(d));
  return UCS_OK;
}

}  // namespace kvnode::transfer
