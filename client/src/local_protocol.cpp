#include "kvnode/client/local_protocol.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <msgpack.hpp>
#include <optional>

#include "kv_wire_codec.hpp"
#include "kvnode/client/kv_wire.hpp"
#include "msgpack_fields.hpp"

namespace kvnode::client::protocol {
namespace {

using namespace detail;

constexpr std::array kOps = {
    LocalOp::kInfo,       LocalOp::kHashes,       LocalOp::kContains, LocalOp::kLookup,
    LocalOp::kPut,        LocalOp::kGet,          LocalOp::kReserve,  LocalOp::kCommit,
    LocalOp::kAbort,      LocalOp::kLease,        LocalOp::kRelease,  LocalOp::kRetrieve,
    LocalOp::kRegisterKv, LocalOp::kUnregisterKv, LocalOp::kStore,    LocalOp::kLoad};

constexpr std::size_t kMaxBlockIds = 1 << 22;  // 4 M blocks: a 64 M token sequence at 16

Status read_u32s(const msgpack::object& v, const std::string& path,
                 std::vector<std::uint32_t>& out) {
  if (v.type != msgpack::type::ARRAY) return field_error(path, "expected an array of integers");
  if (v.via.array.size > kMaxBlockIds)
    return field_error(path, "more than " + std::to_string(kMaxBlockIds) + " entries");
  out.resize(v.via.array.size);
  for (std::uint32_t i = 0; i < v.via.array.size; ++i) {
    const msgpack::object& e = v.via.array.ptr[i];
    if (e.type != msgpack::type::POSITIVE_INTEGER || e.via.u64 > UINT32_MAX)
      return field_error(path + "[" + std::to_string(i) + "]", "expected a 32-bit block id");
    out[i] = static_cast<std::uint32_t>(e.via.u64);
  }
  return {};
}

// "token_bytes": int64 token ids in this host's byte order, one bin (the local socket never
// leaves the host). Bounded as "tokens" is.
Status read_token_bytes(const msgpack::object& v, const std::string& path,
                        std::vector<std::int64_t>& out) {
  if (v.type != msgpack::type::BIN) return field_error(path, "expected bin");
  if (v.via.bin.size % sizeof(std::int64_t) != 0)
    return field_error(path, std::to_string(v.via.bin.size) + " bytes: not whole int64 tokens");
  const std::size_t n = v.via.bin.size / sizeof(std::int64_t);
  if (n > kMaxKeys) return field_error(path, "more than " + std::to_string(kMaxKeys) + " tokens");
  out.resize(n);
  if (n > 0) std::memcpy(out.data(), v.via.bin.ptr, v.via.bin.size);
  return {};
}

Status read_event(const msgpack::object& v, const std::string& path, std::vector<std::byte>& out) {
  if (Status s = read_bin(v, path, out); !s) return s;
  if (out.size() != kCudaIpcHandleBytes)
    return field_error(path, "a CUDA IPC event handle is " + std::to_string(kCudaIpcHandleBytes) +
                                 " bytes, got " + std::to_string(out.size()));
  return {};
}

Status read_bool(const msgpack::object& v, const std::string& path, bool& out) {
  if (v.type != msgpack::type::BOOLEAN) return field_error(path, "expected a boolean");
  out = v.via.boolean;
  return {};
}

std::optional<LocalOp> op_named(std::string_view name) {
  for (LocalOp op : kOps)
    if (name == to_string(op)) return op;
  return std::nullopt;
}

std::string op_names() {
  std::string out;
  for (LocalOp op : kOps) out += (out.empty() ? "" : ", ") + std::string(to_string(op));
  return out;
}

// Unpacks a map under limits (no allocation from a hostile length) and calls on_field(key, value).
template <class OnField>
Status read_map(std::span<const std::byte> bytes, const char* root, OnField on_field) {
  msgpack::object_handle handle;
  std::size_t used = 0;
  try {
    // Depth 4: request -> kv_layout -> allocations -> one allocation.
    const msgpack::unpack_limit limits(std::max(kMaxKeys, kMaxBlockIds), 32, 4096, kMaxInlineBytes,
                                       0, 4);
    handle = msgpack::unpack(reinterpret_cast<const char*>(bytes.data()), bytes.size(), used,
                             nullptr, nullptr, limits);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kInvalid,
                      std::string(root) + ": not a valid msgpack message (" + e.what() + ")");
  }
  // One message per frame: anything after it (a second map, stray bytes) is a sender's bug.
  if (used != bytes.size())
    return make_error(ErrorCode::kInvalid, std::string(root) + ": " +
                                               std::to_string(bytes.size() - used) +
                                               " bytes after the message (one map per frame)");
  const msgpack::object& o = handle.get();
  if (o.type != msgpack::type::MAP)
    return make_error(ErrorCode::kInvalid, std::string(root) + ": expected a map");
  for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
    const msgpack::object& k = o.via.map.ptr[i].key;
    if (k.type != msgpack::type::STR)
      return make_error(ErrorCode::kInvalid, std::string(root) + ": a key is not a string");
    const std::string key(k.via.str.ptr, k.via.str.size);
    if (Status s = on_field(key, o.via.map.ptr[i].val, std::string(root) + "." + key); !s) return s;
  }
  return {};
}

}  // namespace

