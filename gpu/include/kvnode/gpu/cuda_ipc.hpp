// Memory and events shared between processes through CUDA, owned RAII. The node side maps what an
// engine exports: a cudaMalloc allocation by its IPC handle (the handle maps the whole allocation
// at its base: tensors are found by their offset from it), a VMM allocation (cuMemCreate, as
// PyTorch's expandable segments) by the POSIX file descriptor cuMemExportToShareableHandle gave,
// and host memory registered with CUDA so the copy kernel can read and write it. The engine side
// (C++ engines, the tests) exports them. Driver calls go through cudaGetDriverEntryPoint: kvnode
// never links libcuda, so one binary runs with and without a GPU; without one every call answers
// an error naming the missing piece.
#pragma once

#include <cstddef>
#include <memory>

#include "kvnode/common/result.hpp"
#include "kvnode/common/unique_fd.hpp"
#include "kvnode/gpu/segment_copy.hpp"

namespace kvnode::gpu {

// Another process's device allocation mapped into this one on `device`; unmapped on destruction.
class ImportedDeviceMemory {
 public:
  // cudaIpcOpenMemHandle. `bytes`: the allocation's size as the exporter says; checked against
  // what the driver maps (cuMemGetAddressRange) when it can be.
  static Result<ImportedDeviceMemory> open_ipc(const IpcHandle& handle, std::size_t bytes,
                                               int device);
  // cuMemImportFromShareableHandle (POSIX fd) + cuMemAddressReserve + cuMemMap +
  // cuMemSetAccess(read/write on `device`). `fd` is closed once imported.
  static Result<ImportedDeviceMemory> import_vmm(UniqueFd fd, std::size_t bytes, int device);
  ImportedDeviceMemory(ImportedDeviceMemory&&) noexcept;
  ImportedDeviceMemory& operator=(ImportedDeviceMemory&&) noexcept;
  ~ImportedDeviceMemory();

  std::byte* data() const;  // a device address in this process
  std::size_t size() const;

  struct State;

 private:
  explicit ImportedDeviceMemory(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

// Host memory (e.g. an engine's memfd mapping) registered with CUDA (cudaHostRegister, mapped),
// so a kernel on `device` reads and writes it; unregistered on destruction.
class HostRegistration {
 public:
  static Result<HostRegistration> register_memory(std::byte* p, std::size_t bytes, int device);
  HostRegistration(HostRegistration&&) noexcept;
  HostRegistration& operator=(HostRegistration&&) noexcept;
  ~HostRegistration();
  std::byte* device_pointer() const;  // where kernels address it (cudaHostGetDevicePointer)

 private:
  HostRegistration(std::byte* host, std::byte* device) : host_(host), device_(device) {}
  std::byte* host_ = nullptr;
  std::byte* device_ = nullptr;
};

// The device pointer kernels use for pinned host memory from cudaHostAlloc (a pinned pool's
// pages): under unified addressing the same pointer, asked of the runtime to be sure.
Result<std::byte*> device_pointer_of_pinned(std::byte* p);

// --- The exporting side (engines written in C++, tests) -----------------------------------------

// What an engine sends for a cudaMalloc'ed tensor: the IPC handle of the allocation holding `p`,
// the allocation's base and size (cuMemGetAddressRange), and p's offset from that base.
struct DeviceExport {
  IpcHandle handle{};
  std::byte* base = nullptr;
  std::size_t bytes = 0;
  std::size_t offset = 0;
};
Result<DeviceExport> export_device_memory(const void* p);

// Device memory of this process (cudaMalloc), freed on destruction.
class DeviceBuffer {
 public:
  static Result<DeviceBuffer> allocate(std::size_t bytes, int device);
  DeviceBuffer(DeviceBuffer&&) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&&) noexcept;
  ~DeviceBuffer();
  std::byte* data() const { return p_; }
  std::size_t size() const { return bytes_; }

 private:
  DeviceBuffer(std::byte* p, std::size_t bytes, int device)
      : p_(p), bytes_(bytes), device_(device) {}
  std::byte* p_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = 0;
};

// A VMM allocation (cuMemCreate with a POSIX fd handle type, mapped read/write here), as
// PyTorch's expandable segments make them; `bytes` is rounded up to the granularity.
class VmmAllocation {
 public:
  static Result<VmmAllocation> create(std::size_t bytes, int device);
  VmmAllocation(VmmAllocation&&) noexcept;
  VmmAllocation& operator=(VmmAllocation&&) noexcept;
  ~VmmAllocation();
  std::byte* data() const;
  std::size_t size() const;
  // A new POSIX fd for the allocation (cuMemExportToShareableHandle), for another process.
  Result<UniqueFd> export_fd() const;

  struct State;

 private:
  explicit VmmAllocation(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

// An interprocess CUDA event (cudaEventInterprocess | cudaEventDisableTiming) of this process.
class IpcEvent {
 public:
  static Result<IpcEvent> create(int device);
  IpcEvent(IpcEvent&&) noexcept;
  IpcEvent& operator=(IpcEvent&&) noexcept;
  ~IpcEvent();
  const IpcHandle& handle() const { return handle_; }
  Status record_on_default_stream();  // cudaEventRecord(event, 0)
  Status synchronize();               // cudaEventSynchronize

 private:
  IpcEvent(void* event, const IpcHandle& handle, int device)
      : event_(event), handle_(handle), device_(device) {}
  void* event_ = nullptr;  // cudaEvent_t
  IpcHandle handle_{};
  int device_ = 0;  // current while recording on its default stream
};

// Synchronous copies for tests and benchmark baselines (cudaMemcpy, any direction) and a fill.
Status cuda_copy(void* dst, const void* src, std::size_t bytes);
Status cuda_fill(void* dst, int value, std::size_t bytes);

}  // namespace kvnode::gpu
