// KvLayout <-> KvWireLayout: pointers become (allocation, offset) on the engine's side and
// pointers again on the node's, with every index, size and count checked on the way in.
#include "kvnode/client/kv_wire.hpp"

#include <string>

namespace kvnode::client {
namespace {

bool carries_fd(KvMemoryKind kind) {
  return kind == KvMemoryKind::kHostFd || kind == KvMemoryKind::kCudaVmmFd;
}

std::string tensor_name(std::size_t i, bool mla) {
  const std::size_t per_layer = mla ? 1 : 2;
  return "layers[" + std::to_string(i / per_layer) + "]." + (i % per_layer == 0 ? "k" : "v");
}

}  // namespace

std::size_t KvWireLayout::fd_count() const {
  std::size_t n = 0;
  for (const WireAllocation& a : allocations) n += carries_fd(a.kind) ? 1 : 0;
  return n;
}

Result<KvWireLayout> to_wire(const KvLayout& layout, std::span<const KvAllocation> allocations) {
  if (Status st = validate(layout); !st) return wrap_error("layout: ", st.error());
  if (allocations.empty()) return make_error("allocations: none given");
  if (allocations.size() > kMaxKvAllocations)
    return make_error("allocations: more than " + std::to_string(kMaxKvAllocations));
  if (layout.layers.size() > kMaxKvLayers)
    return make_error("layers: more than " + std::to_string(kMaxKvLayers));
  KvWireLayout w;
  w.format = layout.format;
  w.num_blocks = layout.num_blocks;
  w.block_size = layout.block_size;
  w.kv_heads = layout.kv_heads;
  w.head_size = layout.head_size;
  w.elem_bytes = layout.elem_bytes;
  w.layers = static_cast<std::uint32_t>(layout.layers.size());
  for (std::size_t i = 0; i < allocations.size(); ++i) {
    const KvAllocation& a = allocations[i];
    const std::string name = "allocations[" + std::to_string(i) + "]";
    if (a.base == nullptr) return make_error(name + ".base: null");
    if (a.bytes == 0) return make_error(name + ".bytes: must be > 0");
    if (carries_fd(a.kind) && a.fd < 0) return make_error(name + ".fd: not a descriptor");
    WireAllocation wa;
    wa.kind = a.kind;
    wa.bytes = a.bytes;
    if (a.kind == KvMemoryKind::kCudaIpc)
      wa.handle.assign(a.ipc_handle.begin(), a.ipc_handle.end());
    if (a.kind == KvMemoryKind::kHostProcess)
      wa.address = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(a.base));
    w.allocations.push_back(std::move(wa));
  }
  if (w.fd_count() > kMaxKvFds)
    return make_error("allocations: " + std::to_string(w.fd_count()) +
                      " descriptors, one registration carries at most " +
                      std::to_string(kMaxKvFds) + " (register fewer, larger allocations)");
  const bool mla = layout.format == KvFormat::kMla;
  for (const KvLayerTensors& lt : layout.layers) {
    for (const KvTensor* t : {&lt.k, &lt.v}) {
      if (mla && t == &lt.v) continue;
      const std::string name = tensor_name(w.tensors.size(), mla);
      std::size_t found = allocations.size();
      for (std::size_t i = 0; i < allocations.size(); ++i)
        if (allocations[i].base == t->base) found = i;
      if (found == allocations.size())
        return make_error(name + ".base: not the base of any allocation given");
      if (t->allocation_bytes > allocations[found].bytes)
        return make_error(name + ".allocation_bytes: " + std::to_string(t->allocation_bytes) +
                          ", but allocations[" + std::to_string(found) + "] holds " +
                          std::to_string(allocations[found].bytes));
      w.tensors.push_back({static_cast<std::uint32_t>(found), t->offset, t->block_stride,
                           t->token_stride, t->head_stride});
    }
  }
  return w;
}

Result<KvLayout> from_wire(const KvWireLayout& w, std::span<std::byte* const> bases,
                           std::span<const std::size_t> sizes) {
  if (w.layers == 0 || w.layers > kMaxKvLayers)
    return make_error("kv_layout.layers: " + std::to_string(w.layers) + " (1 to " +
                      std::to_string(kMaxKvLayers) + ")");
  const bool mla = w.format == KvFormat::kMla;
  const std::size_t want = std::size_t{w.layers} * (mla ? 1 : 2);
  if (w.tensors.size() != want)
    return make_error("kv_layout.tensors: " + std::to_string(w.tensors.size()) + " for " +
                      std::to_string(w.layers) + " layers, expected " + std::to_string(want));
  if (bases.size() != w.allocations.size() || sizes.size() != w.allocations.size())
    return make_error(ErrorCode::kInternal, "kv_layout.allocations: mapped " +
                                                std::to_string(bases.size()) + " of " +
                                                std::to_string(w.allocations.size()));
  KvLayout l;
  l.format = w.format;
  l.num_blocks = w.num_blocks;
  l.block_size = w.block_size;
  l.kv_heads = w.kv_heads;
  l.head_size = w.head_size;
  l.elem_bytes = w.elem_bytes;
  l.layers.resize(w.layers);
  for (std::size_t i = 0; i < w.tensors.size(); ++i) {
    const WireTensor& wt = w.tensors[i];
    if (wt.allocation >= w.allocations.size())
      return make_error("kv_layout.tensors[" + std::to_string(i) + "] (" + tensor_name(i, mla) +
                        ").allocation: " + std::to_string(wt.allocation) + " of " +
                        std::to_string(w.allocations.size()));
    KvTensor t;
    t.base = bases[wt.allocation];
    t.allocation_bytes = sizes[wt.allocation];
    t.offset = wt.offset;
    t.block_stride = wt.block_stride;
    t.token_stride = wt.token_stride;
    t.head_stride = wt.head_stride;
    KvLayerTensors& lt = l.layers[mla ? i : i / 2];
    ((mla || i % 2 == 0) ? lt.k : lt.v) = t;
  }
  if (Status st = validate(l); !st) return wrap_error("kv_layout: ", st.error());
  return l;
}

}  // namespace kvnode::client
