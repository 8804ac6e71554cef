// RDMA NIC discovery through libibverbs. kvnode's transfer plane prefers RDMA; this probe lists the
// verbs devices with their NUMA node and PCI path so that chunks can be placed near their NIC.
// A host without RDMA (ibv_get_device_list failing or empty) yields no devices and a note.
#pragma once

#include <string>
#include <vector>

namespace kvnode::gpu {

struct RdmaDevice {
  std::string name;       // "mlx5_0"
  std::string node_guid;  // "0c42:a103:0065:7a1c"
  int numa_node = -1;     // -1 when unknown
  std::string pci_path;   // resolved sysfs path of the device, e.g. /sys/devices/pci0000:00/...
};

struct RdmaProbe {
  std::vector<RdmaDevice> devices;
  std::string note;  // why `devices` is empty, or empty when devices were found
};

RdmaProbe probe_rdma();

}  // namespace kvnode::gpu
