#include "ucx_handles.hpp"

#include <cstring>

namespace kvnode::transfer::ucx {
namespace {

using Clock = std::chrono::steady_clock;

struct ConfigRelease {
  void operator()(ucp_config_t* c) const { ucp_config_release(c); }
};

Result<Bytes> copy_out(const void* p, std::size_t n) {
  Bytes out(n);
  std::memcpy(out.data(), p, n);
  return out;
}

}  // namespace

Error status_error(const char* call, ucs_status_t status) {
  return make_error(std::string(call) + " failed: " + ucs_status_string(status));
}

Result<Context> Context::create(const ContextOptions& options) {
  ucp_config_t* raw = nullptr;
  if (ucs_status_t st = ucp_config_read(nullptr, nullptr, &raw); st != UCS_OK)
    return status_error("ucp_config_read", st);
  std::unique_ptr<ucp_config_t, ConfigRelease> config(raw);
  if (options.tls) {
    if (ucs_status_t st = ucp_config_modify(raw, "TLS", options.tls->c_str()); st != UCS_OK)
      return status_error(("ucp_config_modify(TLS=" + *options.tls + ")").c_str(), st);
  }
  if (options.net_devices) {
    if (ucs_status_t st = ucp_config_modify(raw, "NET_DEVICES", options.net_devices->c_str());
        st != UCS_OK)
      return status_error(("ucp_config_modify(NET_DEVICES=" + *options.net_devices + ")").c_str(),
                          st);
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_TAG |
                    (options.wakeup ? UCP_FEATURE_WAKEUP : 0);
  ucp_context_h context = nullptr;
  if (ucs_status_t st = ucp_init(&params, raw, &context); st != UCS_OK)
    return status_error("ucp_init", st);
  return Context(context);
}

Result<std::uint64_t> Context::memory_types() const {
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucs_status_t st = ucp_context_query(get(), &attr); st != UCS_OK)
    return status_error("ucp_context_query", st);
  return std::uint64_t{attr.memory_types};
}

Result<Worker> Worker::create(const Context& context) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  if (ucs_status_t st = ucp_worker_create(context.get(), &params, &worker); st != UCS_OK)
    return status_error("ucp_worker_create", st);
  return Worker(worker);
}

Result<int> Worker::event_fd() const {
  int fd = -1;
  if (ucs_status_t st = ucp_worker_get_efd(get(), &fd); st != UCS_OK)
    return status_error("ucp_worker_get_efd", st);
  return fd;
}

Status Worker::set_am_handler(unsigned id, ucp_am_recv_callback_t cb, void* arg) const {
  ucp_am_handler_param_t param{};
  param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                     UCP_AM_HANDLER_PARAM_FIELD_ARG;
  param.id = id;
  param.cb = cb;
  param.arg = arg;
  if (ucs_status_t st = ucp_worker_set_am_recv_handler(get(), &param); st != UCS_OK)
    return status_error("ucp_worker_set_am_recv_handler", st);
  return {};
}

Result<Bytes> Worker::address() const {
  ucp_address_t* address = nullptr;
  std::size_t length = 0;
  if (ucs_status_t st = ucp_worker_get_address(get(), &address, &length); st != UCS_OK)
    return status_error("ucp_worker_get_address", st);
  Result<Bytes> out = copy_out(address, length);
  ucp_worker_release_address(get(), address);
  return out;
}

Status Worker::wait(ucs_status_ptr_t request, Clock::time_point deadline, const char* call) const {
  if (request == nullptr) return {};
  if (UCS_PTR_IS_ERR(request)) return status_error(call, UCS_PTR_STATUS(request));
  bool cancelled = false;
  ucs_status_t st;
  for (unsigned i = 0; (st = ucp_request_check_status(request)) == UCS_INPROGRESS; ++i) {
    progress();
    if (!cancelled && i % 64 == 0 && Clock::now() > deadline) {
      ucp_request_cancel(get(), request);  // completes the request with UCS_ERR_CANCELED
      cancelled = true;
    }
  }
  ucp_request_free(request);
  if (cancelled) return make_error(std::string(call) + " missed its deadline");
  if (st != UCS_OK) return status_error(call, st);
  return {};
}