const char* to_string(LocalOp op) noexcept {
  switch (op) {
    case LocalOp::kInfo:
      return "info";
    case LocalOp::kHashes:
      return "hashes";
    case LocalOp::kContains:
      return "contains";
    case LocalOp::kLookup:
      return "lookup";
    case LocalOp::kPut:
      return "put";
    case LocalOp::kGet:
      return "get";
    case LocalOp::kReserve:
      return "reserve";
    case LocalOp::kCommit:
      return "commit";
    case LocalOp::kAbort:
      return "abort";
    case LocalOp::kLease:
      return "lease";
    case LocalOp::kRelease:
      return "release";
    case LocalOp::kRetrieve:
      return "retrieve";
    case LocalOp::kRegisterKv:
      return "register_kv";
    case LocalOp::kUnregisterKv:
      return "unregister_kv";
    case LocalOp::kStore:
      return "store";
    case LocalOp::kLoad:
      return "load";
  }
  return "unknown";
}

ErrorCode error_code_named(std::string_view name) noexcept {
  for (auto c = static_cast<int>(ErrorCode::kInvalid); c <= static_cast<int>(ErrorCode::kInternal);
       ++c)
    if (name == to_string(static_cast<ErrorCode>(c))) return static_cast<ErrorCode>(c);
  return ErrorCode::kInternal;
}

Reply failure(const Error& error) {
  Reply r;
  r.ok = false;
  r.code = error.code;
  r.error = error.message;
  return r;
}

std::vector<std::byte> encode(const Request& r) {
  MapOut m;
  m.add("op", [&r](Packer& pk) { pack_str(pk, to_string(r.op)); });
  if (r.by_tokens && r.binary_tokens)
    m.add("token_bytes", [&r](Packer& pk) {
      pack_bin(pk, std::as_bytes(std::span<const std::int64_t>(r.tokens)));
    });
  else if (r.by_tokens)
    add_ints(m, "tokens", r.tokens);
  else if (!r.hashes.empty())
    add_ints(m, "hashes", r.hashes);
  if (!r.data.empty()) m.add("data", [&r](Packer& pk) { pack_bin(pk, r.data); });
  if (r.hold != 0) m.add("hold", [&r](Packer& pk) { pk.pack(r.hold); });
  if (r.since != 0) m.add("since", [&r](Packer& pk) { pk.pack(r.since); });
  if (r.kv_layout) m.add("kv_layout", [&r](Packer& pk) { pack_kv_layout(pk, *r.kv_layout); });
  if (r.fds != 0) m.add("fds", [&r](Packer& pk) { pk.pack(r.fds); });
  if (r.kv != 0) m.add("kv", [&r](Packer& pk) { pk.pack(r.kv); });
  if (!r.block_ids.empty())
    m.add("block_ids", [&r](Packer& pk) {
      pk.pack_array(static_cast<std::uint32_t>(r.block_ids.size()));
      for (std::uint32_t b : r.block_ids) pk.pack(b);
    });
  if (r.num_tokens != 0) m.add("num_tokens", [&r](Packer& pk) { pk.pack(r.num_tokens); });
  if (r.retrieve) m.add("retrieve", [](Packer& pk) { pk.pack(true); });
  if (r.peek) m.add("peek", [](Packer& pk) { pk.pack(true); });
  if (!r.wait_event.empty()) m.add("wait_event", [&r](Packer& pk) { pack_bin(pk, r.wait_event); });
  if (!r.done_event.empty()) m.add("done_event", [&r](Packer& pk) { pack_bin(pk, r.done_event); });
  return m.finish();
}

