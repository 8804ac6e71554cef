#include "kv_registration.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>

#include "kvnode/gpu/cuda_ipc.hpp"
#include "process_copy.hpp"

namespace kvnode::node::local {
namespace {

// One host mapping of an engine's memfd, unmapped on destruction.
class HostMapping {
 public:
  HostMapping(std::byte* p, std::size_t bytes) : p_(p), bytes_(bytes) {}
  HostMapping(HostMapping&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(o.bytes_) {}
  HostMapping& operator=(HostMapping&&) = delete;
  ~HostMapping() {
    if (p_) ::munmap(p_, bytes_);
  }
  std::byte* data() const { return p_; }

 private:
  std::byte* p_;
  std::size_t bytes_;
};

std::string name_of(std::size_t i) {
  return "kv_layout.allocations[" + std::to_string(i) + "]";
}

// The memfd must be a regular file at least `bytes` long and sealed against shrinking: a client
// that truncated a file the node maps would end the node with SIGBUS on the next copy.
Result<HostMapping> map_host(const UniqueFd& fd, std::size_t bytes, const std::string& name) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    return make_error(ErrorCode::kInvalid, name + ": fstat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    return make_error(ErrorCode::kInvalid, name + ": the descriptor is not a memory file");
  // Seals, then the size: once F_SEAL_SHRINK is on, the size read after it cannot go down under
  // our mapping (read before the seals, a client could truncate in between: SIGBUS later).
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0)
    return make_error(ErrorCode::kInvalid,
                      name +
                          ": the memfd must be sealed against shrinking (F_SEAL_SHRINK; "
                          "kvnode::client::HostKvMemory does it)");
  if (::fstat(fd.get(), &st) != 0)
    return make_error(ErrorCode::kInvalid, name + ": fstat: " + std::strerror(errno));
  if (static_cast<std::size_t>(st.st_size) < bytes)
    return make_error(ErrorCode::kInvalid, name + ".bytes: " + std::to_string(bytes) +
                                               ", but the file holds " +
                                               std::to_string(st.st_size));
  // Not populated here (this runs on the socket thread, and faulting in tens of GiB takes
  // seconds): populate() does it on the KV executor, ahead of the first store or load.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    const int e = errno;  // out of memory or maps is no room; a file we may not map is invalid
    return make_error(e == ENOMEM || e == EAGAIN ? ErrorCode::kNoRoom : ErrorCode::kInvalid,
                      name + ": mmap: " + std::strerror(e));
  }
  return HostMapping(static_cast<std::byte*>(p), bytes);
}

}  // namespace

struct KvRegistration::Mappings {
  std::optional<EngineProcess> engine;  // kHostProcess: what the copies read and write
  std::unique_ptr<gpu::SegmentCopier> reader, writer;
  std::vector<HostMapping> host;
  std::vector<std::size_t> host_bytes;
  std::vector<gpu::HostRegistration> registered;
  std::vector<gpu::ImportedDeviceMemory> device;
};

KvRegistration::KvRegistration() : maps_(std::make_unique<Mappings>()) {}
KvRegistration::~KvRegistration() = default;

