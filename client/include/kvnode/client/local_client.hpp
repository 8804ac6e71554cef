// The inference engine's handle on the kvnode daemon of its host: put, get, contains and P2P
// retrieve of KV chunks, named by chunk hash or by tokens (hashed by the daemon with LMCache's
// chain), into and out of the caller's memory. Chunk bytes go through the daemon's shared staging
// region (the client writes or reads slots, the daemon copies them to or from its pool; no byte
// crosses the socket); when the client cannot map it, bytes travel over the socket. Large
// requests are split into rounds of as many chunks as the staging region holds.
//
// The socket is a plain AF_UNIX stream (owner-only). connect() fails at once when the node cannot
// be reached, saying why; every call answers within the timeout or fails with
// ErrorCode::kDeadline. A connection the node closed while idle (it restarted) is replaced within
// the call, which then succeeds; one closed while a request was out fails that call with
// kPeerLost (the request is never sent twice), and the next call connects again. A node over its
// connection cap answers kRefused. Errors the node answers keep its code (kFrozen while a full
// sync runs: ask again shortly). One call at a time per client: a call made while another
// thread's call on the same client is in progress fails at once with kInvalid ("busy: ..."); use a
// client per thread. This library links no UCX, ZeroMQ or CUDA: it is what the C and Python
// bindings wrap.
//
//   auto client = kvnode::client::LocalClient::connect("/tmp/kvnode-vllm-0-0.sock").value();
//   const std::size_t n = client->info().chunk_bytes;
//   client->put(kvnode::client::ChunkKeys::of_tokens(tokens), kv_bytes);  // n bytes per chunk
//   std::size_t got = client->get(kvnode::client::ChunkKeys::of_tokens(tokens), out).value();
//
// An engine with a paged KV cache registers it once and then stores and loads by block table:
// see register_kv, store and load below, and the README.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvnode/client/kv_layout.hpp"
#include "kvnode/client/kv_memory.hpp"
#include "kvnode/common/result.hpp"

namespace kvnode::client {

// Chunks named by their hashes, or by the tokens whose chunks they are.
struct ChunkKeys {
  std::vector<std::int64_t> values{};
  bool tokens = false;
  static ChunkKeys of_hashes(std::vector<std::int64_t> h) { return {std::move(h), false}; }
  static ChunkKeys of_tokens(std::vector<std::int64_t> t) { return {std::move(t), true}; }
};

struct NodeInfo {
  std::size_t chunk_bytes = 0;  // bytes per chunk (one pool page)
  std::size_t chunk_size = 0;   // tokens per chunk
  std::size_t pages = 0;
  std::string shm{};  // the staging region's name; "" when bytes go inline
  std::string location{}, instance{};
  std::int64_t worker_id = 0;
  std::string memory{};  // the pool's memory: "host", "pinned" or "device" ("" from older nodes)
  // A sequence's last partial chunk is a chunk of its own (LMCache's save_unfull_chunk): stored,
  // loaded and looked up like the others. Older nodes do not say; they did (true).
  bool save_unfull_chunk = true;
  bool binary_tokens = false;  // the node reads tokens as one binary field (faster for long ones)
  // The chain the node hashes tokens with (LMCache's, see kvnode_client.h): a client that hashes
  // tokens itself and asks by hash needs these. "" from older nodes.
  std::string hash_generation{}, hash_init{};
  std::uint64_t none_hash = 0;
};

struct RetrieveReply {
  std::size_t chunks = 0;       // leading chunks held locally now
  std::size_t pulled = 0;       // of them, pulled from a peer
  std::size_t tokens = 0;       // by tokens: the leading tokens held
  std::string peer{};           // the peer pulled from (peek: the peer holding the most)
  std::size_t peer_tokens = 0;  // peek: the leading tokens `peer` holds (by tokens)
  std::size_t peer_chunks = 0;  // peek: the leading chunks `peer` holds
};

// One logical put made of several put() calls: what the first call learns from the node.
struct PutSeries {
  std::uint64_t since = 0;  // the node's store tick when the put began (0: not begun)
};

// One store or load of an engine's registered KV cache, by block table.
struct KvTransfer {
  std::uint64_t kv = 0;  // what register_kv answered
  ChunkKeys keys{};      // the sequence's tokens (hashed by the node) or its chunk hashes
  // block_ids[i] holds tokens [i * block_size, (i + 1) * block_size) of the sequence.
  std::vector<std::uint32_t> block_ids{};
  std::size_t num_tokens = 0;  // by hashes: tokens in all (the last chunk may be unfull); 0: whole
  bool retrieve = false;       // load: first pull the chunks this node lacks from a peer (P2P)
  // CUDA IPC event handles (cudaIpcGetEventHandle of an interprocess event): the node's copies
  // wait for `wait_event` (record it after the KV writes); with `done_event` the call returns
  // once the copies are queued and the node records it when they land (wait on it before
  // reusing the blocks); without, the call returns when they landed. Use a fresh event (or one
  // whose last record completed) per request. Copies that fail after the early answer are only
  // logged by the node, and a GPU fault may leave the event unsignalled: wait with a timeout.
  // The KV must be on the node's GPU (one node per GPU and rank).
  std::optional<CudaIpcHandle> wait_event{};
  std::optional<CudaIpcHandle> done_event{};
};

struct KvTransferReply {
  std::size_t chunks = 0;  // leading chunks stored (store) or loaded (load)
  std::size_t tokens = 0;  // the tokens they cover
  std::size_t pulled = 0;  // load with retrieve: of them, pulled from a peer
  std::string peer{};
};

struct LocalClientOptions {
  std::chrono::milliseconds timeout{15'000};  // per request (retrieve may cross the network)
  bool use_shared_memory = true;              // false: bytes inline even when the pool is shared
};

class LocalClient {
 public:
  static Result<std::unique_ptr<LocalClient>> connect(const std::string& socket_path,
                                                      LocalClientOptions options = {});
  ~LocalClient();
  LocalClient(const LocalClient&) = delete;
  LocalClient& operator=(const LocalClient&) = delete;

