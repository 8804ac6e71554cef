// The driver's virtual memory management calls (cuMem*), reached through the runtime, for the
// VMM side of cuda_ipc.hpp: a physical allocation handle mapped read/write for a device at a
// reserved address range, and released again. CUDA builds only.
#pragma once

#include <cstddef>

#include "cuda_check.hpp"

namespace kvnode::gpu::detail {

// A reserved address range with an allocation mapped over all of it.
struct VmmMapping {
  CUdeviceptr ptr = 0;
  std::size_t size = 0;
};

// The minimum granularity of allocations with `prop` (sizes and addresses are multiples of it).
Result<std::size_t> vmm_granularity(const CUmemAllocationProp& prop);
// cuMemAddressReserve + cuMemMap + cuMemSetAccess(read/write on `device`); undone on failure.
// `size` and `alignment` are multiples of the allocation's granularity.
Result<VmmMapping> vmm_map(CUmemGenericAllocationHandle handle, std::size_t size,
                           std::size_t alignment, int device);
// cuMemUnmap + cuMemAddressFree; the physical memory goes once its handles are released too.
void vmm_unmap(const VmmMapping& mapping);
void vmm_release(CUmemGenericAllocationHandle handle);
// cuMemImportFromShareableHandle of a POSIX fd (the fd stays the caller's).
Result<CUmemGenericAllocationHandle> vmm_import(int fd);
// cuMemGetAllocationPropertiesFromHandle.
Result<CUmemAllocationProp> vmm_properties(CUmemGenericAllocationHandle handle);

inline std::size_t round_up(std::size_t bytes, std::size_t multiple) {
  return (bytes + multiple - 1) / multiple * multiple;
}

}  // namespace kvnode::gpu::detail
