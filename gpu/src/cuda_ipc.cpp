// CUDA IPC memory and events, host registration and the exporting side's buffers (cuda_ipc.hpp);
// VMM allocations live in cuda_vmm.cpp. Without CUDA every call answers an error saying so.
#include "kvnode/gpu/cuda_ipc.hpp"

#include <cstring>
#include <string>
#include <utility>

#include "cuda_memory.hpp"

#if KVNODE_HAVE_CUDA
#include <cstdint>

#include "cuda_vmm.hpp"
#endif

namespace kvnode::gpu {

enum class ImportKind { kIpc, kVmm };

#if KVNODE_HAVE_CUDA

namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes);
static_assert(sizeof(cudaIpcEventHandle_t) == kIpcHandleBytes);

std::byte* as_pointer(CUdeviceptr p) {
  return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(p));
}
CUdeviceptr as_device_address(const void* p) {
  return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
}

// cuMemGetAddressRange: the allocation holding p, as {base, size}.
Result<detail::VmmMapping> address_range(const void* p) {
  auto range = detail::driver_function<PFN_cuMemGetAddressRange_v3020>("cuMemGetAddressRange");
  if (!range) return std::move(range).error();
  detail::VmmMapping out;
  if (const CUresult r = (*range)(&out.ptr, &out.size, as_device_address(p)); r != CUDA_SUCCESS)
    return detail::driver_error("cuMemGetAddressRange", r);
  return out;
}

// Releases an imported VMM handle once mapped (the mapping keeps the memory) or on failure.
struct ReleaseHandle {
  CUmemGenericAllocationHandle handle;
  ~ReleaseHandle() { detail::vmm_release(handle); }
};

}  // namespace

struct ImportedDeviceMemory::State {
  ImportKind kind = ImportKind::kIpc;
  int device = 0;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  std::size_t mapped = 0;  // kVmm: the reserved and mapped length
  State(ImportKind k, int d, std::byte* p, std::size_t b, std::size_t m)
      : kind(k), device(d), data(p), bytes(b), mapped(m) {}
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    (void)cudaSetDevice(device);
    if (kind == ImportKind::kIpc)
      (void)cudaIpcCloseMemHandle(data);
    else
      detail::vmm_unmap(detail::VmmMapping{as_device_address(data), mapped});
  }
};

Result<ImportedDeviceMemory> ImportedDeviceMemory::open_ipc(const IpcHandle& handle,
                                                            std::size_t bytes, int device) {
  if (bytes == 0) return make_error(ErrorCode::kInvalid, "an IPC allocation of 0 bytes");
  if (Status s = detail::set_device(device); !s) return s.error();
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof h);
  void* p = nullptr;
  if (const cudaError_t err = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
      err != cudaSuccess)
    return detail::cuda_error("cudaIpcOpenMemHandle", err);
  auto state = std::make_unique<State>(ImportKind::kIpc, device, static_cast<std::byte*>(p), bytes,
                                       std::size_t{0});
  // The handle maps the whole allocation: it must hold what the exporter says from p on. Unchecked,
  // a client's size could send the copy kernel past the mapping (a fault that costs the node its
  // CUDA context), so a range the driver cannot tell is refused.
  Result<detail::VmmMapping> range = address_range(p);
  if (!range) return wrap_error("the imported allocation's range: ", std::move(range).error());
  const std::size_t held = range->ptr + range->size - as_device_address(p);
  if (held < bytes)
    return make_error(ErrorCode::kInvalid,
                      "the exporter says its allocation holds " + std::to_string(bytes) +
                          " bytes, the IPC handle maps " + std::to_string(held));
  return ImportedDeviceMemory(std::move(state));
}

Result<ImportedDeviceMemory> ImportedDeviceMemory::import_vmm(UniqueFd fd, std::size_t bytes,
                                                              int device) {
  if (!fd) return make_error(ErrorCode::kInvalid, "import_vmm: no file descriptor");
  if (bytes == 0) return make_error(ErrorCode::kInvalid, "a VMM allocation of 0 bytes");
  if (Status s = detail::set_device(device); !s) return s.error();
  Result<CUmemGenericAllocationHandle> handle = detail::vmm_import(fd.get());
  fd.reset();  // the driver holds its own reference now
  if (!handle) return std::move(handle).error();
  const ReleaseHandle release{*handle};
  Result<CUmemAllocationProp> prop = detail::vmm_properties(*handle);
  if (!prop) return std::move(prop).error();
  Result<std::size_t> granularity = detail::vmm_granularity(*prop);
  if (!granularity) return std::move(granularity).error();
  if (bytes > SIZE_MAX - *granularity)
    return make_error(ErrorCode::kInvalid,
                      "a VMM allocation of " + std::to_string(bytes) + " bytes is too large");
  const std::size_t size = detail::round_up(bytes, *granularity);
  Result<detail::VmmMapping> mapping = detail::vmm_map(*handle, size, *granularity, device);
  if (!mapping) return std::move(mapping).error();
  return ImportedDeviceMemory(
      std::make_unique<State>(ImportKind::kVmm, device, as_pointer(mapping->ptr), bytes, size));
}

