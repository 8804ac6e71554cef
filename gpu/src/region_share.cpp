// Exporting a shareable region (a duplicate of its memfd, or its device allocation's IPC handle)
// and mapping another process's export (region_share.hpp).
#include "kvnode/gpu/region_share.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <utility>

#include "fault_in.hpp"
#include "kvnode/gpu/cuda_ipc.hpp"

namespace kvnode::gpu {
namespace {

Error os_error(const std::string& what) {
  return make_error(ErrorCode::kIo, what + ": " + std::strerror(errno));
}

// The host kinds' checks: a memfd at least as large as the mapping asked for, which holds the
// region. Mapping past the file's end would fault (SIGBUS) at the first copy there.
Status check_host_export(const RegionExport& what) {
  if (!what.fd) return make_error(ErrorCode::kInvalid, "a host region's export carries no memfd");
  if (what.bytes > what.mapped)
    return make_error(ErrorCode::kInvalid, "an export of " + std::to_string(what.bytes) +
                                               " bytes in a mapping of " +
                                               std::to_string(what.mapped));
  // Sealed against shrinking first (which also means a memfd, no other file), then sized: a
  // file the exporter could still truncate would fault our copies (SIGBUS) later.
  const int seals = fcntl(what.fd.get(), F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK))
    return make_error(ErrorCode::kInvalid,
                      "the exported descriptor is not a memfd sealed against shrinking");
  struct stat st {};
  if (fstat(what.fd.get(), &st) != 0)
    return make_error(ErrorCode::kInvalid,
                      std::string("fstat of the exported memfd: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode) || st.st_size < 0 || static_cast<std::size_t>(st.st_size) < what.mapped)
    return make_error(ErrorCode::kInvalid, "the exported memfd holds " +
                                               std::to_string(st.st_size) + " bytes, not the " +
                                               std::to_string(what.mapped) + " to map");
  return {};
}

}  // namespace

struct MappedRegion::State {
  MemoryKind kind = MemoryKind::kHost;
  std::size_t bytes = 0;
  std::byte* host = nullptr;  // host kinds: the mapping, `mapped` bytes
  std::size_t mapped = 0;
  std::optional<HostRegistration> registration;  // host kinds, when registered with CUDA
  std::optional<ImportedDeviceMemory> device;    // the device kind

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    registration.reset();  // unregistered before the pages go
    if (host != nullptr) munmap(host, mapped);
  }
};

Result<RegionExport> export_region(const MemoryRegion& region) {
  RegionExport out;
  out.kind = region.kind();
  out.bytes = region.size();
  if (region.kind() == MemoryKind::kDevice) {
    Result<DeviceExport> e = export_device_memory(region.data());
    if (!e) return wrap_error("export of a device region: ", std::move(e).error());
    // The importer takes the handle's base for the region's first byte.
    if (e->offset != 0)
      return make_error(ErrorCode::kInvalid,
                        "a device region that does not start its allocation cannot be exported");
    out.ipc = e->handle;
    out.device = region.device();
    return out;
  }
  if (region.share_fd() < 0)
    return make_error(ErrorCode::kInvalid,
                      "a " + std::string(to_string(region.kind())) +
                          " region allocated without `shareable` has no memfd to export");
  out.fd.reset(fcntl(region.share_fd(), F_DUPFD_CLOEXEC, 0));
  if (!out.fd) return os_error("a duplicate of the region's memfd");
  struct stat st {};
  if (fstat(out.fd.get(), &st) != 0) return os_error("fstat of the region's memfd");
  out.mapped = static_cast<std::size_t>(st.st_size);
  return out;
}

Result<MappedRegion> MappedRegion::import(RegionExport what, const ImportOptions& options) {
  if (what.bytes == 0) return make_error(ErrorCode::kInvalid, "an export of 0 bytes");
  if (what.kind != MemoryKind::kHost && what.kind != MemoryKind::kPinnedHost &&
      what.kind != MemoryKind::kDevice)
    return make_error(ErrorCode::kInvalid, "an export of an unknown memory kind");
  if (what.kind == MemoryKind::kDevice && what.ipc == IpcHandle{})
    return make_error(ErrorCode::kInvalid, "a device region's export carries no IPC handle");
  auto state = std::make_unique<State>();
  state->kind = what.kind;
  state->bytes = what.bytes;
  if (what.kind == MemoryKind::kDevice) {
    if (options.device < 0)
      return make_error(ErrorCode::kRefused,
                        "a device region needs a CUDA device to open it on, and this process "
                        "has no CUDA device");
    Result<ImportedDeviceMemory> m =
        ImportedDeviceMemory::open_ipc(what.ipc, what.bytes, options.device);
    if (!m) return wrap_error("import of a device region: ", std::move(m).error());
    state->device.emplace(std::move(*m));
    return MappedRegion(std::move(state));
  }
  if (Status s = check_host_export(what); !s) return s.error();
  void* p = mmap(nullptr, what.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, what.fd.get(), 0);
  if (p == MAP_FAILED)
    return os_error("mmap of an exported memfd of " + std::to_string(what.mapped) + " bytes");
  state->host = static_cast<std::byte*>(p);
  state->mapped = what.mapped;
  what.fd.reset();  // the mapping keeps the memory
  // Best effort: the pages are the exporter's, huge or not as its kernel gave them; the advice
  // lets khugepaged collapse this mapping's view where shmem allows.
  (void)madvise(p, what.mapped, MADV_HUGEPAGE);
  if (options.populate)
    if (Status s = fault_in(state->host, what.mapped); !s)
      return wrap_error("the mapped region: ", s.error());
  if (options.register_with_cuda && options.device >= 0) {
    Result<HostRegistration> r =
        HostRegistration::register_memory(state->host, what.mapped, options.device);
    if (!r) return wrap_error("registering a mapped region with CUDA: ", std::move(r).error());
    state->registration.emplace(std::move(*r));
  }
  return MappedRegion(std::move(state));
}

MappedRegion::MappedRegion(std::unique_ptr<State> s) : s_(std::move(s)) {}
MappedRegion::MappedRegion(MappedRegion&&) noexcept = default;
MappedRegion& MappedRegion::operator=(MappedRegion&&) noexcept = default;
MappedRegion::~MappedRegion() = default;

std::byte* MappedRegion::data() const {
  return s_->device ? s_->device->data() : s_->host;
}
std::size_t MappedRegion::size() const {
  return s_->bytes;
}
MemoryKind MappedRegion::kind() const {
  return s_->kind;
}
bool MappedRegion::device_memory() const {
  return s_->device.has_value();
}
bool MappedRegion::cuda_registered() const {
  return s_->registration.has_value();
}

std::string shmem_huge_pages_setting() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string line;
  if (!std::getline(in, line)) return "unknown";
  const std::size_t open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "unknown";
  return line.substr(open + 1, close - open - 1);
}

bool shmem_huge_pages_available(std::string_view setting) {
  return setting != "never" && setting != "deny" && setting != "unknown";
}

}  // namespace kvnode::gpu
