// InitiatorSession: set-up, the control link, posting our transfers (RMA or active messages,
// staged or not) and what follows when their operations complete.
#include "session_initiator.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace kvnode::transfer {

// ---- Set-up and the control link --------------------------------------------------------------

Result<std::unique_ptr<InitiatorSession>> InitiatorSession::create(
    const SessionSetup& setup, const PeerDescriptor& pool_descriptor) {
  Result<ucx::Worker> worker = ucx::Worker::create(*setup.context);
  if (!worker) return worker.error();
  std::unique_ptr<InitiatorSession> s(new InitiatorSession(setup, std::move(worker).value()));
  const Status started =
      s->start({{am::kPullData, &InitiatorSession::on_pull_data},
                {am::kPullReject, &InitiatorSession::on_run_answer},
                {am::kPushAck, &InitiatorSession::on_run_answer},
                {am::kAnswer, &InitiatorSession::on_answer}},
               s.get(), {am::kPullRequest, am::kPushData, am::kWritten, am::kRead});
  if (!started) return started.error();
  // Our share is for peers that dial us (our welcome tells them): the one we dial maps nothing
  // of ours through this session.
  s->hello_ = encode(without_share(s->local_descriptor(pool_descriptor)));
  return s;
}

Status InitiatorSession::dial() {
  Result<std::pair<std::string, std::uint16_t>> hp = split_url(peer_);
  if (!hp) return hp.error();
  link_.reset();  // closing the descriptor takes it out of the plane's epoll set
  Result<ControlLink> link = ControlLink::dial(hp->first, hp->second, hello_);
  if (!link) return link.error();
  link_.emplace(std::move(link).value());
  ++dials_;
  clear_broken();
  return {};
}

std::optional<LinkBytes> InitiatorSession::pump_link() {
  const Status pumped = link_->pump();
  // Read first: a refusal may come just before the link closes.
  if (std::optional<LinkBytes> welcome = link_->take_frame()) return welcome;
  if (!pumped) mark_broken("the connection to " + peer_ + " failed: " + pumped.error().message);
  return std::nullopt;
}

// ---- Transfers --------------------------------------------------------------------------------

void InitiatorSession::submit(std::unique_ptr<Xfer> xfer) {
  if (!ready()) {
    waiting_.push_back(std::move(xfer));
    return;
  }
  Xfer& x = *xfer;
  const TransferId id = x.id;
  xfers_[id] = std::move(xfer);
  post(x);
}

void InitiatorSession::post_waiting() {
  while (!asks_waiting_.empty()) {
    PendingAsk a = std::move(asks_waiting_.front());
    asks_waiting_.pop_front();
    post_ask(std::move(a));
  }
  while (!waiting_.empty()) {
    std::unique_ptr<Xfer> x = std::move(waiting_.front());
    waiting_.pop_front();
    submit(std::move(x));
  }
}

void InitiatorSession::post(Xfer& x) {
  x.posted = Clock::now();
  x.stats.queued = x.posted - x.submitted;
  x.stats.protocol = protocol_;
  x.stats.transport = transport_;
  Result<Plan> plan = plan_runs(x.pages, pool_.pages, remote_.pages, x.pull, max_run());
  if (!plan) {
    spdlog::warn("transfer {} to {} refused: {}", x.id, peer_, plan.error().message);
    x.fail_all(Failure::kInvalid, plan.error().message);
    return;
  }
  x.open(std::move(plan).value());
  if (mapping_)
    post_mapped(x);
  else if (use_rma(x))
    post_rma(x);
  else
    post_am(x);
  x.stats.post = Clock::now() - x.posted;
}

bool InitiatorSession::use_rma(Xfer& x) const {
  if (protocol_ != Protocol::kRma) return false;
  // Measured (docs/benchmarks.md): cma reads beat cma writes, so a large push between processes
  // of one host goes as an active-message rendezvous, which the receiver completes by reading.
  if (requested_ == Protocol::kAuto && !x.pull && transport_ == "cma") {
    const std::uint64_t bytes = span_bytes(static_cast<std::uint32_t>(x.pages.size()));
    if (bytes / x.plan.runs.size() >= kCmaPushViaAmBytes) {
      x.stats.protocol = Protocol::kActiveMessage;
      x.stats.transport = "sysv+cma";
      return false;
    }
  }
  return true;
}

