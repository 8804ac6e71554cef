#include "kv_wire_codec.hpp"

#include <array>
#include <utility>

namespace kvnode::client::protocol::detail {
namespace {

constexpr std::array kKinds = {KvMemoryKind::kHostFd, KvMemoryKind::kCudaIpc,
                               KvMemoryKind::kCudaVmmFd, KvMemoryKind::kHostProcess};

Status read_u32(const msgpack::object& v, const std::string& path, std::uint32_t& out) {
  std::uint64_t wide = 0;
  if (Status s = read_uint(v, path, wide); !s) return s;
  if (wide > UINT32_MAX) return field_error(path, "does not fit 32 bits");
  out = static_cast<std::uint32_t>(wide);
  return {};
}

Status read_array(const msgpack::object& v, const std::string& path, std::size_t max,
                  std::size_t exact = 0) {
  if (v.type != msgpack::type::ARRAY) return field_error(path, "expected an array");
  if (v.via.array.size > max) return field_error(path, "more than " + std::to_string(max));
  if (exact != 0 && v.via.array.size != exact)
    return field_error(path, "expected " + std::to_string(exact) + " entries");
  return {};
}

Status read_allocation(const msgpack::object& v, const std::string& path, WireAllocation& out) {
  if (Status s = read_array(v, path, 3, 3); !s) return s;
  std::string kind;
  if (Status s = read_str(v.via.array.ptr[0], path + "[0]", kind); !s) return s;
  bool known = false;
  for (KvMemoryKind k : kKinds) {
    if (kind == to_string(k)) {
      out.kind = k;
      known = true;
    }
  }
  if (!known) return field_error(path + "[0]", "unknown memory kind '" + kind + "'");
  if (Status s = read_uint(v.via.array.ptr[1], path + "[1]", out.bytes); !s) return s;
  const msgpack::object& h = v.via.array.ptr[2];
  if (out.kind == KvMemoryKind::kHostProcess) return read_uint(h, path + "[2]", out.address);
  if (out.kind != KvMemoryKind::kCudaIpc) {
    if (h.type != msgpack::type::NIL) return field_error(path + "[2]", "expected nil");
    return {};
  }
  if (Status s = read_bin(h, path + "[2]", out.handle); !s) return s;
  if (out.handle.size() != kCudaIpcHandleBytes)
    return field_error(path + "[2]", "an IPC handle is " + std::to_string(kCudaIpcHandleBytes) +
                                         " bytes, got " + std::to_string(out.handle.size()));
  return {};
}

Status read_tensor(const msgpack::object& v, const std::string& path, WireTensor& out) {
  if (Status s = read_array(v, path, 5, 5); !s) return s;
  const msgpack::object* f = v.via.array.ptr;
  if (Status s = read_u32(f[0], path + "[0]", out.allocation); !s) return s;
  std::uint64_t* const fields[] = {&out.offset, &out.block_stride, &out.token_stride,
                                   &out.head_stride};
  for (std::size_t i = 0; i < 4; ++i)
    if (Status s = read_uint(f[i + 1], path + "[" + std::to_string(i + 1) + "]", *fields[i]); !s)
      return s;
  return {};
}

}  // namespace

void pack_kv_layout(Packer& pk, const KvWireLayout& l) {
  pk.pack_map(9);
  pack_str(pk, "format");
  pack_str(pk, l.format == KvFormat::kMla ? "mla" : "kv");
  const std::pair<const char*, std::uint32_t> fields[] = {
      {"num_blocks", l.num_blocks}, {"block_size", l.block_size}, {"kv_heads", l.kv_heads},
      {"head_size", l.head_size},   {"elem_bytes", l.elem_bytes}, {"layers", l.layers}};
  for (const auto& [key, value] : fields) {
    pack_str(pk, key);
    pk.pack(value);
  }
  pack_str(pk, "allocations");
  pk.pack_array(static_cast<std::uint32_t>(l.allocations.size()));
  for (const WireAllocation& a : l.allocations) {
    pk.pack_array(3);
    pack_str(pk, to_string(a.kind));
    pk.pack(a.bytes);
    if (a.kind == KvMemoryKind::kCudaIpc) {
      pack_bin(pk, a.handle);
    } else if (a.kind == KvMemoryKind::kHostProcess) {
      pk.pack(a.address);
    } else {
      pk.pack_nil();
    }
  }
  pack_str(pk, "tensors");
  pk.pack_array(static_cast<std::uint32_t>(l.tensors.size()));
  for (const WireTensor& t : l.tensors) {
    pk.pack_array(5);
    pk.pack(t.allocation);
    pk.pack(t.offset);
    pk.pack(t.block_stride);
    pk.pack(t.token_stride);
    pk.pack(t.head_stride);
  }
}

Status read_kv_layout(const msgpack::object& v, const std::string& path, KvWireLayout& out) {
  if (v.type != msgpack::type::MAP) return field_error(path, "expected a map");
  bool has_format = false;
  for (std::uint32_t i = 0; i < v.via.map.size; ++i) {
    const msgpack::object& k = v.via.map.ptr[i].key;
    const msgpack::object& val = v.via.map.ptr[i].val;
    if (k.type != msgpack::type::STR) return field_error(path, "a key is not a string");
    const std::string key(k.via.str.ptr, k.via.str.size);
    const std::string at = path + "." + key;
    Status s;
    if (key == "format") {
      std::string f;
      s = read_str(val, at, f);
      if (s && f != "kv" && f != "mla") s = field_error(at, "'" + f + "' (kv or mla)");
      out.format = f == "mla" ? KvFormat::kMla : KvFormat::kKeyValue;
      has_format = true;
    } else if (key == "num_blocks") {
      s = read_u32(val, at, out.num_blocks);
    } else if (key == "block_size") {
      s = read_u32(val, at, out.block_size);
    } else if (key == "kv_heads") {
      s = read_u32(val, at, out.kv_heads);
    } else if (key == "head_size") {
      s = read_u32(val, at, out.head_size);
    } else if (key == "elem_bytes") {
      s = read_u32(val, at, out.elem_bytes);
    } else if (key == "layers") {
      s = read_u32(val, at, out.layers);
    } else if (key == "allocations") {
      s = read_array(val, at, kMaxKvAllocations);
      if (s) out.allocations.resize(val.via.array.size);
      for (std::uint32_t j = 0; s && j < val.via.array.size; ++j)
        s = read_allocation(val.via.array.ptr[j], at + "[" + std::to_string(j) + "]",
                            out.allocations[j]);
    } else if (key == "tensors") {
      s = read_array(val, at, 2 * kMaxKvLayers);
      if (s) out.tensors.resize(val.via.array.size);
      for (std::uint32_t j = 0; s && j < val.via.array.size; ++j)
        s = read_tensor(val.via.array.ptr[j], at + "[" + std::to_string(j) + "]", out.tensors[j]);
    } else {
      s = field_error(at, "unknown field");
    }
    if (!s) return s;
  }
  if (!has_format) return field_error(path + ".format", "missing");
  return {};
}

}  // namespace kvnode::client::protocol::detail
