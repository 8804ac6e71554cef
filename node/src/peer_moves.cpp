#include "kvnode/node/peer_moves.hpp"

#include <algorithm>
#include <thread>

#include <spdlog/spdlog.h>

#include <cstring>

#include "peer_address.hpp"

namespace kvnode::node {
namespace {

using Clock = std::chrono::steady_clock;

// Ask format: [op u8][count u32][value i64 x count], little-endian; the answer: [count u32][i64 x count].
enum Op : std::uint8_t { kReserve = 1, kCommit = 2, kRelease = 3, kLease = 4, kUnlease = 5, kHolds = 6 };
constexpr std::int64_t kHave = -1;     // reserve: the destination holds the chunk already
constexpr std::int64_t kNoRoom = -2;   // reserve: no page free (all pinned or busy)
constexpr std::int64_t kFrozen = -3;   // reserve, commit: a full sync runs there; ask again shortly
// How long a move waits for a destination in a full sync (a node's first one comes seconds
// after it starts) before the chunks count as failed.
constexpr auto kFrozenWait = std::chrono::seconds(20);

std::vector<std::byte> encode(std::uint8_t op, const std::vector<std::int64_t>& values) {
  std::vector<std::byte> out(1 + 4 + 8 * values.size());
  out[0] = static_cast<std::byte>(op);
  const auto n = static_cast<std::uint32_t>(values.size());
  std::memcpy(out.data() + 1, &n, 4);
  if (!values.empty()) std::memcpy(out.data() + 5, values.data(), 8 * values.size());
  return out;
}

std::vector<std::byte> encode_answer(const std::vector<std::int64_t>& values) {
  std::vector<std::byte> out(4 + 8 * values.size());
  const auto n = static_cast<std::uint32_t>(values.size());
  std::memcpy(out.data(), &n, 4);
  if (!values.empty()) std::memcpy(out.data() + 4, values.data(), 8 * values.size());
  return out;
}

Result<std::vector<std::int64_t>> decode_values(const std::byte* p, std::size_t size) {
  if (size < 4) return make_error("shorter than its count");
  std::uint32_t n = 0;
  std::memcpy(&n, p, 4);
  if (n > PeerMoves::kBatch) return make_error("more than 256 values");
  if (size != 4 + 8 * static_cast<std::size_t>(n)) return make_error("its length does not match its count");
  std::vector<std::int64_t> v(n);
  if (n) std::memcpy(v.data(), p + 4, 8 * static_cast<std::size_t>(n));
  return v;
}

}  // namespace

Locate locate_through(std::function<Result<wire::Msg>(const wire::Msg&)> call, std::string instance,
                      std::int64_t rank) {
  return [call = std::move(call), instance = std::move(instance),
          rank](const std::vector<ChunkHash>& hashes) -> Result<std::pair<std::string, std::size_t>> {
    wire::BatchedP2PLookupMsg q{{}, instance, rank};
    for (ChunkHash h : hashes) q.hashes.emplace_back(h);
    Result<wire::Msg> r = call(q);
    if (!r) return make_error("P2P lookup: " + r.error().message);
    const auto* ret = std::get_if<wire::BatchedP2PLookupRetMsg>(&*r);
    if (!ret || ret->layout_info.empty()) return make_error("P2P lookup: no answer from the controller");
    const wire::P2PLayout& l = ret->layout_info[0];
    return std::make_pair(l.peer_init_url, static_cast<std::size_t>(std::max<std::int64_t>(0, l.num_hit_chunks)));
  };
}

PeerMoves::PeerMoves(Engine& engine, transfer::TransferPlane* plane, std::chrono::seconds ttl)
    : engine_(engine), plane_(plane), ttl_(ttl) {}

void PeerMoves::expire_reservations() {
  const auto now = Clock::now();
  for (auto it = reserved_.begin(); it != reserved_.end();) {
    if (it->second.expires > now) {
      ++it;
      continue;
    }
    spdlog::warn("move from {}: reservation of chunk {} expired", it->second.peer, it->first);
    engine_.store().abort(it->first);
    it = reserved_.erase(it);
  }
  for (auto it = leased_.begin(); it != leased_.end();) {
    if (it->second.expires > now) {
      ++it;
      continue;
    }
    spdlog::warn("retrieval by {}: lease of chunk {} expired", it->first.first, it->first.second);
    it = leased_.erase(it);
  }
}

Result<std::vector<std::byte>> PeerMoves::on_ask(const std::string& peer,
                                                 const std::vector<std::byte>& request) {
  if (request.empty()) return make_error("empty request");
  Result<std::vector<std::int64_t>> values = decode_values(request.data() + 1, request.size() - 1);
  if (!values) return make_error("bad request: " + values.error().message);
  std::lock_guard lock(mutex_);
  expire_reservations();
  ChunkStore& store = engine_.store();
  std::vector<std::int64_t> answer;
  switch (static_cast<std::uint8_t>(request[0])) {
    case kReserve:
      for (std::int64_t h : *values) {
        if (store.contains(h)) {
          answer.push_back(kHave);
          continue;
        }
        Result<gpu::PageId> page = store.reserve(h);
        if (!page) {
          answer.push_back(page.error().message == ChunkStore::kFrozenText ? kFrozen : kNoRoom);
          continue;
        }
        reserved_[h] = Reservation{peer, Clock::now() + ttl_};
        answer.push_back(*page);
      }
      break;
    case kCommit:
      for (std::int64_t h : *values) {
        const auto it = reserved_.find(h);
        const bool mine = it != reserved_.end() && it->second.peer == peer;
        const Status stored = mine ? store.commit(h) : Status(make_error("not reserved"));
        if (mine) reserved_.erase(it);
        if (stored || store.contains(h))
          answer.push_back(1);
        else
          answer.push_back(stored.error().message == ChunkStore::kFrozenText ? kFrozen : 0);
      }
      break;
    case kRelease:
      for (std::int64_t h : *values) {
        const auto it = reserved_.find(h);
        if (it == reserved_.end() || it->second.peer != peer) continue;
        store.abort(h);
        reserved_.erase(it);
      }
      break;
    case kLease:  // the leading chunks the peer may read now: their pages, held till kUnlease
      for (std::int64_t h : *values) {
        std::optional<Lease> lease = store.lease(h);
        if (!lease) break;
        answer.push_back(lease->page());
        leased_.erase({peer, h});
        leased_.emplace(std::make_pair(peer, h), Held{std::move(*lease), Clock::now() + ttl_});
      }
      break;
    case kUnlease:
      for (std::int64_t h : *values) leased_.erase({peer, h});
      break;
    case kHolds:  // 1 for each chunk readable here now
      for (std::int64_t h : *values) answer.push_back(store.contains(h) ? 1 : 0);
      break;
    default:
      return make_error("unknown request");
  }
  return encode_answer(answer);
}

Result<std::vector<std::int64_t>> PeerMoves::ask(const std::string& peer_url, std::uint8_t op,
                                                 const std::vector<std::int64_t>& values) {
  Result<std::vector<std::byte>> a = plane_->ask(peer_url, encode(op, values)).get();
  if (!a) return a.error();
  Result<std::vector<std::int64_t>> answer = decode_values(a->data(), a->size());
  if (!answer) return make_error("the destination's answer: " + answer.error().message);
  if (op != kRelease && answer->size() != values.size())
    return make_error("the destination answered a different count");
  return answer;
}

// One batch to the destination: reserve (waiting out a full sync there), push, commit what
// arrived whole, release the rest. Per chunk: kHave (was there), 1 (stored), 0 (not), kFrozen (a
// full sync began before the commit: the destination dropped it; worth another try).
PeerMoves::BatchOutcome PeerMoves::send_batch(const std::string& peer_url, std::span<const Lease> leases,
                                             Clock::time_point frozen_until) {
  BatchOutcome out;
  const std::size_t n = leases.size();
  std::vector<std::int64_t> batch;
  for (const Lease& l : leases) batch.push_back(l.hash());
  out.state.assign(n, 0);
  Result<std::vector<std::int64_t>> pages = ask(peer_url, kReserve, batch);
  while (pages && Clock::now() < frozen_until &&
         std::find(pages->begin(), pages->end(), kFrozen) != pages->end()) {
    std::vector<std::int64_t> reserved;  // give back what was reserved before asking again
    for (std::size_t i = 0; i < n; ++i)
      if ((*pages)[i] >= 0) reserved.push_back(batch[i]);
    if (!reserved.empty()) (void)ask(peer_url, kRelease, reserved);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pages = ask(peer_url, kReserve, batch);
  }
  if (!pages) {
    out.error = pages.error().message;
    return out;
  }
  std::vector<transfer::PageCopy> copies;
  std::vector<std::size_t> sent;  // batch indices pushed
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t p = (*pages)[i];
    if (p == kHave) {
      out.state[i] = kHave;
    } else if (p >= 0 && p <= static_cast<std::int64_t>(UINT32_MAX)) {
      copies.push_back({leases[i].page(), static_cast<gpu::PageId>(p)});
      sent.push_back(i);
    }
  }
  if (copies.empty()) return out;
  const transfer::TransferResult r = plane_->push(peer_url, copies).get();
  if (!r.ok()) out.error = std::string(transfer::to_string(r.failure)) + ": " + r.message;
  out.bytes = r.stats.bytes;
  std::vector<std::int64_t> to_commit, to_release;
  std::vector<std::size_t> committing;
  for (std::size_t k = 0; k < sent.size(); ++k) {
    const bool whole = k < r.done.size() && r.done[k];
    (whole ? to_commit : to_release).push_back(batch[sent[k]]);
    if (whole) committing.push_back(sent[k]);
  }
  if (!to_commit.empty()) {
    Result<std::vector<std::int64_t>> c = ask(peer_url, kCommit, to_commit);
    if (!c) out.error = c.error().message;
    for (std::size_t k = 0; c && k < committing.size(); ++k)
      out.state[committing[k]] = (*c)[k] == 1 || (*c)[k] == kFrozen ? (*c)[k] : 0;
  }
  if (!to_release.empty()) (void)ask(peer_url, kRelease, to_release);
  return out;
}

