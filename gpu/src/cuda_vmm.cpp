// VMM allocations (cuMemCreate with a POSIX fd handle type, as PyTorch's expandable segments) and
// the cuMem* helpers the importing side shares (cuda_vmm.hpp).
#include "kvnode/gpu/cuda_ipc.hpp"

#if KVNODE_HAVE_CUDA
#include <cstdint>
#include <limits>
#include <string>

#include "cuda_vmm.hpp"
#endif

namespace kvnode::gpu {

#if KVNODE_HAVE_CUDA

namespace detail {

Result<std::size_t> vmm_granularity(const CUmemAllocationProp& prop) {
  auto granularity =
      driver_function<PFN_cuMemGetAllocationGranularity_v10020>("cuMemGetAllocationGranularity");
  if (!granularity) return std::move(granularity).error();
  std::size_t bytes = 0;
  if (const CUresult r = (*granularity)(&bytes, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      r != CUDA_SUCCESS)
    return driver_error("cuMemGetAllocationGranularity", r);
  if (bytes == 0) return make_error(ErrorCode::kInternal, "the driver gave a VMM granularity of 0");
  return bytes;
}

Result<VmmMapping> vmm_map(CUmemGenericAllocationHandle handle, std::size_t size,
                           std::size_t alignment, int device) {
  auto reserve = driver_function<PFN_cuMemAddressReserve_v10020>("cuMemAddressReserve");
  auto address_free = driver_function<PFN_cuMemAddressFree_v10020>("cuMemAddressFree");
  auto map = driver_function<PFN_cuMemMap_v10020>("cuMemMap");
  auto unmap = driver_function<PFN_cuMemUnmap_v10020>("cuMemUnmap");
  auto set_access = driver_function<PFN_cuMemSetAccess_v10020>("cuMemSetAccess");
  for (const Error* e :
       {reserve ? nullptr : &reserve.error(), address_free ? nullptr : &address_free.error(),
        map ? nullptr : &map.error(), unmap ? nullptr : &unmap.error(),
        set_access ? nullptr : &set_access.error()})
    if (e) return *e;
  VmmMapping m;
  if (const CUresult r = (*reserve)(&m.ptr, size, alignment, 0, 0); r != CUDA_SUCCESS)
    return driver_error("cuMemAddressReserve of " + std::to_string(size) + " bytes", r);
  m.size = size;
  if (const CUresult r = (*map)(m.ptr, size, 0, handle, 0); r != CUDA_SUCCESS) {
    (void)(*address_free)(m.ptr, size);
    return driver_error("cuMemMap of " + std::to_string(size) + " bytes", r);
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (const CUresult r = (*set_access)(m.ptr, size, &access, 1); r != CUDA_SUCCESS) {
    (void)(*unmap)(m.ptr, size);
    (void)(*address_free)(m.ptr, size);
    return driver_error("cuMemSetAccess(read/write, device " + std::to_string(device) + ")", r);
  }
  return m;
}

void vmm_unmap(const VmmMapping& mapping) {
  if (auto unmap = driver_function<PFN_cuMemUnmap_v10020>("cuMemUnmap"))
    (void)(*unmap)(mapping.ptr, mapping.size);
  if (auto address_free = driver_function<PFN_cuMemAddressFree_v10020>("cuMemAddressFree"))
    (void)(*address_free)(mapping.ptr, mapping.size);
}

void vmm_release(CUmemGenericAllocationHandle handle) {
  if (auto release = driver_function<PFN_cuMemRelease_v10020>("cuMemRelease"))
    (void)(*release)(handle);
}

Result<CUmemGenericAllocationHandle> vmm_import(int fd) {
  auto import_handle =
      driver_function<PFN_cuMemImportFromShareableHandle_v10020>("cuMemImportFromShareableHandle");
  if (!import_handle) return std::move(import_handle).error();
  CUmemGenericAllocationHandle handle = 0;
  // A POSIX fd travels as the pointer-sized integer itself.
  void* os_handle = reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd));
  if (const CUresult r =
          (*import_handle)(&handle, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      r != CUDA_SUCCESS)
    return driver_error("cuMemImportFromShareableHandle(POSIX fd " + std::to_string(fd) + ")", r);
  return handle;
}

Result<CUmemAllocationProp> vmm_properties(CUmemGenericAllocationHandle handle) {
  auto get = driver_function<PFN_cuMemGetAllocationPropertiesFromHandle_v10020>(
      "cuMemGetAllocationPropertiesFromHandle");
  if (!get) return std::move(get).error();
  CUmemAllocationProp prop{};
  if (const CUresult r = (*get)(&prop, handle); r != CUDA_SUCCESS)
    return driver_error("cuMemGetAllocationPropertiesFromHandle", r);
  return prop;
}

}  // namespace detail

struct VmmAllocation::State {
  int device = 0;
  CUmemGenericAllocationHandle handle = 0;
  detail::VmmMapping mapping;  // ptr 0 until mapped
  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    (void)cudaSetDevice(device);
    if (mapping.ptr != 0) detail::vmm_unmap(mapping);
    detail::vmm_release(handle);
  }
};

Result<VmmAllocation> VmmAllocation::create(std::size_t bytes, int device) {
  if (bytes == 0) return make_error(ErrorCode::kInvalid, "cannot allocate an empty VMM allocation");
  if (Status s = detail::set_device(device); !s) return s.error();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  Result<std::size_t> granularity = detail::vmm_granularity(prop);
  if (!granularity) return std::move(granularity).error();
  if (bytes > std::numeric_limits<std::size_t>::max() - *granularity)
    return make_error(ErrorCode::kInvalid,
                      "VMM allocation of " + std::to_string(bytes) + " bytes is too large");
  const std::size_t size = detail::round_up(bytes, *granularity);
  auto create = detail::driver_function<PFN_cuMemCreate_v10020>("cuMemCreate");
  if (!create) return std::move(create).error();
  CUmemGenericAllocationHandle handle = 0;
  if (const CUresult r = (*create)(&handle, size, &prop, 0); r != CUDA_SUCCESS)
    return detail::driver_error("cuMemCreate of " + std::to_string(size) + " bytes", r);
  auto state = std::make_unique<State>();
  state->device = device;
  state->handle = handle;  // released by ~State from here on
  Result<detail::VmmMapping> mapping = detail::vmm_map(handle, size, *granularity, device);
  if (!mapping) return std::move(mapping).error();
  state->mapping = *mapping;
  return VmmAllocation(std::move(state));
}

std::byte* VmmAllocation::data() const {
  return s_ ? reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(s_->mapping.ptr)) : nullptr;
}

