// Which RDMA NIC should carry a GPU's (or a NUMA node's) chunks: the one closest on the PCIe
// tree, so GPUDirect RDMA traffic stays under one PCIe switch instead of crossing the CPU's
// root complex or the socket interconnect. Pure functions over the probes' results, so the rule
// is testable without the hardware.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvnode/gpu/rdma_probe.hpp"

namespace kvnode::gpu {

// How close two PCI devices are: the number of PCI components their sysfs paths share
// (/sys/devices/pci0000:3a/0000:3a:00.0/... counts one per path element after /sys/devices).
int pci_distance_score(std::string_view a_path, std::string_view b_path);

// The device of `nics` nearest to a device at `pci_path` (the GPU; empty when none): most shared
// PCI components, then the same NUMA node, then the first listed. nullopt when `nics` is empty.
std::optional<RdmaDevice> nearest_nic(const std::vector<RdmaDevice>& nics,
                                      std::string_view pci_path, int numa_node);

// The UCX_NET_DEVICES value for one NIC ("mlx5_0:1"); kvnode uses port 1 of the chosen device.
std::string ucx_net_device(const RdmaDevice& nic);

// The resolved sysfs path of a PCI bus id ("0000:3b:00.0"), as RdmaDevice::pci_path holds it;
// empty when the device is not in sysfs.
std::string pci_sysfs_path(std::string_view bus_id);

}  // namespace kvnode::gpu