Result<HostRegistration> HostRegistration::register_memory(std::byte* p, std::size_t bytes,
                                                           int device) {
  if (p == nullptr || bytes == 0)
    return make_error(ErrorCode::kInvalid, "cudaHostRegister needs a non-empty range");
  if (Status s = detail::set_device(device); !s) return s.error();
  if (const cudaError_t err =
          cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
      err != cudaSuccess)
    return detail::cuda_error("cudaHostRegister of " + std::to_string(bytes) + " bytes", err);
  void* d = nullptr;
  if (const cudaError_t err = cudaHostGetDevicePointer(&d, p, 0); err != cudaSuccess) {
    Error e = detail::cuda_error("cudaHostGetDevicePointer", err);
    (void)cudaHostUnregister(p);
    return e;
  }
  return HostRegistration(p, static_cast<std::byte*>(d));
}

HostRegistration::~HostRegistration() {
  if (host_) (void)cudaHostUnregister(host_);
}

Result<std::byte*> device_pointer_of_pinned(std::byte* p) {
  void* d = nullptr;
  const cudaError_t err = cudaHostGetDevicePointer(&d, p, 0);
  if (err == cudaSuccess) return static_cast<std::byte*>(d);
  // Pinned memory that was not allocated as mapped: unified addressing still gives it a device
  // address, which the pointer's attributes name.
  Error e = detail::cuda_error("cudaHostGetDevicePointer", err);
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) == cudaSuccess &&
      attributes.type == cudaMemoryTypeHost && attributes.devicePointer != nullptr)
    return static_cast<std::byte*>(attributes.devicePointer);
  (void)cudaGetLastError();
  return e;
}

Result<DeviceExport> export_device_memory(const void* p) {
  if (p == nullptr) return make_error(ErrorCode::kInvalid, "export of a null pointer");
  cudaPointerAttributes attributes{};
  if (const cudaError_t err = cudaPointerGetAttributes(&attributes, p); err != cudaSuccess)
    return detail::cuda_error("cudaPointerGetAttributes", err);
  if (attributes.type != cudaMemoryTypeDevice)
    return make_error(ErrorCode::kInvalid,
                      "only device memory (cudaMalloc) has an IPC handle; this pointer is of "
                      "cudaMemoryType " +
                          std::to_string(static_cast<int>(attributes.type)));
  if (Status s = detail::set_device(attributes.device); !s) return s.error();
  Result<detail::VmmMapping> range = address_range(p);
  if (!range) return std::move(range).error();
  cudaIpcMemHandle_t h;
  if (const cudaError_t err = cudaIpcGetMemHandle(&h, as_pointer(range->ptr)); err != cudaSuccess)
    return detail::cuda_error("cudaIpcGetMemHandle (a cudaMalloc allocation's base)", err);
  DeviceExport out;
  std::memcpy(out.handle.data(), &h, sizeof h);
  out.base = as_pointer(range->ptr);
  out.bytes = range->size;
  out.offset = static_cast<std::size_t>(as_device_address(p) - range->ptr);
  return out;
}

Result<IpcEvent> IpcEvent::create(int device) {
  if (Status s = detail::set_device(device); !s) return s.error();
  cudaEvent_t event = nullptr;
  if (const cudaError_t err =
          cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming);
      err != cudaSuccess)
    return detail::cuda_error("cudaEventCreateWithFlags(interprocess)", err);
  cudaIpcEventHandle_t h;
  if (const cudaError_t err = cudaIpcGetEventHandle(&h, event); err != cudaSuccess) {
    Error e = detail::cuda_error("cudaIpcGetEventHandle", err);
    (void)cudaEventDestroy(event);
    return e;
  }
  IpcHandle handle;
  std::memcpy(handle.data(), &h, sizeof h);
  return IpcEvent(event, handle, device);
}

