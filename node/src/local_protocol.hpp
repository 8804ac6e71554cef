// The local socket's messages (node-internal; LocalService and LocalClient both speak it). One
// msgpack map per request and per reply over ZeroMQ (REQ to ROUTER on an ipc:// path).
//
// Request keys: "op" (info, hashes, contains, lookup, put, get, reserve, commit, abort, lease, release,
// retrieve), "hashes" or "tokens" (the chunks), "data" (bin: put's inline bytes, chunk after
// chunk), "hold" (commit/abort/release: the id reserve/lease answered), "since" (put/reserve: the
// tick an earlier call of the same put answered; absent: the put begins now).
// Reply keys: "ok", "error" when not ok, and what the op answers (see local_client.hpp).
// Decoding checks every type and length and names the field path in its errors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvnode/common/result.hpp"

namespace kvnode::node::local {

inline constexpr std::size_t kMaxKeys = 1 << 20;               // hashes or tokens in one request
inline constexpr std::size_t kMaxInlineBytes = 256u << 20;     // put/get bytes carried inline
inline constexpr std::size_t kMaxMessageBytes = kMaxInlineBytes + (16u << 20);

struct Request {
  std::string op;
  std::vector<std::int64_t> hashes;
  std::vector<std::int64_t> tokens;
  bool by_tokens = false;
  std::vector<std::byte> data;
  std::uint64_t hold = 0;
  std::uint64_t since = 0;  // put/reserve: evict only chunks stored before this tick (0: now)
};

struct Reply {
  bool ok = true;
  std::string error;
  // info
  std::uint64_t chunk_bytes = 0, chunk_size = 0, pages = 0;
  std::uint64_t slots = 0;           // staging slots (one chunk each) in the shm region
  std::int64_t worker_id = 0;
  std::string shm, location, instance;
  // per op
  std::vector<bool> present;         // contains
  std::vector<std::int64_t> offsets; // reserve/lease: each chunk's staging slot (byte offset); -1 stored
  std::vector<std::int64_t> hashes;  // hashes: the chunk hashes of the tokens
  std::uint64_t hold = 0;            // reserve/lease
  std::uint64_t count = 0;           // put/commit: chunks stored; get/lease/retrieve: leading held
  std::uint64_t tokens = 0;          // lookup/retrieve: leading tokens held
  std::uint64_t pulled = 0;          // retrieve
  std::uint64_t since = 0;           // put/reserve: the put's tick, for its later calls
  std::string peer;                  // retrieve
  std::vector<std::byte> data;       // get
};

std::vector<std::byte> encode(const Request& r);
std::vector<std::byte> encode(const Reply& r);
Result<Request> decode_request(std::span<const std::byte> bytes);
Result<Reply> decode_reply(std::span<const std::byte> bytes);

}  // namespace kvnode::node::local
