#include "kvnode/transfer/listener.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

namespace kvnode::transfer {
namespace {

using Clock = std::chrono::steady_clock;
constexpr unsigned kHelloId = kHelloAmId;
constexpr unsigned kWelcomeId = kWelcomeAmId;
constexpr auto kShutdownGrace = std::chrono::seconds(1);
constexpr std::size_t kMaxHello = 64 << 10;  // a descriptor is a few hundred bytes

Result<sockaddr_storage> resolve(const std::string& host, std::uint16_t port, socklen_t* len) {
  sockaddr_storage ss{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  const std::string h = host.empty() ? "0.0.0.0" : host;
  if (inet_pton(AF_INET, h.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    *len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, h.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    *len = sizeof(sockaddr_in6);
  } else {
    return make_error("'" + host + "' is not an IPv4 or IPv6 address");
  }
  return ss;
}

void ignore_errors(void*, ucp_ep_h, ucs_status_t) {}

}  // namespace

Result<std::unique_ptr<Listener>> Listener::bind(const ucx::Worker& worker, const std::string& host,
                                                 std::uint16_t port, ucx::Bytes descriptor) {
  ListenerHooks hooks;
  hooks.answer = [d = std::move(descriptor)](const ucx::Bytes&, ucp_ep_h) { return d; };
  return bind(worker, host, port, std::move(hooks));
}

Result<std::unique_ptr<Listener>> Listener::bind(const ucx::Worker& worker, const std::string& host,
                                                 std::uint16_t port, ListenerHooks hooks) {
  socklen_t len = 0;
  Result<sockaddr_storage> addr = resolve(host, port, &len);
  if (!addr) return make_error("listener: " + addr.error().message);
  std::unique_ptr<Listener> self(new Listener(worker, std::move(hooks)));
  if (Status s = worker.set_am_handler(kHelloId, &Listener::on_hello, self.get()); !s)
    return s.error();
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*addr);
  params.sockaddr.addrlen = len;
  params.conn_handler.cb = &Listener::on_connection;
  params.conn_handler.arg = self.get();
  if (ucs_status_t st = ucp_listener_create(worker.get(), &params, &self->listener_); st != UCS_OK)
    return make_error("cannot listen at " + host + ":" + std::to_string(port) + ": " +
                      ucs_status_string(st));
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if (ucs_status_t st = ucp_listener_query(self->listener_, &attr); st != UCS_OK)
    return ucx::status_error("ucp_listener_query", st);
  self->port_ = ntohs(attr.sockaddr.ss_family == AF_INET6
                          ? reinterpret_cast<const sockaddr_in6*>(&attr.sockaddr)->sin6_port
                          : reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
  return self;
}

Listener::~Listener() {
  // Answers still in flight get a moment, then are cancelled: a peer that went away must not
  // hold up shutdown.
  const auto until = Clock::now() + kShutdownGrace;
  for (const Send& send : sends_) {
    ucs_status_ptr_t request = send.request;
    bool cancelled = false;
    while (ucp_request_check_status(request) == UCS_INPROGRESS) {
      worker_.progress();
      if (!cancelled && Clock::now() > until) {
        ucp_request_cancel(worker_.get(), request);
        cancelled = true;
      }
    }
    ucp_request_free(request);
  }
  for (ucp_ep_h ep : accepted_) ucx::close_forced(worker_, ep);
  if (listener_) ucp_listener_destroy(listener_);
  (void)worker_.set_am_handler(kHelloId, nullptr, nullptr);
}

void Listener::on_connection(ucp_conn_request_h request, void* arg) {
  auto* self = static_cast<Listener*>(arg);
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.conn_request = request;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Listener::on_error;
  params.err_handler.arg = self;
  ucp_ep_h ep = nullptr;
  // On failure UCX 1.13 has already consumed the request (a client that left before we got to
  // it): rejecting it as well would touch freed memory, so there is nothing more to do.
  if (ucp_ep_create(self->worker_.get(), &params, &ep) == UCS_OK) self->accepted_.push_back(ep);
}

void Listener::on_error(void* arg, ucp_ep_h ep, ucs_status_t) {
  static_cast<Listener*>(arg)->lost_.push_back(ep);  // closed from progress(), not in here
}

ucs_status_t Listener::on_hello(void* arg, const void*, std::size_t, void* data, std::size_t length,
                                const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Listener*>(arg);
  // A hello too large to come eagerly is not a descriptor: no answer.
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep == nullptr ||
      (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || length > kMaxHello)
    return UCS_OK;
  Hello hello{param->reply_ep, ucx::Bytes(length)};
  if (length) std::memcpy(hello.body.data(), data, length);
  self->hellos_.push_back(std::move(hello));  // answered from progress(), not in here
  return UCS_OK;
}

void Listener::drop(ucp_ep_h control) {
  const auto it = std::find(accepted_.begin(), accepted_.end(), control);
  if (it == accepted_.end()) return;
  accepted_.erase(it);
  std::erase_if(hellos_, [&](const Hello& h) { return h.ep == control; });
  std::erase(lost_, control);
  ucx::close_forced(worker_, control);
}

unsigned Listener::progress() {
  unsigned n = worker_.progress();
  while (!lost_.empty()) {
    ucp_ep_h ep = lost_.front();
    lost_.pop_front();
    if (std::find(accepted_.begin(), accepted_.end(), ep) == accepted_.end()) continue;
    if (hooks_.lost) hooks_.lost(ep);
    drop(ep);
    ++n;
  }
  while (!hellos_.empty()) {
    Hello hello = std::move(hellos_.front());
    hellos_.pop_front();
    // The answer's bytes live with the send until UCX is done with them.
    auto answer = std::make_unique<ucx::Bytes>(hooks_.answer(hello.body, hello.ep));
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    params.flags = UCP_AM_SEND_FLAG_REPLY;
    ucs_status_ptr_t request =
        ucp_am_send_nbx(hello.ep, kWelcomeId, nullptr, 0, answer->data(), answer->size(), &params);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) sends_.push_back({request, std::move(answer)});
    ++handshakes_;
    ++n;
  }
  std::erase_if(sends_, [](const Send& send) {
    if (ucp_request_check_status(send.request) == UCS_INPROGRESS) return false;
    ucp_request_free(send.request);
    return true;
  });
  return n;
}

Result<Dialed> dial(const ucx::Worker& worker, const std::string& host, std::uint16_t port,
                    const ucx::Bytes& hello, ucp_err_handler_cb_t on_error, void* arg) {
  socklen_t len = 0;
  Result<sockaddr_storage> addr = resolve(host, port, &len);
  if (!addr) return make_error("dial " + host + ":" + std::to_string(port) + ": " + addr.error().message);
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*addr);
  params.sockaddr.addrlen = len;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = on_error;
  params.err_handler.arg = arg;
  Dialed out;
  if (ucs_status_t st = ucp_ep_create(worker.get(), &params, &out.ep); st != UCS_OK)
    return make_error("dial " + host + ":" + std::to_string(port) + ": " + ucs_status_string(st));
  ucp_request_param_t send{};
  send.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  send.flags = UCP_AM_SEND_FLAG_REPLY;
  out.send = ucp_am_send_nbx(out.ep, kHelloId, nullptr, 0, hello.data(), hello.size(), &send);
  if (UCS_PTR_IS_ERR(out.send)) {
    const ucs_status_t st = UCS_PTR_STATUS(out.send);
    ucx::close_forced(worker, out.ep);
    return ucx::status_error("ucp_am_send_nbx(hello)", st);
  }
  return out;
}

namespace {

struct Welcome {
  bool received = false;
  bool too_large = false;
  ucx::Bytes descriptor;
};

ucs_status_t on_welcome(void* arg, const void*, std::size_t, void* data, std::size_t length,
                        const ucp_am_recv_param_t* param) {
  auto* w = static_cast<Welcome*>(arg);
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    w->too_large = true;  // a descriptor is a few hundred bytes: eager, or not ours
  } else {
    w->descriptor.resize(length);
    if (length) std::memcpy(w->descriptor.data(), data, length);
  }
  w->received = true;
  return UCS_OK;
}

}  // namespace

