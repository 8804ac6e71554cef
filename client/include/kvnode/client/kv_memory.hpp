// Memory an engine shares with its kvnode so the node can read and write its KV cache in place.
// A KvAllocation names one allocation by its base in the engine's process and says how the node
// maps it: host memory through a memfd the node maps (SCM_RIGHTS over the local socket), a
// cudaMalloc allocation through its CUDA IPC handle (which maps the whole allocation at its base:
// tensors say their offset from it), a VMM allocation (PyTorch's expandable segments) through
// the POSIX fd cuMemExportToShareableHandle gave. Every tensor of a registered KvLayout lies in
// one of the allocations registered with it.
//
// HostKvMemory is the shareable host allocation this library provides, for CPU engines and tests:
// a memfd sealed against shrinking (the node refuses one that is not: a client shrinking a file
// the node has mapped would kill the node with SIGBUS), mapped here, unmapped and closed on
// destruction.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kvnode/common/result.hpp"
#include "kvnode/common/unique_fd.hpp"

namespace kvnode::client {

enum class KvMemoryKind : std::uint8_t {
  kHostFd,     // host memory behind `fd` (a sealed memfd)
  kCudaIpc,    // device memory: `ipc_handle` from cudaIpcGetMemHandle(base)
  kCudaVmmFd,  // device memory: `fd` from cuMemExportToShareableHandle (POSIX fd)
  // Host memory of the engine's own process at `base`, which the node cannot map (anonymous
  // memory: SGLang's host pools): the node copies with process_vm_readv/writev (Linux
  // cross-memory attach) into and out of the connected process, no mapping. The node must be
  // allowed to ptrace the engine (the same user; Yama's ptrace_scope 0, or 1 with the engine
  // allowing it); a node that is not refuses the registration.
  kHostProcess,
};
const char* to_string(KvMemoryKind kind) noexcept;

inline constexpr std::size_t kCudaIpcHandleBytes = 64;  // cudaIpcMemHandle_t, cudaIpcEventHandle_t
using CudaIpcHandle = std::array<std::byte, kCudaIpcHandleBytes>;

struct KvAllocation {
  KvMemoryKind kind = KvMemoryKind::kHostFd;
  std::byte* base = nullptr;  // in this process; tensors whose base is this lie here
  std::size_t bytes = 0;
  int fd = -1;  // kHostFd, kCudaVmmFd: a copy goes to the node; the caller keeps this one
  CudaIpcHandle ipc_handle{};  // kCudaIpc
};

class HostKvMemory {
 public:
  // `bytes` of zeroed shareable memory; `name` shows in /proc/<pid>/maps ("memfd:<name>").
  static Result<HostKvMemory> create(std::size_t bytes, const std::string& name = "kvnode-kv");
  HostKvMemory(HostKvMemory&& o) noexcept;
  HostKvMemory& operator=(HostKvMemory&& o) noexcept;
  HostKvMemory(const HostKvMemory&) = delete;
  HostKvMemory& operator=(const HostKvMemory&) = delete;
  ~HostKvMemory();

  std::byte* data() const { return base_; }
  std::size_t size() const { return bytes_; }
  int fd() const { return fd_.get(); }
  KvAllocation allocation() const;  // kHostFd, this memory

 private:
  HostKvMemory(UniqueFd fd, std::byte* base, std::size_t bytes)
      : fd_(std::move(fd)), base_(base), bytes_(bytes) {}
  UniqueFd fd_;
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace kvnode::client
