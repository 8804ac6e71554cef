// Session, the staging half both roles share: slots of the staging ring and the copies between
// chunk pages and slots (and, for a device pool UCX registered directly, the copies of eager
// payloads into its pages). What follows when a copy lands is the role's: landed() in
// session_initiator.cpp (finish a pulled run, send a pushed one) and session_acceptor.cpp (send a
// served run, acknowledge a pushed one).
#include "session.hpp"

namespace kvnode::transfer {

// ---- Staging ----------------------------------------------------------------------------------

bool Session::needs_slot(const Deferred& d) const {
  if (!staging_) return false;
  return d.kind == OpKind::kPullRecv || d.kind == OpKind::kServeRecv ||
         d.kind == OpKind::kPushStage || d.kind == OpKind::kServeStage;
}

std::optional<gpu::PageId> Session::take_slot() {
  return staging_->ring->allocate();
}

void Session::give_slot(gpu::PageId slot) {
  (void)staging_->ring->release(slot);
}

void Session::start_copy(Copy copy, void* dst, const void* src, std::size_t bytes) {
  Result<gpu::CopyEngine::Ticket> ticket = engine_of(copy)->copy(dst, src, bytes);
  if (!ticket) return landed(copy, Status{ticket.error()});
  copy.ticket = *ticket;
  copies_.push_back(copy);
}

unsigned Session::poll_copies() {
  unsigned n = 0;
  for (auto it = copies_.begin(); it != copies_.end();) {
    Result<bool> done = engine_of(*it)->done(it->ticket);
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

}  // namespace kvnode::transfer
