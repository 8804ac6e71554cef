// probe_rdma(): lists verbs devices and reads their NUMA node and PCI path from sysfs.
#include "kvnode/gpu/rdma_probe.hpp"

#include <endian.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <system_error>

namespace kvnode::gpu {

namespace {

struct DeviceListDeleter {
  void operator()(ibv_device** list) const noexcept { ibv_free_device_list(list); }
};
using DeviceList = std::unique_ptr<ibv_device*, DeviceListDeleter>;

std::string format_guid(__be64 guid_be) {
  const std::uint64_t guid = be64toh(guid_be);
  char buf[24];
  std::snprintf(buf, sizeof buf, "%04x:%04x:%04x:%04x", static_cast<unsigned>(guid >> 48) & 0xffff,
                static_cast<unsigned>(guid >> 32) & 0xffff,
                static_cast<unsigned>(guid >> 16) & 0xffff, static_cast<unsigned>(guid) & 0xffff);
  return buf;
}

int read_numa_node(const std::filesystem::path& device_dir) {
  std::ifstream in(device_dir / "numa_node");
  int node = -1;
  if (!(in >> node)) return -1;
  return node;
}

RdmaDevice describe(ibv_device* dev) {
  RdmaDevice out;
  out.name = ibv_get_device_name(dev);
  out.node_guid = format_guid(ibv_get_device_guid(dev));
  const std::filesystem::path device_dir =
      std::filesystem::path("/sys/class/infiniband") / out.name / "device";
  std::error_code ec;
  const auto real = std::filesystem::canonical(device_dir, ec);
  if (!ec) out.pci_path = real.string();
  out.numa_node = read_numa_node(device_dir);
  return out;
}

}  // namespace

RdmaProbe probe_rdma() {
  RdmaProbe probe;
  int count = 0;
  errno = 0;
  DeviceList list(ibv_get_device_list(&count));
  if (!list) {
    const int err = errno;
    probe.note = std::string("no RDMA devices (ibv_get_device_list: ") +
                 (err == 0 ? "failed" : std::generic_category().message(err)) + ")";
    return probe;
  }
  for (ibv_device* dev : std::span(list.get(), static_cast<std::size_t>(count))) {
    probe.devices.push_back(describe(dev));
  }
  if (probe.devices.empty()) probe.note = "no RDMA devices (ibv_get_device_list: empty)";
  return probe;
}

}  // namespace kvnode::gpu
