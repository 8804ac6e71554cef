#include "descriptor.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <msgpack.hpp>
#include <string_view>

namespace kvnode::transfer {
namespace {

constexpr std::size_t kMaxDescriptor = 256 << 10;
constexpr std::size_t kMaxBlob = 64 << 10;  // worker addresses and rkeys are far smaller
constexpr std::size_t kMaxNode = 1024;
constexpr std::size_t kMaxShareName = 107;  // sun_path less the abstract namespace's NUL
constexpr std::uint64_t kMaxPoolKind = 2;   // gpu::MemoryKind::kDevice

void pack_bin(msgpack::packer<msgpack::sbuffer>& pk, const ucx::Bytes& b) {
  pk.pack_bin(static_cast<std::uint32_t>(b.size()));
  pk.pack_bin_body(reinterpret_cast<const char*>(b.data()), static_cast<std::uint32_t>(b.size()));
}

Error field_error(std::string_view field, std::string_view what) {
  return make_error("descriptor." + std::string(field) + ": " + std::string(what));
}

}  // namespace

ucx::Bytes encode(const PeerDescriptor& d) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> pk(buffer);
  pk.pack_map(d.share.empty() ? 11 : 13);
  pk.pack("node");
  pk.pack(d.node);
  pk.pack("worker_address");
  pack_bin(pk, d.worker_address);
  pk.pack("rkey");
  pack_bin(pk, d.rkey);
  pk.pack("base");
  pk.pack(d.base);
  pk.pack("page_bytes");
  pk.pack(d.page_bytes);
  pk.pack("pages");
  pk.pack(d.pages);
  pk.pack("host");
  pk.pack(d.host);
  pk.pack("instance");
  pk.pack(d.instance);
  pk.pack("rma");
  pk.pack(d.rma);
  pk.pack("pool_kind");
  pk.pack(d.pool_kind);
  pk.pack("device");
  pk.pack(d.device);
  if (!d.share.empty()) {
    pk.pack("share");
    pk.pack(d.share);
    pk.pack("share_token");
    pk.pack_bin(static_cast<std::uint32_t>(d.share_token.size()));
    pk.pack_bin_body(reinterpret_cast<const char*>(d.share_token.data()),
                     static_cast<std::uint32_t>(d.share_token.size()));
  }
  ucx::Bytes out(buffer.size());
  std::memcpy(out.data(), buffer.data(), buffer.size());
  return out;
}

ucx::Bytes encode_refusal(const std::string& reason) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> pk(buffer);
  pk.pack_map(1);
  pk.pack("error");
  pk.pack(reason.substr(0, kMaxNode));
  ucx::Bytes out(buffer.size());
  std::memcpy(out.data(), buffer.data(), buffer.size());
  return out;
}

std::string host_identity() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return std::string(name) + "/" + id;
}