MoveResult PeerMoves::move(const std::string& peer_url, const std::vector<std::int64_t>& tokens,
                           bool copy) {
  MoveResult out;
  Result<std::vector<ChunkHash>> hashes = engine_.hashes(tokens);
  if (!hashes || !plane_) {
    out.error = hashes ? "no transfer plane" : hashes.error().message;
    return out;
  }
  if (names_own_listener(peer_url, plane_->url())) {
    out.refused = true;
    out.error = "the destination " + peer_url + " is this node itself (its peer_init_url is " + plane_->url() +
                "); nothing moved, every chunk stays";
    return out;
  }
  ChunkStore& store = engine_.store();
  // Leases keep the chunks from being evicted or freed while they are read.
  std::vector<Lease> leases = store.lease_leading(*hashes);
  std::vector<ChunkHash> confirmed;  // in order: the leading run the destination holds
  for (std::size_t start = 0; start < leases.size(); start += kBatch) {
    const std::span<const Lease> slice(leases.data() + start, std::min(kBatch, leases.size() - start));
    const auto frozen_until = Clock::now() + kFrozenWait;
    BatchOutcome b = send_batch(peer_url, slice, frozen_until);
    // A full sync began at the destination mid-batch: it dropped the commits; push again.
    while (Clock::now() < frozen_until && std::find(b.state.begin(), b.state.end(), kFrozen) != b.state.end()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      BatchOutcome again = send_batch(peer_url, slice, frozen_until);
      for (std::size_t i = 0; i < again.state.size(); ++i)
        if (b.state[i] != 1) b.state[i] = again.state[i];  // what was stored stays counted as sent
      b.bytes += again.bytes;
      b.error = again.error;
    }
    out.bytes += b.bytes;
    if (!b.error.empty()) out.error = b.error;
    // Walk the batch in order: what the destination now holds, and where the run breaks.
    bool gap = false;
    for (std::size_t i = 0; i < slice.size(); ++i) {
      const bool ok = b.state[i] == 1 || b.state[i] == kHave;
      if (b.state[i] == 1) ++out.chunks_sent;
      else if (ok) ++out.chunks_present;
      else ++out.chunks_failed;
      gap = gap || !ok;
      if (!gap) {
        confirmed.push_back(slice[i].hash());
        out.tokens_confirmed = keys::chunk_end_token(start + i, tokens.size(), engine_.chunk_size());
      }
    }
    // The prefix breaks here: later rounds could only scatter chunks no node holds a usable
    // prefix of, so stop (the rest stays at the source).
    if (gap) {
      out.chunks_failed += leases.size() - start - slice.size();
      break;
    }
  }
  leases.clear();
  // The destination may have evicted a confirmed chunk since (its pool full, a later batch's
  // reservations): what it holds now, from the first, is what moved.
  std::size_t held = 0;
  for (std::size_t start = 0; start < confirmed.size() && held == start; start += kBatch) {
    const std::vector<std::int64_t> batch(confirmed.begin() + static_cast<std::ptrdiff_t>(start),
                                          confirmed.begin() + static_cast<std::ptrdiff_t>(
                                                                  std::min(confirmed.size(), start + kBatch)));
    Result<std::vector<std::int64_t>> holds = ask(peer_url, kHolds, batch);
    if (!holds) {
      out.error = "checking what the destination holds: " + holds.error().message;
      break;
    }
    while (held - start < batch.size() && (*holds)[held - start] == 1) ++held;
  }
  if (held < confirmed.size()) {
    spdlog::warn("move to {}: the destination no longer holds {} of the {} chunks it confirmed", peer_url,
                 confirmed.size() - held, confirmed.size());
    out.chunks_failed += confirmed.size() - held;
    out.chunks_sent -= std::min(out.chunks_sent, confirmed.size() - held);
    out.tokens_confirmed =
        held == 0 ? 0 : keys::chunk_end_token(held - 1, tokens.size(), engine_.chunk_size());
    confirmed.resize(held);
  }
  if (!copy) {
    std::size_t later = 0, kept = 0;  // EVICT only the leading run the destination holds
    for (ChunkHash h : confirmed) {
      const ChunkStore::Removal r = store.remove_or_defer(h);
      later += r == ChunkStore::Removal::kWhenThawed ? 1 : 0;
      kept += r == ChunkStore::Removal::kRefused ? 1 : 0;
    }
    if (later)
      spdlog::info("move to {}: a full sync runs here; {} moved chunks leave this node when it ends", peer_url, later);
    if (kept) spdlog::warn("move to {}: {} chunks stay here too (pinned or gone since)", peer_url, kept);
  }
  return out;
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

RetrieveResult PeerMoves::retrieve_chunks(const std::vector<ChunkHash>& wanted, const Locate& locate) {
  RetrieveResult out;
  if (!plane_) {
    out.error = "no transfer plane";
    return out;
  }
  ChunkStore& store = engine_.store();
  out.chunks_local = store.leading(wanted);
  std::size_t held = out.chunks_local;
  if (held == wanted.size()) return out;
  // Pages for the pulled chunks evict only chunks older than this retrieve: never the local
  // prefix (refreshed now) nor what an earlier batch pulled.
  const std::uint64_t since = store.tick();
  for (std::size_t i = 0; i < held; ++i) (void)store.refresh(wanted[i]);
  // Ask for the run this node lacks, from its first missing chunk: the controller counts hits
  // from the first hash asked and leaves the asker out, so asking for the whole prefix finds
  // nobody when this node holds its start.
  const std::vector<ChunkHash> missing(wanted.begin() + static_cast<std::ptrdiff_t>(held), wanted.end());
  Result<std::pair<std::string, std::size_t>> where = locate(missing);
  if (!where || where->second == 0 || where->first.empty()) {
    out.error = where ? "no peer holds more of it" : where.error().message;
    return out;
  }
  out.peer = where->first;
  const std::size_t end = std::min(held + where->second, wanted.size());
  while (held < end) {
    const std::size_t n = std::min(kBatch, end - held);
    std::vector<std::int64_t> batch(wanted.begin() + static_cast<std::ptrdiff_t>(held),
                                    wanted.begin() + static_cast<std::ptrdiff_t>(held + n));
    Result<std::vector<std::byte>> a = plane_->ask(out.peer, encode(kLease, batch)).get();
    Result<std::vector<std::int64_t>> remote =
        a ? decode_values(a->data(), a->size()) : Result<std::vector<std::int64_t>>(a.error());
    if (!remote || remote->empty() || remote->size() > n) {
      out.error = remote ? "the peer no longer holds them" : remote.error().message;
      break;
    }
    const std::size_t got = remote->size();
    std::vector<std::int64_t> leased(batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(got));
    std::vector<transfer::PageCopy> copies;
    std::size_t reserved = 0;
    for (; reserved < got; ++reserved) {
      Result<gpu::PageId> page = store.reserve(leased[reserved], since);
      if (!page) {  // no room (or a full sync runs here): pull what fits
        if (reserved == 0) out.error = "no page here: " + page.error().message;
        break;
      }
      copies.push_back({*page, static_cast<gpu::PageId>((*remote)[reserved])});
    }
    transfer::TransferResult r;
    if (!copies.empty()) r = plane_->pull(out.peer, copies).get();
    std::size_t stored = 0;
    for (std::size_t i = 0; i < reserved; ++i) {
      const bool whole = i < r.done.size() && r.done[i] && stored == i;
      if (whole && store.commit(leased[i])) {
        ++stored;
      } else {
        store.abort(leased[i]);
      }
    }
    (void)plane_->ask(out.peer, encode(kUnlease, leased)).get();
    held += stored;
    out.chunks_pulled += stored;
    if (!r.ok() && !copies.empty()) out.error = std::string(transfer::to_string(r.failure)) + ": " + r.message;
    if (stored < n) break;  // the leading run ends here
  }
  return out;
}

wire::Msg PeerMoves::on_move(const wire::MoveWorkerMsg& m) {
  if (m.new_position.location != "LocalCPUBackend")
    return wire::ErrorMsg{"kvnode: moves go to LocalCPUBackend, not " + m.new_position.location};
  if (m.old_position != engine_.store().location())
    return wire::MoveWorkerRetMsg{0};
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
