// The fan-out executor, the callers' side (fanout.hpp says why DEALERs and request ids). One
// thread owns every ZMQ socket, because ZMQ sockets are not thread-safe; call() and forget() hand
// it commands through a locked queue and wake it with an eventfd, which zmq::poll watches next to
// the DEALERs. An eventfd needs no socket shared between threads and no lock around a send,
// unlike an inproc pair. The executor is in fanout_executor.hpp and fanout_{requests,replies}.cpp.
#include "kvnode/controller/fanout.hpp"

#include <algorithm>
#include <stdexcept>
#include <thread>
#include <utility>

#include "fanout_executor.hpp"
#include "thread_name.hpp"

namespace kvnode::controller {
namespace fanout_detail {

void fail_call(CallCmd& cmd, const std::string& why) {
  Results results;
  results.reserve(cmd.targets.size());
  for (std::size_t i = 0; i < cmd.targets.size(); ++i) results.emplace_back(make_error(why));
  cmd.promise.set_value(std::move(results));
}

namespace {

// FanOut's constructor has no other way to fail: without a wake-up fd no command would ever run.
EventFd make_wake_fd() {
  Result<EventFd> fd = EventFd::create();
  if (!fd) throw std::runtime_error("fan-out: " + fd.error().message);
  return std::move(fd).value();
}

}  // namespace

Shared::Shared() : wake(make_wake_fd()) {}

}  // namespace fanout_detail

using fanout_detail::CallCmd;
using fanout_detail::Clock;
using fanout_detail::Executor;
using fanout_detail::fail_call;
using fanout_detail::ForgetCmd;
using fanout_detail::kLongestDeadline;
using fanout_detail::Results;
using fanout_detail::Shared;

struct FanOut::Impl {
  Impl(zmq::context_t& ctx, const FanOutOptions& options)
      : thread([this, &ctx, options] {
          name_this_thread("kvc/fanout");
          Executor(ctx, options, shared).run();
        }) {}

  ~Impl() {
    {
      std::lock_guard lock(shared.mutex);
      shared.stopping = true;
      if (shared.stop_reason.empty()) shared.stop_reason = "controller shutting down";
    }
    shared.wake.signal();
    thread.join();
  }

  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  Shared shared;
  std::thread thread;  // declared last: starts once `shared` exists
};

FanOut::FanOut(zmq::context_t& ctx, FanOutOptions options)
    : impl_(std::make_unique<Impl>(ctx, options)) {}

FanOut::~FanOut() = default;

std::future<Results> FanOut::call(std::vector<FanOutTarget> targets,
                                  std::chrono::milliseconds deadline, LateReplyFn on_late) {
  const auto wait = std::clamp(deadline, std::chrono::milliseconds{0}, kLongestDeadline);
  CallCmd cmd{std::move(targets), Clock::now() + wait, deadline, std::move(on_late), {}};
  auto future = cmd.promise.get_future();
  if (cmd.targets.empty()) {
    cmd.promise.set_value({});
    return future;
  }
  std::string refused;
  {
    std::lock_guard lock(impl_->shared.mutex);
    if (!impl_->shared.stopping) {
      impl_->shared.queue.emplace_back(std::move(cmd));
      impl_->shared.wake.signal();
      return future;
    }
    refused = impl_->shared.stop_reason;
  }
  fail_call(cmd, refused);
  return future;
}

void FanOut::forget(const std::string& worker_key) {
  std::lock_guard lock(impl_->shared.mutex);
  if (impl_->shared.stopping) return;
  impl_->shared.queue.emplace_back(ForgetCmd{worker_key});
}

FanOutStats FanOut::stats() const {
  const auto& s = impl_->shared;
  FanOutStats out;
  out.requests = s.requests.load(std::memory_order_relaxed);
  out.timeouts = s.timeouts.load(std::memory_order_relaxed);
  out.late_replies = s.late_replies.load(std::memory_order_relaxed);
  out.open_sockets = s.open_sockets.load(std::memory_order_relaxed);
  out.dropped_replies = s.dropped_replies.load(std::memory_order_relaxed);
  return out;
}

}  // namespace kvnode::controller
