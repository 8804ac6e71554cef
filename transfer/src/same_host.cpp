#include "same_host.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace kvnode::transfer {
namespace {

// A fetch waits on the peer's share thread, which answers at once unless another client holds it.
constexpr std::chrono::milliseconds kFetchTimeout{3000};

bool host_memory(gpu::MemoryKind k) {
  return k == gpu::MemoryKind::kHost || k == gpu::MemoryKind::kPinnedHost;
}

}  // namespace

SameHostDecision decide_same_host(gpu::MemoryKind local, gpu::MemoryKind remote, int cuda_device) {
  SameHostDecision d;
  if (host_memory(local) && host_memory(remote)) {
    d.copy = SameHostCopy::kHostThreads;
    return d;
  }
  if (cuda_device < 0) {
    d.why = std::string("a ") + std::string(gpu::to_string(local)) + " pool here and a " +
            std::string(gpu::to_string(remote)) +
            " pool there need a CUDA copy engine, and this plane has none";
    return d;
  }
  d.copy = SameHostCopy::kCuda;
  d.import.device = cuda_device;
  d.import.register_with_cuda = host_memory(remote);
  return d;
}

SameHostMapper::SameHostMapper(std::function<void(MapResult)> done, gpu::CopyEngine* host_engine,
                               gpu::CopyEngine* cuda_engine)
    : done_(std::move(done)), host_engine_(host_engine), cuda_engine_(cuda_engine) {
  thread_ = std::thread([this] { run(); });
}

SameHostMapper::~SameHostMapper() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  wake_.notify_all();
  thread_.join();
}

void SameHostMapper::request(MapRequest r) {
  {
    std::lock_guard lock(mutex_);
    const bool queued = std::any_of(queue_.begin(), queue_.end(), [&](const MapRequest& q) {
      return q.peer == r.peer && q.instance == r.instance;
    });
    if (queued || stopping_) return;
    queue_.push_back(std::move(r));
  }
  wake_.notify_one();
}

void SameHostMapper::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    MapRequest r = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    done_(MapResult{r.peer, r.instance, map(r)});
    lock.lock();
  }
}

Result<std::shared_ptr<const PeerMapping>> SameHostMapper::map(const MapRequest& r) const {
  gpu::CopyEngine* engine =
      r.decision.copy == SameHostCopy::kHostThreads ? host_engine_ : cuda_engine_;
  if (r.decision.copy == SameHostCopy::kNone || !engine)
    return make_error(ErrorCode::kRefused,
                      r.decision.why.empty() ? "no copy engine for these pools" : r.decision.why);
  Result<gpu::RegionExport> fetched = fetch_pool_share(r.share, r.token, kFetchTimeout);
  if (!fetched) return std::move(fetched).error();
  if (fetched->kind != r.kind || fetched->bytes < r.pool_bytes)
    return make_error(ErrorCode::kInvalid,
                      "the peer handed out a " + std::string(gpu::to_string(fetched->kind)) +
                          " region of " + std::to_string(fetched->bytes) + " bytes for a " +
                          std::string(gpu::to_string(r.kind)) + " pool of " +
                          std::to_string(r.pool_bytes));
  const auto t0 = std::chrono::steady_clock::now();
  Result<gpu::MappedRegion> region =
      gpu::MappedRegion::import(std::move(fetched).value(), r.decision.import);
  if (!region) return std::move(region).error();
  auto mapping = std::make_shared<PeerMapping>(
      PeerMapping{std::move(region).value(), engine,
                  r.kind == gpu::MemoryKind::kDevice ? "cuda-ipc" : "memfd"});
  spdlog::info(
      "transfer plane: mapped the {} pool of {} ({} MiB, {}) in {} ms", gpu::to_string(r.kind),
      r.peer, mapping->region.size() >> 20, engine->name(),
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  return std::shared_ptr<const PeerMapping>(std::move(mapping));
}

}  // namespace kvnode::transfer