Result<ucx::Bytes> handshake(const ucx::Worker& worker, const std::string& host, std::uint16_t port,
                             const ucx::Bytes& descriptor, Clock::time_point deadline) {
  socklen_t len = 0;
  Result<sockaddr_storage> addr = resolve(host, port, &len);
  if (!addr) return make_error("handshake: " + addr.error().message);
  Welcome welcome;
  if (Status s = worker.set_am_handler(kWelcomeId, &on_welcome, &welcome); !s) return s.error();
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&*addr);
  params.sockaddr.addrlen = len;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &ignore_errors;
  ucp_ep_h ep = nullptr;
  const std::string where = host + ":" + std::to_string(port);
  Result<ucx::Bytes> result = make_error("handshake with " + where + ": no answer before the deadline");
  if (ucs_status_t st = ucp_ep_create(worker.get(), &params, &ep); st != UCS_OK) {
    result = make_error("handshake with " + where + ": " + ucs_status_string(st));
  } else {
    ucp_request_param_t send{};
    send.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    send.flags = UCP_AM_SEND_FLAG_REPLY;
    const Status sent = worker.wait(
        ucp_am_send_nbx(ep, kHelloId, nullptr, 0, descriptor.data(), descriptor.size(), &send),
        deadline, "ucp_am_send_nbx(hello)");
    if (!sent) {
      result = make_error("handshake with " + where + ": " + sent.error().message);
    } else {
      while (!welcome.received && Clock::now() < deadline)
        for (int i = 0; i < 64 && !welcome.received; ++i) worker.progress();
      if (welcome.too_large)
        result = make_error("handshake with " + where + ": the answer came as a rendezvous");
      else if (welcome.received)
        result = std::move(welcome.descriptor);
    }
    ucx::close_forced(worker, ep);
  }
  (void)worker.set_am_handler(kWelcomeId, nullptr, nullptr);
  return result;
}

}  // namespace kvnode::transfer
