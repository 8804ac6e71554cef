// msgpack helpers the local protocol's encoders and decoders share: packing strings, bins and
// integer arrays, a map written from its non-empty fields, and readers that check every type and
// name the field path in their errors. Private to the client library.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <msgpack.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvnode/client/local_protocol.hpp"
#include "kvnode/common/result.hpp"

namespace kvnode::client::protocol::detail {

using Packer = msgpack::packer<msgpack::sbuffer>;

inline void pack_str(Packer& pk, const std::string& s) {
  pk.pack_str(static_cast<std::uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<std::uint32_t>(s.size()));
}

inline void pack_bin(Packer& pk, std::span<const std::byte> b) {
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

inline void add_ints(MapOut& m, const char* key, const std::vector<std::int64_t>& v) {
  m.add(key, [&v](Packer& pk) {
    pk.pack_array(static_cast<std::uint32_t>(v.size()));
    for (std::int64_t x : v) pk.pack(x);
  });
}

inline Status field_error(const std::string& path, const std::string& what) {
  return make_error(ErrorCode::kInvalid, path + ": " + what);
}

inline Status read_uint(const msgpack::object& v, const std::string& path, std::uint64_t& out) {
  if (v.type != msgpack::type::POSITIVE_INTEGER)
    return field_error(path, "expected an unsigned integer");
  out = v.via.u64;
  return {};
}

inline Status read_int(const msgpack::object& v, const std::string& path, std::int64_t& out) {
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

inline Status read_str(const msgpack::object& v, const std::string& path, std::string& out) {
  if (v.type != msgpack::type::STR) return field_error(path, "expected a string");
  out.assign(v.via.str.ptr, v.via.str.size);
  return {};
}

inline Status read_ints(const msgpack::object& v, const std::string& path,
                        std::vector<std::int64_t>& out) {
  if (v.type != msgpack::type::ARRAY) return field_error(path, "expected an array of integers");
  if (v.via.array.size > kMaxKeys)
    return field_error(path, "more than " + std::to_string(kMaxKeys) + " entries");
  out.resize(v.via.array.size);
  for (std::uint32_t i = 0; i < v.via.array.size; ++i) {
    const msgpack::object& e = v.via.array.ptr[i];
    // The element's path is built only for an error: a 32k-token request would otherwise
    // allocate 32k strings (most of a lookup's time at the node).
    if (e.type == msgpack::type::NEGATIVE_INTEGER) {
      out[i] = e.via.i64;
    } else if (e.type == msgpack::type::POSITIVE_INTEGER &&
               e.via.u64 <= static_cast<std::uint64_t>(INT64_MAX)) {
      out[i] = static_cast<std::int64_t>(e.via.u64);
    } else {
      return read_int(e, path + "[" + std::to_string(i) + "]", out[i]);
    }
  }
  return {};
}

inline Status read_bin(const msgpack::object& v, const std::string& path,
                       std::vector<std::byte>& out) {
  if (v.type != msgpack::type::BIN) return field_error(path, "expected bin");
  const auto* p = reinterpret_cast<const std::byte*>(v.via.bin.ptr);
  out.assign(p, p + v.via.bin.size);
  return {};
}

}  // namespace kvnode::client::protocol::detail
