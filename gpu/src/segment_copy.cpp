// The host copier (memcpy) and the CUDA copier's host side: descriptors staged in pinned memory,
// uploaded on the copier's stream, one kernel launch per batch (segment_copy_kernel.cu).
#include "kvnode/gpu/segment_copy.hpp"

#include <cstring>
#include <string>

#include "kvnode/gpu/stream_copy.hpp"

#if KVNODE_HAVE_CUDA
#include <algorithm>
#include <array>
#include <chrono>
#include <limits>
#include <thread>
#include <type_traits>
#include <vector>

#include "cuda_check.hpp"
#include "segment_copy_kernel.hpp"
#endif

namespace kvnode::gpu {
namespace {

// Null pointers are refused before anything is copied; empty segments are skipped.
Status check_segments(std::span<const CopySegment> segments) {
  for (std::size_t i = 0; i < segments.size(); ++i)
    if (segments[i].bytes > 0 && (segments[i].src == nullptr || segments[i].dst == nullptr))
      return make_error(ErrorCode::kInvalid, "segment " + std::to_string(i) + " of " +
                                                 std::to_string(segments[i].bytes) +
                                                 " bytes has a null source or destination");
  return {};
}

class HostSegmentCopier final : public SegmentCopier {
 public:
  Status wait(const IpcHandle&) override {
    return make_error(ErrorCode::kInvalid,
                      "the memcpy copier cannot wait on a CUDA event: use the CUDA copier");
  }
  // A batch larger than the caches streams its stores (stream_copy.hpp: 3x the rate of
  // memcpy's runs here); a small one is copied through the cache, where its reader finds it.
  Status copy(std::span<const CopySegment> segments) override {
    if (Status s = check_segments(segments); !s) return s;
    std::size_t total = 0;
    for (const CopySegment& s : segments) total += s.bytes;
    if (total < kStreamCopyBytes) {
      for (const CopySegment& s : segments)
        if (s.bytes > 0) std::memcpy(s.dst, s.src, s.bytes);
      return {};
    }
    for (const CopySegment& s : segments)
      if (s.bytes > 0) stream_copy(s.dst, s.src, s.bytes);
    stream_fence();
    return {};
  }
  Status record(const IpcHandle&) override {
    return make_error(ErrorCode::kInvalid,
                      "the memcpy copier cannot record a CUDA event: use the CUDA copier");
  }
  Status synchronize() override { return {}; }
  bool on_device() const override { return false; }
  const char* name() const override { return "memcpy"; }
};

#if KVNODE_HAVE_CUDA

using detail::CopyPiece;
using detail::cuda_error;
using detail::kMaxPieceBytes;

struct StreamDestroy {
  void operator()(cudaStream_t s) const { (void)cudaStreamDestroy(s); }
};
struct EventDestroy {
  void operator()(cudaEvent_t e) const { (void)cudaEventDestroy(e); }
};
struct PinnedFree {
  void operator()(CopyPiece* p) const { (void)cudaFreeHost(p); }
};
struct DeviceFree {
  void operator()(CopyPiece* p) const { (void)cudaFree(p); }
};
using StreamPtr = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDestroy>;
using EventPtr = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDestroy>;
using PinnedPieces = std::unique_ptr<CopyPiece[], PinnedFree>;
using DevicePieces = std::unique_ptr<CopyPiece[], DeviceFree>;

static_assert(sizeof(cudaIpcEventHandle_t) == kIpcHandleBytes);

// Batches in flight at once before copy() waits for the oldest one's upload: each has its own
// slice of the pinned staging buffer, so queueing a batch behind a wait() does not block.
constexpr std::size_t kStagingSlots = 4;
constexpr std::size_t kInitialPieces = 4096;  // 256 MiB of copies per batch before growing

// An interprocess event of another process, opened here; destroyed once what was queued on it
// ran (cudaEventDestroy defers the release).
Result<EventPtr> open_event(const IpcHandle& handle) {
  cudaIpcEventHandle_t h;
  std::memcpy(&h, handle.data(), sizeof h);
  cudaEvent_t event = nullptr;
  if (const cudaError_t err = cudaIpcOpenEventHandle(&event, h); err != cudaSuccess)
    return cuda_error("cudaIpcOpenEventHandle", err);
  return EventPtr(event);
}

// How long synchronize() waits for queued copies: an engine that never records the event a
// batch waits for (it died, or reused the event) must not hang the node's copies for ever.
constexpr std::chrono::seconds kLandDeadline{60};

class CudaSegmentCopier final : public SegmentCopier {
 public:
  explicit CudaSegmentCopier(int device) : device_(device) {}
  ~CudaSegmentCopier() override {
    // Nothing may still read the buffers freed below. A broken copier's stream may never drain
    // (a wait that never fires) or cannot (a faulted context): its buffers are left to the
    // process rather than freed under a kernel.
    if (broken_.empty() && synchronize()) return;
    (void)stream_.release();
    (void)pinned_.release();
    (void)device_pieces_.release();
    for (EventPtr& e : uploaded_) (void)e.release();
    (void)landed_.release();
    for (EventPtr& e : imported_) (void)e.release();
  }