std::vector<std::byte> encode(const Reply& r) {
  MapOut m;
  m.add("ok", [&r](Packer& pk) { pk.pack(r.ok); });
  if (!r.ok) {
    m.add("error", [&r](Packer& pk) { pack_str(pk, r.error); });
    m.add("code", [&r](Packer& pk) { pack_str(pk, to_string(r.code)); });
  }
  const std::pair<const char*, const std::uint64_t*> uints[] = {{"chunk_bytes", &r.chunk_bytes},
                                                                {"chunk_size", &r.chunk_size},
                                                                {"pages", &r.pages},
                                                                {"slots", &r.slots},
                                                                {"hold", &r.hold},
                                                                {"count", &r.count},
                                                                {"tokens", &r.tokens},
                                                                {"pulled", &r.pulled},
                                                                {"peer_tokens", &r.peer_tokens},
                                                                {"peer_chunks", &r.peer_chunks},
                                                                {"since", &r.since},
                                                                {"kv", &r.kv},
                                                                {"none_hash", &r.none_hash}};
  for (const auto& [key, value] : uints)
    if (*value != 0) m.add(key, [value](Packer& pk) { pk.pack(*value); });
  if (r.worker_id != 0) m.add("worker_id", [&r](Packer& pk) { pk.pack(r.worker_id); });
  if (r.save_unfull_chunk)
    m.add("save_unfull_chunk", [&r](Packer& pk) { pk.pack(*r.save_unfull_chunk); });
  if (r.binary_tokens) m.add("binary_tokens", [](Packer& pk) { pk.pack(true); });
  const std::pair<const char*, const std::string*> strs[] = {
      {"shm", &r.shm},
      {"location", &r.location},
      {"instance", &r.instance},
      {"peer", &r.peer},
      {"memory", &r.memory},
      {"hash_generation", &r.hash_generation},
      {"hash_init", &r.hash_init}};
  for (const auto& [key, value] : strs)
    if (!value->empty()) m.add(key, [value](Packer& pk) { pack_str(pk, *value); });
  if (!r.present.empty())
    m.add("present", [&r](Packer& pk) {
      pk.pack_array(static_cast<std::uint32_t>(r.present.size()));
      for (bool b : r.present) pk.pack(b);
    });
  if (!r.offsets.empty()) add_ints(m, "offsets", r.offsets);
  if (!r.hashes.empty()) add_ints(m, "hashes", r.hashes);
  if (!r.data.empty()) m.add("data", [&r](Packer& pk) { pack_bin(pk, r.data); });
  return m.finish();
}

Result<Request> decode_request(std::span<const std::byte> bytes) {
  Request r;
  bool has_op = false;
  Status s = read_map(
      bytes, "request",
      [&](const std::string& key, const msgpack::object& v, const std::string& path) -> Status {
        if (key == "op") {
          has_op = true;
          std::string name;
          if (Status s = read_str(v, path, name); !s) return s;
          const std::optional<LocalOp> op = op_named(name);
          if (!op)
            return field_error(path, "unknown operation '" + name + "' (" + op_names() + ")");
          r.op = *op;
          return {};
        }
        if (key == "hashes") return read_ints(v, path, r.hashes);
        if (key == "tokens" || key == "token_bytes") {
          if (r.by_tokens) return field_error(path, "tokens given twice");
          r.by_tokens = true;
          return key == "tokens" ? read_ints(v, path, r.tokens)
                                 : read_token_bytes(v, path, r.tokens);
        }
        if (key == "data") return read_bin(v, path, r.data);
        if (key == "hold") return read_uint(v, path, r.hold);
        if (key == "since") return read_uint(v, path, r.since);
        if (key == "kv_layout") {
          r.kv_layout.emplace();
          return read_kv_layout(v, path, *r.kv_layout);
        }
        if (key == "fds") return read_uint(v, path, r.fds);
        if (key == "kv") return read_uint(v, path, r.kv);
        if (key == "block_ids") return read_u32s(v, path, r.block_ids);
        if (key == "num_tokens") return read_uint(v, path, r.num_tokens);
        if (key == "retrieve") return read_bool(v, path, r.retrieve);
        if (key == "peek") return read_bool(v, path, r.peek);
        if (key == "wait_event") return read_event(v, path, r.wait_event);
        if (key == "done_event") return read_event(v, path, r.done_event);
        return field_error(path, "unknown field");
      });
  if (!s) return s.error();
  if (!has_op) return make_error(ErrorCode::kInvalid, "request.op: missing");
  if (r.by_tokens && !r.hashes.empty())
    return make_error(ErrorCode::kInvalid, "request: give hashes or tokens, not both");
  return r;
}

