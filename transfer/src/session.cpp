#include "session.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "lanes.hpp"

namespace kvnode::transfer {

// ---- Xfer -------------------------------------------------------------------------------------

void Xfer::fail_run(std::uint32_t run, Failure f, const std::string& why) {
  if (failure == Failure::kNone) {
    failure = f;
    message = why;
  }
  if (run < run_state.size() && run_state[run] == 0) {
    run_state[run] = 2;
    --open_runs;
  }
}

void Xfer::finish_run(std::uint32_t run) {
  if (run < run_state.size() && run_state[run] == 0) {
    run_state[run] = 1;
    --open_runs;
  }
}

void Xfer::fail_all(Failure f, const std::string& why) {
  if (failure == Failure::kNone) {
    failure = f;
    message = why;
  }
  for (std::uint32_t r = 0; r < run_state.size(); ++r) fail_run(r, f, why);
}

TransferResult Xfer::result(const PoolView& pool) const {
  TransferResult out;
  out.failure = failure;
  out.message = message;
  out.done.assign(pages.size(), 0);
  out.stats = stats;
  for (std::uint32_t r = 0; r < run_state.size(); ++r) {
    if (run_state[r] != 1) continue;
    const Run& run = plan.runs[r];
    for (std::uint32_t k = 0; k < run.count; ++k) out.done[plan.chunk_order[run.first_chunk + k]] = 1;
    out.stats.chunks += run.count;
  }
  out.stats.bytes = static_cast<std::uint64_t>(out.stats.chunks) * pool.page_bytes;
  return out;
}

// ---- Session set-up ---------------------------------------------------------------------------

namespace {

std::string status_text(const char* call, ucs_status_t st) {
  return std::string(call) + ": " + ucs_status_string(st);
}

}  // namespace

Result<std::unique_ptr<Session>> Session::create(const ucx::Context& context, Role role,
                                                 std::string peer, const PoolView& pool,
                                                 Protocol protocol, const Staging* staging) {
  Result<ucx::Worker> worker = ucx::Worker::create(context);
  if (!worker) return worker.error();
  std::unique_ptr<Session> s(
      new Session(role, std::move(peer), pool, protocol, staging, std::move(worker).value()));
  Result<int> fd = s->worker_.event_fd();
  if (!fd) return fd.error();
  s->event_fd_ = *fd;
  if (Status st = s->install_handlers(); !st) return st.error();
  return s;
}

Status Session::install_handlers() {
  const std::pair<unsigned, ucp_am_recv_callback_t> handlers[] = {
      {wire::kPullRequest, &Session::on_pull_request}, {wire::kPullData, &Session::on_pull_data},
      {wire::kPullReject, &Session::on_run_answer},    {wire::kPushData, &Session::on_push_data},
      {wire::kPushAck, &Session::on_run_answer},       {wire::kWritten, &Session::on_written},
      {wire::kRead, &Session::on_read},                {wire::kAsk, &Session::on_ask},
      {wire::kAnswer, &Session::on_answer}};
  for (const auto& [id, cb] : handlers)
    if (Status s = worker_.set_am_handler(id, cb, this); !s) return s;
  return {};
}

Session::~Session() {
  // Copies cannot be cancelled: let them land (they take microseconds) before the slots and
  // pages they touch are handed on.
  const auto until = Clock::now() + std::chrono::seconds(5);
  for (Copy& c : copies_) {
    while (Clock::now() < until) {
      Result<bool> done = staging_->engine->done(c.ticket);
      if (!done || *done) break;
    }
    if (c.slot) slot_return_.slots.push_back(*c.slot);
  }
  for (Op& op : ops_) {
    if (op.request) ucp_request_free(op.request);
    if (op.slot) slot_return_.slots.push_back(*op.slot);
  }
  for (Deferred& d : deferred_)
    if (d.desc) ucp_am_data_release(worker_.get(), d.desc);
  rkey_.reset();
  endpoint_.reset();
}

PeerDescriptor Session::local_descriptor(const PeerDescriptor& pool_descriptor) const {
  PeerDescriptor d = pool_descriptor;
  if (Result<ucx::Bytes> a = worker_.address()) d.worker_address = std::move(a).value();
  return d;
}

Status Session::connect(PeerDescriptor peer, bool same_host) {
  if (peer.page_bytes != pool_.page_bytes)
    return make_error("the peer's pages are " + std::to_string(peer.page_bytes) +
                      " bytes, ours " + std::to_string(pool_.page_bytes) + ": not the same chunk size");
  Result<ucx::Endpoint> ep = ucx::Endpoint::connect(worker_, peer.worker_address, !same_host);
  if (!ep) return ep.error();
  endpoint_.emplace(std::move(ep).value());
  if (Status s = check_packed_rkey(peer.rkey); !s) return s;
  Result<ucx::RemoteKey> key = ucx::RemoteKey::unpack(*endpoint_, peer.rkey);
  if (!key) return key.error();
  rkey_.emplace(std::move(key).value());
  const EndpointLanes lanes = endpoint_lanes(endpoint_->get());
  const bool one_sided_possible = !staging_ && peer.rma;
  switch (one_sided_possible ? requested_ : Protocol::kActiveMessage) {
    case Protocol::kRma: protocol_ = Protocol::kRma; break;
    case Protocol::kActiveMessage: protocol_ = Protocol::kActiveMessage; break;
    case Protocol::kAuto:
      protocol_ = rma_is_native(lanes) ? Protocol::kRma : Protocol::kActiveMessage;
  }
  transport_ = protocol_ == Protocol::kRma && !lanes.rma_bw.empty() ? lanes.rma_bw : lanes.am_bw;
  if (transport_.empty()) transport_ = "unknown";
  remote_ = std::move(peer);
  return {};
}

void Session::mark_broken(const std::string& why) {
  if (!broken_) broken_reason_ = why;
  broken_ = true;
}

// ---- Transfers --------------------------------------------------------------------------------

void Session::submit(std::unique_ptr<Xfer> xfer) {
  if (!ready()) {
    waiting_.push_back(std::move(xfer));
    return;
  }
  Xfer& x = *xfer;
  const TransferId id = x.id;
  xfers_[id] = std::move(xfer);
  post(x);
}

void Session::post_waiting() {
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

void Session::post(Xfer& x) {
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
  x.plan = std::move(plan).value();
  x.run_state.assign(x.plan.runs.size(), 0);
  x.open_runs = static_cast<std::uint32_t>(x.plan.runs.size());
  if (use_rma(x))
    post_rma(x);
  else
    post_am(x);
  x.stats.post = Clock::now() - x.posted;
}

void Session::track(ucs_status_ptr_t request, Op op) {
  if (request == nullptr) return completed(op, UCS_OK);
  if (UCS_PTR_IS_ERR(request)) return completed(op, UCS_PTR_STATUS(request));
  op.request = request;
  ops_.push_back(std::move(op));
}

bool Session::use_rma(Xfer& x) const {
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

void Session::settle(ucs_status_ptr_t request) {
  // The op is ops_.back(): it stays there while UCX may still read its header.
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) {
    ops_.back().request = request;
    return;
  }
  Op op = std::move(ops_.back());
  ops_.pop_back();
  completed(op, request == nullptr ? UCS_OK : UCS_PTR_STATUS(request));
}

void Session::post_rma(Xfer& x) {
  ucp_request_param_t param{};
  for (std::uint32_t r = 0; r < x.plan.runs.size(); ++r) {
    const Run& run = x.plan.runs[r];
    std::byte* local = pool_.page(run.local);
    const std::uint64_t remote = remote_.base + static_cast<std::uint64_t>(run.remote) * pool_.page_bytes;
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

void Session::post_am(Xfer& x) {
  ucp_request_param_t param{};
  const auto& runs = x.plan.runs;
  if (x.pull) {
    for (std::uint32_t start = 0; start < runs.size(); start += wire::kMaxRunsPerMessage) {
      const std::uint32_t n = std::min<std::uint32_t>(wire::kMaxRunsPerMessage,
                                                      static_cast<std::uint32_t>(runs.size()) - start);
      Op& op = ops_.emplace_back(Op(OpKind::kPullRequest, x.id, start));
      op.pull = wire::PullRequest{x.id, n};
      for (std::uint32_t r = start; r < start + n; ++r)
        op.runs.push_back(wire::RunRequest{r, runs[r].remote, runs[r].count});
      ++x.stats.ops;
      settle(ucp_am_send_nbx(endpoint_->get(), wire::kPullRequest, &op.pull, sizeof(op.pull),
                             op.runs.data(), op.runs.size() * sizeof(wire::RunRequest), &param));
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
    op.push = wire::PushHeader{x.id, wire::RunRequest{r, runs[r].remote, runs[r].count}};
    ++x.stats.ops;
    settle(ucp_am_send_nbx(endpoint_->get(), wire::kPushData, &op.push, sizeof(op.push),
                           pool_.page(runs[r].local), span_bytes(runs[r].count), &param));
  }
}

Xfer* Session::find(TransferId id) {
  const auto it = xfers_.find(id);
  return it == xfers_.end() ? nullptr : it->second.get();
}

void Session::completed(Op& op, ucs_status_t st) {
  Xfer* x = op.xfer ? find(op.xfer) : nullptr;
  const bool ok = st == UCS_OK;
  if (op.slot && (op.kind == OpKind::kPushSend || op.kind == OpKind::kServeSend)) give_slot(*op.slot);
  if (op.slot && op.kind == OpKind::kPullRecv) {
    const gpu::PageId slot = *op.slot;
    if (!x || !ok) {
      give_slot(slot);
      if (x) x->fail_run(op.run, Failure::kPeerLost, status_text("reading from the peer", st));
      return;
    }
    Copy c{0, CopyKind::kPullLanded, x->id, op.run, slot, {}, {}};
    return start_copy(c, pool_.page(x->plan.runs[op.run].local), slot_bytes(slot), pool_.page_bytes);
  }
  if (op.slot && op.kind == OpKind::kServeRecv) {
    const wire::RunRequest target = op.runs.at(0);
    const wire::RunHeader header{op.push.transfer, target.run, wire::kOk};
    if (!ok) {
      give_slot(*op.slot);
      send_run_header(OpKind::kAck, wire::kPushAck, {header.transfer, header.run, wire::kMalformed},
                      status_text("receiving", st));
      return;
    }
    Copy c{0, CopyKind::kServeLanded, 0, 0, op.slot, header, target};
    return start_copy(c, pool_.page(target.first), slot_bytes(*op.slot), span_bytes(target.count));
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
      if (op.kind == OpKind::kGet && x->finished()) notify(wire::kRead, *x);
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
      notify(wire::kWritten, *x);
      break;
    }
    case OpKind::kPullRequest:
      if (x && !ok)
        for (const wire::RunRequest& r : op.runs)
          x->fail_run(r.run, Failure::kPeerLost, status_text("sending the pull request", st));
      break;
    case OpKind::kServeSend:
      if (ok) serve_.bytes += span_bytes(op.runs.empty() ? 0 : op.runs[0].count);
      break;
    case OpKind::kServeRecv: {
      const wire::RunRequest target = op.runs.at(0);
      wire::RunHeader ack{op.push.transfer, target.run, ok ? wire::kOk : wire::kMalformed};
      if (ok) {
        serve_.bytes += span_bytes(target.count);
        std::vector<gpu::PageId> pages(target.count);
        for (std::uint32_t i = 0; i < target.count; ++i) pages[i] = target.first + i;
        written_.push_back(std::move(pages));
      }
      send_run_header(OpKind::kAck, wire::kPushAck, ack, ok ? "" : status_text("receiving", st));
      break;
    }
    case OpKind::kAck:
    case OpKind::kNotify:
    case OpKind::kPushStage:
    case OpKind::kServeStage:
    case OpKind::kAnswer:
      break;
    case OpKind::kAsk:
      if (!ok) {
        const auto it = asks_.find(op.ask.id);
        if (it != asks_.end()) {
          answered_.emplace_back(std::move(it->second), make_error(status_text("sending the ask", st)));
          asks_.erase(it);
        }
      }
      break;
  }
}

void Session::send_run_header(OpKind kind, unsigned am_id, const wire::RunHeader& h,
                              std::string text) {
  if (!endpoint_) return;
  Op& op = ops_.emplace_back(Op(kind, 0, 0));
  op.run_header = h;
  op.text = std::move(text);
  ucp_request_param_t param{};
  settle(ucp_am_send_nbx(endpoint_->get(), am_id, &op.run_header, sizeof(op.run_header),
                         op.text.data(), op.text.size(), &param));
}

// ---- Progress ---------------------------------------------------------------------------------

unsigned Session::progress() {
  unsigned n = 0;
  for (int i = 0; i < 4; ++i) n += worker_.progress();
  while (!deferred_.empty()) {
    Deferred d = std::move(deferred_.front());
    deferred_.pop_front();
    if (needs_slot(d))
      stalled_.push_back(std::move(d));  // in order, behind earlier work waiting for a slot
    else
      serve(d);
    ++n;
  }
  while (!stalled_.empty() && (!needs_slot(stalled_.front()) || staging_->ring->free_pages() > 0)) {
    Deferred d = std::move(stalled_.front());
    stalled_.pop_front();
    serve(d);
    ++n;
  }
  if (staging_) n += poll_copies();
  for (auto it = ops_.begin(); it != ops_.end();) {
    if (it->request == nullptr) {
      ++it;
      continue;
    }
    const ucs_status_t st = ucp_request_check_status(it->request);
    if (st == UCS_INPROGRESS) {
      ++it;
      continue;
    }
    ucp_request_free(it->request);
    it->request = nullptr;
    Op op = std::move(*it);
    it = ops_.erase(it);
    completed(op, st);  // may append to ops_ (acks, notices): list iterators stay valid
    ++n;
  }
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

void Session::serve(Deferred& d) {
  ucp_request_param_t param{};
  switch (d.kind) {
    case OpKind::kServeSend:  // a peer's pull request: send each run back, or say why not
      for (const wire::RunRequest& r : d.runs) {
        if (r.count == 0 || r.first >= pool_.pages || r.count > pool_.pages - r.first) {
          ++serve_.rejected;
          const std::string why = "pages " + std::to_string(r.first) + "+" + std::to_string(r.count) +
                                  " are outside this pool of " + std::to_string(pool_.pages);
          spdlog::warn("pull request {} from {} rejected: {}", d.transfer, peer_, why);
          send_run_header(OpKind::kAck, wire::kPullReject, {d.transfer, r.run, wire::kOutOfPool}, why);
          continue;
        }
        if (staging_) {  // one page per run, through a slot (landed(kServeStaged) sends it)
          if (r.count != 1) {
            ++serve_.rejected;
            send_run_header(OpKind::kAck, wire::kPullReject, {d.transfer, r.run, wire::kBadLength},
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
        op.run_header = wire::RunHeader{d.transfer, r.run, wire::kOk};
        op.runs = {r};
        settle(ucp_am_send_nbx(endpoint_->get(), wire::kPullData, &op.run_header,
                               sizeof(op.run_header), pool_.page(r.first), span_bytes(r.count),
                               &param));
      }
      break;
    case OpKind::kPullRecv: {  // a rendezvous carrying a run we pulled
      Xfer* x = find(d.run.transfer);
      if (!x || d.run.run >= x->run_state.size() || x->run_state[d.run.run] != 0) {
        ucp_am_data_release(worker_.get(), d.desc);
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
      track(ucp_am_recv_data_nbx(worker_.get(), desc, into, d.length, &param), std::move(op));
      break;
    }
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
      track(ucp_am_recv_data_nbx(worker_.get(), desc, into, d.length, &param), std::move(op));
      break;
    }
    case OpKind::kPushStage: {  // our push, staged: page -> slot, then sent (landed)
      Xfer* x = find(d.transfer);
      if (!x || x->run_state[d.run_index] != 0) break;
      const Run& run = x->plan.runs[d.run_index];
      const gpu::PageId slot = *take_slot();
      Copy c{0, CopyKind::kPushStaged, x->id, d.run_index, slot, {}, {}};
      start_copy(c, slot_bytes(slot), pool_.page(run.local), pool_.page_bytes);
      break;
    }
    case OpKind::kServeStage: {  // a peer's pull, staged: page -> slot, then sent (landed)
      const wire::RunRequest r = d.runs.at(0);
      const gpu::PageId slot = *take_slot();
      Copy c{0, CopyKind::kServeStaged, 0, 0, slot, {d.transfer, r.run, wire::kOk}, r};
      start_copy(c, slot_bytes(slot), pool_.page(r.first), pool_.page_bytes);
      break;
    }
    case OpKind::kAck:
      send_run_header(OpKind::kAck, wire::kPushAck, d.run,
                      d.run.code == wire::kOk ? "" : "pages outside the pool or a wrong length");
      break;
    case OpKind::kAnswer:
      answer_ask(d);
      break;
    default:
      break;
  }
}

std::vector<std::unique_ptr<Xfer>> Session::take_finished() { return std::exchange(finished_, {}); }

std::vector<std::vector<gpu::PageId>> Session::take_written() { return std::exchange(written_, {}); }

std::vector<std::unique_ptr<Xfer>> Session::fail_all(Failure first, TransferId culprit,
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
  for (auto& [id, a] : asks_) answered_.emplace_back(std::move(a), make_error(why));
  asks_.clear();
  for (PendingAsk& a : asks_waiting_) answered_.emplace_back(std::move(a), make_error(why));
  asks_waiting_.clear();
  return out;
}

std::optional<Clock::time_point> Session::earliest_deadline() const {
  std::optional<Clock::time_point> out;
  auto see = [&](const Xfer& x) {
    if (!out || x.deadline < *out) out = x.deadline;
  };
  for (const auto& [id, x] : xfers_) see(*x);
  for (const auto& x : waiting_) see(*x);
  return out;
}

std::optional<TransferId> Session::expired(Clock::time_point now) const {
  for (const auto& [id, x] : xfers_)
    if (x->deadline <= now) return id;
  for (const auto& x : waiting_)
    if (x->deadline <= now) return x->id;
  return std::nullopt;
}

}  // namespace kvnode::transfer
