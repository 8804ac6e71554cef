// kvctl doctor: what this host offers to kvnode (UCX transports and memory types, the path a
// device pool would take, RDMA NICs, CUDA devices).
// Human output is a short aligned table; --json prints one JSON object. Always exits 0: a missing
// GPU or NIC is a fact to report, not an error.
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "kvnode/gpu/device_probe.hpp"
#include "kvnode/gpu/rdma_probe.hpp"
#include "kvnode/gpu/region_share.hpp"
#include "kvnode/transfer/device_path.hpp"
#include "kvnode/transfer/ucx_probe.hpp"

namespace kvctl {

namespace {

using nlohmann::json;

struct Report {
  kvnode::transfer::UcxProbe ucx;
  kvnode::gpu::RdmaProbe rdma;
  kvnode::gpu::CudaProbe cuda;
  std::string shmem_huge_pages = kvnode::gpu::shmem_huge_pages_setting();
};

// Same-host moves share pools as memfds (shmem): their huge pages follow shmem_enabled.
std::string same_host_pools(const Report& r) {
  const bool huge = kvnode::gpu::shmem_huge_pages_available(r.shmem_huge_pages);
  return std::string("memfd, ") + (huge ? "huge pages" : "4 KiB pages") +
         " (shmem_enabled: " + r.shmem_huge_pages + ")";
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out.empty() ? "-" : out;
}

// What a node's device pool would take here with the default kvnode_gpudirect (auto): the
// plane's own decision, from the memory types this UCX reports.
kvnode::transfer::PoolPathChoice device_pool_path(const kvnode::transfer::UcxProbe& ucx) {
  return kvnode::transfer::choose_pool_path(kvnode::gpu::MemoryKind::kDevice, ucx.memory_type_mask,
                                            kvnode::transfer::GpuDirect::kAuto);
}

std::string cuda_version(int v) {
  return v == 0 ? "-" : std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

json to_json(const Report& r) {
  json rdma = json::array();
  for (const auto& d : r.rdma.devices) {
    rdma.push_back({{"name", d.name},
                    {"node_guid", d.node_guid},
                    {"numa_node", d.numa_node},
                    {"pci_path", d.pci_path}});
  }
  json cuda = json::array();
  for (const auto& d : r.cuda.devices) {
    cuda.push_back({{"index", d.index},
                    {"name", d.name},
                    {"pci_bus_id", d.pci_bus_id},
                    {"total_memory", d.total_memory}});
  }
  return {{"kvnode_version", KVNODE_VERSION},
          {"ucx",
           {{"version", r.ucx.version},
            {"transports", r.ucx.transports},
            {"memory_types", r.ucx.memory_types},
            {"device_pools", kvnode::transfer::to_string(device_pool_path(r.ucx).path)},
            {"device_pools_detail",
             kvnode::transfer::describe(device_pool_path(r.ucx), r.ucx.memory_type_mask)},
            {"note", r.ucx.note}}},
          {"same_host", {{"pools", same_host_pools(r)}, {"shmem_huge_pages", r.shmem_huge_pages}}},
          {"rdma", {{"devices", rdma}, {"note", r.rdma.note}}},
          {"cuda",
           {{"built_with_cuda", r.cuda.built_with_cuda},
            {"runtime_version", r.cuda.runtime_version},
            {"driver_version", r.cuda.driver_version},
            {"devices", cuda},
            {"note", r.cuda.note}}}};
}

void row(const std::string& key, const std::string& value) {
  std::cout << "  " << std::left << std::setw(18) << key << value << '\n';
}

void print_table(const Report& r) {
  std::cout << "kvnode " << KVNODE_VERSION << "\n";
  std::cout << "UCX\n";
  row("version", r.ucx.version);
  row("transports", join(r.ucx.transports));
  row("memory types", join(r.ucx.memory_types));
  row("device pools", kvnode::transfer::describe(device_pool_path(r.ucx), r.ucx.memory_type_mask));
  if (!r.ucx.note.empty()) row("note", r.ucx.note);
  row("same-host pools", same_host_pools(r));
  std::cout << "RDMA\n";
  for (const auto& d : r.rdma.devices) {
    row(d.name,
        "guid " + d.node_guid + "  numa " + std::to_string(d.numa_node) + "  " + d.pci_path);
  }
  if (!r.rdma.note.empty()) row("note", r.rdma.note);
  std::cout << "CUDA\n";
  row("built with CUDA", r.cuda.built_with_cuda ? "yes" : "no");
  if (r.cuda.built_with_cuda) {
    row("runtime", cuda_version(r.cuda.runtime_version));
    row("driver", cuda_version(r.cuda.driver_version));
  }
  for (const auto& d : r.cuda.devices) {
    row("device " + std::to_string(d.index),
        d.name + "  " + d.pci_bus_id + "  " + std::to_string(d.total_memory >> 20) + " MiB");
  }
  if (!r.cuda.note.empty()) row("note", r.cuda.note);
}

}  // namespace

void add_doctor_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("doctor", "Show what this host offers: UCX, RDMA NICs, CUDA");
  cmd->add_flag("--json")->description("Print one JSON object instead of a table");
  cmd->callback([cmd] {
    const Report report{kvnode::transfer::probe_ucx(), kvnode::gpu::probe_rdma(),
                        kvnode::gpu::probe_cuda()};
    if (cmd->count("--json") > 0) {
      std::cout << to_json(report).dump(2) << '\n';
    } else {
      print_table(report);
    }
  });
}

}  // namespace kvctl