IpcEvent::~IpcEvent() {
  if (event_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

Status IpcEvent::record_on_default_stream() {
  if (Status s = detail::set_device(device_); !s) return s;
  if (const cudaError_t err = cudaEventRecord(static_cast<cudaEvent_t>(event_), nullptr);
      err != cudaSuccess)
    return detail::cuda_error("cudaEventRecord", err);
  return {};
}

Status IpcEvent::synchronize() {
  if (const cudaError_t err = cudaEventSynchronize(static_cast<cudaEvent_t>(event_));
      err != cudaSuccess)
    return detail::cuda_error("cudaEventSynchronize", err);
  return {};
}

Status cuda_copy(void* dst, const void* src, std::size_t bytes) {
  if (const cudaError_t err = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault); err != cudaSuccess)
    return detail::cuda_error("cudaMemcpy of " + std::to_string(bytes) + " bytes", err);
  return {};
}

Status cuda_fill(void* dst, int value, std::size_t bytes) {
  if (const cudaError_t err = cudaMemset(dst, value, bytes); err != cudaSuccess)
    return detail::cuda_error("cudaMemset of " + std::to_string(bytes) + " bytes", err);
  return {};
}

#else

namespace {
Error no_cuda(const char* what) {
  return make_error(ErrorCode::kRefused,
                    std::string(what) + " needs CUDA, and this kvnode was built without CUDA");
}
}  // namespace

struct ImportedDeviceMemory::State {
  ImportKind kind = ImportKind::kIpc;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
};

Result<ImportedDeviceMemory> ImportedDeviceMemory::open_ipc(const IpcHandle&, std::size_t, int) {
  return no_cuda("cudaIpcOpenMemHandle");
}
Result<ImportedDeviceMemory> ImportedDeviceMemory::import_vmm(UniqueFd, std::size_t, int) {
  return no_cuda("importing a VMM allocation");
}
Result<HostRegistration> HostRegistration::register_memory(std::byte*, std::size_t, int) {
  return no_cuda("cudaHostRegister");
}
HostRegistration::~HostRegistration() = default;
Result<std::byte*> device_pointer_of_pinned(std::byte*) {
  return no_cuda("cudaHostGetDevicePointer");
}
Result<DeviceExport> export_device_memory(const void*) {
  return no_cuda("cudaIpcGetMemHandle");
}
Result<IpcEvent> IpcEvent::create(int) {
  return no_cuda("an interprocess CUDA event");
}
IpcEvent::~IpcEvent() = default;
Status IpcEvent::record_on_default_stream() {
  return no_cuda("cudaEventRecord");
}
Status IpcEvent::synchronize() {
  return no_cuda("cudaEventSynchronize");
}
Status cuda_copy(void*, const void*, std::size_t) {
  return no_cuda("cudaMemcpy");
}
Status cuda_fill(void*, int, std::size_t) {
  return no_cuda("cudaMemset");
}

#endif

// --- Build-independent: ownership moves -----------------------------------------------------

ImportedDeviceMemory::ImportedDeviceMemory(std::unique_ptr<State> s) : s_(std::move(s)) {}
ImportedDeviceMemory::ImportedDeviceMemory(ImportedDeviceMemory&&) noexcept = default;
ImportedDeviceMemory& ImportedDeviceMemory::operator=(ImportedDeviceMemory&&) noexcept = default;
ImportedDeviceMemory::~ImportedDeviceMemory() = default;
std::byte* ImportedDeviceMemory::data() const {
  return s_ ? s_->data : nullptr;
}
std::size_t ImportedDeviceMemory::size() const {
  return s_ ? s_->bytes : 0;
}

HostRegistration::HostRegistration(HostRegistration&& o) noexcept
    : host_(std::exchange(o.host_, nullptr)), device_(std::exchange(o.device_, nullptr)) {}
HostRegistration& HostRegistration::operator=(HostRegistration&& o) noexcept {
  if (this != &o) {
    HostRegistration old(std::move(*this));  // unregisters what this held
    host_ = std::exchange(o.host_, nullptr);
    device_ = std::exchange(o.device_, nullptr);
  }
  return *this;
}
std::byte* HostRegistration::device_pointer() const {
  return device_;
}

Result<DeviceBuffer> DeviceBuffer::allocate(std::size_t bytes, int device) {
  if (bytes == 0)
    return make_error(ErrorCode::kInvalid, "cannot allocate 0 bytes of device memory");
  Result<void*> p = detail::cuda_device_alloc(bytes, device);
  if (!p) return std::move(p).error();
  return DeviceBuffer(static_cast<std::byte*>(*p), bytes, device);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), device_(o.device_) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    DeviceBuffer old(std::move(*this));  // frees what this held
    p_ = std::exchange(o.p_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    device_ = o.device_;
  }
  return *this;
}
DeviceBuffer::~DeviceBuffer() {
  if (p_) detail::cuda_device_free(p_, device_);
}

IpcEvent::IpcEvent(IpcEvent&& o) noexcept
    : event_(std::exchange(o.event_, nullptr)), handle_(o.handle_), device_(o.device_) {}
IpcEvent& IpcEvent::operator=(IpcEvent&& o) noexcept {
  if (this != &o) {
    IpcEvent old(std::move(*this));  // destroys what this held
    event_ = std::exchange(o.event_, nullptr);
    handle_ = o.handle_;
    device_ = o.device_;
  }
  return *this;
}

}  // namespace kvnode::gpu
