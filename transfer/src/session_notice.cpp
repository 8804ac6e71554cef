// Session, the notice half: after one-sided RMA the peer's plane saw nothing, so the initiator
// tells it which of its pages were written (a push: its node marks the chunks present) or read
// (a pull: its served-bytes counter). Each notice names page runs, checked against the pool.
#include <spdlog/spdlog.h>

#include <cstring>

#include "session.hpp"

namespace kvnode::transfer {

void Session::notify(unsigned am_id, Xfer& x) {
  if (x.notified) return;
  std::vector<wire::RunRequest> done;
  for (std::uint32_t r = 0; r < x.run_state.size(); ++r)
    if (x.run_state[r] == 1) done.push_back({r, x.plan.runs[r].remote, x.plan.runs[r].count});
  x.notified = true;
  for (std::size_t start = 0; start < done.size(); start += wire::kMaxRunsPerMessage) {
    const std::size_t n = std::min<std::size_t>(wire::kMaxRunsPerMessage, done.size() - start);
    Op& note = ops_.emplace_back(Op(OpKind::kNotify, 0, 0));
    note.pull = wire::PullRequest{x.id, static_cast<std::uint32_t>(n)};
    note.runs.assign(done.begin() + static_cast<std::ptrdiff_t>(start),
                     done.begin() + static_cast<std::ptrdiff_t>(start + n));
    ucp_request_param_t param{};
    settle(ucp_am_send_nbx(endpoint_->get(), am_id, &note.pull, sizeof(note.pull), note.runs.data(),
                           note.runs.size() * sizeof(wire::RunRequest), &param));
  }
}

ucs_status_t Session::noticed(bool written, const void* header, std::size_t header_length,
                              const void* data, std::size_t length, const ucp_am_recv_param_t* p) {
  // Only the side that serves its pool hears notices: an initiator's pages are its own business,
  // and a peer must not inflate our served bytes or mark our chunks through a session we opened.
  const auto h = wire::read<wire::PullRequest>(header, header_length);
  if (role_ != Role::kAcceptor || !h || (p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ||
      h->count > wire::kMaxRunsPerMessage || length != h->count * sizeof(wire::RunRequest)) {
    ++serve_.rejected;
    return UCS_OK;
  }
  std::vector<wire::RunRequest> runs(h->count);
  if (length) std::memcpy(runs.data(), data, length);
  std::vector<gpu::PageId> pages;
  for (const wire::RunRequest& r : runs) {
    if (r.count == 0 || r.first >= pool_.pages || r.count > pool_.pages - r.first) {
      ++serve_.rejected;
      spdlog::warn("{} notice from {} names pages {}+{} outside the pool; ignored",
                   written ? "write" : "read", peer_, r.first, r.count);
      continue;
    }
    serve_.bytes += span_bytes(r.count);
    if (written)
      for (std::uint32_t i = 0; i < r.count; ++i) pages.push_back(r.first + i);
  }
  if (!pages.empty()) written_.push_back(std::move(pages));
  return UCS_OK;
}

ucs_status_t Session::on_written(void* arg, const void* header, std::size_t header_length,
                                 void* data, std::size_t length, const ucp_am_recv_param_t* p) {
  return static_cast<Session*>(arg)->noticed(true, header, header_length, data, length, p);
}

ucs_status_t Session::on_read(void* arg, const void* header, std::size_t header_length, void* data,
                              std::size_t length, const ucp_am_recv_param_t* p) {
  return static_cast<Session*>(arg)->noticed(false, header, header_length, data, length, p);
}

}  // namespace kvnode::transfer
