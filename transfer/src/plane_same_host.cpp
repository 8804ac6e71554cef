// The plane's same-host moves (PlaneOptions::same_host, same_host.hpp): offering our pool on a
// share socket at start, asking for a same-host peer's pool when a session with it opens, and
// handing the mapping to that session when the mapper thread has made it.
#include <spdlog/spdlog.h>

#include <system_error>

#include "kvnode/gpu/parallel_copy.hpp"
#include "plane_impl.hpp"

namespace kvnode::transfer {

void TransferPlane::Impl::start_same_host() {
  pool_descriptor_.pool_kind = static_cast<std::uint8_t>(memory_kind_);
  pool_descriptor_.device = static_cast<std::uint32_t>(std::max(device_, 0));
  if (options_.same_host == SameHost::kOff) {
    same_host_status_ = "off (same_host off)";
    return;
  }
  gpu::ParallelCopyOptions copy;
  copy.threads = options_.copy_threads;
  copy.on_landed = [this] { wake_->signal(); };
  Result<std::unique_ptr<gpu::CopyEngine>> threads = gpu::make_parallel_copy_engine(copy);
  if (!threads) {
    same_host_status_ = "off (copy threads: " + threads.error().message + ")";
    spdlog::warn("transfer plane: same-host moves {}", same_host_status_);
    return;
  }
  host_copier_ = std::move(threads).value();
  std::string cuda_note;
  if (memory_kind_ != gpu::MemoryKind::kHost) {
    // Copies with a device pool on either side are DMA, on a stream of their own (staged
    // copies keep theirs).
    if (Result<std::unique_ptr<gpu::CopyEngine>> cuda = gpu::make_cuda_copy_engine(device_))
      cuda_copier_ = std::move(cuda).value();
    else
      cuda_note = "; no CUDA copies: " + cuda.error().message;
  }
  try {
    mapper_ = std::make_unique<SameHostMapper>(
        [this](MapResult r) {
          {
            std::lock_guard lock(commands_mutex_);
            Command c{Command::kMapped, nullptr, 0, r.peer, {}, std::move(r)};
            commands_.push_back(std::move(c));
          }
          wake_->signal();
        },
        host_copier_.get(), cuda_copier_.get());
  } catch (const std::system_error& e) {
    same_host_status_ = std::string("off (the mapping thread: ") + e.what() + ")";
    spdlog::warn("transfer plane: same-host moves {}", same_host_status_);
    return;
  }
  // Offer ours: peers on this host map it. Without it they still may not: we can map theirs.
  std::string offer;
  Result<gpu::RegionExport> exported = gpu::export_region(*region_);
  if (exported) {
    Result<std::unique_ptr<PoolShareServer>> server =
        PoolShareServer::start(std::move(exported).value());
    if (server) {
      share_ = std::move(server).value();
      pool_descriptor_.share = share_->name();
      pool_descriptor_.share_token = share_->token();
      offer = "pool offered";
    } else {
      offer = "pool not offered: " + server.error().message;
    }
  } else {
    offer = "pool not offered: " + exported.error().message;
  }
  same_host_status_ = "on (" + offer + "; " + host_copier_->name() + cuda_note + ")";
  spdlog::info("transfer plane: same-host moves {}", same_host_status_);
}

int TransferPlane::Impl::cuda_device() const {
  return cuda_copier_ ? device_ : -1;
}

void TransferPlane::Impl::request_mapping(const InitiatorSession& s) {
  if (!mapper_) return;
  const PeerDescriptor& peer = s.remote();
  if (peer.share.empty()) {
    spdlog::info(
        "transfer plane: {} is on this host but does not offer its pool: UCX moves "
        "its chunks",
        s.peer());
    return;
  }
  const auto kind = static_cast<gpu::MemoryKind>(peer.pool_kind);  // range-checked when decoded
  SameHostDecision d = decide_same_host(memory_kind_, kind, cuda_device());
  if (d.copy == SameHostCopy::kNone) {
    spdlog::info("transfer plane: {} is on this host; UCX moves its chunks: {}", s.peer(), d.why);
    return;
  }
  MapRequest r;
  r.peer = s.peer();
  r.instance = peer.instance;
  r.share = peer.share;
  r.token = peer.share_token;
  r.kind = kind;
  r.pool_bytes = static_cast<std::size_t>(peer.page_bytes * peer.pages);
  r.decision = std::move(d);
  mapper_->request(std::move(r));
}

void TransferPlane::Impl::attach_mapping(MapResult r) {
  if (!r.mapping) {
    // Unreachable (another network namespace) or unusable here (a GPU this process does not
    // see) is how some hosts are: info. Anything else is worth a look.
    const ErrorCode code = r.mapping.error().code;
    const bool expected = code == ErrorCode::kPeerLost || code == ErrorCode::kRefused;
    spdlog::log(expected ? spdlog::level::info : spdlog::level::warn,
                "transfer plane: {} is on this host, but its pool could not be mapped ({}): "
                "UCX moves its chunks",
                r.peer, r.mapping.error().message);
    return;
  }
  const auto it = initiators_.find(r.peer);
  // The session ended, or the peer restarted, while the mapping was made: it is dropped here.
  if (it == initiators_.end() || !it->second->ready() ||
      it->second->remote().instance != r.instance)
    return;
  std::shared_ptr<const PeerMapping> mapping = std::move(r.mapping).value();
  spdlog::info("transfer plane: moves with {} copy through its mapped pool ({})", r.peer,
               mapping->transport);
  it->second->attach(std::move(mapping));
}

}  // namespace kvnode::transfer
