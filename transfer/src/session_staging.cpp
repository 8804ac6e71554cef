// Session, the staging half: slots of the staging ring, the copies between chunk pages and
// slots, and what follows when a copy lands (send the slot, finish the run, acknowledge a push).
#include <spdlog/spdlog.h>

#include "session.hpp"

namespace kvnode::transfer {

// ---- Staging ----------------------------------------------------------------------------------

bool Session::needs_slot(const Deferred& d) const {
  if (!staging_) return false;
  return d.kind == OpKind::kPullRecv || d.kind == OpKind::kServeRecv ||
         d.kind == OpKind::kPushStage || d.kind == OpKind::kServeStage;
}

std::optional<gpu::PageId> Session::take_slot() { return staging_->ring->allocate(); }

void Session::give_slot(gpu::PageId slot) { (void)staging_->ring->release(slot); }

void Session::start_copy(Copy copy, void* dst, const void* src, std::size_t bytes) {
  Result<gpu::CopyEngine::Ticket> ticket = staging_->engine->copy(dst, src, bytes);
  if (!ticket) return landed(copy, Status{ticket.error()});
  copy.ticket = *ticket;
  copies_.push_back(copy);
}

unsigned Session::poll_copies() {
  unsigned n = 0;
  for (auto it = copies_.begin(); it != copies_.end();) {
    Result<bool> done = staging_->engine->done(it->ticket);
    if (done && !*done) {
      ++it;
      continue;
    }
    Copy c = *it;
    it = copies_.erase(it);
    landed(c, done ? Status{} : Status{done.error()});
    ++n;
  }
  return n;
}

void Session::landed(Copy& c, const Status& status) {
  ucp_request_param_t param{};
  switch (c.kind) {
    case CopyKind::kPullLanded: {
      if (c.slot) give_slot(*c.slot);
      Xfer* x = find(c.xfer);
      if (!x) break;
      if (status)
        x->finish_run(c.run);
      else
        x->fail_run(c.run, Failure::kRejected, "copying into the local page: " + status.error().message);
      break;
    }
    case CopyKind::kPushStaged: {
      Xfer* x = find(c.xfer);
      if (!x || !status || x->run_state[c.run] != 0) {
        give_slot(*c.slot);
        if (x && !status)
          x->fail_run(c.run, Failure::kRejected, "copying out of the local page: " + status.error().message);
        break;
      }
      const Run& run = x->plan.runs[c.run];
      Op& op = ops_.emplace_back(Op(OpKind::kPushSend, x->id, c.run));
      op.push = wire::PushHeader{x->id, wire::RunRequest{c.run, run.remote, run.count}};
      op.slot = c.slot;
      settle(ucp_am_send_nbx(endpoint_->get(), wire::kPushData, &op.push, sizeof(op.push),
                             slot_bytes(*c.slot), pool_.page_bytes, &param));
      break;
    }
    case CopyKind::kServeStaged: {
      if (!status) {
        give_slot(*c.slot);
        send_run_header(OpKind::kAck, wire::kPullReject,
                        {c.header.transfer, c.header.run, wire::kMalformed}, status.error().message);
        break;
      }
      Op& op = ops_.emplace_back(Op(OpKind::kServeSend));
      op.run_header = c.header;
      op.runs = {c.target};
      op.slot = c.slot;
      settle(ucp_am_send_nbx(endpoint_->get(), wire::kPullData, &op.run_header,
                             sizeof(op.run_header), slot_bytes(*c.slot), pool_.page_bytes, &param));
      break;
    }
    case CopyKind::kServeLanded: {
      if (c.slot) give_slot(*c.slot);
      if (status) {
        serve_.bytes += span_bytes(c.target.count);
        std::vector<gpu::PageId> pages(c.target.count);
        for (std::uint32_t i = 0; i < c.target.count; ++i) pages[i] = c.target.first + i;
        written_.push_back(std::move(pages));
      }
      send_run_header(OpKind::kAck, wire::kPushAck,
                      {c.header.transfer, c.header.run, status ? wire::kOk : wire::kMalformed},
                      status ? "" : status.error().message);
      break;
    }
  }
}

}  // namespace kvnode::transfer
