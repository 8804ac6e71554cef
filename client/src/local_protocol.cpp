#include "kvnode/client/local_protocol.hpp"

#include <array>
#include <cstring>
#include <functional>
#include <msgpack.hpp>
#include <optional>

namespace kvnode::client::protocol {
namespace {

constexpr std::array kOps = {LocalOp::kInfo,    LocalOp::kHashes,  LocalOp::kContains,
                             LocalOp::kLookup,  LocalOp::kPut,     LocalOp::kGet,
                             LocalOp::kReserve, LocalOp::kCommit,  LocalOp::kAbort,
                             LocalOp::kLease,   LocalOp::kRelease, LocalOp::kRetrieve};

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

using Packer = msgpack::packer<msgpack::sbuffer>;

void pack_str(Packer& pk, const std::string& s) {
  pk.pack_str(static_cast<std::uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<std::uint32_t>(s.size()));
}

void pack_bin(Packer& pk, const std::vector<std::byte>& b) {
  pk.pack_bin(static_cast<std::uint32_t>(b.size()));
  pk.pack_bin_body(reinterpret_cast<const char*>(b.data()), static_cast<std::uint32_t>(b.size()));
}

// A map whose entries are written only when they carry something.
class MapOut {
 public:
  template <class F>
  void add(const char* key, F&& write) {
    entries_.push_back({key, std::forward<F>(write)});
  }
  std::vector<std::byte> finish() {
    msgpack::sbuffer buffer;
    Packer pk(buffer);
    pk.pack_map(static_cast<std::uint32_t>(entries_.size()));
    for (auto& [key, write] : entries_) {
      pack_str(pk, key);
      write(pk);
    }
    std::vector<std::byte> out(buffer.size());
    std::memcpy(out.data(), buffer.data(), buffer.size());
    return out;
  }

 private:
  std::vector<std::pair<std::string, std::function<void(Packer&)>>> entries_;
};

void add_ints(MapOut& m, const char* key, const std::vector<std::int64_t>& v) {
  m.add(key, [&v](Packer& pk) {
    pk.pack_array(static_cast<std::uint32_t>(v.size()));
    for (std::int64_t x : v) pk.pack(x);
  });
}

Status field_error(const std::string& path, const std::string& what) {
  return make_error(ErrorCode::kInvalid, path + ": " + what);
}

Status read_uint(const msgpack::object& v, const std::string& path, std::uint64_t& out) {
  if (v.type != msgpack::type::POSITIVE_INTEGER)
    return field_error(path, "expected an unsigned integer");
  out = v.via.u64;
  return {};
}

Status read_int(const msgpack::object& v, const std::string& path, std::int64_t& out) {
  if (v.type == msgpack::type::NEGATIVE_INTEGER) {
    out = v.via.i64;
    return {};
  }
  if (v.type != msgpack::type::POSITIVE_INTEGER) return field_error(path, "expected an integer");
  if (v.via.u64 > static_cast<std::uint64_t>(INT64_MAX))
    return field_error(path, "does not fit 64 signed bits");
  out = static_cast<std::int64_t>(v.via.u64);
  return {};
}

Status read_str(const msgpack::object& v, const std::string& path, std::string& out) {
  if (v.type != msgpack::type::STR) return field_error(path, "expected a string");
  out.assign(v.via.str.ptr, v.via.str.size);
  return {};
}

Status read_ints(const msgpack::object& v, const std::string& path,
                 std::vector<std::int64_t>& out) {
  if (v.type != msgpack::type::ARRAY) return field_error(path, "expected an array of integers");
  if (v.via.array.size > kMaxKeys)
    return field_error(path, "more than " + std::to_string(kMaxKeys) + " entries");
  out.resize(v.via.array.size);
  for (std::uint32_t i = 0; i < v.via.array.size; ++i)
    if (Status s = read_int(v.via.array.ptr[i], path + "[" + std::to_string(i) + "]", out[i]); !s)
      return s;
  return {};
}

Status read_bin(const msgpack::object& v, const std::string& path, std::vector<std::byte>& out) {
  if (v.type != msgpack::type::BIN) return field_error(path, "expected bin");
  const auto* p = reinterpret_cast<const std::byte*>(v.via.bin.ptr);
  out.assign(p, p + v.via.bin.size);
  return {};
}

// Unpacks a map under limits (no allocation from a hostile length) and calls on_field(key, value).
template <class OnField>
Status read_map(std::span<const std::byte> bytes, const char* root, OnField on_field) {
  msgpack::object_handle handle;
  try {
    const msgpack::unpack_limit limits(kMaxKeys, 32, 4096, kMaxInlineBytes, 0, 3);
    handle = msgpack::unpack(reinterpret_cast<const char*>(bytes.data()), bytes.size(), nullptr,
                             nullptr, limits);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kInvalid,
                      std::string(root) + ": not a valid msgpack message (" + e.what() + ")");
  }
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
  if (r.by_tokens)
    add_ints(m, "tokens", r.tokens);
  else if (!r.hashes.empty())
    add_ints(m, "hashes", r.hashes);
  if (!r.data.empty()) m.add("data", [&r](Packer& pk) { pack_bin(pk, r.data); });
  if (r.hold != 0) m.add("hold", [&r](Packer& pk) { pk.pack(r.hold); });
  if (r.since != 0) m.add("since", [&r](Packer& pk) { pk.pack(r.since); });
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
                                                                {"since", &r.since}};
  for (const auto& [key, value] : uints)
    if (*value != 0) m.add(key, [value](Packer& pk) { pk.pack(*value); });
  if (r.worker_id != 0) m.add("worker_id", [&r](Packer& pk) { pk.pack(r.worker_id); });
  const std::pair<const char*, const std::string*> strs[] = {
      {"shm", &r.shm}, {"location", &r.location}, {"instance", &r.instance}, {"peer", &r.peer}};
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
        if (key == "tokens") {
          r.by_tokens = true;
          return read_ints(v, path, r.tokens);
        }
        if (key == "data") return read_bin(v, path, r.data);
        if (key == "hold") return read_uint(v, path, r.hold);
        if (key == "since") return read_uint(v, path, r.since);
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
        if (key == "since") return read_uint(v, path, r.since);
        if (key == "worker_id") return read_int(v, path, r.worker_id);
        if (key == "shm") return read_str(v, path, r.shm);
        if (key == "location") return read_str(v, path, r.location);
        if (key == "instance") return read_str(v, path, r.instance);
        if (key == "peer") return read_str(v, path, r.peer);
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
