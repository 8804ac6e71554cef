// An in-process stand-in for the transfer plane behind transfer::PeerTransport, so the move and
// retrieve state machines run without UCX and with the faults a real network produces only by
// chance. A FakeNetwork knows each node by its url: its chunk pool (push and pull memcpy pages
// between pools) and its ask handler (a PeerService's on_ask). Every call first asks the
// network's `fault` hook what goes wrong with it, and may run test code there (freeze a node,
// evict a chunk) before the call happens.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/gpu/chunk_pool.hpp"
#include "kvnode/node/peer_moves.hpp"
#include "kvnode/transfer/peer_transport.hpp"
#include "peer_protocol.hpp"
#include "peer_service.hpp"

namespace kvnode::node::fake {

enum class Kind { kPull, kPush, kAsk };

struct Call {
  std::string from{};
  std::string to{};
  Kind kind = Kind::kAsk;
  std::size_t nth = 0;                   // this call's number among all calls, from 0
  std::span<const std::byte> request{};  // kAsk: the encoded request
  std::size_t pages = 0;                 // kPull, kPush
};

struct Fault {
  enum class What {
    kNone,
    kUnreachable,  // nothing reaches the peer: kPeerLost, nothing done
    kAnswerLost,   // the peer acts (an ask is answered there, pages are copied), the caller
                   // hears nothing before its deadline: kDeadline / kTimeout, nothing reported done
    kPartial,      // push/pull: only the first `done` pages arrive (or those `arrive` names),
                   // then the peer is lost
  };
  What what = What::kNone;
  std::size_t done = 0;
  std::vector<std::uint8_t> arrive{};  // kPartial: when not empty, page i arrives iff arrive[i]
};

class FakeNetwork {
 public:
  using AskHandler = std::function<Result<std::vector<std::byte>>(const std::string& peer,
                                                                  std::span<const std::byte>)>;

  void add(const std::string& url, gpu::ChunkPool& pool, AskHandler on_ask);
  // A node that stops answering (down) or answers again.
  void set_down(const std::string& url, bool down);
  // This node's view of the network.
  std::unique_ptr<transfer::PeerTransport> transport(const std::string& url);

  // Consulted before every call (unset: nothing goes wrong).
  std::function<Fault(const Call&)> fault{};

  std::size_t calls(Kind kind) const;

  // What a transport calls (public for FakeTransport).
  transfer::TransferResult copy(const std::string& from, const std::string& to, Kind kind,
                                const std::vector<transfer::PageCopy>& pages);
  Result<std::vector<std::byte>> ask(const std::string& from, const std::string& to,
                                     const std::vector<std::byte>& request);

 private:
  struct Node {
    gpu::ChunkPool* pool = nullptr;
    AskHandler on_ask{};
    bool down = false;
  };
  // The node at `url` unless it is down or unknown; the fault for this call.
  Fault begin(Call& call, Node* node_out, bool* reachable);

  mutable std::mutex mutex_;
  std::map<std::string, Node> nodes_;
  std::size_t calls_ = 0;
  std::map<Kind, std::size_t> per_kind_;
};

// The op of an ask (nullopt for a pull, a push, or a request that does not decode).
std::optional<peer::Op> op_of(const Call& call);
// A fault hook: `f` for the `n`-th (from 0) call of `kind` (and, for asks, of `op`), none else.
std::function<Fault(const Call&)> at(Kind kind, std::size_t n, Fault f,
                                     std::optional<peer::Op> op = std::nullopt);

// A node as the daemon assembles it for peers, over a FakeNetwork: a host pool of `pages`
// chunks of 4 KiB, its store (ADMITs counted), engine (4 tokens a chunk), peer service and moves.
// The state hooks forward to on_move_state / on_retrieve_state, and the service's race hook to
// before_reserve, which a test may set any time.
struct FakeNode {
  static constexpr std::size_t kPageBytes = 4096;
  static constexpr std::size_t kTokensPerChunk = 4;

  FakeNode(FakeNetwork& network, std::string url, std::size_t pages, PeerMovesOptions options = {},
           std::chrono::milliseconds ttl = std::chrono::seconds(60));
  // Stores `h` with its pattern bytes; whether it is readable here with exactly those bytes.
  bool put(ChunkHash h);
  bool intact(ChunkHash h);

  std::string url;
  gpu::ChunkPool pool;
  std::atomic<std::size_t> admits{0};
  ChunkStore store;
  Engine engine;
  std::function<void(ChunkHash)> before_reserve{};
  PeerService service;
  std::unique_ptr<transfer::PeerTransport> transport;
  std::function<void(MoveState)> on_move_state{};
  std::function<void(RetrieveState)> on_retrieve_state{};
  PeerMoves moves;

 private:
  static gpu::ChunkPool make_pool(std::size_t pages);
  static EngineOptions engine_options();
  PeerMovesOptions hooked(PeerMovesOptions o);
  PeerServiceOptions service_options(std::chrono::milliseconds ttl);
};

// A chunk's bytes, a function of its hash.
std::vector<std::byte> pattern(ChunkHash h, std::size_t size = FakeNode::kPageBytes);

}  // namespace kvnode::node::fake
