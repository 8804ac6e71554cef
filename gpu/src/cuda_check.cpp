// Compiled only where KVNODE_HAVE_CUDA is set (see gpu/CMakeLists.txt).
#include "cuda_check.hpp"

namespace kvnode::gpu::detail {

Error cuda_error(const std::string& what, cudaError_t err) {
  (void)cudaGetLastError();  // clear the sticky error state
  ErrorCode code = ErrorCode::kIo;
  std::string hint;
  if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice) {
    code = ErrorCode::kRefused;
    hint = " (this host has no usable GPU: use host memory)";
  } else if (err == cudaErrorInvalidDevice) {
    code = ErrorCode::kRefused;
  } else if (err == cudaErrorMemoryAllocation) {
    code = ErrorCode::kNoRoom;
  }
  return make_error(
      code, what + " failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err) + hint);
}

Error driver_error(const std::string& what, CUresult result) {
  const char* name = nullptr;
  if (Result<PFN_cuGetErrorName_v6000> get =
          driver_function<PFN_cuGetErrorName_v6000>("cuGetErrorName")) {
    if ((*get)(result, &name) != CUDA_SUCCESS) name = nullptr;
  }
  const ErrorCode code = result == CUDA_ERROR_OUT_OF_MEMORY ? ErrorCode::kNoRoom : ErrorCode::kIo;
  return make_error(code, what + " failed: " + (name ? name : "CUresult") + " (" +
                              std::to_string(static_cast<int>(result)) + ")");
}

Status set_device(int device) {
  if (const cudaError_t err = cudaSetDevice(device); err != cudaSuccess)
    return cuda_error("cudaSetDevice(" + std::to_string(device) + ")", err);
  return {};
}

Result<void*> driver_entry_point(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (const cudaError_t err =
          cudaGetDriverEntryPointByVersion(name, &fn, kDriverAbiVersion, cudaEnableDefault, &found);
      err != cudaSuccess)
    return cuda_error(std::string("cudaGetDriverEntryPointByVersion(") + name + ")", err);
  if (found != cudaDriverEntryPointSuccess || fn == nullptr)
    return make_error(ErrorCode::kRefused, std::string("the CUDA driver has no ") + name +
                                               (found == cudaDriverEntryPointVersionNotSufficent
                                                    ? " (the driver is older than CUDA 12.0)"
                                                    : ""));
  return fn;
}

}  // namespace kvnode::gpu::detail