void InitiatorSession::post_rma(Xfer& x) {
  ucp_request_param_t param{};
  for (std::uint32_t r = 0; r < x.plan.runs.size(); ++r) {
    const Run& run = x.plan.runs[r];
    std::byte* local = pool_.page(run.local);
    const std::uint64_t remote =
        remote_.base + static_cast<std::uint64_t>(run.remote) * pool_.page_bytes;
    const std::size_t length = span_bytes(run.count);
    ++x.stats.ops;
    if (x.pull)
      track(ucp_get_nbx(endpoint_->get(), local, length, remote, rkey_->get(), &param),
            Op(OpKind::kGet, x.id, r));
    else
      track(ucp_put_nbx(endpoint_->get(), local, length, remote, rkey_->get(), &param),
            Op(OpKind::kPut, x.id, r));
  }
  // Remote completion: the flush ends after every put above is in the peer's memory.
  if (!x.pull) track(ucp_ep_flush_nbx(endpoint_->get(), &param), Op(OpKind::kFlush, x.id, 0));
}

// Each run is one copy between our page and the peer's, on the mapping's engine; landed()
// finishes it. The peer's plane hears of it as of RMA, by a notice, once all runs ended.
void InitiatorSession::post_mapped(Xfer& x) {
  x.same_host = true;
  x.stats.protocol = Protocol::kRma;
  x.stats.transport = mapping_->transport;
  for (std::uint32_t r = 0; r < x.plan.runs.size(); ++r) {
    const Run& run = x.plan.runs[r];
    std::byte* local = pool_.page(run.local);
    std::byte* remote = mapping_->page(run.remote, pool_.page_bytes);
    Copy c = Copy::of_run(CopyKind::kMappedRun, x.id, r, std::nullopt);
    c.engine = mapping_->engine;
    c.keep = mapping_;
    ++x.stats.ops;
    if (x.pull)
      start_copy(std::move(c), local, remote, span_bytes(run.count));
    else
      start_copy(std::move(c), remote, local, span_bytes(run.count));
  }
}

void InitiatorSession::post_am(Xfer& x) {
  ucp_request_param_t param{};
  const auto& runs = x.plan.runs;
  if (x.pull) {
    for (std::uint32_t start = 0; start < runs.size(); start += am::kMaxRunsPerMessage) {
      const std::uint32_t n = std::min<std::uint32_t>(
          am::kMaxRunsPerMessage, static_cast<std::uint32_t>(runs.size()) - start);
      Op& op = ops_.emplace_back(Op(OpKind::kPullRequest, x.id, start));
      op.pull = am::PullRequest{x.id, n};
      for (std::uint32_t r = start; r < start + n; ++r)
        op.runs.push_back(am::RunRequest{r, runs[r].remote, runs[r].count});
      ++x.stats.ops;
      settle(ucp_am_send_nbx(endpoint_->get(), am::kPullRequest, &op.pull, sizeof(op.pull),
                             op.runs.data(), op.runs.size() * sizeof(am::RunRequest), &param));
    }
    return;
  }
  for (std::uint32_t r = 0; r < runs.size(); ++r) {
    if (staging_) {  // copied into a slot first, sent from there (landed(kPushStaged))
      Deferred d(OpKind::kPushStage);
      d.transfer = x.id;
      d.run_index = r;
      stalled_.push_back(std::move(d));
      ++x.stats.ops;
      continue;
    }
    Op& op = ops_.emplace_back(Op(OpKind::kPushSend, x.id, r));
    op.push = am::PushHeader{x.id, am::RunRequest{r, runs[r].remote, runs[r].count}};
    ++x.stats.ops;
    settle(ucp_am_send_nbx(endpoint_->get(), am::kPushData, &op.push, sizeof(op.push),
                           pool_.page(runs[r].local), span_bytes(runs[r].count), &param));
  }
}

