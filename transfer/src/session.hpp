// One session between this plane and a peer plane: a UCX worker of its own, the data endpoint to
// the peer's session worker, the peer's pool key and geometry, and the transfers in flight on it.
// An initiator session is opened by this plane's transfers to a peer url; an acceptor session
// is the peer's counterpart, which serves the initiator's active messages against our pool.
//
// The worker is the session's unit of failure: resetting a session destroys it, which ends every
// operation UCX still holds for the session (even where UCX 1.13 cannot cancel one, such as an
// RMA get to a dead shared-memory peer), so no late byte can land in a page after the transfer
// was reported. Runs on the plane's progress thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvnode/gpu/copy_engine.hpp"
#include "kvnode/transfer/control_link.hpp"
#include "kvnode/transfer/descriptor.hpp"
#include "kvnode/transfer/listener.hpp"
#include "kvnode/transfer/plane.hpp"
#include "kvnode/transfer/ucx_handles.hpp"
#include "runs.hpp"
#include "wire.hpp"

namespace kvnode::transfer {

using Clock = std::chrono::steady_clock;

struct PoolView {
  std::byte* base = nullptr;
  std::size_t page_bytes = 0;
  std::uint32_t pages = 0;
  std::byte* page(gpu::PageId p) const { return base + static_cast<std::size_t>(p) * page_bytes; }
};

// Where chunks of a pool UCX cannot touch go through: one-page slots of registered host memory,
// filled and drained by a copy engine (cudaMemcpyAsync, or memcpy as a stand-in).
struct Staging {
  gpu::CopyEngine* engine = nullptr;
  gpu::ChunkPool* ring = nullptr;
};

// A request to the peer's node, waiting for its answer.
struct PendingAsk {
  std::uint64_t id = 0;
  std::vector<std::byte> body;
  Clock::time_point deadline;
  std::function<void(Result<std::vector<std::byte>>)> done;
};
using AskHandler = std::function<Result<std::vector<std::byte>>(const std::string& peer,
                                                                const std::vector<std::byte>&)>;

// A transfer this plane started.
struct Xfer {
  TransferId id = 0;
  bool pull = true;
  std::string peer;
  std::vector<PageCopy> pages;
  TransferPlane::Callback callback;
  Clock::time_point submitted, posted, deadline;
  Plan plan;
  std::vector<std::uint8_t> run_state;  // 0 open, 1 done, 2 failed
  std::uint32_t open_runs = 0;
  bool notified = false;  // the peer was told what RMA did to its pages
  Failure failure = Failure::kNone;
  std::string message;
  TransferStats stats;

  void fail_run(std::uint32_t run, Failure f, const std::string& why);
  void finish_run(std::uint32_t run);
  void fail_all(Failure f, const std::string& why);
  bool finished() const { return open_runs == 0; }
  TransferResult result(const PoolView& pool) const;
};

// What the plane counts of the serving side.
struct ServeCounters {
  std::uint64_t bytes = 0;
  std::uint64_t rejected = 0;
};

class Session {
 public:
  enum class Role { kInitiator, kAcceptor };

  static Result<std::unique_ptr<Session>> create(const ucx::Context& context, Role role,
                                                 std::string peer, const PoolView& pool,
                                                 Protocol protocol, const Staging* staging);
  ~Session();

  // Initiator: the descriptor to send in the hello / acceptor: the one to answer with.
  PeerDescriptor local_descriptor(const PeerDescriptor& pool_descriptor) const;
  // Connects the data endpoint to the peer's session worker. Same-host peers connect without
  // UCX peer error handling so shared memory stays available.
  Status connect(PeerDescriptor peer, bool same_host);

  // Initiator: queue a transfer (posted at once when ready, else when connected).
  void submit(std::unique_ptr<Xfer> xfer);
  void ask(PendingAsk a);
  void set_ask_handler(const AskHandler* handler) { ask_handler_ = handler; }
  // Asks answered, failed or expired since the last call, with their results.
  std::vector<std::pair<PendingAsk, Result<std::vector<std::byte>>>> take_answered(Clock::time_point now);
  void post_waiting();
  // Progresses the worker, completes operations, serves peers. Returns events handled.
  unsigned progress();
  // Transfers that have ended since the last call.
  std::vector<std::unique_ptr<Xfer>> take_finished();
  // Fails every transfer on this session; the caller then destroys it.
  std::vector<std::unique_ptr<Xfer>> fail_all(Failure first, TransferId culprit,
                                              const std::string& why);
  // Pages a peer wrote into our pool since the last call (push).
  std::vector<std::vector<gpu::PageId>> take_written();

