// probe_cuda(): asks the CUDA runtime (never the driver library) for devices.
#include "kvnode/gpu/device_probe.hpp"

#ifdef KVNODE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <array>
#endif

namespace kvnode::gpu {

#ifdef KVNODE_HAVE_CUDA

namespace {

std::string describe(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

CudaDeviceInfo device_info(int index) {
  CudaDeviceInfo info;
  info.index = index;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) == cudaSuccess) {
    info.name = prop.name;
    info.total_memory = prop.totalGlobalMem;
  }
  std::array<char, 32> bus_id{};
  if (cudaDeviceGetPCIBusId(bus_id.data(), static_cast<int>(bus_id.size()), index) == cudaSuccess) {
    info.pci_bus_id = bus_id.data();
  }
  return info;
}

}  // namespace

CudaProbe probe_cuda() {
  CudaProbe probe;
  probe.built_with_cuda = true;
  (void)cudaRuntimeGetVersion(&probe.runtime_version);
  (void)cudaDriverGetVersion(&probe.driver_version);  // 0 without a driver

  int count = 0;  // cudaGetDeviceCount leaves it unwritten when it fails
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice) {
    probe.note = err == cudaErrorNoDevice ? "no CUDA device (cudaErrorNoDevice)"
                                          : "no CUDA driver (cudaErrorInsufficientDriver)";
    (void)cudaGetLastError();  // clear the sticky error state
    return probe;
  }
  if (err != cudaSuccess) {
    probe.note = "CUDA unavailable (" + describe(err) + ")";
    (void)cudaGetLastError();
    return probe;
  }
  for (int i = 0; i < count; ++i) probe.devices.push_back(device_info(i));
  if (probe.devices.empty()) probe.note = "no CUDA device";
  return probe;
}

#else

CudaProbe probe_cuda() {
  CudaProbe probe;
  probe.note =
      "built without CUDA (configure with the CUDA Toolkit present and KVNODE_CUDA=AUTO|ON)";
  return probe;
}

#endif

}  // namespace kvnode::gpu
