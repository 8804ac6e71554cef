#include "kvnode/client/kv_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace kvnode::client {

const char* to_string(KvMemoryKind kind) noexcept {
  switch (kind) {
    case KvMemoryKind::kHostFd:
      return "host";
    case KvMemoryKind::kCudaIpc:
      return "cuda_ipc";
    case KvMemoryKind::kCudaVmmFd:
      return "cuda_vmm";
    case KvMemoryKind::kHostProcess:
      return "host_process";
  }
  return "unknown";
}

Result<HostKvMemory> HostKvMemory::create(std::size_t bytes, const std::string& name) {
  if (bytes == 0) return make_error(ErrorCode::kInvalid, "host KV memory: bytes must be > 0");
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return make_error(ErrorCode::kIo, std::string("memfd_create: ") + std::strerror(errno));
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0)
    return make_error(ErrorCode::kNoRoom, "host KV memory of " + std::to_string(bytes) +
                                              " bytes: " + std::strerror(errno));
  // The node maps this file: it must never shrink under it (SIGBUS there), nor be unsealed.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0)
    return make_error(ErrorCode::kIo, std::string("memfd seals: ") + std::strerror(errno));
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED)
    return make_error(ErrorCode::kNoRoom, "host KV memory of " + std::to_string(bytes) +
                                              " bytes: " + std::strerror(errno));
  return HostKvMemory(std::move(fd), static_cast<std::byte*>(p), bytes);
}

HostKvMemory::HostKvMemory(HostKvMemory&& o) noexcept
    : fd_(std::move(o.fd_)),
      base_(std::exchange(o.base_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)) {}

HostKvMemory& HostKvMemory::operator=(HostKvMemory&& o) noexcept {
  if (this != &o) {
    if (base_) ::munmap(base_, bytes_);
    fd_ = std::move(o.fd_);
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

HostKvMemory::~HostKvMemory() {
  if (base_) ::munmap(base_, bytes_);
}

KvAllocation HostKvMemory::allocation() const {
  KvAllocation a;
  a.kind = KvMemoryKind::kHostFd;
  a.base = base_;
  a.bytes = bytes_;
  a.fd = fd_.get();
  return a;
}

}  // namespace kvnode::client
