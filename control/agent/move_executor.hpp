// The worker agent's move executor: runs the control requests that take long (a MoveWorkerMsg
// takes seconds to minutes) on a thread of its own, one at a time in arrival order, so that the
// ROUTER thread keeps answering health, clear and pin meanwhile. It never touches a socket (ZeroMQ
// sockets are single-threaded): a finished reply waits in an outbox under its ticket, and an
// eventfd that the ROUTER thread polls next to its socket says one is there.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kvnode/common/result.hpp"
#include "kvnode/common/unique_fd.hpp"
#include "kvnode/wire/messages.hpp"

namespace kvnode::agent {

class MoveExecutor {
 public:
  // Runs one request to its reply; must not throw (the agent's handler wrapper catches).
  using Handler = std::function<wire::Msg(const wire::Msg& request)>;
  struct Finished {
    std::uint64_t ticket = 0;
    wire::Msg reply{};
  };
  struct Load {
    std::size_t running = 0;  // 0 or 1
    std::size_t queued = 0;
  };

  // `max_queued`: requests that may wait behind the running one.
  static Result<std::unique_ptr<MoveExecutor>> start(std::size_t max_queued, Handler handler);
  ~MoveExecutor();  // stop()
  MoveExecutor(const MoveExecutor&) = delete;
  MoveExecutor& operator=(const MoveExecutor&) = delete;

  // Queues `request` under `ticket`, or refuses it (false) when max_queued already wait or the
  // executor is stopping; the caller then answers it itself.
  bool submit(std::uint64_t ticket, wire::Msg request);
  // Readable while a finished reply waits: poll it, then take_finished().
  int wake_fd() const { return wake_.fd(); }
  // The replies finished since the last call, in the order they finished.
  std::vector<Finished> take_finished();
  Load load() const;
  // Takes no more requests, waits for the running one's handler to return (its reply stays for
  // take_finished()), and hands back the tickets of those that never started.
  std::vector<std::uint64_t> stop();

 private:
  struct Job {
    std::uint64_t ticket = 0;
    wire::Msg request{};
  };
  MoveExecutor(std::size_t max_queued, Handler handler, EventFd wake);
  void run();

  const std::size_t max_queued_;
  const Handler handler_;
  EventFd wake_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;         // under mutex_
  std::vector<Finished> outbox_;  // under mutex_
  std::size_t running_ = 0;       // under mutex_
  bool stopping_ = false;         // under mutex_
  std::thread thread_;            // last: starts once everything above exists
};

}  // namespace kvnode::agent
