// The CUDA runtime calls behind MemoryRegion's pinned and device kinds and ChunkPool's copies into
// device pages. Built as stubs that return errors when the build has no CUDA, so memory_region.cpp
// and chunk_pool.cpp have no #if.
#pragma once

#include <cstddef>

#include "kvnode/common/result.hpp"

namespace kvnode::gpu::detail {

Result<void*> cuda_host_alloc(std::size_t bytes);
void cuda_host_free(void* p);
// cudaHostRegister (portable) of an existing mapping, and its undoing: the pinned kind of a
// shareable region is a memfd mapping pinned in place rather than cudaHostAlloc memory.
Status cuda_host_register(void* p, std::size_t bytes);
void cuda_host_unregister(void* p);
Result<void*> cuda_device_alloc(std::size_t bytes, int device);
void cuda_device_free(void* p, int device);
// cudaMemcpy with cudaMemcpyDefault (the direction follows from the pointers under unified
// addressing), `device` current; synchronous.
Status cuda_memcpy(void* dst, const void* src, std::size_t bytes, int device);

}  // namespace kvnode::gpu::detail

namespace kvnode::gpu::detail {

// A dma-buf file descriptor for [p, p + bytes) of device memory, from the driver's
// cuMemGetHandleForAddressRange reached through cudaGetDriverEntryPointByVersion (kvnode never
// links libcuda). The caller closes it.
Result<int> cuda_dmabuf_fd(void* p, std::size_t bytes);

}  // namespace kvnode::gpu::detail
