// Sharing a chunk pool's memory with another process on the same host, so a peer node copies
// chunks straight between the two pools instead of through the network stack. A region
// allocated shareable (RegionOptions::shareable) is backed by a memfd for the host and pinned
// kinds (the pinned kind then pinned with cudaHostRegister); the exporter hands that descriptor
// over a Unix socket and the importer maps it MAP_SHARED. A device region exports a CUDA IPC
// handle of its allocation. The importer's mapping is its own: a memfd's pages live until the
// last mapping goes, so an exporter that dies cannot make the importer fault (the bytes simply
// stop changing).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "kvnode/common/result.hpp"
#include "kvnode/common/unique_fd.hpp"
#include "kvnode/gpu/memory_region.hpp"
#include "kvnode/gpu/segment_copy.hpp"

namespace kvnode::gpu {

// What one process gives another so it can map a region.
struct RegionExport {
  MemoryKind kind = MemoryKind::kHost;
  std::size_t bytes = 0;   // the region's size (what the pool's pages span)
  std::size_t mapped = 0;  // host and pinned: the memfd's size (>= bytes, whole pages)
  int device = 0;          // device: the exporter's CUDA device
  UniqueFd fd;             // host and pinned: the memfd (a duplicate; the region keeps its own)
  IpcHandle ipc{};         // device: the allocation's IPC handle
};

// A duplicate of a shareable host or pinned region's memfd, or a device region's IPC handle.
// An error (kInvalid) for a region allocated without `shareable`.
Result<RegionExport> export_region(const MemoryRegion& region);

struct ImportOptions {
  // The CUDA device this process copies with: device regions open on it (CUDA IPC; across
  // devices only with peer access), and host regions are registered with it when
  // `register_with_cuda`. -1: no CUDA here, so a device region is refused (kRefused).
  int device = -1;
  bool register_with_cuda = false;  // host and pinned: cudaHostRegister the mapping
  bool populate = true;             // fault the whole mapping in now, not inside the copies
};

// Another process's region mapped into this one; unmapped (and unregistered, or the IPC handle
// closed) on destruction. Move-only.
class MappedRegion {
 public:
  // Checks the export first (kInvalid: a memfd smaller than `mapped`, `bytes` > `mapped`, a
  // kind without its fd or handle), then maps it.
  static Result<MappedRegion> import(RegionExport what, const ImportOptions& options);
  MappedRegion(MappedRegion&&) noexcept;
  MappedRegion& operator=(MappedRegion&&) noexcept;
  ~MappedRegion();

  std::byte* data() const;       // a host address, or a device address for a device region
  std::size_t size() const;      // the exporter's `bytes`
  MemoryKind kind() const;       // the exporter's kind
  bool device_memory() const;    // data() is a device address (cudaMemcpy reaches it, memcpy not)
  bool cuda_registered() const;  // host memory registered with CUDA by import()

  struct State;

 private:
  explicit MappedRegion(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

// The host's huge-page setting for shared memory (a shareable pool's memfd pages), the bracketed
// word of /sys/kernel/mm/transparent_hugepage/shmem_enabled: "never" (4 KiB pages), "advise" or
// "always" (huge pages), ...; "unknown" where the file is missing. For kvctl doctor.
std::string shmem_huge_pages_setting();
// Whether that setting gives a memfd's pages huge pages (with MADV_HUGEPAGE, which succeeds on
// shmem whatever it says): anything but "never", "deny" and "unknown".
bool shmem_huge_pages_available(std::string_view setting = shmem_huge_pages_setting());

}  // namespace kvnode::gpu
