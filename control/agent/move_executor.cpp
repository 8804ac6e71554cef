#include "move_executor.hpp"

#include <exception>
#include <type_traits>
#include <utility>

namespace kvnode::agent {

// Storing a reply into its job must not throw after the handler has run.
static_assert(std::is_nothrow_move_assignable_v<wire::Msg>);

std::string busy_text(std::size_t running, std::size_t queued) {
  return std::string(kBusyPrefix) + std::to_string(running + queued) + " moves (" +
         std::to_string(running) + " running, " + std::to_string(queued) +
         " queued); ask again when one finishes";
}

wire::Msg reply_or_error(const ControlHandler& handler, const wire::Msg& request) noexcept {
  try {
    if (!handler) {
      return wire::ErrorMsg{std::string(kWorkerErrorPrefix) +
                            "this worker serves no control requests"};
    }
    try {
      return handler(request);
    } catch (const std::exception& e) {
      return wire::ErrorMsg{std::string(kWorkerErrorPrefix) + e.what()};
    } catch (...) {
      return wire::ErrorMsg{std::string(kUnknownExceptionText)};
    }
  } catch (...) {  // building the error's text ran out of memory
    return wire::ErrorMsg{};
  }
}

Result<std::unique_ptr<MoveExecutor>> MoveExecutor::start(std::size_t max_queued, Handler handler) {
  Result<EventFd> wake = EventFd::create();
  if (!wake) return wrap_error("worker agent: move executor: ", wake.error());
  return std::unique_ptr<MoveExecutor>(
      new MoveExecutor(max_queued, std::move(handler), std::move(*wake)));
}

MoveExecutor::MoveExecutor(std::size_t max_queued, Handler handler, EventFd wake)
    : max_queued_(max_queued), handler_(std::move(handler)), wake_(std::move(wake)) {
  thread_ = std::thread([this] { run(); });
}

MoveExecutor::~MoveExecutor() {
  stop();
}

bool MoveExecutor::submit(std::uint64_t ticket, wire::Msg request) {
  std::list<Job> job;  // allocated outside the lock; a bad_alloc leaves nothing half-queued
  job.push_back(Job{ticket, std::move(request), {}});
  {
    std::lock_guard lock(mutex_);
    // One running plus max_queued waiting; one taken but not yet started still counts as queued.
    if (stopping_ || running_ + queue_.size() > max_queued_) return false;
    queue_.splice(queue_.end(), job);
  }
  cv_.notify_one();
  return true;
}

std::list<MoveExecutor::Job> MoveExecutor::take_finished() {
  wake_.drain();  // before taking: a reply that lands after this read signals again
  std::lock_guard lock(mutex_);
  return std::exchange(outbox_, {});
}

MoveExecutor::Load MoveExecutor::load() const {
  std::lock_guard lock(mutex_);
  return Load{running_, queue_.size()};
}

std::list<MoveExecutor::Job> MoveExecutor::stop() {
  std::list<Job> never_started;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    never_started.swap(queue_);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  return never_started;
}

void MoveExecutor::run() {
  for (;;) {
    std::list<Job> job;  // the running one, spliced out of queue_ and into outbox_ when done
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job.splice(job.end(), queue_, queue_.begin());
      running_ = 1;
    }
    job.front().reply = reply_or_error(handler_, job.front().request);
    {
      std::lock_guard lock(mutex_);
      outbox_.splice(outbox_.end(), job);
      running_ = 0;
    }
    wake_.signal();
  }
}

}  // namespace kvnode::agent
