// What the CUDA sources share: a runtime or driver failure turned into an Error naming the call,
// cudaSetDevice with its error, and driver functions reached through the runtime
// (cudaGetDriverEntryPointByVersion: kvnode never links libcuda). Included only where
// KVNODE_HAVE_CUDA is set.
#pragma once

#include <cuda.h>          // driver types only
#include <cudaTypedefs.h>  // PFN_<function>_v<version>
#include <cuda_runtime_api.h>

#include <string>

#include "kvnode/common/result.hpp"

namespace kvnode::gpu::detail {

// The driver ABI kvnode asks for: every function it uses has this version's signature.
inline constexpr unsigned kDriverAbiVersion = 12000;

// "<what> failed: <name>: <description>", the code by kind (no device: kRefused, out of memory:
// kNoRoom, else kIo); clears the runtime's last-error state.
Error cuda_error(const std::string& what, cudaError_t err);
// The same for a driver call: "<what> failed: <CUresult name> (<number>)".
Error driver_error(const std::string& what, CUresult result);
Status set_device(int device);

// The driver function `name` with the signature of kDriverAbiVersion; an error naming it where
// the driver lacks it.
Result<void*> driver_entry_point(const char* name);
template <class Fn>
Result<Fn> driver_function(const char* name) {
  Result<void*> fn = driver_entry_point(name);
  if (!fn) return std::move(fn).error();
  return reinterpret_cast<Fn>(*fn);
}

}  // namespace kvnode::gpu::detail
