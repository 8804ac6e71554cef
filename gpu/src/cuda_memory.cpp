#include "cuda_memory.hpp"

#include <string>

#if KVNODE_HAVE_CUDA
#include "cuda_check.hpp"
#endif

namespace kvnode::gpu::detail {

#if KVNODE_HAVE_CUDA

Result<void*> cuda_host_alloc(std::size_t bytes) {
  void* p = nullptr;
  // Portable: pinned for every context, so any device's copies and UCX's registration see it.
  if (const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable); err != cudaSuccess)
    return cuda_error("cudaHostAlloc", err);
  return p;
}

void cuda_host_free(void* p) {
  (void)cudaFreeHost(p);
}

Status cuda_host_register(void* p, std::size_t bytes) {
  // Portable, as cudaHostAlloc's: pinned for every context. Pinning faults every page in.
  if (const cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
      err != cudaSuccess)
    return cuda_error("cudaHostRegister of " + std::to_string(bytes) + " bytes", err);
  return {};
}

void cuda_host_unregister(void* p) {
  (void)cudaHostUnregister(p);
}

Result<void*> cuda_device_alloc(std::size_t bytes, int device) {
  if (Status s = set_device(device); !s) return s.error();
  void* p = nullptr;
  if (const cudaError_t err = cudaMalloc(&p, bytes); err != cudaSuccess)
    return cuda_error("cudaMalloc", err);
  return p;
}

void cuda_device_free(void* p, int device) {
  (void)cudaSetDevice(device);
  (void)cudaFree(p);
}

Status cuda_memcpy(void* dst, const void* src, std::size_t bytes, int device) {
  if (Status s = set_device(device); !s) return s;
  if (const cudaError_t err = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault); err != cudaSuccess)
    return cuda_error("cudaMemcpy of " + std::to_string(bytes) + " bytes", err);
  // From pageable memory cudaMemcpy may return once the bytes are staged, before the DMA to the
  // device ends; a chunk is committed right after this, so wait for the copy itself.
  if (const cudaError_t err = cudaStreamSynchronize(cudaStreamLegacy); err != cudaSuccess)
    return cuda_error("cudaStreamSynchronize after cudaMemcpy", err);
  return {};
}

Result<int> cuda_dmabuf_fd(void* p, std::size_t bytes) {
  Result<PFN_cuMemGetHandleForAddressRange_v11070> get =
      driver_function<PFN_cuMemGetHandleForAddressRange_v11070>("cuMemGetHandleForAddressRange");
  if (!get) {
    Error e = std::move(get).error();
    e.message += " (dma-buf needs driver >= 515 and a kernel with dma-buf support)";
    return e;
  }
  int fd = -1;
  const CUresult r =
      (*get)(&fd, reinterpret_cast<CUdeviceptr>(p), bytes, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (r != CUDA_SUCCESS) {
    Error e = driver_error("cuMemGetHandleForAddressRange(DMA_BUF_FD)", r);
    e.message += " (the range must be page-aligned; the GPU and driver must support dma-buf)";
    return e;
  }
  return fd;
}

#else

Result<void*> cuda_host_alloc(std::size_t) {
  return make_error(ErrorCode::kRefused,
                    "pinned host memory needs a kvnode built with the CUDA Toolkit");
}
void cuda_host_free(void*) {}
Status cuda_host_register(void*, std::size_t) {
  return make_error(ErrorCode::kRefused,
                    "pinned host memory needs a kvnode built with the CUDA Toolkit");
}
void cuda_host_unregister(void*) {}
Result<void*> cuda_device_alloc(std::size_t, int) {
  return make_error(ErrorCode::kRefused,
                    "device memory needs a kvnode built with the CUDA Toolkit");
}
void cuda_device_free(void*, int) {}
Status cuda_memcpy(void*, const void*, std::size_t, int) {
  return make_error(ErrorCode::kRefused, "cudaMemcpy needs a kvnode built with the CUDA Toolkit");
}
Result<int> cuda_dmabuf_fd(void*, std::size_t) {
  return make_error(ErrorCode::kRefused,
                    "dma-buf export needs a kvnode built with the CUDA Toolkit");
}

#endif

}  // namespace kvnode::gpu::detail