  Status init() {
    if (Status s = detail::set_device(device_); !s) return s;
    cudaStream_t stream = nullptr;
    if (const cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        err != cudaSuccess)
      return cuda_error("cudaStreamCreateWithFlags", err);
    stream_.reset(stream);
    auto create = [](EventPtr& slot) -> Status {
      cudaEvent_t event = nullptr;
      if (const cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
          err != cudaSuccess)
        return cuda_error("cudaEventCreateWithFlags", err);
      slot.reset(event);
      return {};
    };
    for (EventPtr& uploaded : uploaded_)
      if (Status s = create(uploaded); !s) return s;
    if (Status s = create(landed_); !s) return s;
    return grow(kInitialPieces);
  }

  Status wait(const IpcHandle& event) override {
    if (Status s = usable(); !s) return s;
    if (Status s = detail::set_device(device_); !s) return s;
    Result<EventPtr> imported = open_event(event);
    if (!imported) return imported.error();
    if (const cudaError_t err = cudaStreamWaitEvent(stream_.get(), imported->get(), 0);
        err != cudaSuccess)
      return cuda_error("cudaStreamWaitEvent", err);
    // Kept open until the stream passed it: the last process to use a shared event must not
    // destroy it before then.
    imported_.push_back(std::move(imported).value());
    return {};
  }

  Status copy(std::span<const CopySegment> segments) override {
    if (Status s = usable(); !s) return s;
    if (Status s = check_segments(segments); !s) return s;
    std::size_t pieces = 0;
    for (const CopySegment& s : segments) pieces += (s.bytes + kMaxPieceBytes - 1) / kMaxPieceBytes;
    if (pieces == 0) return {};
    if (Status s = detail::set_device(device_); !s) return s;
    if (pieces > capacity_)
      if (Status s = grow(pieces); !s) return s;
    // The slot's previous upload must have left the pinned buffer before it is written again.
    if (in_flight_[next_slot_]) {
      if (const cudaError_t err = cudaEventSynchronize(uploaded_[next_slot_].get());
          err != cudaSuccess)
        return cuda_error("cudaEventSynchronize (a previous batch's descriptor upload)", err);
      in_flight_[next_slot_] = false;
    }
    CopyPiece* staged = pinned_.get() + next_slot_ * capacity_;
    std::size_t n = 0;
    for (const CopySegment& s : segments)
      for (std::size_t at = 0; at < s.bytes; at += kMaxPieceBytes)
        staged[n++] = CopyPiece{s.src + at, s.dst + at, std::min(kMaxPieceBytes, s.bytes - at)};
    // The device buffer is shared by every batch: the stream orders this upload after the
    // previous batch's kernel, which read the last one.
    if (const cudaError_t err = cudaMemcpyAsync(device_pieces_.get(), staged, n * sizeof(CopyPiece),
                                                cudaMemcpyHostToDevice, stream_.get());
        err != cudaSuccess)
      return cuda_error("cudaMemcpyAsync (copy descriptors)", err);
    if (const cudaError_t err = cudaEventRecord(uploaded_[next_slot_].get(), stream_.get());
        err != cudaSuccess)
      return cuda_error("cudaEventRecord (descriptor upload)", err);
    in_flight_[next_slot_] = true;
    next_slot_ = (next_slot_ + 1) % kStagingSlots;
    if (const cudaError_t err = detail::launch_piece_copy(device_pieces_.get(), n, stream_.get());
        err != cudaSuccess)
      return cuda_error("the segment copy kernel launch (" + std::to_string(n) + " pieces)", err);
    return {};
  }

  Status record(const IpcHandle& event) override {
    if (Status s = usable(); !s) return s;
    if (Status s = detail::set_device(device_); !s) return s;
    Result<EventPtr> imported = open_event(event);
    if (!imported) return imported.error();
    if (const cudaError_t err = cudaEventRecord(imported->get(), stream_.get()); err != cudaSuccess)
      return cuda_error("cudaEventRecord (an interprocess event)", err);
    imported_.push_back(std::move(imported).value());
    return {};
  }

