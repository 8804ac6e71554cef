// InitiatorSession, what goes back and forth once transfers are posted: the acceptor's replies
// (pulled bytes, a verdict on each run, answers to our asks), the asks themselves, and the
// notices this side sends after one-sided RMA, which the acceptor's plane does not see.
// The handlers run inside ucp_worker_progress: they check and record what came, and never send.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "session_initiator.hpp"

namespace kvnode::transfer {
namespace {

// The code a peer's handler failed with, as it came off the wire (an unknown value is a bug).
ErrorCode handler_error(std::uint32_t value) {
  return value <= static_cast<std::uint32_t>(ErrorCode::kInternal) ? static_cast<ErrorCode>(value)
                                                                   : ErrorCode::kInternal;
}

}  // namespace

// ---- Replies to transfers ---------------------------------------------------------------------

ucs_status_t InitiatorSession::on_pull_data(void* arg, const void* header,
                                            std::size_t header_length, void* data,
                                            std::size_t length, const ucp_am_recv_param_t* p) {
  auto* s = static_cast<InitiatorSession*>(arg);
  const auto h = am::read<am::RunHeader>(header, header_length);
  Xfer* x = h ? s->find(h->transfer) : nullptr;
  // Only a run we asked for, still open, of exactly its size: never trust the peer's numbers.
  if (!x || !x->pull || !x->is_open(h->run)) return UCS_OK;
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
  if (s->copier_) {  // staged, or a device pool: only the copy engine reaches it
    s->start_copy(Copy::of_run(CopyKind::kPullLanded, x->id, h->run, std::nullopt),
                  s->pool_.page(run.local), data, length);
    return UCS_OK;
  }
  std::memcpy(s->pool_.page(run.local), data, length);
  x->finish_run(h->run);
  return UCS_OK;
}

ucs_status_t InitiatorSession::on_run_answer(void* arg, const void* header,
                                             std::size_t header_length, void* data,
                                             std::size_t length, const ucp_am_recv_param_t* p) {
  auto* s = static_cast<InitiatorSession*>(arg);
  const auto h = am::read<am::RunHeader>(header, header_length);
  Xfer* x = h ? s->find(h->transfer) : nullptr;
  if (!x || h->run >= x->run_state.size()) return UCS_OK;
  if (h->code == am::RunCode::kOk) {
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

// ---- Notices after RMA ------------------------------------------------------------------------

void InitiatorSession::notify(unsigned am_id, Xfer& x) {
  if (x.notified) return;
  std::vector<am::RunRequest> done;
  for (std::uint32_t r = 0; r < x.run_state.size(); ++r)
    if (x.run_state[r] == RunState::kDone)
      done.push_back({r, x.plan.runs[r].remote, x.plan.runs[r].count});
  x.notified = true;
  for (std::size_t start = 0; start < done.size(); start += am::kMaxRunsPerMessage) {
    const std::size_t n = std::min<std::size_t>(am::kMaxRunsPerMessage, done.size() - start);
    Op& note = ops_.emplace_back(Op(OpKind::kNotify, 0, 0));
    note.pull = am::PullRequest{x.id, static_cast<std::uint32_t>(n)};
    note.runs.assign(done.begin() + static_cast<std::ptrdiff_t>(start),
                     done.begin() + static_cast<std::ptrdiff_t>(start + n));
    ucp_request_param_t param{};
    settle(ucp_am_send_nbx(endpoint_->get(), am_id, &note.pull, sizeof(note.pull), note.runs.data(),
                           note.runs.size() * sizeof(am::RunRequest), &param));
  }
}

// ---- Asks -------------------------------------------------------------------------------------

void InitiatorSession::ask(PendingAsk a) {
  if (!ready())
    asks_waiting_.push_back(std::move(a));
  else
    post_ask(std::move(a));
}

void InitiatorSession::post_ask(PendingAsk a) {
  Op& op = ops_.emplace_back(Op(OpKind::kAsk));
  op.ask = am::AskHeader{a.id, am::AnswerCode::kAnswered, 0};
  op.body = a.body;
  const std::uint64_t id = a.id;
  asks_[id] = std::move(a);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  settle(ucp_am_send_nbx(endpoint_->get(), am::kAsk, &op.ask, sizeof(op.ask), op.body.data(),
                         op.body.size(), &param));
}

void InitiatorSession::asked(std::uint64_t id, Result<std::vector<std::byte>> result) {
  const auto it = asks_.find(id);
  if (it == asks_.end()) return;  // expired already
  answered_.emplace_back(std::move(it->second), std::move(result));
  asks_.erase(it);
}

std::vector<std::pair<PendingAsk, Result<std::vector<std::byte>>>> InitiatorSession::take_answered(
    Clock::time_point now) {
  for (auto it = asks_.begin(); it != asks_.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    answered_.emplace_back(std::move(it->second),
                           make_error(ErrorCode::kDeadline, "no answer before the deadline"));
    it = asks_.erase(it);
  }
  for (auto it = asks_waiting_.begin(); it != asks_waiting_.end();) {
    if (it->deadline > now) {
      ++it;
      continue;
    }
    answered_.emplace_back(std::move(*it),
                           make_error(ErrorCode::kDeadline, "not connected before the deadline"));
    it = asks_waiting_.erase(it);
  }
  return std::exchange(answered_, {});
}

ucs_status_t InitiatorSession::on_answer(void* arg, const void* header, std::size_t header_length,
                                         void* data, std::size_t length,
                                         const ucp_am_recv_param_t* p) {
  auto* s = static_cast<InitiatorSession*>(arg);
  const auto h = am::read<am::AskHeader>(header, header_length);
  if (!h || rendezvous(p)) return UCS_OK;
  const auto* bytes = static_cast<const std::byte*>(data);
  switch (h->code) {
    case am::AnswerCode::kAnswered:
      s->asked(h->id, std::vector<std::byte>(bytes, bytes + length));
      break;
    case am::AnswerCode::kNoHandler:
      s->asked(h->id, make_error(ErrorCode::kRefused, "the peer answers no asks"));
      break;
    default: {  // kHandlerFailed, or a code this build does not know
      const std::string text(reinterpret_cast<const char*>(bytes),
                             std::min<std::size_t>(length, 1024));
      s->asked(h->id, make_error(handler_error(h->error), "the peer could not answer: " + text));
    }
  }
  return UCS_OK;
}

}  // namespace kvnode::transfer