Xfer* InitiatorSession::find(TransferId id) {
  const auto it = xfers_.find(id);
  return it == xfers_.end() ? nullptr : it->second.get();
}

// ---- Completions ------------------------------------------------------------------------------

void InitiatorSession::completed(Op& op, ucs_status_t st) {
  Xfer* x = op.xfer ? find(op.xfer) : nullptr;
  const bool ok = st == UCS_OK;
  if (op.slot && op.kind == OpKind::kPushSend) give_slot(*op.slot);
  if (op.slot && op.kind == OpKind::kPullRecv) {
    const gpu::PageId slot = *op.slot;
    if (!x || !ok) {
      give_slot(slot);
      if (x) x->fail_run(op.run, Failure::kPeerLost, status_text("reading from the peer", st));
      return;
    }
    const Copy c = Copy::of_run(CopyKind::kPullLanded, x->id, op.run, slot);
    return start_copy(c, pool_.page(x->plan.runs[op.run].local), slot_bytes(slot),
                      pool_.page_bytes);
  }
  switch (op.kind) {
    case OpKind::kGet:
    case OpKind::kPullRecv:
      if (!x) break;
      if (ok)
        x->finish_run(op.run);
      else
        x->fail_run(op.run, Failure::kPeerLost, status_text("reading from the peer", st));
      // A one-sided get never reaches the peer's plane: tell it what was read (its counters).
      if (op.kind == OpKind::kGet && x->finished()) notify(am::kRead, *x);
      break;
    case OpKind::kPut:
    case OpKind::kPushSend:
      if (x && !ok) x->fail_run(op.run, Failure::kPeerLost, status_text("writing to the peer", st));
      break;
    case OpKind::kFlush: {
      if (!x) break;
      if (!ok) {
        x->fail_all(Failure::kPeerLost, status_text("ucp_ep_flush_nbx", st));
        break;
      }
      // Tell the peer which pages now hold our bytes (its node marks them present).
      for (std::uint32_t r = 0; r < x->run_state.size(); ++r) x->finish_run(r);
      notify(am::kWritten, *x);
      break;
    }
    case OpKind::kPullRequest:
      if (x && !ok)
        for (const am::RunRequest& r : op.runs)
          x->fail_run(r.run, Failure::kPeerLost, status_text("sending the pull request", st));
      break;
    case OpKind::kAsk:
      if (!ok)
        asked(op.ask.id, make_error(ErrorCode::kPeerLost, status_text("sending the ask", st)));
      break;
    default:  // notices and answers: nothing follows
      break;
  }
}

void InitiatorSession::serve(Deferred& d) {
  ucp_request_param_t param{};
  switch (d.kind) {
    case OpKind::kPullRecv: {  // a rendezvous carrying a run we pulled
      Xfer* x = find(d.run.transfer);
      if (!x || !x->is_open(d.run.run)) {
        ucp_am_data_release(worker().get(), d.desc);
        break;
      }
      const Run& run = x->plan.runs[d.run.run];
      void* desc = std::exchange(d.desc, nullptr);
      Op op(OpKind::kPullRecv, x->id, d.run.run);
      std::byte* into = pool_.page(run.local);
      if (staging_) {
        op.slot = take_slot();
        into = slot_bytes(*op.slot);
      }
      track(ucp_am_recv_data_nbx(worker().get(), desc, into, d.length, &param), std::move(op));
      break;
    }
    case OpKind::kPushStage: {  // our push, staged: page -> slot, then sent (landed)
      Xfer* x = find(d.transfer);
      if (!x || !x->is_open(d.run_index)) break;
      const Run& run = x->plan.runs[d.run_index];
      const gpu::PageId slot = *take_slot();
      const Copy c = Copy::of_run(CopyKind::kPushStaged, x->id, d.run_index, slot);
      start_copy(c, slot_bytes(slot), pool_.page(run.local), pool_.page_bytes);
      break;
    }
    default:
      break;
  }
}

