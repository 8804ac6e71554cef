#include "move_executor.hpp"

#include <utility>

namespace kvnode::agent {

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
  {
    std::lock_guard lock(mutex_);
    // One running plus max_queued waiting; one taken but not yet started still counts as queued.
    if (stopping_ || running_ + queue_.size() > max_queued_) return false;
    queue_.push_back(Job{ticket, std::move(request)});
  }
  cv_.notify_one();
  return true;
}

std::vector<MoveExecutor::Finished> MoveExecutor::take_finished() {
  wake_.drain();  // before taking: a reply that lands after this read signals again
  std::lock_guard lock(mutex_);
  return std::exchange(outbox_, {});
}

MoveExecutor::Load MoveExecutor::load() const {
  std::lock_guard lock(mutex_);
  return Load{running_, queue_.size()};
}

std::vector<std::uint64_t> MoveExecutor::stop() {
  std::deque<Job> never_started;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    never_started.swap(queue_);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::vector<std::uint64_t> tickets;
  for (const Job& job : never_started) tickets.push_back(job.ticket);
  return tickets;
}

void MoveExecutor::run() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      running_ = 1;
    }
    wire::Msg reply = handler_(job.request);
    {
      std::lock_guard lock(mutex_);
      outbox_.push_back(Finished{job.ticket, std::move(reply)});
      running_ = 0;
    }
    wake_.signal();
  }
}

}  // namespace kvnode::agent
