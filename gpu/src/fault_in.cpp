#include "fault_in.hpp"

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace kvnode::gpu {

Status fault_in(void* p, std::size_t bytes) {
  constexpr std::size_t kSmallPage = 4096;
  if (madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return {};
  if (errno != EINVAL)
    return make_error(ErrorCode::kIo, std::string("faulting in ") + std::to_string(bytes) +
                                          " bytes: " + std::strerror(errno));
  auto* bytes_at = static_cast<unsigned char*>(p);
  for (std::size_t at = 0; at < bytes; at += kSmallPage)
    std::atomic_ref<unsigned char>(bytes_at[at]).fetch_or(0, std::memory_order_relaxed);
  return {};
}

}  // namespace kvnode::gpu
