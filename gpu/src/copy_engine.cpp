#include "kvnode/gpu/copy_engine.hpp"

#include <cstring>
#include <string>
#include <unordered_map>

#if KVNODE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvnode::gpu {
namespace {

class HostCopyEngine final : public CopyEngine {
 public:
  Result<Ticket> copy(void* dst, const void* src, std::size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return next_++;
  }
  Result<bool> done(Ticket) override { return true; }
  void cancel(Ticket) override {}  // a copy has landed when copy() returns: nothing runs
  const char* name() const override { return "memcpy"; }

 private:
  Ticket next_ = 1;
};

#if KVNODE_HAVE_CUDA

Error cuda_error(const char* what, cudaError_t err) {
  (void)cudaGetLastError();
  return make_error(std::string(what) + " failed: " + cudaGetErrorName(err) + ": " +
                    cudaGetErrorString(err));
}

class CudaCopyEngine final : public CopyEngine {
 public:
  static Result<std::unique_ptr<CopyEngine>> create(int device) {
    if (const cudaError_t err = cudaSetDevice(device); err != cudaSuccess)
      return cuda_error(("cudaSetDevice(" + std::to_string(device) + ")").c_str(), err);
    cudaStream_t stream = nullptr;
    if (const cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        err != cudaSuccess)
      return cuda_error("cudaStreamCreateWithFlags", err);
    return std::unique_ptr<CopyEngine>(new CudaCopyEngine(device, stream));
  }
  ~CudaCopyEngine() override {
    (void)cudaSetDevice(device_);
    (void)cudaStreamSynchronize(stream_);  // nothing may land after the engine is gone
    for (auto& [ticket, event] : events_) (void)cudaEventDestroy(event);
    (void)cudaStreamDestroy(stream_);
  }
  Result<Ticket> copy(void* dst, const void* src, std::size_t bytes) override {
    (void)cudaSetDevice(device_);
    if (const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_);
        err != cudaSuccess)
      return cuda_error("cudaMemcpyAsync", err);
    cudaEvent_t event = nullptr;
    if (const cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
        err != cudaSuccess)
      return cuda_error("cudaEventCreateWithFlags", err);
    if (const cudaError_t err = cudaEventRecord(event, stream_); err != cudaSuccess) {
      (void)cudaEventDestroy(event);
      return cuda_error("cudaEventRecord", err);
    }
    events_[next_] = event;
    return next_++;
  }
  Result<bool> done(Ticket ticket) override {
    const auto it = events_.find(ticket);
    if (it == events_.end()) return true;
    const cudaError_t err = cudaEventQuery(it->second);
    if (err == cudaErrorNotReady) return false;
    (void)cudaEventDestroy(it->second);
    events_.erase(it);
    if (err != cudaSuccess) return cuda_error("cudaMemcpyAsync (completion)", err);
    return true;
  }
  // A stream cannot drop queued work: wait for the copy to land (or fail) and forget it.
  void cancel(Ticket ticket) override {
    const auto it = events_.find(ticket);
    if (it == events_.end()) return;
    (void)cudaSetDevice(device_);
    (void)cudaEventSynchronize(it->second);
    (void)cudaGetLastError();  // a failed copy is given up on: keep its error off later calls
    (void)cudaEventDestroy(it->second);
    events_.erase(it);
  }
  const char* name() const override { return "cudaMemcpyAsync"; }

 private:
  CudaCopyEngine(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  int device_;
  cudaStream_t stream_;
  std::unordered_map<Ticket, cudaEvent_t> events_;
  Ticket next_ = 1;
};

#endif

}  // namespace

std::unique_ptr<CopyEngine> make_host_copy_engine() {
  return std::make_unique<HostCopyEngine>();
}

Result<std::unique_ptr<CopyEngine>> make_cuda_copy_engine([[maybe_unused]] int device) {
#if KVNODE_HAVE_CUDA
  return CudaCopyEngine::create(device);
#else
  return make_error("device memory copies need a kvnode built with the CUDA Toolkit");
#endif
}

}  // namespace kvnode::gpu