std::size_t VmmAllocation::size() const {
  return s_ ? s_->mapping.size : 0;
}

Result<UniqueFd> VmmAllocation::export_fd() const {
  if (!s_) return make_error(ErrorCode::kInvalid, "export_fd of a moved-from VMM allocation");
  auto share = detail::driver_function<PFN_cuMemExportToShareableHandle_v10020>(
      "cuMemExportToShareableHandle");
  if (!share) return std::move(share).error();
  int fd = -1;
  if (const CUresult r = (*share)(&fd, s_->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      r != CUDA_SUCCESS)
    return detail::driver_error("cuMemExportToShareableHandle(POSIX fd)", r);
  return UniqueFd(fd);
}

#else

struct VmmAllocation::State {};

Result<VmmAllocation> VmmAllocation::create(std::size_t, int) {
  return make_error(ErrorCode::kRefused,
                    "VMM allocations need CUDA, and this kvnode was built without CUDA");
}
std::byte* VmmAllocation::data() const {
  return nullptr;
}
std::size_t VmmAllocation::size() const {
  return 0;
}
Result<UniqueFd> VmmAllocation::export_fd() const {
  return make_error(ErrorCode::kRefused,
                    "VMM export needs CUDA, and this kvnode was built without CUDA");
}

#endif

VmmAllocation::VmmAllocation(std::unique_ptr<State> s) : s_(std::move(s)) {}
VmmAllocation::VmmAllocation(VmmAllocation&&) noexcept = default;
VmmAllocation& VmmAllocation::operator=(VmmAllocation&&) noexcept = default;
VmmAllocation::~VmmAllocation() = default;

}  // namespace kvnode::gpu
