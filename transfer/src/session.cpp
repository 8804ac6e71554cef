// Session, the part both roles share: set-up and connection, UCX operations in flight, the
// progress loop, and answering the peer's asks with the plane's on_ask handler.
#include "session.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>

#include "lanes.hpp"

namespace kvnode::transfer {

std::string status_text(const char* call, ucs_status_t st) {
  return std::string(call) + ": " + ucs_status_string(st);
}

// ---- Set-up -----------------------------------------------------------------------------------

Session::Session(const SessionSetup& setup, ucx::Worker worker)
    : peer_(setup.peer),
      pool_(setup.pool),
      requested_(setup.protocol),
      staging_(setup.staging),
      copier_(setup.staging ? setup.staging->engine : setup.pool_copier),
      ask_handler_(setup.ask_handler),
      worker_(std::move(worker)) {
  if (staging_) slot_return_.ring = staging_->ring;
}

Status Session::start(std::initializer_list<AmHandler> handlers, void* arg,
                      std::initializer_list<unsigned> refused) {
  Result<int> fd = worker_.event_fd();
  if (!fd) return fd.error();
  event_fd_ = *fd;
  if (Status s = worker_.set_am_handler(am::kAsk, &Session::on_ask, this); !s) return s;
  for (const auto& [id, cb] : handlers)
    if (Status s = worker_.set_am_handler(id, cb, arg); !s) return s;
  for (unsigned id : refused)
    if (Status s = worker_.set_am_handler(id, &Session::on_wrong_side, this); !s) return s;
  return {};
}

Session::~Session() {
  // Nothing of a copy may run once the slots and pages it touches are handed on: cancel()
  // returns when none of it does (a CUDA copy is waited for; queued pieces of a same-host copy
  // are dropped).
  std::map<gpu::CopyEngine*, std::vector<gpu::CopyEngine::Ticket>> by_engine;
  for (Copy& c : copies_) {
    by_engine[engine_of(c)].push_back(c.ticket);
    if (c.slot) slot_return_.slots.push_back(*c.slot);
  }
  for (auto& [engine, tickets] : by_engine) engine->cancel(tickets);
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
    return make_error("the peer's pages are " + std::to_string(peer.page_bytes) + " bytes, ours " +
                      std::to_string(pool_.page_bytes) + ": not the same chunk size");
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
    case Protocol::kRma:
      protocol_ = Protocol::kRma;
      break;
    case Protocol::kActiveMessage:
      protocol_ = Protocol::kActiveMessage;
      break;
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

// ---- Operations and progress ------------------------------------------------------------------

void Session::track(ucs_status_ptr_t request, Op op) {
  if (request == nullptr) return completed(op, UCS_OK);
  if (UCS_PTR_IS_ERR(request)) return completed(op, UCS_PTR_STATUS(request));
  op.request = request;
  ops_.push_back(std::move(op));
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

unsigned Session::progress() {
  unsigned n = 0;
  for (int i = 0; i < 4; ++i) n += worker_.progress();
  auto run = [this](Deferred& d) {
    if (d.kind == OpKind::kAnswer)
      answer_ask(d);
    else
      serve(d);
  };
  while (!deferred_.empty()) {
    Deferred d = std::move(deferred_.front());
    deferred_.pop_front();
    if (needs_slot(d))
      stalled_.push_back(std::move(d));  // in order, behind earlier work waiting for a slot
    else
      run(d);
    ++n;
  }
  while (!stalled_.empty() && (!needs_slot(stalled_.front()) || staging_->ring->free_pages() > 0)) {
    Deferred d = std::move(stalled_.front());
    stalled_.pop_front();
    run(d);
    ++n;
  }
  if (!copies_.empty()) n += poll_copies();
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
  return n;
}

ucs_status_t Session::on_wrong_side(void* arg, const void*, std::size_t, void*, std::size_t,
                                    const ucp_am_recv_param_t*) {
  auto* s = static_cast<Session*>(arg);
  ++s->serve_.rejected;
  return UCS_OK;  // drops the data, a rendezvous included
}

// ---- Answering the peer's asks (either role) --------------------------------------------------

ucs_status_t Session::on_ask(void* arg, const void* header, std::size_t header_length, void* data,
                             std::size_t length, const ucp_am_recv_param_t* p) {
  auto* s = static_cast<Session*>(arg);
  const auto h = am::read<am::AskHeader>(header, header_length);
  if (!h || rendezvous(p) || length > am::kMaxAskBytes) {
    ++s->serve_.rejected;
    spdlog::warn("malformed ask from {} dropped", s->peer_);
    return UCS_OK;
  }
  Deferred d(OpKind::kAnswer);
  d.ask = *h;
  d.body.assign(static_cast<const std::byte*>(data), static_cast<const std::byte*>(data) + length);
  s->deferred_.push_back(std::move(d));
  return UCS_OK;
}

void Session::answer_ask(const Deferred& d) {
  am::AskHeader header{d.ask.id, am::AnswerCode::kAnswered, 0};
  std::vector<std::byte> body;
  if (!ask_handler_ || !*ask_handler_) {
    header.code = am::AnswerCode::kNoHandler;
  } else {
    Result<std::vector<std::byte>> r = (*ask_handler_)(peer_, d.body);
    if (r && r->size() <= am::kMaxAskBytes) {
      body = std::move(r).value();
    } else {
      // The asker gets the handler's code (frozen, no room ...) to act on, and its text.
      header.code = am::AnswerCode::kHandlerFailed;
      header.error = static_cast<std::uint32_t>(r ? ErrorCode::kInternal : r.error().code);
      const std::string why = r ? "the answer is larger than 8 KiB" : r.error().message;
      body.assign(reinterpret_cast<const std::byte*>(why.data()),
                  reinterpret_cast<const std::byte*>(why.data()) + why.size());
    }
  }
  if (!endpoint_) return;
  Op& op = ops_.emplace_back(Op(OpKind::kAnswer));
  op.ask = header;
  op.body = std::move(body);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  settle(ucp_am_send_nbx(endpoint_->get(), am::kAnswer, &op.ask, sizeof(op.ask), op.body.data(),
                         op.body.size(), &param));
}

}  // namespace kvnode::transfer
