// RAII over UCP's C handles, with errors as values: every failing call comes back as an Error
// that names the call and UCX's status text. The transfer plane is built from these; nothing
// else in kvnode touches a raw ucp_* handle. Destruction order is the reverse of acquisition:
// endpoints and remote keys before their worker, registrations before their context.
// Not thread-safe: a Worker and everything made from it belong to one thread
// (UCS_THREAD_MODE_SINGLE).
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvnode/common/result.hpp"

namespace kvnode::transfer::ucx {

using Bytes = std::vector<std::byte>;

Error status_error(const char* call, ucs_status_t status);

struct ContextOptions {
  std::optional<std::string> tls;          // UCX_TLS for this context; unset: environment or UCX
  std::optional<std::string> net_devices;  // UCX_NET_DEVICES, e.g. "lo" to keep tcp on loopback
  bool wakeup = false;                     // workers get an event fd (Worker::event_fd) to sleep on
  // Room to grow: estimated endpoint count.
};

class Context {
 public:
  static Result<Context> create(const ContextOptions& options = {});
  ucp_context_h get() const { return handle_.get(); }
  // The memory types this context registers and moves (ucp_context_query): a bitmap with bit n
  // for ucs_memory_type_t n; CUDA among them means GPU memory can be registered directly.
  Result<std::uint64_t> memory_types() const;

 private:
  struct Cleanup {
    void operator()(ucp_context_h c) const { ucp_cleanup(c); }
  };
  explicit Context(ucp_context_h h) : handle_(h) {}
  std::unique_ptr<std::remove_pointer_t<ucp_context_h>, Cleanup> handle_;
};

class Worker {
 public:
  static Result<Worker> create(const Context& context);
  ucp_worker_h get() const { return handle_.get(); }
  unsigned progress() const { return ucp_worker_progress(handle_.get()); }
  // Needs a context created with wakeup. The fd turns readable on events once arm() said true.
  Result<int> event_fd() const;
  // True when armed (safe to sleep on the fd); false when events are pending: progress first.
  bool arm() const { return ucp_worker_arm(handle_.get()) == UCS_OK; }
  // Routes active message `id` to cb(arg, ...); a null cb removes the handler (its arg is about
  // to dangle).
  Status set_am_handler(unsigned id, ucp_am_recv_callback_t cb, void* arg) const;
  // The address peers need to reach this worker over shm, cma or RDMA (not only tcp).
  Result<Bytes> address() const;
  // Progresses until the request completes or the deadline passes (then cancels it and waits
  // for the cancellation). Accepts what the *_nbx calls return: NULL (done), an error, a request.
  Status wait(ucs_status_ptr_t request, std::chrono::steady_clock::time_point deadline,
              const char* call) const;

 private:
  struct Destroy {
    void operator()(ucp_worker_h w) const { ucp_worker_destroy(w); }
  };
  explicit Worker(ucp_worker_h h) : handle_(h) {}
  std::unique_ptr<std::remove_pointer_t<ucp_worker_h>, Destroy> handle_;
};

// A local buffer registered for RMA; its packed rkey lets a peer read or write it.
class Registration {
 public:
  // `type`: what the memory is (UCS_MEMORY_TYPE_CUDA for a device pool registered directly);
  // UNKNOWN lets UCX find out.
  static Result<Registration> map(const Context& context, void* address, std::size_t length,
                                  ucs_memory_type_t type = UCS_MEMORY_TYPE_UNKNOWN);
  Result<Bytes> packed_rkey() const;
  void* address() const { return address_; }
  std::size_t length() const { return length_; }
  ucp_mem_h get() const { return handle_.get(); }

 private:
  struct Unmap {
    ucp_context_h context;
    void operator()(ucp_mem_h m) const { ucp_mem_unmap(context, m); }
  };
  Registration(ucp_mem_h h, ucp_context_h c, void* address, std::size_t length)
      : handle_(h, Unmap{c}), address_(address), length_(length) {}
  std::unique_ptr<std::remove_pointer_t<ucp_mem_h>, Unmap> handle_;
  void* address_;
  std::size_t length_;
};

// Closes an endpoint without flushing (nothing of ours is in flight when we close) and
// progresses the worker until UCX is done with it; a graceful close to a dead peer would wait
// for UCX's keepalive.
void close_forced(const Worker& worker, ucp_ep_h ep);

// A connection to one peer worker. With peer error handling (the default) a dead peer fails
// operations instead of hanging them, and the endpoint is force-closed when destroyed. UCX 1.13
// drops every shared-memory transport (sysv, posix, cma) from endpoints that ask for it, so
// same-host sessions connect without it and rely on the plane's own liveness channel and
// deadlines; such an endpoint is left to its worker's destruction (it cannot be force-closed).
class Endpoint {
 public:
  static Result<Endpoint> connect(const Worker& worker, const Bytes& peer_address,
                                  bool peer_error_handling = true);
  Endpoint(Endpoint&& o) noexcept
      : worker_(o.worker_),
        handle_(std::exchange(o.handle_, nullptr)),
        state_(std::move(o.state_)),
        peer_error_handling_(o.peer_error_handling_) {}
  Endpoint& operator=(Endpoint&&) = delete;
  ~Endpoint();
  ucp_ep_h get() const { return handle_; }
  bool failed() const { return state_->failed; }
  ucs_status_t failure() const { return state_->status; }
  bool peer_error_handling() const { return peer_error_handling_; }

 private:
  struct State {
    bool failed = false;
    ucs_status_t status = UCS_OK;
  };
  Endpoint(const Worker* w, ucp_ep_h h, std::unique_ptr<State> s, bool peh)
      : worker_(w), handle_(h), state_(std::move(s)), peer_error_handling_(peh) {}
  static void on_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  const Worker* worker_ = nullptr;
  ucp_ep_h handle_ = nullptr;
  std::unique_ptr<State> state_;  // stable address for the error callback
  bool peer_error_handling_ = true;
};

// A peer's rkey unpacked for one endpoint.
class RemoteKey {
 public:
  static Result<RemoteKey> unpack(const Endpoint& endpoint, const Bytes& packed);
  ucp_rkey_h get() const { return handle_.get(); }

 private:
  struct Destroy {
    void operator()(ucp_rkey_h k) const { ucp_rkey_destroy(k); }
  };
  explicit RemoteKey(ucp_rkey_h h) : handle_(h) {}
  std::unique_ptr<std::remove_pointer_t<ucp_rkey_h>, Destroy> handle_;
};

// One-sided copies with remote completion: they return once the data is in place (a flush
// follows the operation), or with an error at the deadline or when the peer fails.
Status put(const Worker& worker, const Endpoint& ep, const void* local, std::size_t length,
           std::uint64_t remote_address, const RemoteKey& rkey,
           std::chrono::steady_clock::time_point deadline);
Status get(const Worker& worker, const Endpoint& ep, void* local, std::size_t length,
           std::uint64_t remote_address, const RemoteKey& rkey,
           std::chrono::steady_clock::time_point deadline);

}  // namespace kvnode::transfer::ucx
