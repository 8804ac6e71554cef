// choose_pool_path() and its words: which way a pool reaches UCX, and why.
#include "kvnode/transfer/device_path.hpp"

#include <ucs/memory/memory_type.h>

#include "kvnode/transfer/ucx_probe.hpp"

namespace kvnode::transfer {

static_assert(kUcxMemoryHost == std::uint64_t{1} << UCS_MEMORY_TYPE_HOST);
static_assert(kUcxMemoryCuda == std::uint64_t{1} << UCS_MEMORY_TYPE_CUDA);

namespace {

std::string joined_types(std::uint64_t mask) {
  std::string out;
  for (const std::string& name : ucx_memory_type_names(mask))
    out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

Result<GpuDirect> parse_gpudirect(const std::string& text) {
  if (text == "auto") return GpuDirect::kAuto;
  if (text == "off") return GpuDirect::kOff;
  return make_error(ErrorCode::kInvalid, "gpudirect: '" + text + "' is not auto or off");
}

const char* to_string(GpuDirect setting) {
  return setting == GpuDirect::kOff ? "off" : "auto";
}

PoolPathChoice choose_pool_path(gpu::MemoryKind pool, std::uint64_t ucx_memory_types,
                                GpuDirect setting) {
  if (pool != gpu::MemoryKind::kDevice) return {PoolPath::kAsIs, PathReason::kHostMemory};
  if (setting == GpuDirect::kOff) return {PoolPath::kStaged, PathReason::kOperatorOff};
  if (ucx_memory_types & kUcxMemoryCuda) return {PoolPath::kGpuDirect, PathReason::kUcxHasCuda};
  if (ucx_memory_types == 0) return {PoolPath::kStaged, PathReason::kUcxSaidNone};
  return {PoolPath::kStaged, PathReason::kUcxNoCuda};
}

const char* to_string(PoolPath path) {
  switch (path) {
    case PoolPath::kGpuDirect:
      return "gpudirect";
    case PoolPath::kStaged:
      return "staged";
    case PoolPath::kAsIs:
      break;
  }
  return "as-is";
}

std::string describe(const PoolPathChoice& choice, std::uint64_t ucx_memory_types) {
  const std::string types = joined_types(ucx_memory_types);
  std::string how;
  switch (choice.path) {
    case PoolPath::kAsIs:
      how = "registered with UCX as it is";
      break;
    case PoolPath::kGpuDirect:
      how = "GPUDirect through UCX";
      break;
    case PoolPath::kStaged:
      how = "staged through pinned memory";
      break;
  }
  std::string why;
  switch (choice.reason) {
    case PathReason::kHostMemory:
    case PathReason::kUcxHasCuda:
      why = "memory types: " + (types.empty() ? std::string("unknown") : types);
      break;
    case PathReason::kUcxNoCuda:
      why = ucx_memory_types == kUcxMemoryHost
                ? "this UCX registers host memory only"
                : "this UCX registers no CUDA memory; memory types: " + types;
      break;
    case PathReason::kUcxSaidNone:
      why = "UCX did not report the memory types it registers";
      break;
    case PathReason::kUcxRefusedPool:
      why = "UCX could not register the device pool; memory types: " + types;
      break;
    case PathReason::kOperatorOff:
      why = "gpudirect is off" + (types.empty() ? "" : "; UCX's memory types: " + types);
      break;
  }
  return how + " (" + why + ")";
}

}  // namespace kvnode::transfer
