// AcceptorSession: the peer's requests against our pool. The handlers run inside
// ucp_worker_progress and only check and record (a rendezvous or a reply waits in deferred_);
// serve() and completed() do the sending, from progress().
#include "session_acceptor.hpp"

#include <spdlog/spdlog.h>

#include <cstring>

namespace kvnode::transfer {

Result<std::unique_ptr<AcceptorSession>> AcceptorSession::create(const SessionSetup& setup,
                                                                 LinkId link) {
  Result<ucx::Worker> worker = ucx::Worker::create(*setup.context);
  if (!worker) return worker.error();
  std::unique_ptr<AcceptorSession> s(new AcceptorSession(setup, std::move(worker).value(), link));
  const Status started =
      s->start({{am::kPullRequest, &AcceptorSession::on_pull_request},
                {am::kPushData, &AcceptorSession::on_push_data},
                {am::kWritten, &AcceptorSession::on_written},
                {am::kRead, &AcceptorSession::on_read}},
               s.get(), {am::kPullData, am::kPullReject, am::kPushAck, am::kAnswer});
  if (!started) return started.error();
  return s;
}

void AcceptorSession::wrote(std::uint32_t first, std::uint32_t count) {
  std::vector<gpu::PageId> pages(count);
  for (std::uint32_t i = 0; i < count; ++i) pages[i] = first + i;
  written_.push_back(std::move(pages));
}

void AcceptorSession::send_run_header(unsigned am_id, const am::RunHeader& h, std::string text) {
  if (!endpoint_) return;
  Op& op = ops_.emplace_back(Op(OpKind::kAck, 0, 0));
  op.run_header = h;
  op.text = std::move(text);
  ucp_request_param_t param{};
  settle(ucp_am_send_nbx(endpoint_->get(), am_id, &op.run_header, sizeof(op.run_header),
                         op.text.data(), op.text.size(), &param));
}

// ---- Serving ----------------------------------------------------------------------------------

void AcceptorSession::serve(Deferred& d) {
  ucp_request_param_t param{};
  switch (d.kind) {
    case OpKind::kServeSend:  // a peer's pull request: send each run back, or say why not
      for (const am::RunRequest& r : d.runs) {
        if (!in_pool(r.first, r.count)) {
          ++serve_.rejected;
          const std::string why = "pages " + std::to_string(r.first) + "+" +
                                  std::to_string(r.count) + " are outside this pool of " +
                                  std::to_string(pool_.pages);
          spdlog::warn("pull request {} from {} rejected: {}", d.transfer, peer_, why);
          send_run_header(am::kPullReject, {d.transfer, r.run, am::RunCode::kOutOfPool}, why);
          continue;
        }
        if (staging_) {  // one page per run, through a slot (landed(kServeStaged) sends it)
          if (r.count != 1) {
            ++serve_.rejected;
            send_run_header(am::kPullReject, {d.transfer, r.run, am::RunCode::kBadLength},
                            "this node stages chunks through host memory: one page per run");
            continue;
          }
          Deferred stage(OpKind::kServeStage);
          stage.transfer = d.transfer;
          stage.runs = {r};
          stalled_.push_back(std::move(stage));
          continue;
        }
        Op& op = ops_.emplace_back(Op(OpKind::kServeSend, 0, 0));
        op.run_header = am::RunHeader{d.transfer, r.run, am::RunCode::kOk};
        op.runs = {r};
        settle(ucp_am_send_nbx(endpoint_->get(), am::kPullData, &op.run_header,
                               sizeof(op.run_header), pool_.page(r.first), span_bytes(r.count),
                               &param));
      }
      break;
    case OpKind::kServeRecv: {  // a rendezvous carrying a run pushed into our pool (checked)
      Op op(OpKind::kServeRecv);
      op.push = d.push;
      op.runs = {d.push.target};
      void* desc = std::exchange(d.desc, nullptr);
      std::byte* into = pool_.page(d.push.target.first);
      if (staging_) {
        op.slot = take_slot();
        into = slot_bytes(*op.slot);
      }
      track(ucp_am_recv_data_nbx(worker().get(), desc, into, d.length, &param), std::move(op));
      break;
    }
    case OpKind::kServeStage: {  // a peer's pull, staged: page -> slot, then sent (landed)
      const am::RunRequest r = d.runs.at(0);
      const gpu::PageId slot = *take_slot();
      const Copy c = Copy::serving(CopyKind::kServeStaged, d.transfer, r, slot);
      start_copy(c, slot_bytes(slot), pool_.page(r.first), pool_.page_bytes);
      break;
    }
    case OpKind::kAck:
      send_run_header(
          am::kPushAck, d.run,
          d.run.code == am::RunCode::kOk ? "" : "pages outside the pool or a wrong length");
      break;
    default:
      break;
  }
}

void AcceptorSession::completed(Op& op, ucs_status_t st) {
  const bool ok = st == UCS_OK;
  switch (op.kind) {
    case OpKind::kServeSend:
      if (op.slot) give_slot(*op.slot);
      if (ok) serve_.bytes += span_bytes(op.runs.empty() ? 0 : op.runs[0].count);
      break;
    case OpKind::kServeRecv: {
      const am::RunRequest target = op.runs.at(0);
      const am::RunHeader ack{op.push.transfer, target.run,
                              ok ? am::RunCode::kOk : am::RunCode::kMalformed};
      if (op.slot && ok) {  // the bytes are in a slot: copied to the page, acknowledged after
        const Copy c = Copy::serving(CopyKind::kServeLanded, ack.transfer, target, op.slot);
        return start_copy(c, pool_.page(target.first), slot_bytes(*op.slot),
                          span_bytes(target.count));
      }
      if (op.slot) give_slot(*op.slot);
      if (ok) {
        serve_.bytes += span_bytes(target.count);
        wrote(target.first, target.count);
      }
      send_run_header(am::kPushAck, ack, ok ? "" : status_text("receiving", st));
      break;
    }
    default:  // acks and answers: nothing follows
      break;
  }
}

void AcceptorSession::landed(Copy& c, const Status& status) {
  ucp_request_param_t param{};
  switch (c.kind) {
    case CopyKind::kServeStaged: {
      if (!status) {
        give_slot(*c.slot);
        send_run_header(am::kPullReject, {c.header.transfer, c.header.run, am::RunCode::kMalformed},
                        status.error().message);
        break;
      }
      Op& op = ops_.emplace_back(Op(OpKind::kServeSend));
      op.run_header = c.header;
      op.runs = {c.target};
      op.slot = c.slot;
      settle(ucp_am_send_nbx(endpoint_->get(), am::kPullData, &op.run_header, sizeof(op.run_header),
                             slot_bytes(*c.slot), pool_.page_bytes, &param));
      break;
    }
    case CopyKind::kServeLanded: {
      if (c.slot) give_slot(*c.slot);
      if (status) {
        serve_.bytes += span_bytes(c.target.count);
        wrote(c.target.first, c.target.count);
      }
      send_run_header(
          am::kPushAck,
          {c.header.transfer, c.header.run, status ? am::RunCode::kOk : am::RunCode::kMalformed},
          status ? "" : status.error().message);
      break;
    }
    default:
      break;
  }
}

// ---- Active-message handlers (inside ucp_worker_progress: record, never send) -----------------

ucs_status_t AcceptorSession::on_pull_request(void* arg, const void* header,
                                              std::size_t header_length, void* data,
                                              std::size_t length, const ucp_am_recv_param_t* p) {
  auto* s = static_cast<AcceptorSession*>(arg);
  const auto h = am::read<am::PullRequest>(header, header_length);
  if (!h || rendezvous(p) || h->count == 0 || h->count > am::kMaxRunsPerMessage ||
      length != h->count * sizeof(am::RunRequest)) {
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

ucs_status_t AcceptorSession::on_push_data(void* arg, const void* header, std::size_t header_length,
                                           void* data, std::size_t length,
                                           const ucp_am_recv_param_t* p) {
  auto* s = static_cast<AcceptorSession*>(arg);
  const auto h = am::read<am::PushHeader>(header, header_length);
  if (!h) {
    ++s->serve_.rejected;
    spdlog::warn("malformed push from {} dropped", s->peer_);
    return UCS_OK;
  }
  const am::RunRequest& t = h->target;
  const bool fits = s->in_pool(t.first, t.count);
  if (!fits || length != s->span_bytes(t.count) || (s->staging_ && t.count != 1)) {
    ++s->serve_.rejected;
    spdlog::warn("push {} from {} rejected: pages {}+{} ({} bytes) do not fit this pool of {} x {}",
                 h->transfer, s->peer_, t.first, t.count, length, s->pool_.pages,
                 s->pool_.page_bytes);
    Deferred d(OpKind::kAck);
    d.run =
        am::RunHeader{h->transfer, t.run, fits ? am::RunCode::kBadLength : am::RunCode::kOutOfPool};
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
  if (s->copier_) {  // staged, or a device pool: only the copy engine reaches it
    s->start_copy(Copy::serving(CopyKind::kServeLanded, h->transfer, t, std::nullopt),
                  s->pool_.page(t.first), data, length);
    return UCS_OK;
  }
  std::memcpy(s->pool_.page(t.first), data, length);
  s->serve_.bytes += length;
  s->wrote(t.first, t.count);
  Deferred d(OpKind::kAck);
  d.run = am::RunHeader{h->transfer, t.run, am::RunCode::kOk};
  s->deferred_.push_back(std::move(d));
  return UCS_OK;
}

// After one-sided RMA the peer tells us which of our pages it wrote (a push: our node marks the
// chunks present) or read (a pull: our served-bytes counter). Each notice names page runs.
ucs_status_t AcceptorSession::noticed(bool written, const void* header, std::size_t header_length,
                                      const void* data, std::size_t length,
                                      const ucp_am_recv_param_t* p) {
  const auto h = am::read<am::PullRequest>(header, header_length);
  if (!h || rendezvous(p) || h->count > am::kMaxRunsPerMessage ||
      length != h->count * sizeof(am::RunRequest)) {
    ++serve_.rejected;
    return UCS_OK;
  }
  std::vector<am::RunRequest> runs(h->count);
  if (length) std::memcpy(runs.data(), data, length);
  std::vector<gpu::PageId> pages;
  for (const am::RunRequest& r : runs) {
    if (!in_pool(r.first, r.count)) {
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

ucs_status_t AcceptorSession::on_written(void* arg, const void* header, std::size_t header_length,
                                         void* data, std::size_t length,
                                         const ucp_am_recv_param_t* p) {
  return static_cast<AcceptorSession*>(arg)->noticed(true, header, header_length, data, length, p);
}

ucs_status_t AcceptorSession::on_read(void* arg, const void* header, std::size_t header_length,
                                      void* data, std::size_t length,
                                      const ucp_am_recv_param_t* p) {
  return static_cast<AcceptorSession*>(arg)->noticed(false, header, header_length, data, length, p);
}

}  // namespace kvnode::transfer
