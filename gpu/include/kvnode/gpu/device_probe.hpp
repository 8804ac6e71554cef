// CUDA device discovery. kvnode moves KV-cache chunks that may live in GPU memory; this probe
// reports whether the build has CUDA support and which devices the runtime sees. It never aborts:
// on a host without a GPU or driver, `devices` is empty and `note` says why.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kvnode::gpu {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  std::string pci_bus_id;        // "0000:3b:00.0"
  std::size_t total_memory = 0;  // bytes
};

struct CudaProbe {
  bool built_with_cuda = false;
  int runtime_version = 0;  // 1000 * major + 10 * minor, 0 when unknown
  int driver_version = 0;   // 0 when no driver is installed
  std::vector<CudaDeviceInfo> devices;
  std::string note;  // why `devices` is empty, or empty when all went well
};

CudaProbe probe_cuda();

}  // namespace kvnode::gpu