Result<PeerDescriptor> decode_descriptor(const ucx::Bytes& bytes) {
  if (bytes.size() > kMaxDescriptor) return make_error("descriptor: larger than 256 KiB");
  msgpack::object_handle handle;
  try {
    // Limits keep a hostile header from making msgpack-cxx allocate for elements never sent.
    // Maps of up to 64 keys: room for newer peers' additions (13 keys today).
    const msgpack::unpack_limit limits(16, 64, kMaxBlob, kMaxBlob, 16, 2);
    handle = msgpack::unpack(reinterpret_cast<const char*>(bytes.data()), bytes.size(), nullptr,
                             nullptr, limits);
  } catch (const std::exception& e) {
    return make_error(std::string("descriptor: not msgpack: ") + e.what());
  }
  const msgpack::object& root = handle.get();
  if (root.type != msgpack::type::MAP) return make_error("descriptor: expected a map");
  PeerDescriptor d;
  unsigned seen = 0;
  bool token_seen = false;
  for (std::uint32_t i = 0; i < root.via.map.size; ++i) {
    const msgpack::object& k = root.via.map.ptr[i].key;
    const msgpack::object& v = root.via.map.ptr[i].val;
    if (k.type != msgpack::type::STR) return make_error("descriptor: a key is not a string");
    const std::string_view key(k.via.str.ptr, k.via.str.size);
    auto bin = [&](ucx::Bytes& out, unsigned bit) -> Status {
      if (v.type != msgpack::type::BIN) return field_error(key, "expected bin");
      if (v.via.bin.size == 0) return field_error(key, "empty");
      out.resize(v.via.bin.size);
      std::memcpy(out.data(), v.via.bin.ptr, v.via.bin.size);
      seen |= bit;
      return {};
    };
    auto uint = [&](std::uint64_t& out, std::uint64_t max, unsigned bit) -> Status {
      if (v.type != msgpack::type::POSITIVE_INTEGER)
        return field_error(key, "expected an unsigned integer");
      if (v.via.u64 > max) return field_error(key, "out of range");
      out = v.via.u64;
      seen |= bit;
      return {};
    };
    Status s;
    std::uint64_t pages = 0;
    if (key == "node") {
      if (v.type != msgpack::type::STR) return field_error(key, "expected a string");
      if (v.via.str.size > kMaxNode) return field_error(key, "longer than 1024 bytes");
      d.node.assign(v.via.str.ptr, v.via.str.size);
      seen |= 1;
    } else if (key == "worker_address") {
      s = bin(d.worker_address, 2);
    } else if (key == "rkey") {
      s = bin(d.rkey, 4);
    } else if (key == "base") {
      s = uint(d.base, std::numeric_limits<std::uint64_t>::max(), 8);
    } else if (key == "page_bytes") {
      s = uint(d.page_bytes, std::numeric_limits<std::uint64_t>::max(), 16);
    } else if (key == "error") {
      if (v.type != msgpack::type::STR) return field_error(key, "expected a string");
      return make_error("refused: " + std::string(v.via.str.ptr,
                                                  std::min<std::size_t>(v.via.str.size, kMaxNode)));
    } else if (key == "host") {
      if (v.type != msgpack::type::STR) return field_error(key, "expected a string");
      if (v.via.str.size > kMaxNode) return field_error(key, "longer than 1024 bytes");
      d.host.assign(v.via.str.ptr, v.via.str.size);
    } else if (key == "rma") {
      if (v.type != msgpack::type::BOOLEAN) return field_error(key, "expected a boolean");
      d.rma = v.via.boolean;
    } else if (key == "instance") {
      s = uint(d.instance, std::numeric_limits<std::uint64_t>::max(), 0);
    } else if (key == "share") {
      if (v.type != msgpack::type::STR) return field_error(key, "expected a string");
      if (v.via.str.size > kMaxShareName) return field_error(key, "longer than 107 bytes");
      d.share.assign(v.via.str.ptr, v.via.str.size);
      // Only a kvnode share socket: a peer must not make us connect to just any abstract socket.
      if (!d.share.starts_with(kShareNamePrefix))
        return field_error(key,
                           "not a kvnode pool share (" + std::string(kShareNamePrefix) + "...)");
    } else if (key == "share_token") {
      if (v.type != msgpack::type::BIN) return field_error(key, "expected bin");
      if (v.via.bin.size != d.share_token.size()) return field_error(key, "not 16 bytes");
      std::memcpy(d.share_token.data(), v.via.bin.ptr, d.share_token.size());
      token_seen = true;
    } else if (key == "pool_kind") {
      std::uint64_t kind = 0;
      s = uint(kind, kMaxPoolKind, 0);
      d.pool_kind = static_cast<std::uint8_t>(kind);
    } else if (key == "device") {
      std::uint64_t device = 0;
      s = uint(device, std::numeric_limits<std::int32_t>::max(), 0);
      d.device = static_cast<std::uint32_t>(device);
    } else if (key == "pages") {
      s = uint(pages, std::numeric_limits<std::uint32_t>::max(), 32);
      d.pages = static_cast<std::uint32_t>(pages);
    }  // unknown keys: a newer peer's additions, ignored
    if (!s) return s.error();
  }
  const char* names[] = {"node", "worker_address", "rkey", "base", "page_bytes", "pages"};
  for (unsigned b = 0; b < 6; ++b)
    if (!(seen & (1u << b))) return field_error(names[b], "missing");
  if (!d.share.empty() && !token_seen) return field_error("share_token", "missing");
  if (d.page_bytes == 0 || d.pages == 0) return make_error("descriptor: an empty pool");
  if (d.page_bytes > std::numeric_limits<std::uint64_t>::max() / d.pages ||
      d.base > std::numeric_limits<std::uint64_t>::max() - d.page_bytes * d.pages)
    return make_error("descriptor: the pool wraps around the address space");
  return d;
}

}  // namespace kvnode::transfer
