#include "kvnode/gpu/nic_affinity.hpp"

#include <filesystem>
#include <system_error>

namespace kvnode::gpu {
namespace {

std::vector<std::string_view> components(std::string_view path) {
  constexpr std::string_view kRoot = "/sys/devices/";
  if (path.starts_with(kRoot)) path.remove_prefix(kRoot.size());
  std::vector<std::string_view> out;
  while (!path.empty()) {
    const auto slash = path.find('/');
    const std::string_view part = path.substr(0, slash);
    if (!part.empty()) out.push_back(part);
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return out;
}

}  // namespace

int pci_distance_score(std::string_view a_path, std::string_view b_path) {
  const auto a = components(a_path), b = components(b_path);
  int shared = 0;
  while (static_cast<std::size_t>(shared) < a.size() &&
         static_cast<std::size_t>(shared) < b.size() && a[shared] == b[shared])
    ++shared;
  return shared;
}

std::optional<RdmaDevice> nearest_nic(const std::vector<RdmaDevice>& nics,
                                      std::string_view pci_path, int numa_node) {
  const RdmaDevice* best = nullptr;
  int best_score = -1;
  bool best_numa = false;
  for (const RdmaDevice& nic : nics) {
    const int score =
        pci_path.empty() || nic.pci_path.empty() ? 0 : pci_distance_score(pci_path, nic.pci_path);
    const bool numa = numa_node >= 0 && nic.numa_node == numa_node;
    if (score > best_score || (score == best_score && numa && !best_numa)) {
      best = &nic;
      best_score = score;
      best_numa = numa;
    }
  }
  if (!best) return std::nullopt;
  return *best;
}

std::string ucx_net_device(const RdmaDevice& nic) {
  return nic.name + ":1";
}

std::string pci_sysfs_path(std::string_view bus_id) {
  std::error_code ec;
  const auto path =
      std::filesystem::canonical(std::filesystem::path("/sys/bus/pci/devices") / bus_id, ec);
  return ec ? std::string() : path.string();
}

}  // namespace kvnode::gpu
