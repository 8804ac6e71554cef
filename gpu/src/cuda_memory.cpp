#include "cuda_memory.hpp"

#include <string>

#if KVNODE_HAVE_CUDA
#include <cuda.h>  // types only: the driver is reached through the runtime, never linked
#include <cuda_runtime_api.h>
#endif

namespace kvnode::gpu::detail {

#if KVNODE_HAVE_CUDA
namespace {

Error cuda_error(const char* what, cudaError_t err) {
  (void)cudaGetLastError();  // clear the sticky error state
  std::string hint;
  if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice)
    hint = " (this host has no usable GPU: use host memory)";
  return make_error(std::string(what) + " failed: " + cudaGetErrorName(err) + ": " +
                    cudaGetErrorString(err) + hint);
}

}  // namespace

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

Result<void*> cuda_device_alloc(std::size_t bytes, int device) {
  if (const cudaError_t err = cudaSetDevice(device); err != cudaSuccess)
    return cuda_error(("cudaSetDevice(" + std::to_string(device) + ")").c_str(), err);
  void* p = nullptr;
  if (const cudaError_t err = cudaMalloc(&p, bytes); err != cudaSuccess)
    return cuda_error("cudaMalloc", err);
  return p;
}

void cuda_device_free(void* p, int device) {
  (void)cudaSetDevice(device);
  (void)cudaFree(p);
}

Result<int> cuda_dmabuf_fd(void* p, std::size_t bytes) {
  using GetHandle =
      CUresult (*)(void*, CUdeviceptr, std::size_t, CUmemRangeHandleType, unsigned long long);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (const cudaError_t err = cudaGetDriverEntryPointByVersion("cuMemGetHandleForAddressRange", &fn,
                                                               12000, cudaEnableDefault, &found);
      err != cudaSuccess)
    return cuda_error("cudaGetDriverEntryPointByVersion(cuMemGetHandleForAddressRange)", err);
  if (found != cudaDriverEntryPointSuccess || fn == nullptr)
    return make_error(
        "the CUDA driver has no cuMemGetHandleForAddressRange (dma-buf needs driver "
        ">= 515 and a kernel with dma-buf support)");
  int fd = -1;
  const CUresult r = reinterpret_cast<GetHandle>(fn)(&fd, reinterpret_cast<CUdeviceptr>(p), bytes,
                                                     CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (r != CUDA_SUCCESS)
    return make_error("cuMemGetHandleForAddressRange(DMA_BUF_FD) failed: CUresult " +
                      std::to_string(static_cast<int>(r)) +
                      " (the range must be page-aligned; the GPU and driver must support dma-buf)");
  return fd;
}

#else

Result<void*> cuda_host_alloc(std::size_t) {
  return make_error("pinned host memory needs a kvnode built with the CUDA Toolkit");
}
void cuda_host_free(void*) {}
Result<void*> cuda_device_alloc(std::size_t, int) {
  return make_error("device memory needs a kvnode built with the CUDA Toolkit");
}
void cuda_device_free(void*, int) {}
Result<int> cuda_dmabuf_fd(void*, std::size_t) {
  return make_error("dma-buf export needs a kvnode built with the CUDA Toolkit");
}

#endif

}  // namespace kvnode::gpu::detail