  // Polls an event recorded after everything queued, within kLandDeadline. A failure here is a
  // kernel fault (sticky: the context is lost for this process) or a wait that never fired:
  // either way the copier is out of service from now on, and says why on every later call.
  Status synchronize() override {
    if (!stream_) return {};  // init() failed before the stream existed
    if (Status s = usable(); !s) return s;
    if (Status s = detail::set_device(device_); !s) return s;
    if (const cudaError_t err = cudaEventRecord(landed_.get(), stream_.get()); err != cudaSuccess)
      return fail(cuda_error("cudaEventRecord (copies landed)", err));
    const auto deadline = std::chrono::steady_clock::now() + kLandDeadline;
    for (int polls = 0;; ++polls) {
      const cudaError_t err = cudaEventQuery(landed_.get());
      if (err == cudaSuccess) break;
      if (err != cudaErrorNotReady) return fail(cuda_error("the segment copies", err));
      if (std::chrono::steady_clock::now() > deadline)
        return fail(make_error(ErrorCode::kDeadline,
                               "the GPU copies did not land within " +
                                   std::to_string(kLandDeadline.count()) +
                                   " s (an event they wait for was never recorded?)"));
      // Spin briefly (a chunk lands in tens of microseconds), then sleep between polls.
      if (polls < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    in_flight_.fill(false);
    imported_.clear();
    return {};
  }

  bool on_device() const override { return true; }
  const char* name() const override { return "cuda kernel"; }

 private:
  // Room for `pieces` descriptors per batch. Rare (a batch past every earlier one): it waits for
  // the stream so the old buffers are idle when freed.
  Status grow(std::size_t pieces) {
    const std::size_t capacity = std::max({pieces, 2 * capacity_, kInitialPieces});
    if (capacity > std::numeric_limits<std::size_t>::max() / (kStagingSlots * sizeof(CopyPiece)))
      return make_error(ErrorCode::kInvalid,
                        "a batch of " + std::to_string(pieces) + " copy pieces is too large");
    if (Status s = synchronize(); !s) return s;
    void* host = nullptr;
    if (const cudaError_t err = cudaHostAlloc(&host, kStagingSlots * capacity * sizeof(CopyPiece),
                                              cudaHostAllocDefault);
        err != cudaSuccess)
      return cuda_error("cudaHostAlloc (copy descriptors)", err);
    PinnedPieces pinned(static_cast<CopyPiece*>(host));
    void* device = nullptr;
    if (const cudaError_t err = cudaMalloc(&device, capacity * sizeof(CopyPiece));
        err != cudaSuccess)
      return cuda_error("cudaMalloc (copy descriptors)", err);
    pinned_ = std::move(pinned);
    device_pieces_.reset(static_cast<CopyPiece*>(device));
    capacity_ = capacity;
    next_slot_ = 0;
    return {};
  }

  Status usable() const {
    if (broken_.empty()) return {};
    return make_error(ErrorCode::kInternal,
                      "the GPU copier is out of service since: " + broken_ + " (restart the node)");
  }
  Error fail(Error e) {
    broken_ = e.message;
    return e;
  }

  int device_;
  std::string broken_;  // why the copier is out of service; empty while it serves
  StreamPtr stream_;    // declared first: destroyed after the buffers and events
  std::array<EventPtr, kStagingSlots> uploaded_;  // recorded after each slot's upload
  std::array<bool, kStagingSlots> in_flight_{};   // uploaded_[i] recorded, not yet waited for
  EventPtr landed_;                               // recorded by synchronize() after all copies
  std::vector<EventPtr> imported_;                // other processes' events, until they passed
  std::size_t next_slot_ = 0;
  std::size_t capacity_ = 0;    // descriptors per slot and in device_pieces_
  PinnedPieces pinned_;         // kStagingSlots x capacity_
  DevicePieces device_pieces_;  // capacity_
};

#endif

}  // namespace

std::unique_ptr<SegmentCopier> make_host_segment_copier() {
  return std::make_unique<HostSegmentCopier>();
}

#if KVNODE_HAVE_CUDA

Result<std::unique_ptr<SegmentCopier>> make_cuda_segment_copier(int device) {
  auto copier = std::make_unique<CudaSegmentCopier>(device);
  if (Status s = copier->init(); !s)
    return wrap_error("CUDA segment copier on device " + std::to_string(device) + ": ", s.error());
  return std::unique_ptr<SegmentCopier>(std::move(copier));
}

#else

Result<std::unique_ptr<SegmentCopier>> make_cuda_segment_copier(int) {
  return make_error(ErrorCode::kRefused,
                    "the CUDA segment copier needs CUDA, and this kvnode was built without CUDA");
}

#endif

}  // namespace kvnode::gpu
