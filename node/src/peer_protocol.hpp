// The peer protocol: what two nodes say through PeerTransport::ask() around a move (source ->
// destination) and a retrieve (requester -> holder). One struct per request and per answer, a
// named outcome per chunk, one codec (no I/O: peer_client.hpp sends them and checks the answers);
// the states that use them are in peer_moves.hpp.
//
// Wire format, both ways, little-endian, every length checked before anything is allocated:
//   [version u8 = 0xA2][op u8][count u16 <= kMaxChunks][move u64: kReserve, kFinish][count items]
// The version byte lies outside the ops 1-6 the first protocol began with, so a node of either
// kind refuses the other's message (kInvalid) instead of misreading it. Items, per op:
//   kReserve  request: hash i64               answer: outcome u8 (ReserveOutcome), page u32
//   kFinish   request: hash i64, whole u8     answer: outcome u8 (FinishOutcome)
//   kLease    request: hash i64               answer: page u32 (the leading chunks leased)
//   kUnlease  request: hash i64               answer: none (count 0)
//   kHolds    request: hash i64               answer: held u8 (0 or 1)
// An answer carries its request's op, and as many items (kLease: at most as many). `move` names
// the source's move: a reservation is its move's alone, so two moves from one peer never write,
// commit or release each other's pages.
//
// Why the destination commits on kFinish and not on the plane's "written" notice
// (PlaneOptions::on_written, left uninstalled): the source must learn, per chunk, whether the
// commit happened, because only a chunk stored there may leave the source (copy=false) and a
// chunk whose commit a full sync refused must be pushed again; a notice has no answer, so a
// commit from it would still need an ask to learn its outcome, saving nothing. The notice is also
// heard only on sessions the destination accepted (a session it dialed itself carries none), so a
// chunk pushed over such a session would never be committed; and it names pages, not chunks.
// kFinish folds commit and release into the one ask after a push: a batch costs two asks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/gpu/chunk_pool.hpp"
#include "kvnode/node/chunk_store.hpp"

namespace kvnode::node::peer {

enum class Version : std::uint8_t { kV2 = 0xA2 };
// In the variants' order below: Op(i + 1) is alternative i.
enum class Op : std::uint8_t { kReserve = 1, kFinish, kLease, kUnlease, kHolds };
inline constexpr std::size_t kMaxChunks = 256;  // per request: 256 * 9 bytes fit an 8 KiB ask

// Destination: pages for the chunks it lacks (a source's push goes there).
struct ReserveRequest {
  std::uint64_t move = 0;  // the source's id for this move
  std::vector<ChunkHash> hashes{};
};
enum class ReserveOutcome : std::uint8_t {
  kPage,    // a page reserved for this move (the same one again if it had reserved it already)
  kHave,    // the chunk is readable there already
  kNoRoom,  // every page is pinned, leased or being written
  kFrozen,  // a full sync runs there: ask again shortly
  kBusy,    // another writer (a local client, another move) is storing the chunk
};
struct Reserved {
  ReserveOutcome outcome = ReserveOutcome::kNoRoom;
  gpu::PageId page = 0;  // kPage only
};
struct ReserveAnswer {
  std::vector<Reserved> chunks{};
};

// Destination, after a push: commit the chunks pushed whole, release the others.
struct FinishItem {
  ChunkHash hash = 0;
  bool whole = false;  // every byte arrived (the push reported it done)
};
struct FinishRequest {
  std::uint64_t move = 0;
  std::vector<FinishItem> chunks{};
};
enum class FinishOutcome : std::uint8_t {
  kStored,    // readable there now (committed, or stored already)
  kFrozen,    // a full sync began: the page went back; push again once it ends
  kLost,      // not stored: the move's reservation had expired, or the commit failed
  kReleased,  // not whole: the page went back
};
struct FinishAnswer {
  std::vector<FinishOutcome> chunks{};
};

// Holder: keep the leading chunks of the request readable and in place while a peer reads them.
struct LeaseRequest {
  std::vector<ChunkHash> hashes{};
};
struct LeaseAnswer {
  std::vector<gpu::PageId> pages{};  // the leading chunks leased, in order; stops at a miss
};
struct UnleaseRequest {
  std::vector<ChunkHash> hashes{};
};
struct UnleaseAnswer {};
// Destination, at the end of a move: which chunks are readable there now.
struct HoldsRequest {
  std::vector<ChunkHash> hashes{};
};
struct HoldsAnswer {
  std::vector<std::uint8_t> held{};  // 1: readable there
};

using Request =
    std::variant<ReserveRequest, FinishRequest, LeaseRequest, UnleaseRequest, HoldsRequest>;
using Answer = std::variant<ReserveAnswer, FinishAnswer, LeaseAnswer, UnleaseAnswer, HoldsAnswer>;

const char* to_string(Op op);
const char* to_string(ReserveOutcome o);
const char* to_string(FinishOutcome o);

Op op_of(const Request& r);
Op op_of(const Answer& a);
std::vector<std::byte> encode(const Request& r);
std::vector<std::byte> encode(const Answer& a);
// Errors: kInvalid (a wrong version, op, outcome, count or length).
Result<Request> decode_request(std::span<const std::byte> bytes);
Result<Answer> decode_answer(std::span<const std::byte> bytes);
// Whether `a` answers `r`: the same op, and as many items (a lease: at most as many). kInvalid.
Status answers(const Request& r, const Answer& a);

}  // namespace kvnode::node::peer