  std::optional<Clock::time_point> earliest_deadline() const;
  std::optional<TransferId> expired(Clock::time_point now) const;
  bool has(TransferId id) const { return xfers_.count(id) != 0; }
  bool busy() const { return !xfers_.empty() || !ops_.empty() || !asks_.empty(); }

  const std::string& peer() const { return peer_; }
  Role role() const { return role_; }
  bool ready() const { return endpoint_.has_value(); }
  const ucx::Worker& worker() const { return worker_; }
  int event_fd() const { return event_fd_; }
  const std::string& transport() const { return transport_; }
  Protocol protocol() const { return protocol_; }
  // Set by UCX callbacks; the plane resets the session when it sees it.
  bool broken() const { return broken_ || (endpoint_ && endpoint_->failed()); }
  void mark_broken(const std::string& why);
  void clear_broken() {
    broken_ = false;
    broken_reason_.clear();
  }
  const std::string& broken_reason() const { return broken_reason_; }
  ServeCounters& serve_counters() { return serve_; }

  // Initiator: the control link it dialed (hello, welcome, then liveness) and the hello it sends.
  std::optional<ControlLink> link;
  ucx::Bytes hello_body;
  int dials = 0;
  // Acceptor: the listener's link it came on.
  LinkId link_id = 0;

 private:
  enum class OpKind { kGet, kPut, kFlush, kPullRequest, kPushSend, kServeSend, kServeRecv, kAck,
                      kNotify, kPullRecv, kPushStage, kServeStage, kAsk, kAnswer };
  enum class CopyKind { kPullLanded, kPushStaged, kServeStaged, kServeLanded };
  struct Op {
    explicit Op(OpKind k, TransferId x = 0, std::uint32_t r = 0) : kind(k), xfer(x), run(r) {}
    ucs_status_ptr_t request = nullptr;
    OpKind kind;
    TransferId xfer = 0;
    std::uint32_t run = 0;
    wire::PushHeader push{};      // header storage: UCX 1.13 reads it until the send completes
    wire::RunHeader run_header{};
    wire::PullRequest pull{};
    std::vector<wire::RunRequest> runs;  // kPullRequest / kNotify bodies, kServeRecv target
    std::string text;                    // kAck / reject reason
    std::optional<gpu::PageId> slot;     // the staging slot UCX reads or writes
    wire::AskHeader ask{};
    std::vector<std::byte> body;         // kAsk / kAnswer
  };
  struct Copy {  // a staging copy in flight, and what follows when it lands
    gpu::CopyEngine::Ticket ticket = 0;
    CopyKind kind;
    TransferId xfer = 0;
    std::uint32_t run = 0;
    std::optional<gpu::PageId> slot;
    wire::RunHeader header{};  // kServeStaged / kServeLanded: whom to answer
    wire::RunRequest target{};
  };
  // Slots go back to the ring only after the worker is destroyed: UCX may hold them till then.
  struct SlotReturn {
    gpu::ChunkPool* ring = nullptr;
    std::vector<gpu::PageId> slots;
    ~SlotReturn() {
      for (gpu::PageId s : slots) (void)ring->release(s);
    }
  };
  struct Deferred {  // a rendezvous to receive, or a request to serve, outside UCX's callback
    explicit Deferred(OpKind k) : kind(k) {}
    OpKind kind;
    void* desc = nullptr;
    std::size_t length = 0;
    wire::PushHeader push{};
    wire::RunHeader run{};
    std::vector<wire::RunRequest> runs;
    TransferId transfer = 0;
    std::uint32_t run_index = 0;  // kPushStage
    wire::AskHeader ask{};        // kAnswer: a peer's ask to answer
    std::vector<std::byte> body;
  };

