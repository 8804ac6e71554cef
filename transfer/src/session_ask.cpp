// Session, the ask half: small requests between the two nodes of a session (which pages to
// write, which chunks were stored), answered by the peer plane's on_ask handler.
#include <spdlog/spdlog.h>

#include <cstring>

#include "session.hpp"

namespace kvnode::transfer {

void Session::ask(PendingAsk a) {
  if (!ready())
    asks_waiting_.push_back(std::move(a));
  else
    post_ask(std::move(a));
}

void Session::post_ask(PendingAsk a) {
  Op& op = ops_.emplace_back(Op(OpKind::kAsk));
  op.ask = wire::AskHeader{a.id, 0, 0};
  op.body = a.body;
  const std::uint64_t id = a.id;
  asks_[id] = std::move(a);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  settle(ucp_am_send_nbx(endpoint_->get(), wire::kAsk, &op.ask, sizeof(op.ask), op.body.data(),
                         op.body.size(), &param));
}

void Session::answer_ask(const Deferred& d) {
  wire::AskHeader header = d.ask;
  std::vector<std::byte> body;
  if (!ask_handler_ || !*ask_handler_) {
    header.code = 1;
  } else {
    Result<std::vector<std::byte>> r = (*ask_handler_)(peer_, d.body);
    if (r && r->size() <= wire::kMaxAskBytes) {
      body = std::move(r).value();
    } else {
      header.code = 2;
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
  settle(ucp_am_send_nbx(endpoint_->get(), wire::kAnswer, &op.ask, sizeof(op.ask), op.body.data(),
                         op.body.size(), &param));
}

std::vector<std::pair<PendingAsk, Result<std::vector<std::byte>>>> Session::take_answered(
    Clock::time_point now) {
  for (auto it = asks_.begin(); it != asks_.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    answered_.emplace_back(std::move(it->second), make_error("no answer before the deadline"));
    it = asks_.erase(it);
  }
  for (auto it = asks_waiting_.begin(); it != asks_waiting_.end();) {
    if (it->deadline > now) {
      ++it;
      continue;
    }
    answered_.emplace_back(std::move(*it), make_error("not connected before the deadline"));
    it = asks_waiting_.erase(it);
  }
  return std::exchange(answered_, {});
}

ucs_status_t Session::on_ask(void* arg, const void* header, std::size_t header_length, void* data,
                             std::size_t length, const ucp_am_recv_param_t* p) {
  auto* s = static_cast<Session*>(arg);
  const auto h = wire::read<wire::AskHeader>(header, header_length);
  if (!h || (p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || length > wire::kMaxAskBytes) {
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

ucs_status_t Session::on_answer(void* arg, const void* header, std::size_t header_length,
                                void* data, std::size_t length, const ucp_am_recv_param_t* p) {
  auto* s = static_cast<Session*>(arg);
  const auto h = wire::read<wire::AskHeader>(header, header_length);
  if (!h || (p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) return UCS_OK;
  const auto it = s->asks_.find(h->id);
  if (it == s->asks_.end()) return UCS_OK;  // expired already
  const auto* bytes = static_cast<const std::byte*>(data);
  if (h->code == 0) {
    s->answered_.emplace_back(std::move(it->second), std::vector<std::byte>(bytes, bytes + length));
  } else {
    const std::string text(reinterpret_cast<const char*>(bytes), std::min<std::size_t>(length, 1024));
    s->answered_.emplace_back(std::move(it->second),
                              make_error(h->code == 1 ? "the peer answers no asks"
                                                      : "the peer could not answer: " + text));
  }
  s->asks_.erase(it);
  return UCS_OK;
}

}  // namespace kvnode::transfer
