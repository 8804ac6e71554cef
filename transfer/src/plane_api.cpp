// TransferPlane's public face: the names of its enums, start(), and the calls that hand work to
// the progress thread (plane.cpp) through TransferPlane::Impl (plane_impl.hpp).
#include "plane_impl.hpp"

namespace kvnode::transfer {

const char* to_string(Protocol p) {
  switch (p) {
    case Protocol::kAuto:
      return "auto";
    case Protocol::kRma:
      return "rma";
    case Protocol::kActiveMessage:
      return "am";
  }
  return "?";
}

Result<Protocol> parse_protocol(const std::string& text) {
  if (text == "auto") return Protocol::kAuto;
  if (text == "rma") return Protocol::kRma;
  if (text == "am") return Protocol::kActiveMessage;
  return make_error("protocol '" + text + "': expected auto, rma or am");
}

const char* to_string(Failure f) {
  switch (f) {
    case Failure::kNone:
      return "ok";
    case Failure::kInvalid:
      return "invalid";
    case Failure::kConnect:
      return "connect";
    case Failure::kRejected:
      return "rejected";
    case Failure::kPeerLost:
      return "peer_lost";
    case Failure::kTimeout:
      return "timeout";
    case Failure::kCancelled:
      return "cancelled";
    case Failure::kReset:
      return "reset";
  }
  return "?";
}

Result<SameHost> parse_same_host(const std::string& text) {
  if (text == "auto") return SameHost::kAuto;
  if (text == "off") return SameHost::kOff;
  return make_error(ErrorCode::kInvalid, "same-host '" + text + "': expected auto or off");
}

const char* to_string(SameHost s) {
  return s == SameHost::kAuto ? "auto" : "off";
}

// ---- TransferPlane ----------------------------------------------------------------------------

std::string TransferPlane::same_host_status() const {
  return impl_->same_host_status();
}

PoolPathChoice TransferPlane::pool_path() const {
  return impl_->pool_path();
}

std::uint64_t TransferPlane::ucx_memory_types() const {
  return impl_->ucx_memory_types();
}

Result<std::unique_ptr<TransferPlane>> TransferPlane::start(const PlaneOptions& options,
                                                            const gpu::ChunkPool& pool) {
  auto impl = std::make_unique<Impl>(options, pool);
  if (Status s = impl->init(); !s) return wrap_error("transfer plane: ", s.error());
  return std::unique_ptr<TransferPlane>(new TransferPlane(std::move(impl)));
}

TransferPlane::TransferPlane(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TransferPlane::~TransferPlane() = default;

std::string TransferPlane::url() const {
  return impl_->url();
}

TransferId TransferPlane::pull(const std::string& peer, std::vector<PageCopy> pages, Callback done,
                               TransferOptions options) {
  return impl_->submit(true, peer, std::move(pages), std::move(done), options);
}

TransferId TransferPlane::push(const std::string& peer, std::vector<PageCopy> pages, Callback done,
                               TransferOptions options) {
  return impl_->submit(false, peer, std::move(pages), std::move(done), options);
}

namespace {

std::future<TransferResult> as_future(const std::function<void(TransferPlane::Callback)>& submit) {
  auto promise = std::make_shared<std::promise<TransferResult>>();
  std::future<TransferResult> future = promise->get_future();
  submit([promise](TransferResult r) { promise->set_value(std::move(r)); });
  return future;
}

}  // namespace

std::future<TransferResult> TransferPlane::pull(const std::string& peer,
                                                std::vector<PageCopy> pages,
                                                TransferOptions options) {
  return as_future([&](Callback cb) { pull(peer, std::move(pages), std::move(cb), options); });
}

std::future<TransferResult> TransferPlane::push(const std::string& peer,
                                                std::vector<PageCopy> pages,
                                                TransferOptions options) {
  return as_future([&](Callback cb) { push(peer, std::move(pages), std::move(cb), options); });
}

void TransferPlane::cancel(TransferId id) {
  impl_->cancel(id);
}

std::future<Result<std::vector<std::byte>>> TransferPlane::ask(const std::string& peer,
                                                               std::vector<std::byte> request,
                                                               TransferOptions options) {
  auto promise = std::make_shared<std::promise<Result<std::vector<std::byte>>>>();
  auto future = promise->get_future();
  if (request.size() > am::kMaxAskBytes) {
    promise->set_value(make_error(ErrorCode::kInvalid, "an ask carries at most 8 KiB"));
    return future;
  }
  PendingAsk a;
  a.id = impl_->next_ask_id();
  a.body = std::move(request);
  a.deadline = Clock::now() + options.deadline.value_or(impl_->default_deadline());
  a.done = [promise](Result<std::vector<std::byte>> r) { promise->set_value(std::move(r)); };
  impl_->submit_ask(peer, std::move(a));
  return future;
}

PlaneCounters TransferPlane::counters() const {
  return impl_->counters();
}

}  // namespace kvnode::transfer
