// GPUDirect RDMA, checked rather than assumed: a device region is exported as a dma-buf (through
// the CUDA runtime's driver entry point) and registered with ibv_reg_dmabuf_mr on an RDMA NIC.
// When that works, the NIC can read and write GPU memory directly and a UCX built with CUDA can
// register the pool as is; when it does not, the plane stages device chunks through pinned host
// memory. No NIC (ibv_get_device_list failing with ENOSYS, as here) is an answer, not an error.
#pragma once

#include <string>

#include "kvnode/gpu/memory_region.hpp"

namespace kvnode::gpu {

struct GpuDirectCheck {
  bool supported = false;
  std::string nic;     // the device tried, e.g. "mlx5_0"
  std::string detail;  // what worked, or the first step that did not and why
};

// `nic`: a verbs device name; empty: the first one listed.
GpuDirectCheck check_gpudirect(const MemoryRegion& region, const std::string& nic = "");

}  // namespace kvnode::gpu
