// A session between this plane and a peer plane: a UCX worker of its own, the data endpoint to
// the peer's session worker, the peer's pool key and geometry. A session has one of two roles,
// each its own class:
//   InitiatorSession (session_initiator.*): this plane dialled the peer (a transfer or an ask
//     named its url); it posts our transfers and asks and hears how they end.
//   AcceptorSession (session_acceptor.*): a peer dialled us; it serves that peer's pulls, pushes
//     and notices against our pool.
// This base holds what both share: connecting, the UCX operations in flight, the loop that
// progresses them, the staging copies (session_staging.cpp), and answering the peer's asks.
//
// The worker is the session's unit of failure: resetting a session destroys it, which ends every
// operation UCX still holds for the session (even where UCX 1.13 cannot cancel one, such as an
// RMA get to a dead shared-memory peer), so no late byte can land in a page after the transfer
// was reported. Runs on the plane's progress thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <initializer_list>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "am_messages.hpp"
#include "descriptor.hpp"
#include "kvnode/gpu/copy_engine.hpp"
#include "kvnode/transfer/plane.hpp"
#include "ucx_handles.hpp"
#include "xfer.hpp"

namespace kvnode::transfer {

// Where chunks of a pool UCX cannot touch go through: one-page slots of registered host memory,
// filled and drained by a copy engine (cudaMemcpyAsync, or memcpy as a stand-in).
struct Staging {
  gpu::CopyEngine* engine = nullptr;
  gpu::ChunkPool* ring = nullptr;
};

using AskHandler = std::function<Result<std::vector<std::byte>>(const std::string& peer,
                                                                const std::vector<std::byte>&)>;

// What the plane counts of a session's serving side, taken by take_serve_counters().
struct ServeCounters {
  std::uint64_t bytes = 0;
  std::uint64_t rejected = 0;
};

// How a session is made: the plane's objects it works against (all outlive it).
struct SessionSetup {
  const ucx::Context* context = nullptr;
  std::string peer;  // the url dialled, or the name the peer gave in its hello
  PoolView pool;
  Protocol protocol = Protocol::kAuto;  // what the plane was asked to use
  const Staging* staging = nullptr;     // set when our pool moves through a staging ring
  // Set when our pool is device memory UCX registered itself (GPUDirect): eager active messages
  // arrive in host buffers, and only the GPU's copy engine can put them in the pool.
  gpu::CopyEngine* pool_copier = nullptr;
  const AskHandler* ask_handler = nullptr;
};

// "call: what UCX said", for failures of a UCX operation.
std::string status_text(const char* call, ucs_status_t st);

class Session {
 public:
  virtual ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // The descriptor to send in the hello (initiator) or the welcome (acceptor): the pool's, with
  // this session's worker address.
  PeerDescriptor local_descriptor(const PeerDescriptor& pool_descriptor) const;
  // Connects the data endpoint to the peer's session worker. Same-host peers connect without
  // UCX peer error handling so shared memory stays available.
  Status connect(PeerDescriptor peer, bool same_host);

  // Progresses the worker, completes operations, serves the peer. Returns events handled.
  virtual unsigned progress();
  // What the serving side counted since the last call.
  ServeCounters take_serve_counters() { return std::exchange(serve_, {}); }

  const std::string& peer() const { return peer_; }
  const PeerDescriptor& remote() const { return remote_; }  // once connected
  bool ready() const { return endpoint_.has_value(); }
  const ucx::Worker& worker() const { return worker_; }
  int event_fd() const { return event_fd_; }
  const std::string& transport() const { return transport_; }
  Protocol protocol() const { return protocol_; }
  // Set by UCX callbacks or by the plane (a lost link); the plane resets the session.
  bool broken() const { return broken_ || (endpoint_ && endpoint_->failed()); }
  void mark_broken(const std::string& why);
  const std::string& broken_reason() const { return broken_reason_; }

 protected:
  // What a UCX operation in flight is for; each role handles its own in completed().
  enum class OpKind {
    kGet,
    kPut,
    kFlush,
    kPullRequest,
    kPushSend,
    kNotify,
    kPullRecv,
    kPushStage,
    kAsk,  // initiator
    kServeSend,
    kServeRecv,
    kAck,
    kServeStage,  // acceptor
    kAnswer,      // both
  };
  enum class CopyKind { kPullLanded, kPushStaged, kServeStaged, kServeLanded, kMappedRun };
  struct Op {
    explicit Op(OpKind k, TransferId x = 0, std::uint32_t r = 0) : kind(k), xfer(x), run(r) {}
    ucs_status_ptr_t request = nullptr;
    OpKind kind;
    TransferId xfer = 0;
    std::uint32_t run = 0;
    am::PushHeader push{};  // header storage: UCX 1.13 reads it until the send completes
    am::RunHeader run_header{};
    am::PullRequest pull{};
    std::vector<am::RunRequest> runs;  // kPullRequest / kNotify bodies, kServeRecv target
    std::string text;                  // kAck / reject reason
    std::optional<gpu::PageId> slot;   // the staging slot UCX reads or writes
    am::AskHeader ask{};
    std::vector<std::byte> body;  // kAsk / kAnswer
  };
  // A copy in flight: staging, an eager payload into a device pool, or a run of a same-host
  // transfer copied straight to or from the peer's mapped pool (engine: the mapping's).
  struct Copy {
    gpu::CopyEngine::Ticket ticket = 0;
    CopyKind kind = CopyKind::kPullLanded;
    TransferId xfer = 0;
    std::uint32_t run = 0;
    std::optional<gpu::PageId> slot;
    am::RunHeader header{};  // kServeStaged / kServeLanded: whom to answer
    am::RunRequest target{};
    gpu::CopyEngine* engine = nullptr;  // null: copier_
    std::shared_ptr<const void> keep;   // the mapped pool it reads or writes, until it ends

