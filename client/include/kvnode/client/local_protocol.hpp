// The local socket's messages: what LocalClient and the node's LocalService say to each other.
// One msgpack map per request and per reply, each in one frame (local_framing.hpp) on an AF_UNIX
// stream socket. Shared by the client and the node; an engine uses LocalClient, not this.
//
// Request keys: "op" (info, hashes, contains, lookup, put, get, reserve, commit, abort, lease,
// release, retrieve, register_kv, unregister_kv, store, load), "hashes" or "tokens" (the chunks;
// "token_bytes" instead: the tokens as one bin of int64, to nodes whose info said
// "binary_tokens"), "data" (bin: put's inline bytes, chunk after chunk), "hold"
// (commit/abort/release: the id reserve/lease answered), "since" (put/reserve: the tick an earlier
// call of the same put answered; absent: the put begins now). The engine's KV path: "kv_layout"
// (register_kv: a KvWireLayout, its descriptors beside the frame, "fds" of them), "kv" (the
// registration), "block_ids", "num_tokens" (by hashes: tokens in all, the last chunk may be
// unfull), "retrieve" (load: pull missing chunks from peers first), "peek" (retrieve: who holds
// more, nothing pulled; answered with "peer", "peer_tokens" and "peer_chunks"), "wait_event" /
// "done_event" (64-byte CUDA IPC event handles). Reply keys: "ok"; when not ok, "error" (for a
// person) and "code" (for a program: an ErrorCode's to_string name, e.g. "frozen"); and what the
// op answers (see local_client.hpp). Decoding checks every type and length and names the field
// path in its errors; the op string is parsed once, into LocalOp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvnode/client/kv_wire.hpp"
#include "kvnode/common/result.hpp"

namespace kvnode::client::protocol {

inline constexpr std::size_t kMaxKeys = 1 << 20;            // hashes or tokens in one request
inline constexpr std::size_t kMaxInlineBytes = 256u << 20;  // put/get bytes carried inline
inline constexpr std::size_t kMaxMessageBytes = kMaxInlineBytes + (16u << 20);

enum class LocalOp : std::uint8_t {
  kInfo,
  kHashes,
  kContains,
  kLookup,
  kPut,
  kGet,
  kReserve,
  kCommit,
  kAbort,
  kLease,
  kRelease,
  kRetrieve,
  kRegisterKv,
  kUnregisterKv,
  kStore,
  kLoad,
};
const char* to_string(LocalOp op) noexcept;
// An ErrorCode from its to_string name; a name this build does not know is kInternal.
ErrorCode error_code_named(std::string_view name) noexcept;

struct Request {
  LocalOp op = LocalOp::kInfo;
  std::vector<std::int64_t> hashes{};
  std::vector<std::int64_t> tokens{};
  bool by_tokens = false;
  // Send the tokens as one bin of int64 in this host's byte order ("token_bytes"; one memcpy at
  // the node instead of an msgpack integer each), for nodes whose info said binary_tokens.
  bool binary_tokens = false;
  std::vector<std::byte> data{};
  std::uint64_t hold = 0;
  std::uint64_t since = 0;  // put/reserve: evict only chunks stored before this tick (0: now)
  // The engine's KV path.
  std::optional<KvWireLayout> kv_layout{};  // register_kv
  std::uint64_t fds = 0;                    // descriptors beside this frame (SCM_RIGHTS)
  std::uint64_t kv = 0;                     // unregister_kv, store, load: the registration
  std::vector<std::uint32_t> block_ids{};   // store, load
  std::uint64_t num_tokens = 0;             // by hashes: tokens in all (0: whole chunks)
  bool retrieve = false;                    // load
  bool peek = false;  // retrieve: only ask the controller who holds more; nothing is pulled
  std::vector<std::byte> wait_event{}, done_event{};  // 64-byte CUDA IPC event handles
};

struct Reply {
  bool ok = true;
  ErrorCode code = ErrorCode::kInternal;  // when not ok
  std::string error{};
  // info
  std::uint64_t chunk_bytes = 0, chunk_size = 0, pages = 0;
  std::uint64_t slots = 0;  // staging slots (one chunk each) in the shm region
  std::int64_t worker_id = 0;
  std::string shm{}, location{}, instance{};
  std::string memory{};                     // info: the pool's memory, "host", "pinned" or "device"
  std::optional<bool> save_unfull_chunk{};  // info: a last partial chunk is a chunk (unset: old)
  bool binary_tokens = false;  // info: the node reads "token_bytes" (older nodes do not say)
  // info: the chunk-hash chain ("lmcache-0.5.6" or "legacy"; "" from older nodes), its initial
  // hash in decimal (it may pass 2^63) and hash(None) of the legacy chain
  std::string hash_generation{}, hash_init{};
  std::uint64_t none_hash = 0;
  // per op
  std::vector<bool> present{};          // contains
  std::vector<std::int64_t> offsets{};  // reserve/lease: each chunk's slot (byte offset); -1 stored
  std::vector<std::int64_t> hashes{};   // hashes: the chunk hashes of the tokens
  std::uint64_t hold = 0;               // reserve/lease
  std::uint64_t count = 0;   // put/commit/store: chunks stored; get/lease/retrieve/load: leading
  std::uint64_t tokens = 0;  // lookup/retrieve: leading tokens held; store/load: tokens copied
  std::uint64_t pulled = 0;  // retrieve, load
  std::uint64_t since = 0;   // put/reserve: the put's tick, for its later calls
  std::string peer{};        // retrieve, load
  std::uint64_t peer_tokens = 0;  // retrieve with peek: leading tokens `peer` holds
  std::uint64_t peer_chunks = 0;  // retrieve with peek: leading chunks `peer` holds
  std::vector<std::byte> data{};  // get
  std::uint64_t kv = 0;           // register_kv: the registration's id
};

// A reply that carries `error` (its code and message).
Reply failure(const Error& error);

std::vector<std::byte> encode(const Request& r);
std::vector<std::byte> encode(const Reply& r);
Result<Request> decode_request(std::span<const std::byte> bytes);
Result<Reply> decode_reply(std::span<const std::byte> bytes);

}  // namespace kvnode::client::protocol