  Session(Role role, std::string peer, const PoolView& pool, Protocol protocol,
          const Staging* staging, ucx::Worker worker)
      : role_(role), peer_(std::move(peer)), pool_(pool), requested_(protocol), staging_(staging),
        worker_(std::move(worker)) {
    if (staging_) slot_return_.ring = staging_->ring;
  }
  // Staging: slots, copies, and the work waiting for a free slot.
  std::optional<gpu::PageId> take_slot();
  void give_slot(gpu::PageId slot);
  std::byte* slot_bytes(gpu::PageId slot) const { return staging_->ring->page(slot); }
  void start_copy(Copy copy, void* dst, const void* src, std::size_t bytes);
  void landed(Copy& copy, const Status& status);
  unsigned poll_copies();
  bool needs_slot(const Deferred& d) const;
  std::uint32_t max_run() const { return staging_ || !remote_.rma ? 1 : UINT32_MAX; }
  Status install_handlers();
  void post(Xfer& x);
  bool use_rma(Xfer& x) const;
  static constexpr std::uint64_t kCmaPushViaAmBytes = 8 << 20;  // per run, on average
  void post_rma(Xfer& x);
  void post_am(Xfer& x);
  void track(ucs_status_ptr_t request, Op op);
  void settle(ucs_status_ptr_t request);  // for the op just appended to ops_
  void completed(Op& op, ucs_status_t status);
  void serve(Deferred& d);
  void send_run_header(OpKind kind, unsigned am_id, const wire::RunHeader& h, std::string text);
  Xfer* find(TransferId id);
  std::uint64_t span_bytes(std::uint32_t count) const {
    return static_cast<std::uint64_t>(count) * pool_.page_bytes;
  }

  static ucs_status_t on_pull_request(void* arg, const void* header, std::size_t header_length,
                                      void* data, std::size_t length, const ucp_am_recv_param_t* p);
  static ucs_status_t on_pull_data(void* arg, const void* header, std::size_t header_length,
                                   void* data, std::size_t length, const ucp_am_recv_param_t* p);
  static ucs_status_t on_run_answer(void* arg, const void* header, std::size_t header_length,
                                    void* data, std::size_t length, const ucp_am_recv_param_t* p);
  static ucs_status_t on_push_data(void* arg, const void* header, std::size_t header_length,
                                   void* data, std::size_t length, const ucp_am_recv_param_t* p);
  static ucs_status_t on_written(void* arg, const void* header, std::size_t header_length,
                                 void* data, std::size_t length, const ucp_am_recv_param_t* p);
  static ucs_status_t on_read(void* arg, const void* header, std::size_t header_length,
                              void* data, std::size_t length, const ucp_am_recv_param_t* p);
  // After RMA: tells the peer which of its pages x wrote (kWritten) or read (kRead).
  void notify(unsigned am_id, Xfer& x);
  ucs_status_t noticed(bool written, const void* header, std::size_t header_length, const void* data,
                       std::size_t length, const ucp_am_recv_param_t* p);
  static ucs_status_t on_ask(void* arg, const void* header, std::size_t header_length, void* data,
                             std::size_t length, const ucp_am_recv_param_t* p);
  static ucs_status_t on_answer(void* arg, const void* header, std::size_t header_length,
                                void* data, std::size_t length, const ucp_am_recv_param_t* p);
  void post_ask(PendingAsk a);
  void answer_ask(const Deferred& d);

  Role role_;
  std::string peer_;
  PoolView pool_;
  Protocol requested_;
  const Staging* staging_;
  Protocol protocol_ = Protocol::kActiveMessage;
  std::string transport_;
  PeerDescriptor remote_;
  bool broken_ = false;
  std::string broken_reason_;
  ServeCounters serve_;
  int event_fd_ = -1;

  // Destroyed in reverse: remote key, endpoint, the worker that owns what is left, then the
  // staging slots UCX might still have been using go back to the ring.
  SlotReturn slot_return_;
  ucx::Worker worker_;
  std::optional<ucx::Endpoint> endpoint_;
  std::optional<ucx::RemoteKey> rkey_;

  std::deque<std::unique_ptr<Xfer>> waiting_;
  std::map<TransferId, std::unique_ptr<Xfer>> xfers_;
  std::vector<std::unique_ptr<Xfer>> finished_;
  std::list<Op> ops_;  // stable addresses: headers live here while UCX sends them
  std::deque<Deferred> deferred_;
  std::deque<Deferred> stalled_;  // waiting for a staging slot, in order
  std::list<Copy> copies_;
  std::vector<std::vector<gpu::PageId>> written_;
  const AskHandler* ask_handler_ = nullptr;
  std::deque<PendingAsk> asks_waiting_;  // until connected
  std::map<std::uint64_t, PendingAsk> asks_;
  std::vector<std::pair<PendingAsk, Result<std::vector<std::byte>>>> answered_;
};

}  // namespace kvnode::transfer