Result<std::shared_ptr<KvRegistration>> KvRegistration::map(const client::KvWireLayout& wire,
                                                            std::vector<UniqueFd> fds,
                                                            const KvPoolFacts& pool, int pid) {
  if (fds.size() != wire.fd_count())
    return make_error(ErrorCode::kInvalid, "request.fds: " + std::to_string(fds.size()) +
                                               " descriptors came with the request, its " +
                                               "allocations need " +
                                               std::to_string(wire.fd_count()));
  bool device_kv = false;
  std::size_t in_process = 0;
  for (const client::WireAllocation& a : wire.allocations) {
    const bool process = a.kind == client::KvMemoryKind::kHostProcess;
    in_process += process ? 1 : 0;
    device_kv = device_kv || (a.kind != client::KvMemoryKind::kHostFd && !process);
  }
  if (in_process != 0 && in_process != wire.allocations.size())
    return make_error(ErrorCode::kInvalid,
                      "kv_layout.allocations: the engine's own memory (host_process) and mapped "
                      "memory in one registration; register them separately");
  if (in_process != 0 && pool.pool_kind == gpu::MemoryKind::kDevice)
    return make_error(ErrorCode::kInvalid,
                      "kv_layout: the engine's own memory (host_process) needs a host or pinned "
                      "pool; this node's pool is device memory");
  if (device_kv && pool.pool_kind == gpu::MemoryKind::kHost)
    return make_error(ErrorCode::kInvalid,
                      "kv_layout: KV in GPU memory needs a pinned or device pool; this node's "
                      "pool is host memory (start it with --memory pinned or --memory device)");
  std::shared_ptr<KvRegistration> reg(new KvRegistration());
  reg->uses_gpu_ = device_kv || pool.pool_kind == gpu::MemoryKind::kDevice;
  std::vector<std::byte*> host_bases, kernel_bases;
  std::vector<std::size_t> sizes;
  std::size_t next_fd = 0;
  for (std::size_t i = 0; i < wire.allocations.size(); ++i) {
    const client::WireAllocation& a = wire.allocations[i];
    const std::string name = name_of(i);
    if (a.bytes == 0) return make_error(ErrorCode::kInvalid, name + ".bytes: must be > 0");
    sizes.push_back(a.bytes);
    if (a.kind == client::KvMemoryKind::kHostProcess) {
      if (a.address == 0 || a.address > UINTPTR_MAX - a.bytes)
        return make_error(ErrorCode::kInvalid, name + ".address: not an address range");
      if (!reg->maps_->engine) {
        Result<EngineProcess> e = open_engine_process(pid, a.address, name.c_str());
        if (!e) return e.error();
        reg->maps_->engine.emplace(std::move(e).value());
      }
      auto* at = reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(a.address));
      host_bases.push_back(at);  // the engine's addresses: the process copier's, never ours
      kernel_bases.push_back(at);
      continue;  // nothing mapped
    }
    if (a.kind == client::KvMemoryKind::kHostFd) {
      Result<HostMapping> m = map_host(fds[next_fd++], a.bytes, name);
      if (!m) return m.error();
      std::byte* host = m->data();
      reg->maps_->host.push_back(std::move(m).value());
      reg->maps_->host_bytes.push_back(a.bytes);
      host_bases.push_back(host);
      kernel_bases.push_back(host);
      if (reg->uses_gpu_) {
        Result<gpu::HostRegistration> r =
            gpu::HostRegistration::register_memory(host, a.bytes, pool.device);
        if (!r) return wrap_error(name + ": registering host memory with CUDA: ", r.error());
        kernel_bases.back() = r->device_pointer();
        reg->maps_->registered.push_back(std::move(r).value());
      }
    } else {
      Result<gpu::ImportedDeviceMemory> m = [&]() -> Result<gpu::ImportedDeviceMemory> {
        if (a.kind == client::KvMemoryKind::kCudaVmmFd)
          return gpu::ImportedDeviceMemory::import_vmm(std::move(fds[next_fd++]), a.bytes,
                                                       pool.device);
        gpu::IpcHandle h{};
        std::memcpy(h.data(), a.handle.data(), h.size());
        return gpu::ImportedDeviceMemory::open_ipc(h, a.bytes, pool.device);
      }();
      if (!m) return wrap_error(name + ": ", m.error());
      host_bases.push_back(nullptr);  // not addressable by the host
      kernel_bases.push_back(m->data());
      reg->maps_->device.push_back(std::move(m).value());
    }
    reg->mapped_bytes_ += a.bytes;
  }
  if (reg->maps_->engine) {
    reg->uses_gpu_ = false;  // a pinned pool is host memory too: the process copier serves it
    reg->maps_->reader = make_process_copier(*reg->maps_->engine, true);
    reg->maps_->writer = make_process_copier(*reg->maps_->engine, false);
  }
  Result<client::KvLayout> kernel = client::from_wire(wire, kernel_bases, sizes);
  if (!kernel) return kernel.error();
  reg->kernel_layout_ = std::move(kernel).value();
  if (!device_kv) {
    Result<client::KvLayout> host = client::from_wire(wire, host_bases, sizes);
    if (!host) return host.error();
    reg->host_layout_ = std::move(host).value();
  }
  Result<std::size_t> chunk = client::chunk_bytes(reg->kernel_layout_, pool.chunk_size);
  if (!chunk) return wrap_error("kv_layout: ", chunk.error());
  if (*chunk != pool.page_bytes)
    return make_error(ErrorCode::kInvalid,
                      "kv_layout: a chunk of " + std::to_string(pool.chunk_size) +
                          " tokens of this layout is " + std::to_string(*chunk) +
                          " bytes, but this node's pool pages are " +
                          std::to_string(pool.page_bytes) +
                          " bytes (start the node with the model's KV shape or --chunk-bytes " +
                          std::to_string(*chunk) + ")");
  return reg;
}

std::size_t KvRegistration::mapped_host_bytes() const {
  std::size_t total = 0;
  for (std::size_t b : maps_->host_bytes) total += b;
  return total;
}

int KvRegistration::engine_pid() const {
  return maps_->engine ? maps_->engine->pid : 0;
}

gpu::SegmentCopier* KvRegistration::process_copier(bool store) const {
  return store ? maps_->reader.get() : maps_->writer.get();
}

void KvRegistration::populate() const {
  for (std::size_t i = 0; i < maps_->host.size(); ++i) {
    // MADV_POPULATE_WRITE (Linux 5.14): the pages faulted in writable, as a store's copies need
    // them; where the kernel lacks it the first copies take the faults instead.
    if (::madvise(maps_->host[i].data(), maps_->host_bytes[i], MADV_POPULATE_WRITE) != 0 &&
        errno != EINVAL)
      spdlog::warn("KV registration: populating {} bytes: {}", maps_->host_bytes[i],
                   std::strerror(errno));
  }
}

}  // namespace kvnode::node::local
