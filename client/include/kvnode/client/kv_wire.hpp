// A KvLayout as it crosses the local socket: allocations by how the node maps them (a memfd or
// VMM fd travels beside the frame with SCM_RIGHTS, in allocation order; a CUDA IPC handle or the
// address of the engine's own memory inside it), tensors by allocation index and offset instead of
// this process's pointers. The engine's side makes it with to_wire(); the node rebuilds a KvLayout
// in its own address space with from_wire() from the bases it mapped, and validates it. Limits keep
// a hostile message from costing the node memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvnode/client/kv_layout.hpp"
#include "kvnode/client/kv_memory.hpp"
#include "kvnode/common/result.hpp"

namespace kvnode::client {

inline constexpr std::size_t kMaxKvLayers = 4096;
inline constexpr std::size_t kMaxKvAllocations = 2 * kMaxKvLayers;
inline constexpr std::size_t kMaxKvFds = 253;  // SCM_MAX_FD: what one sendmsg may carry

struct WireAllocation {
  KvMemoryKind kind = KvMemoryKind::kHostFd;
  std::uint64_t bytes = 0;
  std::vector<std::byte> handle{};  // kCudaIpc: the 64-byte IPC handle
  std::uint64_t address = 0;        // kHostProcess: its base in the engine's address space
};

struct WireTensor {
  std::uint32_t allocation = 0;  // index into allocations
  std::uint64_t offset = 0;      // from the allocation's base
  std::uint64_t block_stride = 0, token_stride = 0, head_stride = 0;
};

struct KvWireLayout {
  KvFormat format = KvFormat::kKeyValue;
  std::uint32_t num_blocks = 0, block_size = 0, kv_heads = 0, head_size = 0, elem_bytes = 0;
  std::uint32_t layers = 0;
  std::vector<WireAllocation> allocations{};
  std::vector<WireTensor> tensors{};  // per layer: K then V (MLA: one)

  // Descriptors that travel with it: one per kHostFd or kCudaVmmFd allocation, in order.
  std::size_t fd_count() const;
};

// Checks the layout (validate()) and that every tensor lies inside one of `allocations` (named by
// its base); an error names the tensor or the allocation.
Result<KvWireLayout> to_wire(const KvLayout& layout, std::span<const KvAllocation> allocations);
// The layout in the node's address space: tensor i at bases[its allocation] + offset. Checks the
// counts, each allocation's size against `sizes` (what the node mapped), then validate().
Result<KvLayout> from_wire(const KvWireLayout& wire, std::span<std::byte* const> bases,
                           std::span<const std::size_t> sizes);

}  // namespace kvnode::client
