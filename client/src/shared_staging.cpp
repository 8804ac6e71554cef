#include "shared_staging.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "kvnode/common/unique_fd.hpp"

namespace kvnode::client::detail {

Result<SharedStaging> SharedStaging::open(const std::string& name, std::size_t bytes) {
  const UniqueFd fd(::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0));
  if (!fd) return make_error(ErrorCode::kIo, "shm_open " + name + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    return make_error(ErrorCode::kIo, "fstat " + name + ": " + std::strerror(errno));
  if (static_cast<std::size_t>(st.st_size) < bytes)
    return make_error(ErrorCode::kInvalid, "shared pool " + name + " (" + std::to_string(bytes) +
                                               " bytes): smaller than the node says");
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED)
    return make_error(ErrorCode::kIo, "shared pool " + name + " (" + std::to_string(bytes) +
                                          " bytes): " + std::strerror(errno));
  return SharedStaging(static_cast<std::byte*>(p), bytes);
}

SharedStaging::SharedStaging(SharedStaging&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

SharedStaging::~SharedStaging() {
  if (base_) ::munmap(base_, bytes_);
}

std::byte* SharedStaging::at(std::int64_t offset, std::size_t n) const {
  if (offset < 0 || static_cast<std::size_t>(offset) > bytes_ ||
      n > bytes_ - static_cast<std::size_t>(offset))
    return nullptr;
  return base_ + offset;
}

}  // namespace kvnode::client::detail
