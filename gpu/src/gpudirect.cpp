#include "kvnode/gpu/gpudirect.hpp"

#include <infiniband/verbs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "cuda_memory.hpp"
#include "kvnode/common/unique_fd.hpp"

namespace kvnode::gpu {
namespace {

struct FreeList {
  void operator()(ibv_device** l) const { ibv_free_device_list(l); }
};
struct CloseDevice {
  void operator()(ibv_context* c) const { ibv_close_device(c); }
};
struct FreePd {
  void operator()(ibv_pd* pd) const { ibv_dealloc_pd(pd); }
};
struct Deregister {
  void operator()(ibv_mr* mr) const { ibv_dereg_mr(mr); }
};

}  // namespace

GpuDirectCheck check_gpudirect(const MemoryRegion& region, const std::string& nic) {
  GpuDirectCheck out;
  if (region.kind() != MemoryKind::kDevice) {
    out.detail = std::string(to_string(region.kind())) + " memory: NICs reach it without GPUDirect";
    return out;
  }
  int count = 0;
  errno = 0;
  std::unique_ptr<ibv_device*, FreeList> list(ibv_get_device_list(&count));
  if (!list || count == 0) {
    out.detail = std::string("no RDMA devices (") + (list ? "none listed" : std::strerror(errno)) +
                 "): tcp or shared memory only";
    return out;
  }
  ibv_device* device = nullptr;
  for (int i = 0; i < count; ++i)
    if (nic.empty() || nic == ibv_get_device_name(list.get()[i])) {
      device = list.get()[i];
      break;
    }
  if (!device) {
    out.detail = "no RDMA device named '" + nic + "'";
    return out;
  }
  out.nic = ibv_get_device_name(device);
  std::unique_ptr<ibv_context, CloseDevice> context(ibv_open_device(device));
  if (!context) {
    out.detail = std::string("ibv_open_device: ") + std::strerror(errno);
    return out;
  }
  std::unique_ptr<ibv_pd, FreePd> pd(ibv_alloc_pd(context.get()));
  if (!pd) {
    out.detail = std::string("ibv_alloc_pd: ") + std::strerror(errno);
    return out;
  }
  Result<int> fd = detail::cuda_dmabuf_fd(region.data(), region.size());
  if (!fd) {
    out.detail = fd.error().message;
    return out;
  }
  const UniqueFd owned(*fd);
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
  std::unique_ptr<ibv_mr, Deregister> mr(ibv_reg_dmabuf_mr(
      pd.get(), 0, region.size(), reinterpret_cast<std::uint64_t>(region.data()), *fd, access));
  if (!mr) {
    out.detail = std::string("ibv_reg_dmabuf_mr: ") + std::strerror(errno) +
                 " (the NIC driver or kernel lacks dma-buf peer memory)";
    return out;
  }
  out.supported = true;
  out.detail = "dma-buf export + ibv_reg_dmabuf_mr on " + out.nic + " succeeded";
  return out;
}

}  // namespace kvnode::gpu
