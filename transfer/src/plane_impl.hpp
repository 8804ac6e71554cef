// The plane's state, shared by plane.cpp (start and stop, the progress thread, the facade),
// plane_initiator.cpp (the sessions this plane dials: dialing, links, welcomes) and
// plane_acceptor.cpp (the sessions peers open: answering hellos, lost links). Private to
// transfer/src.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

#include "descriptor.hpp"
#include "kvnode/common/unique_fd.hpp"
#include "kvnode/transfer/plane.hpp"
#include "listener.hpp"
#include "pool_share.hpp"
#include "same_host.hpp"
#include "session_acceptor.hpp"
#include "session_initiator.hpp"

namespace kvnode::transfer {

class TransferPlane::Impl {
 public:
  Impl(const PlaneOptions& options, const gpu::ChunkPool& pool) : options_(options) {
    pool_.base = pool.region().data();
    pool_.page_bytes = pool.page_bytes();
    pool_.pages = static_cast<std::uint32_t>(pool.page_count());
    memory_kind_ = pool.region().kind();
    device_ = pool.region().device();
    region_ = &pool.region();
  }
  ~Impl() { stop(); }

  Status init();
  void stop();
  std::string url() const { return url_; }
  TransferId submit(bool pull, const std::string& peer, std::vector<PageCopy> pages, Callback cb,
                    TransferOptions options);
  void cancel(TransferId id);
  PlaneCounters counters() const {
    std::lock_guard lock(counters_mutex_);
    return counters_;
  }
  PoolPathChoice pool_path() const { return path_; }
  std::string same_host_status() const { return same_host_status_; }
  std::uint64_t ucx_memory_types() const { return ucx_memory_types_; }

 private:
  struct Command {
    enum Kind { kSubmit, kCancel, kAsk, kMapped } kind;
    std::unique_ptr<Xfer> xfer;
    TransferId id = 0;
    std::string peer;  // kAsk, kMapped
    PendingAsk ask;
    MapResult mapped;  // kMapped
  };

 public:
  void submit_ask(const std::string& peer, PendingAsk a) {
    {
      std::lock_guard lock(commands_mutex_);
      Command c{Command::kAsk, nullptr, 0, peer, std::move(a), {}};
      commands_.push_back(std::move(c));
    }
    wake_->signal();
  }
  std::uint64_t next_ask_id() { return next_id_++; }
  std::chrono::milliseconds default_deadline() const { return options_.default_deadline; }

 private:
  // The initiator session to `peer`, dialled now if there is none.
  Result<InitiatorSession*> session_for(const std::string& peer);
  SessionSetup session_setup(std::string peer) const;
  AskHandler ask_handler_;

  void run();
  unsigned drain_commands();
  void start(std::unique_ptr<Xfer> x);
  unsigned check_links();
  Status dial_peer(InitiatorSession& s);
  static constexpr int kMaxDials = 3;
  static constexpr auto kRedialPause = std::chrono::milliseconds(20);
  unsigned progress_sessions();
  void expire(Clock::time_point now);
  // Ends a session: its transfers and asks fail (the culprit with `failure`, the others as
  // Failure::kReset where they may retry), its link closes, its worker goes.
  void reset(InitiatorSession& s, Failure failure, TransferId culprit, const std::string& why);
  void reset(AcceptorSession& s, Failure failure, const std::string& why);
  void retire(std::unique_ptr<Session> s, Failure failure, TransferId culprit,
              const std::string& why);
  void count_served(Session& s);
  void report(std::unique_ptr<Xfer> x);
  void sleep();
  void watch(int fd, bool add);
  ListenerAnswer answer(const LinkBytes& hello, LinkId link);
  void lost(LinkId link, const std::string& why);
  void welcomed(InitiatorSession& s, const LinkBytes& welcome);

  // Same-host moves (plane_same_host.cpp).
  void start_same_host();
  void request_mapping(const InitiatorSession& s);
  void attach_mapping(MapResult r);
  int cuda_device() const;  // our CUDA copy engine's device, -1 without one

  PlaneOptions options_;
  PoolView pool_;
  gpu::MemoryKind memory_kind_ = gpu::MemoryKind::kHost;
  int device_ = 0;
  Status start_staging();
  Status choose_path();
  Result<ucx::Registration> register_memory();
  void bind_device();
  const Staging* staging() const { return ring_ ? &staging_ : nullptr; }
  // GPUDirect: the engine that lands eager payloads in the device pool.
  gpu::CopyEngine* pool_copier() const {
    return path_.path == PoolPath::kGpuDirect ? engine_.get() : nullptr;
  }
  PoolPathChoice path_;
  std::uint64_t ucx_memory_types_ = 0;
  PeerDescriptor pool_descriptor_;             // ours; each session adds its worker address
  const gpu::MemoryRegion* region_ = nullptr;  // the pool's memory, handed to same-host peers
  std::string url_;

  // Acquired in this order, released in reverse (sessions go first, on the thread).
  std::unique_ptr<gpu::CopyEngine> engine_;  // set when the pool is staged or GPUDirect
  std::optional<gpu::ChunkPool> ring_;       // the staging slots, registered instead of the pool
  Staging staging_;
  std::optional<ucx::Context> context_;
  std::optional<ucx::Registration> registration_;
  std::unique_ptr<Listener> listener_;
  std::optional<Epoll> links_;  // the initiators' control links
  UniqueFd epoll_;
  std::optional<EventFd> wake_;  // callers' commands wake the progress thread

  // Same-host moves: the engines their copies run on (host pools: threads; a pinned or device
  // pool: a CUDA engine of its own, so long copies do not queue staged ones), our pool's share
  // socket, and the thread mapping peers' pools. Declared before the sessions, which cancel their
  // copies on these engines when they go.
  std::unique_ptr<gpu::CopyEngine> host_copier_;
  std::unique_ptr<gpu::CopyEngine> cuda_copier_;
  std::unique_ptr<PoolShareServer> share_;
  std::unique_ptr<SameHostMapper> mapper_;
  std::string same_host_status_ = "off";

  std::map<std::string, std::unique_ptr<InitiatorSession>> initiators_;  // by peer url
  std::map<LinkId, std::unique_ptr<AcceptorSession>> acceptors_;         // by the listener's link
  std::unordered_map<TransferId, std::string> where_;                    // transfer -> peer url

  std::mutex commands_mutex_;
  std::deque<Command> commands_;
  std::atomic<bool> stopping_{false};
  std::atomic<TransferId> next_id_{1};
  mutable std::mutex counters_mutex_;
  PlaneCounters counters_;
  Clock::time_point last_event_ = Clock::now();
  std::thread thread_;
};

}  // namespace kvnode::transfer