  const NodeInfo& info() const;
  bool shared_memory() const;  // the direct data path is in use

  // Stores chunk i from data[i * chunk_bytes, (i + 1) * chunk_bytes); data holds exactly one
  // chunk per key. Chunks already stored are left as they are. Returns the leading chunks now
  // stored: fewer than asked when the node ran out of room, for a put never evicts its own
  // chunks (only older ones, least recently used first) and keeps the longest prefix that fits.
  // One put split over several calls passes the same PutSeries to each, so a later call cannot
  // evict what an earlier one stored either.
  Result<std::size_t> put(const ChunkKeys& keys, std::span<const std::byte> data,
                          PutSeries* series = nullptr);
  // Copies the leading stored chunks into out (chunk after chunk); returns how many. An error
  // when out is too small for every stored chunk asked for.
  Result<std::size_t> get(const ChunkKeys& keys, std::span<std::byte> out);
  Result<std::vector<bool>> contains(const ChunkKeys& keys);
  // The chunk hashes of tokens, as this node computes them (LMCache's chain).
  Result<std::vector<std::int64_t>> hashes(const std::vector<std::int64_t>& tokens);
  // Leading tokens stored on this node.
  Result<std::size_t> lookup(const std::vector<std::int64_t>& tokens);
  // Pulls the chunks this node lacks from the peer the controller names (P2P), then answers
  // what is held locally.
  Result<RetrieveReply> retrieve(const ChunkKeys& keys);
  // What retrieve would find, nothing pulled: the leading chunks (and tokens) held here and,
  // when that is not all, the peer the controller names for the most and its leading tokens
  // (none when the lookup fails or there is no controller: peek never errs for that).
  Result<RetrieveReply> peek(const ChunkKeys& keys);

  // The engine's KV path. register_kv shares a paged KV cache with the node: every tensor of
  // `layout` lies in one of `allocations` (host memory from HostKvMemory, or CUDA memory by IPC
  // handle or VMM fd), which the node maps once; the node checks that a chunk of the layout is
  // exactly one pool page (an error says both sizes). Returns the registration's id. A
  // registration lives as long as this client (the node unmaps it when the connection closes,
  // the client dies included); when the connection is replaced (the node restarted) the client
  // registers again by itself, so the id stays valid. The allocations must outlive it.
  Result<std::uint64_t> register_kv(const KvLayout& layout,
                                    std::span<const KvAllocation> allocations);
  Status unregister_kv(std::uint64_t kv);
  // The node gathers each chunk's blocks into a pool page and commits the chunk (ADMIT) once
  // its copy landed; chunks stored already are kept. Stops at the first chunk that finds no
  // room (a store never evicts its own chunks). Answers the leading chunks stored.
  Result<KvTransferReply> store(const KvTransfer& transfer);
  // The node copies the leading stored chunks into the blocks (leased meanwhile, so no eviction
  // touches them mid-copy). Answers the leading chunks and tokens loaded.
  Result<KvTransferReply> load(const KvTransfer& transfer);

  struct Impl;

 private:
  explicit LocalClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvnode::client