Result<Registration> Registration::map(const Context& context, void* address, std::size_t length,
                                       ucs_memory_type_t type) {
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = address;
  params.length = length;
  if (type != UCS_MEMORY_TYPE_UNKNOWN) {
    params.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    params.memory_type = type;
  }
  ucp_mem_h memh = nullptr;
  if (ucs_status_t st = ucp_mem_map(context.get(), &params, &memh); st != UCS_OK)
    return status_error("ucp_mem_map", st);
  return Registration(memh, context.get(), address, length);
}

Result<Bytes> Registration::packed_rkey() const {
  void* buffer = nullptr;
  std::size_t size = 0;
  // ucp_memh_pack replaces this in newer UCX; Debian's 1.13 has only ucp_rkey_pack.
  if (ucs_status_t st = ucp_rkey_pack(handle_.get_deleter().context, get(), &buffer, &size);
      st != UCS_OK)
    return status_error("ucp_rkey_pack", st);
  Result<Bytes> out = copy_out(buffer, size);
  ucp_rkey_buffer_release(buffer);
  return out;
}

void Endpoint::on_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* state = static_cast<State*>(arg);
  state->failed = true;
  state->status = status;
}

Result<Endpoint> Endpoint::connect(const Worker& worker, const Bytes& peer_address,
                                   bool peer_error_handling) {
  if (peer_address.empty()) return make_error("connect: empty peer worker address");
  auto state = std::make_unique<State>();
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(peer_address.data());
  params.err_mode = peer_error_handling ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  params.err_handler.cb = &Endpoint::on_error;
  params.err_handler.arg = state.get();
  ucp_ep_h ep = nullptr;
  if (ucs_status_t st = ucp_ep_create(worker.get(), &params, &ep); st != UCS_OK)
    return status_error("ucp_ep_create", st);
  return Endpoint(&worker, ep, std::move(state), peer_error_handling);
}

void close_forced(const Worker& worker, ucp_ep_h ep) {
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &params);
  if (request == nullptr || UCS_PTR_IS_ERR(request)) return;
  while (ucp_request_check_status(request) == UCS_INPROGRESS) worker.progress();
  ucp_request_free(request);
}

Endpoint::~Endpoint() {
  // Forced: every operation of ours completed (or was cancelled) before it returned. Without
  // peer error handling UCX refuses a forced close; the worker's destruction reclaims the
  // endpoint instead.
  if (handle_ && peer_error_handling_) close_forced(*worker_, handle_);
}

Result<RemoteKey> RemoteKey::unpack(const Endpoint& endpoint, const Bytes& packed) {
  if (packed.empty()) return make_error("rkey unpack: empty rkey");
  ucp_rkey_h rkey = nullptr;
  if (ucs_status_t st = ucp_ep_rkey_unpack(endpoint.get(), packed.data(), &rkey); st != UCS_OK)
    return status_error("ucp_ep_rkey_unpack", st);
  return RemoteKey(rkey);
}

namespace {

Status flush(const Worker& worker, const Endpoint& ep, Clock::time_point deadline) {
  ucp_request_param_t params{};
  return worker.wait(ucp_ep_flush_nbx(ep.get(), &params), deadline, "ucp_ep_flush_nbx");
}

}  // namespace

Status put(const Worker& worker, const Endpoint& ep, const void* local, std::size_t length,
           std::uint64_t remote_address, const RemoteKey& rkey, Clock::time_point deadline) {
  if (ep.failed()) return make_error("put: the endpoint has failed");
  ucp_request_param_t params{};
  if (Status s =
          worker.wait(ucp_put_nbx(ep.get(), local, length, remote_address, rkey.get(), &params),
                      deadline, "ucp_put_nbx");
      !s)
    return s;
  return flush(worker, ep, deadline);  // remote completion: the bytes are in the peer's memory
}

Status get(const Worker& worker, const Endpoint& ep, void* local, std::size_t length,
           std::uint64_t remote_address, const RemoteKey& rkey, Clock::time_point deadline) {
  if (ep.failed()) return make_error("get: the endpoint has failed");
  ucp_request_param_t params{};
  return worker.wait(ucp_get_nbx(ep.get(), local, length, remote_address, rkey.get(), &params),
                     deadline, "ucp_get_nbx");
}

}  // namespace kvnode::transfer::ucx