Result<Reply> decode_reply(std::span<const std::byte> bytes) {
  Reply r;
  Status s = read_map(
      bytes, "reply",
      [&](const std::string& key, const msgpack::object& v, const std::string& path) -> Status {
        if (key == "ok") {
          if (v.type != msgpack::type::BOOLEAN) return field_error(path, "expected a boolean");
          r.ok = v.via.boolean;
          return {};
        }
        if (key == "error") return read_str(v, path, r.error);
        if (key == "code") {
          std::string name;
          if (Status s = read_str(v, path, name); !s) return s;
          r.code = error_code_named(name);
          return {};
        }
        if (key == "chunk_bytes") return read_uint(v, path, r.chunk_bytes);
        if (key == "chunk_size") return read_uint(v, path, r.chunk_size);
        if (key == "pages") return read_uint(v, path, r.pages);
        if (key == "slots") return read_uint(v, path, r.slots);
        if (key == "hold") return read_uint(v, path, r.hold);
        if (key == "count") return read_uint(v, path, r.count);
        if (key == "tokens") return read_uint(v, path, r.tokens);
        if (key == "pulled") return read_uint(v, path, r.pulled);
        if (key == "peer_tokens") return read_uint(v, path, r.peer_tokens);
        if (key == "peer_chunks") return read_uint(v, path, r.peer_chunks);
        if (key == "since") return read_uint(v, path, r.since);
        if (key == "kv") return read_uint(v, path, r.kv);
        if (key == "worker_id") return read_int(v, path, r.worker_id);
        if (key == "shm") return read_str(v, path, r.shm);
        if (key == "location") return read_str(v, path, r.location);
        if (key == "instance") return read_str(v, path, r.instance);
        if (key == "peer") return read_str(v, path, r.peer);
        if (key == "memory") return read_str(v, path, r.memory);
        if (key == "hash_generation") return read_str(v, path, r.hash_generation);
        if (key == "hash_init") return read_str(v, path, r.hash_init);
        if (key == "none_hash") return read_uint(v, path, r.none_hash);
        if (key == "binary_tokens") return read_bool(v, path, r.binary_tokens);
        if (key == "save_unfull_chunk") {
          bool b = false;
          if (Status s = read_bool(v, path, b); !s) return s;
          r.save_unfull_chunk = b;
          return {};
        }
        if (key == "offsets") return read_ints(v, path, r.offsets);
        if (key == "hashes") return read_ints(v, path, r.hashes);
        if (key == "data") return read_bin(v, path, r.data);
        if (key == "present") {
          if (v.type != msgpack::type::ARRAY)
            return field_error(path, "expected an array of booleans");
          r.present.resize(v.via.array.size);
          for (std::uint32_t i = 0; i < v.via.array.size; ++i) {
            if (v.via.array.ptr[i].type != msgpack::type::BOOLEAN)
              return field_error(path + "[" + std::to_string(i) + "]", "expected a boolean");
            r.present[i] = v.via.array.ptr[i].via.boolean;
          }
          return {};
        }
        return {};  // newer daemons may answer more
      });
  if (!s) return s.error();
  return r;
}

}  // namespace kvnode::client::protocol