    // A run of one of our transfers (through a staging slot, or none).
    static Copy of_run(CopyKind kind, TransferId xfer, std::uint32_t run,
                       std::optional<gpu::PageId> slot) {
      Copy c;
      c.kind = kind;
      c.xfer = xfer;
      c.run = run;
      c.slot = slot;
      return c;
    }
    // A run served to a peer: `target` of its transfer, answered with kOk once copied.
    static Copy serving(CopyKind kind, TransferId peer_xfer, const am::RunRequest& target,
                        std::optional<gpu::PageId> slot) {
      Copy c;
      c.kind = kind;
      c.slot = slot;
      c.header = {peer_xfer, target.run, am::RunCode::kOk};
      c.target = target;
      return c;
    }
  };
  struct Deferred {  // a rendezvous to receive, or a request to serve, outside UCX's callback
    explicit Deferred(OpKind k) : kind(k) {}
    OpKind kind;
    void* desc = nullptr;
    std::size_t length = 0;
    am::PushHeader push{};
    am::RunHeader run{};
    std::vector<am::RunRequest> runs;
    TransferId transfer = 0;
    std::uint32_t run_index = 0;  // kPushStage
    am::AskHeader ask{};          // kAnswer: a peer's ask to answer
    std::vector<std::byte> body;
  };
  using AmHandler = std::pair<unsigned, ucp_am_recv_callback_t>;

  Session(const SessionSetup& setup, ucx::Worker worker);
  // The rest of set-up, once the object is whole: the worker's event fd, the ask handler both
  // roles install, the role's own `handlers` (called with `arg`, the role's this), and a refusal
  // for the messages only the other role receives (`refused`).
  Status start(std::initializer_list<AmHandler> handlers, void* arg,
               std::initializer_list<unsigned> refused);

  void clear_broken() {
    broken_ = false;
    broken_reason_.clear();
  }

  // A UCX operation just posted: complete it now, or keep it (and `op`) until UCX is done.
  void track(ucs_status_ptr_t request, Op op);
  void settle(ucs_status_ptr_t request);  // for the op just appended to ops_
  // The role's side of an operation that ended, a deferred piece of work, a landed copy.
  virtual void completed(Op& op, ucs_status_t status) = 0;
  virtual void serve(Deferred& d) = 0;
  virtual void landed(Copy& copy, const Status& status) = 0;

  // Staging (session_staging.cpp): slots, copies (copier_: the staging ring's engine, or the
  // device pool's where UCX registered it directly), and the work waiting for a free slot.
  std::optional<gpu::PageId> take_slot();
  void give_slot(gpu::PageId slot);
  std::byte* slot_bytes(gpu::PageId slot) const { return staging_->ring->page(slot); }
  void start_copy(Copy copy, void* dst, const void* src, std::size_t bytes);
  gpu::CopyEngine* engine_of(const Copy& c) const { return c.engine ? c.engine : copier_; }
  unsigned poll_copies();
  bool needs_slot(const Deferred& d) const;

  std::uint64_t span_bytes(std::uint32_t count) const {
    return static_cast<std::uint64_t>(count) * pool_.page_bytes;
  }
  bool in_pool(std::uint32_t first, std::uint32_t count) const {
    return count > 0 && first < pool_.pages && count <= pool_.pages - first;
  }
  static bool rendezvous(const ucp_am_recv_param_t* p) {
    return p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
  }
  // A message only the other role sends: counted as refused and dropped.
  static ucs_status_t on_wrong_side(void* arg, const void* header, std::size_t header_length,
                                    void* data, std::size_t length, const ucp_am_recv_param_t* p);

  std::string peer_;
  PoolView pool_;
  Protocol requested_;
  const Staging* staging_;
  gpu::CopyEngine* copier_;  // null when the CPU writes the pool itself
  Protocol protocol_ = Protocol::kActiveMessage;
  std::string transport_;
  PeerDescriptor remote_;
  ServeCounters serve_;

 private:
  // Slots go back to the ring only after the worker is destroyed: UCX may hold them till then.
  struct SlotReturn {
    gpu::ChunkPool* ring = nullptr;
    std::vector<gpu::PageId> slots;
    ~SlotReturn() {
      for (gpu::PageId s : slots) (void)ring->release(s);
    }
  };

  static ucs_status_t on_ask(void* arg, const void* header, std::size_t header_length, void* data,
                             std::size_t length, const ucp_am_recv_param_t* p);
  void answer_ask(const Deferred& d);

  const AskHandler* ask_handler_;
  bool broken_ = false;
  std::string broken_reason_;
  int event_fd_ = -1;

  // Destroyed in reverse: remote key, endpoint, the worker that owns what is left, then the
  // staging slots UCX might still have been using go back to the ring.
  SlotReturn slot_return_;
  ucx::Worker worker_;

 protected:
  std::optional<ucx::Endpoint> endpoint_;
  std::optional<ucx::RemoteKey> rkey_;

  std::list<Op> ops_;  // stable addresses: headers live here while UCX sends them
  std::deque<Deferred> deferred_;
  std::deque<Deferred> stalled_;  // waiting for a staging slot, in order
  std::list<Copy> copies_;
};

}  // namespace kvnode::transfer
