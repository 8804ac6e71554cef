// The worker agent's move executor: runs the control requests that take long (a MoveWorkerMsg
// takes seconds to minutes) on a thread of its own, one at a time in arrival order, so that the
// ROUTER thread keeps answering health, clear and pin meanwhile. It never touches a socket (ZeroMQ
// sockets are single-threaded): a finished reply waits in an outbox under its ticket, and an
// eventfd that the ROUTER thread polls next to its socket says one is there.
//
// Every request taken gets a reply, whatever its handler does: one that throws (a std::exception
// or anything else) is answered with an ErrorMsg, and a job's place in the outbox is allocated
// when it is submitted, so posting a reply cannot fail (not even out of memory).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "kvnode/common/result.hpp"
#include "kvnode/common/unique_fd.hpp"
#include "kvnode/wire/messages.hpp"

namespace kvnode::agent {

// The texts of the ErrorMsgs the worker port writes itself. LMCache's worker answers a failure
// with "Worker error: <why>"; callers branch on the message type, these are for people (and for
// tests, which compare against the names rather than copies of the text).
inline constexpr std::string_view kWorkerErrorPrefix = "Worker error: ";
// A move refused because max_queued_moves already wait; busy_text() adds the counts.
inline constexpr std::string_view kBusyPrefix = "Worker error: busy with ";
// A move still queued when the agent stops: it never started.
inline constexpr std::string_view kStoppingText =
    "Worker error: the node is stopping; the move did not start";
// A handler threw something that is not a std::exception (a std::exception gives its what()).
inline constexpr std::string_view kUnknownExceptionText =
    "Worker error: the handler failed with an exception that is not a std::exception";

// "Worker error: busy with 2 moves (1 running, 1 queued); ask again when one finishes".
std::string busy_text(std::size_t running, std::size_t queued);

// Runs one control request to its reply. May throw.
using ControlHandler = std::function<wire::Msg(const wire::Msg& request)>;

// handler(request), or an ErrorMsg saying why there is no reply: the handler is unset or threw
// (anything at all). Never throws: when even the error's text cannot be allocated, the ErrorMsg
// has none (an empty string allocates nothing), which still says the request failed.
wire::Msg reply_or_error(const ControlHandler& handler, const wire::Msg& request) noexcept;

class MoveExecutor {
 public:
  // Runs one request to its reply. May throw: the request is then answered with an ErrorMsg.
  using Handler = ControlHandler;
  struct Job {
    std::uint64_t ticket = 0;
    wire::Msg request{};
    wire::Msg reply{};  // set once the handler has returned (or thrown)
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
  // executor is stopping; the caller then answers it itself. Throws only std::bad_alloc, and then
  // nothing was queued.
  bool submit(std::uint64_t ticket, wire::Msg request);
  // Readable while a finished reply waits: poll it, then take_finished().
  int wake_fd() const { return wake_.fd(); }
  // The jobs finished since the last call, in the order they finished, each with its reply.
  std::list<Job> take_finished();
  Load load() const;
  // Takes no more requests, waits for the running one's handler to return (its reply stays for
  // take_finished()), and hands back the jobs that never started (without a reply).
  std::list<Job> stop();

 private:
  MoveExecutor(std::size_t max_queued, Handler handler, EventFd wake);
  void run();

  const std::size_t max_queued_;
  const Handler handler_;
  EventFd wake_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  // Jobs move between these by splicing (no allocation): queue_ -> the run thread -> outbox_.
  std::list<Job> queue_;     // under mutex_
  std::list<Job> outbox_;    // under mutex_
  std::size_t running_ = 0;  // under mutex_
  bool stopping_ = false;    // under mutex_
  std::thread thread_;       // last: starts once everything above exists
};

}  // namespace kvnode::agent
