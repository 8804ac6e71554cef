#include "kvnode/node/peer_moves.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>

#include "kvnode/keys/chunk_hash.hpp"
#include "move_source.hpp"
#include "retrieve.hpp"

namespace kvnode::node {

const char* to_string(MoveState s) {
  switch (s) {
    case MoveState::kLeaseLocal:
      return "lease_local";
    case MoveState::kReserve:
      return "reserve";
    case MoveState::kWaitThaw:
      return "wait_thaw";
    case MoveState::kPush:
      return "push";
    case MoveState::kFinish:
      return "finish";
    case MoveState::kNextBatch:
      return "next_batch";
    case MoveState::kCheckHolds:
      return "check_holds";
    case MoveState::kEvictSource:
      return "evict_source";
    case MoveState::kDone:
      return "done";
    case MoveState::kFailed:
      return "failed";
  }
  return "unknown";
}

const char* to_string(RetrieveState s) {
  switch (s) {
    case RetrieveState::kLocate:
      return "locate";
    case RetrieveState::kLeaseRemote:
      return "lease_remote";
    case RetrieveState::kReserveLocal:
      return "reserve_local";
    case RetrieveState::kPull:
      return "pull";
    case RetrieveState::kCommitLocal:
      return "commit_local";
    case RetrieveState::kUnlease:
      return "unlease";
    case RetrieveState::kDone:
      return "done";
    case RetrieveState::kFailed:
      return "failed";
  }
  return "unknown";
}

Locate locate_through(std::function<Result<wire::Msg>(const wire::Msg&)> call, std::string instance,
                      std::int64_t rank) {
  return [call = std::move(call), instance = std::move(instance), rank](
             const std::vector<ChunkHash>& hashes) -> Result<std::pair<std::string, std::size_t>> {
    wire::BatchedP2PLookupMsg q{{}, instance, rank};
    for (ChunkHash h : hashes) q.hashes.emplace_back(h);
    Result<wire::Msg> r = call(q);
    if (!r) return wrap_error("P2P lookup: ", std::move(r).error());
    if (const auto* e = std::get_if<wire::ErrorMsg>(&*r))
      return make_error(ErrorCode::kRefused, "P2P lookup: the controller refused: " + e->error);
    // The controller answers a lookup with one layout, empty when nobody holds the chunks:
    // another message, or none, is a malformed answer.
    const auto* ret = std::get_if<wire::BatchedP2PLookupRetMsg>(&*r);
    if (!ret || ret->layout_info.empty())
      return make_error(ErrorCode::kInternal,
                        "P2P lookup: the controller's answer holds no layout");
    const wire::P2PLayout& l = ret->layout_info[0];
    return std::make_pair(l.peer_init_url,
                          static_cast<std::size_t>(std::max<std::int64_t>(0, l.num_hit_chunks)));
  };
}

void StopSignal::stop() {
  {
    std::lock_guard lock(mutex_);  // a waiter between its check and its wait still wakes
    stopped_ = true;
  }
  wake_.notify_all();
}

bool StopSignal::wait_for(std::chrono::steady_clock::duration d) const {
  std::unique_lock lock(mutex_);
  return wake_.wait_for(lock, d, [this] { return stopped_.load(); });
}

PeerMoves::PeerMoves(Engine& engine, transfer::PeerTransport& transport, PeerMovesOptions options)
    : engine_(engine),
      transport_(transport),
      options_(std::move(options)),
      next_move_(std::uint64_t{std::random_device{}()} << 32 | std::random_device{}()) {
  options_.batch = std::clamp<std::size_t>(options_.batch, 1, peer::kMaxChunks);
}

MoveResult PeerMoves::move(const std::string& peer_url, const std::vector<std::int64_t>& tokens,
                           bool copy) {
  return MoveSource(engine_, transport_, options_, stop_, next_move_++, peer_url, tokens, copy)
      .run();
}

RetrieveResult PeerMoves::retrieve(const std::vector<std::int64_t>& tokens, const Locate& locate) {
  Result<std::vector<ChunkHash>> hashes = engine_.hashes(tokens);
  if (!hashes) {
    RetrieveResult out;
    out.error = hashes.error().message;
    return out;
  }
  RetrieveResult out = retrieve_chunks(*hashes, locate);
  const std::size_t held = out.chunks_local + out.chunks_pulled;
  out.tokens = held == 0 ? 0 : keys::chunk_end_token(held - 1, tokens.size(), engine_.chunk_size());
  return out;
}

RetrieveResult PeerMoves::retrieve_chunks(const std::vector<ChunkHash>& wanted,
                                          const Locate& locate) {
  return Retrieve(engine_, transport_, options_, stop_, wanted, locate).run();
}

wire::Msg PeerMoves::on_move(const wire::MoveWorkerMsg& m) {
  if (m.new_position.location != "LocalCPUBackend")
    return wire::ErrorMsg{"kvnode: moves go to LocalCPUBackend, not " + m.new_position.location};
  if (m.old_position != engine_.location()) return wire::MoveWorkerRetMsg{0};
  const MoveResult r = move(m.new_position.target, m.tokens.value_or(std::vector<std::int64_t>{}),
                            m.copy.value_or(true));
  if (r.refused) {
    spdlog::warn("move {} refused: {}", m.worker_event_id, r.error);
    return wire::ErrorMsg{"kvnode: move refused: " + r.error};
  }
  spdlog::info("move {} to {}: {} chunks sent, {} already there, {} failed{}{}", m.worker_event_id,
               m.new_position.target, r.chunks_sent, r.chunks_present, r.chunks_failed,
               r.error.empty() ? "" : ": ", r.error);
  return wire::MoveWorkerRetMsg{static_cast<std::int64_t>(r.tokens_confirmed)};
}

}  // namespace kvnode::node