void InitiatorSession::landed(Copy& c, const Status& status) {
  ucp_request_param_t param{};
  switch (c.kind) {
    case CopyKind::kPullLanded: {
      if (c.slot) give_slot(*c.slot);
      Xfer* x = find(c.xfer);
      if (!x) break;
      if (status)
        x->finish_run(c.run);
      else
        x->fail_run(c.run, Failure::kRejected,
                    "copying into the local page: " + status.error().message);
      break;
    }
    case CopyKind::kPushStaged: {
      Xfer* x = find(c.xfer);
      if (!x || !status || !x->is_open(c.run)) {
        give_slot(*c.slot);
        if (x && !status)
          x->fail_run(c.run, Failure::kRejected,
                      "copying out of the local page: " + status.error().message);
        break;
      }
      const Run& run = x->plan.runs[c.run];
      Op& op = ops_.emplace_back(Op(OpKind::kPushSend, x->id, c.run));
      op.push = am::PushHeader{x->id, am::RunRequest{c.run, run.remote, run.count}};
      op.slot = c.slot;
      settle(ucp_am_send_nbx(endpoint_->get(), am::kPushData, &op.push, sizeof(op.push),
                             slot_bytes(*c.slot), pool_.page_bytes, &param));
      break;
    }
    case CopyKind::kMappedRun: {
      Xfer* x = find(c.xfer);
      if (!x) break;
      if (status) {
        x->finish_run(c.run);
      } else {
        // A local fault (a CUDA error): the mapping is dropped so UCX carries what follows, and
        // the run may be retried; the peer refused nothing.
        if (mapping_)
          spdlog::warn(
              "transfer plane: copying with {}'s mapped pool failed ({}): "
              "UCX moves its chunks from now on",
              peer_, status.error().message);
        mapping_.reset();
        x->fail_run(c.run, Failure::kReset,
                    "copying with the peer's mapped pool: " + status.error().message);
      }
      if (x->finished()) notify(x->pull ? am::kRead : am::kWritten, *x);
      break;
    }
    default:
      break;
  }
}

// ---- Progress, failure, deadlines -------------------------------------------------------------

unsigned InitiatorSession::progress() {
  const unsigned n = Session::progress();
  for (auto it = xfers_.begin(); it != xfers_.end();) {
    if (it->second->finished()) {
      finished_.push_back(std::move(it->second));
      it = xfers_.erase(it);
    } else {
      ++it;
    }
  }
  return n;
}

std::vector<std::unique_ptr<Xfer>> InitiatorSession::fail_all(Failure first, TransferId culprit,
                                                              const std::string& why) {
  std::vector<std::unique_ptr<Xfer>> out = take_finished();
  auto fail = [&](std::unique_ptr<Xfer> x) {
    const bool others_retry = first == Failure::kTimeout || first == Failure::kCancelled;
    if (x->id == culprit || culprit == 0 || !others_retry)
      x->fail_all(first, why);
    else
      x->fail_all(Failure::kReset, "session with " + peer_ + " reset: another transfer " + why);
    out.push_back(std::move(x));
  };
  for (auto& [id, x] : xfers_) fail(std::move(x));
  xfers_.clear();
  while (!waiting_.empty()) {
    fail(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  // An ask does not outlive its session: whatever ended the session, the peer is gone for it.
  for (auto& [id, a] : asks_)
    answered_.emplace_back(std::move(a), make_error(ErrorCode::kPeerLost, why));
  asks_.clear();
  for (PendingAsk& a : asks_waiting_)
    answered_.emplace_back(std::move(a), make_error(ErrorCode::kPeerLost, why));
  asks_waiting_.clear();
  return out;
}

std::optional<Clock::time_point> InitiatorSession::earliest_deadline() const {
  std::optional<Clock::time_point> out;
  auto see = [&](const Xfer& x) {
    if (!out || x.deadline < *out) out = x.deadline;
  };
  for (const auto& [id, x] : xfers_) see(*x);
  for (const auto& x : waiting_) see(*x);
  return out;
}

std::optional<TransferId> InitiatorSession::expired(Clock::time_point now) const {
  for (const auto& [id, x] : xfers_)
    if (x->deadline <= now) return id;
  for (const auto& x : waiting_)
    if (x->deadline <= now) return x->id;
  return std::nullopt;
}

}  // namespace kvnode::transfer
