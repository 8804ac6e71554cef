// FanOut against real ZMQ REP workers on 127.0.0.1: ordering, deadlines, late replies that must
// not be mistaken for later answers, worker restarts, concurrency, forget() and shutdown.
#include "kvnode/controller/fanout.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <thread>

#include "fake_worker.hpp"
#include "support/eventually.hpp"

namespace kvnode::controller {
namespace {

using namespace std::chrono_literals;
using testing::FakeWorker;
using testing::unused_endpoint;
using Clock = std::chrono::steady_clock;
using Results = std::vector<Result<std::string>>;

// Every wait in these tests is bounded by this; a hang fails the test instead of the suite.
constexpr auto kPatience = 10s;

Results get(std::future<Results>& future) {
  if (future.wait_for(kPatience) != std::future_status::ready) {
    ADD_FAILURE() << "fan-out call did not complete within " << kPatience.count() << " s";
    return {};
  }
  return future.get();
}

FanOutTarget target(const std::string& key, const std::string& endpoint, std::string payload) {
  return FanOutTarget{key, endpoint, std::move(payload)};
}

std::string text(const Result<std::string>& r) {
  return r.ok() ? "ok: " + r.value() : "error: " + r.error().message;
}

bool eventually(const std::function<bool()>& condition) {
  return test::eventually(condition, kPatience);
}

TEST(FanOut, ZeroTargetsCompleteAtOnce) {
  zmq::context_t ctx;
  FanOut fanout(ctx);
  auto future = fanout.call({}, 1000ms);
  ASSERT_EQ(future.wait_for(0s), std::future_status::ready);
  EXPECT_TRUE(future.get().empty());
}

TEST(FanOut, RepliesComeBackInTargetOrder) {
  zmq::context_t ctx;
  FakeWorker w0(ctx), w1(ctx), w2(ctx);
  FanOut fanout(ctx);
  // The slowest worker first, so arrival order differs from target order.
  FakeWorker slow(ctx, [](const std::string&) { return 100ms; });
  auto future = fanout.call({target("s", slow.endpoint(), "s"), target("a", w0.endpoint(), "a"),
                             target("b", w1.endpoint(), "b"), target("c", w2.endpoint(), "c")},
                            5000ms);
  const auto results = get(future);
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(text(results[0]), "ok: echo:s");
  EXPECT_EQ(text(results[1]), "ok: echo:a");
  EXPECT_EQ(text(results[2]), "ok: echo:b");
  EXPECT_EQ(text(results[3]), "ok: echo:c");
  const auto stats = fanout.stats();
  EXPECT_EQ(stats.requests, 4u);
  EXPECT_EQ(stats.timeouts, 0u);
  EXPECT_EQ(stats.open_sockets, 4u);
}

TEST(FanOut, HungWorkerFailsAtItsDeadlineOthersSucceed) {
  zmq::context_t ctx;
  FakeWorker good0(ctx), hung(ctx, FakeWorker::never_answer()), good1(ctx);
  FanOut fanout(ctx);
  const auto begin = Clock::now();
  auto future = fanout.call({target("g0", good0.endpoint(), "x"), target("h", hung.endpoint(), "y"),
                             target("g1", good1.endpoint(), "z")},
                            1000ms);
  const auto results = get(future);
  const auto elapsed = Clock::now() - begin;
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(text(results[0]), "ok: echo:x");
  EXPECT_EQ(text(results[1]), "error: no reply from " + hung.endpoint() + " within 1000 ms");
  ASSERT_FALSE(results[1].ok());
  EXPECT_EQ(results[1].error().code, ErrorCode::kDeadline);  // what the orchestrator branches on
  EXPECT_EQ(text(results[2]), "ok: echo:z");
  EXPECT_GE(elapsed, 990ms);
  EXPECT_LT(elapsed, 2000ms);
  EXPECT_EQ(fanout.stats().timeouts, 1u);
}

TEST(FanOut, EndlessDeadlineIsAccepted) {
  zmq::context_t ctx;
  FakeWorker worker(ctx);
  FanOut fanout(ctx);
  auto future =
      fanout.call({target("w", worker.endpoint(), "x")}, std::chrono::milliseconds::max());
  EXPECT_EQ(text(get(future).at(0)), "ok: echo:x");
}

TEST(FanOut, NothingListeningFailsAfterTheDeadline) {
  zmq::context_t ctx;
  const auto endpoint = unused_endpoint(ctx);
  FanOut fanout(ctx);
  const auto begin = Clock::now();
  auto future = fanout.call({target("gone", endpoint, "x")}, 200ms);
  const auto results = get(future);
  EXPECT_GE(Clock::now() - begin, 190ms);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(text(results[0]), "error: no reply from " + endpoint + " within 200 ms");
}

TEST(FanOut, BadEndpointFailsAtOnce) {
  zmq::context_t ctx;
  FakeWorker good(ctx);
  FanOut fanout(ctx);
  auto future = fanout.call(
      {target("bad", "nonsense://here", "x"), target("good", good.endpoint(), "y")}, 5000ms);
  const auto results = get(future);
  ASSERT_EQ(results.size(), 2u);
  ASSERT_FALSE(results[0].ok());
  EXPECT_NE(results[0].error().message.find("cannot connect to nonsense://here"), std::string::npos)
      << results[0].error().message;
  EXPECT_EQ(text(results[1]), "ok: echo:y");
}

// The core point: a late reply is told apart from the answer to the next request on the same
// socket (a REQ socket would be stuck, or would hand the stale reply to the next caller).
TEST(FanOut, LateReplyGoesToOnLateAndNextCallGetsItsOwnReply) {
  zmq::context_t ctx;
  FakeWorker fast(ctx);
  FakeWorker slow(ctx,
                  [](const std::string& payload) { return payload == "first" ? 1500ms : 0ms; });
  FanOut fanout(ctx);

  std::promise<std::pair<std::size_t, std::string>> late;
  auto late_future = late.get_future();
  auto first =
      fanout.call({target("f", fast.endpoint(), "hello"), target("s", slow.endpoint(), "first")},
                  1000ms, [&late](std::size_t index, std::string reply) {
                    late.set_value({index, std::move(reply)});
                  });
  const auto first_results = get(first);
  ASSERT_EQ(first_results.size(), 2u);
  EXPECT_EQ(text(first_results[0]), "ok: echo:hello");
  EXPECT_FALSE(first_results[1].ok());

  // Sent while the worker still works on "first": its reply arrives before this one's.
  auto second = fanout.call({target("s", slow.endpoint(), "second")}, 5000ms);
  const auto second_results = get(second);
  ASSERT_EQ(second_results.size(), 1u);
  EXPECT_EQ(text(second_results[0]), "ok: echo:second");

  ASSERT_EQ(late_future.wait_for(kPatience), std::future_status::ready);
  const auto [index, reply] = late_future.get();
  EXPECT_EQ(index, 1u);
  EXPECT_EQ(reply, "echo:first");
  EXPECT_EQ(fanout.stats().late_replies, 1u);
  EXPECT_EQ(fanout.stats().timeouts, 1u);
}

TEST(FanOut, TimedOutRequestsBeyondTheMemoryBoundAreNotRecognised) {
  zmq::context_t ctx;
  FakeWorker slow(ctx, [](const std::string&) { return 500ms; });
  FanOut fanout(ctx, FanOutOptions{.late_reply_window = 60s, .max_late_pending = 0});
  std::atomic<int> late_calls{0};
  auto future = fanout.call({target("s", slow.endpoint(), "x")}, 100ms,
                            [&late_calls](std::size_t, const std::string&) { ++late_calls; });
  EXPECT_FALSE(get(future).at(0).ok());
  EXPECT_TRUE(eventually([&] { return fanout.stats().dropped_replies == 1; }));
  EXPECT_EQ(late_calls, 0);
  EXPECT_EQ(fanout.stats().late_replies, 0u);
}

TEST(FanOut, WorkerThatRestartsAtTheSameEndpointIsReachedAgain) {
  zmq::context_t ctx;
  FanOut fanout(ctx);
  auto worker = std::make_unique<FakeWorker>(ctx);
  const auto endpoint = worker->endpoint();

  auto before = fanout.call({target("w", endpoint, "before")}, 5000ms);
  EXPECT_EQ(text(get(before).at(0)), "ok: echo:before");

  worker.reset();
  auto down = fanout.call({target("w", endpoint, "down")}, 200ms);
  EXPECT_FALSE(get(down).at(0).ok());

  worker = std::make_unique<FakeWorker>(ctx, FakeWorker::answer_now(), endpoint);
  auto after = fanout.call({target("w", endpoint, "after")}, 5000ms);
  EXPECT_EQ(text(get(after).at(0)), "ok: echo:after");
  EXPECT_EQ(fanout.stats().open_sockets, 1u);  // the same DEALER reconnected
}

TEST(FanOut, ConcurrentCallersEachGetTheirOwnReplies) {
  zmq::context_t ctx;
  FakeWorker w0(ctx), w1(ctx), w2(ctx);
  const std::vector<const FakeWorker*> workers{&w0, &w1, &w2};
  FanOut fanout(ctx);
  constexpr int kThreads = 4;
  constexpr int kCallsEach = 25;
  std::atomic<int> wrong{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < kThreads; ++t) {
    callers.emplace_back([&, t] {
      for (int c = 0; c < kCallsEach; ++c) {
        std::vector<FanOutTarget> targets;
        for (std::size_t w = 0; w < workers.size(); ++w) {
          targets.push_back(
              target("w" + std::to_string(w), workers[w]->endpoint(),
                     std::to_string(t) + "/" + std::to_string(c) + "/" + std::to_string(w)));
        }
        auto future = fanout.call(targets, 5000ms);
        if (future.wait_for(kPatience) != std::future_status::ready) {
          ++wrong;
          continue;
        }
        const auto results = future.get();
        for (std::size_t w = 0; w < targets.size(); ++w) {
          if (text(results.at(w)) != "ok: echo:" + targets[w].payload) ++wrong;
        }
      }
    });
  }
  for (auto& caller : callers) caller.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(fanout.stats().requests, std::uint64_t{kThreads} * kCallsEach * workers.size());
  EXPECT_EQ(fanout.stats().open_sockets, 3u);
}

TEST(FanOut, ForgetClosesTheSocketAndTheNextCallOpensANewOne) {
  zmq::context_t ctx;
  FakeWorker worker(ctx);
  FanOut fanout(ctx);
  auto first = fanout.call({target("w#1", worker.endpoint(), "one")}, 5000ms);
  EXPECT_EQ(text(get(first).at(0)), "ok: echo:one");
  EXPECT_EQ(fanout.stats().open_sockets, 1u);

  fanout.forget("w#1");
  EXPECT_TRUE(eventually([&] { return fanout.stats().open_sockets == 0; }));

  auto second = fanout.call({target("w#1", worker.endpoint(), "two")}, 5000ms);
  EXPECT_EQ(text(get(second).at(0)), "ok: echo:two");
  EXPECT_EQ(fanout.stats().open_sockets, 1u);
}

TEST(FanOut, ForgetFailsRequestsInFlightAtOnce) {
  zmq::context_t ctx;
  FakeWorker hung(ctx, FakeWorker::never_answer());
  FanOut fanout(ctx);
  auto future = fanout.call({target("h", hung.endpoint(), "x")}, 60000ms);
  fanout.forget("h");
  const auto results = get(future);
  ASSERT_FALSE(results.at(0).ok());
  EXPECT_EQ(results[0].error().message, "worker h was forgotten before it replied");
}

TEST(FanOut, FullSendQueueFailsAtOnce) {
  zmq::context_t ctx;
  const auto endpoint = unused_endpoint(ctx);
  FanOut fanout(ctx);
  // Requests to a worker that is not up queue in the DEALER until the queue is full.
  std::vector<FanOutTarget> targets(1000, target("gone", endpoint, "x"));
  auto future = fanout.call(targets, 200ms);
  const auto results = get(future);
  ASSERT_EQ(results.size(), targets.size());
  EXPECT_EQ(text(results.front()), "error: no reply from " + endpoint + " within 200 ms");
  ASSERT_FALSE(results.back().ok());
  EXPECT_NE(results.back().error().message.find("send queue to " + endpoint + " is full"),
            std::string::npos)
      << results.back().error().message;
}

TEST(FanOut, StrayAndMalformedRepliesAreDropped) {
  zmq::context_t ctx;
  // A misbehaving worker: a ROUTER that sends garbage before the proper reply.
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind("tcp://127.0.0.1:*");
  const auto endpoint = router.get(zmq::sockopt::last_endpoint);
  std::thread worker([&router] {
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(kPatience)) == 0) return;
    std::array<zmq::message_t, 4> request;  // [peer, id, "", payload]
    for (auto& frame : request) (void)router.recv(frame);
    const std::uint64_t stranger = ~std::uint64_t{0};
    const auto more = zmq::send_flags::sndmore;
    (void)router.send(zmq::buffer(request[0].to_string()), more);  // unknown id
    (void)router.send(zmq::const_buffer(&stranger, sizeof stranger), more);
    (void)router.send(zmq::str_buffer(""), more);
    (void)router.send(zmq::str_buffer("bogus"));
    (void)router.send(zmq::buffer(request[0].to_string()), more);  // no delimiter
    (void)router.send(zmq::str_buffer("short"));
    (void)router.send(zmq::buffer(request[0].to_string()), more);  // the real reply
    (void)router.send(zmq::buffer(request[1].to_string()), more);
    (void)router.send(zmq::str_buffer(""), more);
    (void)router.send(zmq::buffer("echo:" + request[3].to_string()));
  });
  FanOut fanout(ctx);
  auto future = fanout.call({target("r", endpoint, "x")}, 5000ms);
  const auto results = get(future);
  worker.join();
  EXPECT_EQ(text(results.at(0)), "ok: echo:x");
  EXPECT_EQ(fanout.stats().dropped_replies, 2u);  // both came before the real reply
}

// A reply over max_reply_bytes ends its connection unread, and ZMQ never reconnects a socket after
// a protocol error: that request fails at its deadline, and the next call, rather than finding a
// "full" queue, gets a new socket and is served.
TEST(FanOut, AReplyOverTheSizeCapFailsAtTheDeadlineAndTheNextCallIsServed) {
  zmq::context_t ctx;
  FakeWorker worker(ctx);
  FanOutOptions options;
  options.max_reply_bytes = 1024;
  FanOut fanout(ctx, options);
  auto big = fanout.call({target("w", worker.endpoint(), std::string(2000, 'x'))}, 500ms);
  EXPECT_EQ(text(get(big).at(0)), "error: no reply from " + worker.endpoint() + " within 500 ms");
  auto small = fanout.call({target("w", worker.endpoint(), std::string(1000, 'y'))}, 5000ms);
  EXPECT_EQ(text(get(small).at(0)), "ok: echo:" + std::string(1000, 'y'));
  EXPECT_TRUE(eventually([&] { return worker.answered() == 2; }));  // counted after its send
  EXPECT_EQ(fanout.stats().open_sockets, 1u);
}

// A worker whose queue filled while it was down, once no call waits for those requests any more,
// gets a new socket: when it comes back it runs the new request, not 256 stale ones.
TEST(FanOut, AFullQueueOfTimedOutRequestsIsReplacedAndNeverDelivered) {
  zmq::context_t ctx;
  const auto endpoint = unused_endpoint(ctx);
  FanOut fanout(ctx);
  auto stale = fanout.call(std::vector<FanOutTarget>(300, target("w", endpoint, "stale")), 200ms);
  const auto stale_results = get(stale);
  ASSERT_EQ(stale_results.size(), 300u);
  EXPECT_NE(text(stale_results.back()).find("is full"), std::string::npos);
  // Sent while the worker is still down, so the old socket is closed before it could connect.
  auto fresh = fanout.call({target("w", endpoint, "fresh")}, 5000ms);
  std::this_thread::sleep_for(50ms);
  FakeWorker worker(ctx, FakeWorker::answer_now(), endpoint);
  EXPECT_EQ(text(get(fresh).at(0)), "ok: echo:fresh");
  std::this_thread::sleep_for(200ms);  // stale requests, were any delivered, would be answered now
  EXPECT_EQ(worker.answered(), 1);
  EXPECT_EQ(fanout.stats().open_sockets, 1u);
}

// A misbehaving worker for the protocol-error tests: a ROUTER, driven step by step from one thread.
class RouterWorker {
 public:
  struct Request {
    std::string peer, id, payload;
  };
  explicit RouterWorker(zmq::context_t& ctx) : socket_(ctx, zmq::socket_type::router) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind("tcp://127.0.0.1:*");
    endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
  }
  const std::string& endpoint() const { return endpoint_; }

  std::optional<Request> take(std::chrono::milliseconds wait = kPatience) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, wait) == 0) return std::nullopt;
    std::array<zmq::message_t, 4> frames;  // [peer, id, "", payload]
    for (auto& frame : frames) (void)socket_.recv(frame);
    return Request{frames[0].to_string(), frames[1].to_string(), frames[3].to_string()};
  }
  void echo(const Request& r) {
    const auto more = zmq::send_flags::sndmore;
    (void)socket_.send(zmq::buffer(r.peer), more);
    (void)socket_.send(zmq::buffer(r.id), more);
    (void)socket_.send(zmq::str_buffer(""), more);
    (void)socket_.send(zmq::buffer("echo:" + r.payload));
  }
  void send_oversized(const std::string& peer, std::size_t bytes) {
    (void)socket_.send(zmq::buffer(peer), zmq::send_flags::sndmore);
    (void)socket_.send(zmq::buffer(std::string(bytes, 'x')));
  }
  void echo_until(const std::atomic<bool>& stop) {
    while (!stop) {
      if (auto r = take(20ms)) echo(*r);
    }
  }

 private:
  zmq::socket_t socket_;
  std::string endpoint_;
};

// Calls the worker until one is answered; a request that went into a dying connection is lost
// and waits for its deadline, so one call alone would race the connection's end.
bool served_within(FanOut& fanout, const std::string& endpoint, std::chrono::milliseconds bound) {
  const auto give_up = Clock::now() + bound;
  while (Clock::now() < give_up) {
    auto next = fanout.call({target("w", endpoint, "next")}, 300ms);
    if (text(get(next).at(0)) == "ok: echo:next") return true;
  }
  return false;
}

// A worker that sits on more than half a queue of requests and then breaks the protocol: ZMQ ends
// that connection for good, and the requests it held never come back. Once they have timed out,
// the next call gets a new socket instead of a "full" queue forever.
TEST(FanOut, AProtocolErrorWithManyRequestsUnansweredDoesNotWedgeTheWorker) {
  zmq::context_t ctx;
  RouterWorker router(ctx);
  constexpr int kHeld = 200;
  std::promise<void> timed_out;
  std::atomic<bool> stop{false};
  std::thread worker([&] {
    std::string peer;
    for (int i = 0; i < kHeld; ++i) {
      if (auto r = router.take()) peer = r->peer;
    }
    timed_out.get_future().wait();
    router.send_oversized(peer, 2048);
    router.echo_until(stop);
  });
  FanOutOptions options;
  options.max_reply_bytes = 1024;
  FanOut fanout(ctx, options);
  auto held =
      fanout.call(std::vector<FanOutTarget>(kHeld, target("w", router.endpoint(), "held")), 300ms);
  EXPECT_EQ(get(held).size(), static_cast<std::size_t>(kHeld));
  timed_out.set_value();
  EXPECT_TRUE(served_within(fanout, router.endpoint(), 5s));
  stop = true;
  worker.join();
}

// Requests whose replies came too late to be remembered still count as read, so a protocol error
// afterwards is recognised at once: the request in flight fails with it, well before its deadline,
// and the worker is served again (counting replies, as first written, saw a full queue instead).
TEST(FanOut, RequestsAnsweredTooLateStillCountAsRead) {
  zmq::context_t ctx;
  RouterWorker router(ctx);
  constexpr int kLate = 200;
  std::promise<void> timed_out;
  std::promise<void> answered;
  std::atomic<bool> stop{false};
  std::thread worker([&] {
    std::vector<RouterWorker::Request> held;
    for (int i = 0; i < kLate; ++i) {
      if (auto r = router.take()) held.push_back(*r);
    }
    timed_out.get_future().wait();
    for (const auto& r : held) router.echo(r);
    answered.get_future().wait();
    if (auto r = router.take()) router.send_oversized(r->peer, 2048);  // the long call's request
    router.echo_until(stop);
  });
  FanOutOptions options;
  options.max_reply_bytes = 1024;
  options.max_late_pending = 0;  // late replies are not recognised, only dropped
  FanOut fanout(ctx, options);
  const auto endpoint = router.endpoint();
  auto late = fanout.call(std::vector<FanOutTarget>(kLate, target("w", endpoint, "late")), 300ms);
  EXPECT_EQ(get(late).size(), static_cast<std::size_t>(kLate));
  timed_out.set_value();
  EXPECT_TRUE(eventually([&] { return fanout.stats().dropped_replies == kLate; }));
  answered.set_value();
  auto long_call = fanout.call({target("w", endpoint, "long")}, 60s);
  EXPECT_TRUE(served_within(fanout, endpoint, 5s));
  const bool failed_early = long_call.wait_for(0s) == std::future_status::ready;
  stop = true;
  worker.join();
  ASSERT_TRUE(failed_early);
  const auto result = long_call.get().at(0);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error().message.find("protocol error"), std::string::npos)
      << result.error().message;
}

// Request ids are sequential, so any "worker" can guess another's. A reply counts, late or not,
// only on the socket its request left by.
TEST(FanOut, ALateReplyIsTakenOnlyFromTheWorkerItWasSentTo) {
  zmq::context_t ctx;
  FakeWorker hung(ctx, FakeWorker::never_answer());
  RouterWorker router(ctx);
  const auto endpoint = router.endpoint();
  std::thread rogue([&router] {
    const auto request = router.take();
    if (!request) return;
    std::uint64_t id = 0;
    std::memcpy(&id, request->id.data(), sizeof id);
    const std::uint64_t guessed = id - 1;  // the hung worker's request
    router.echo({request->peer,
                 std::string(reinterpret_cast<const char*>(&guessed), sizeof guessed), "forged"});
    router.echo(*request);
  });
  FanOut fanout(ctx);
  std::atomic<int> late_calls{0};
  auto first = fanout.call({target("h", hung.endpoint(), "x")}, 100ms,
                           [&late_calls](std::size_t, const std::string&) { ++late_calls; });
  EXPECT_FALSE(get(first).at(0).ok());
  auto second = fanout.call({target("r", endpoint, "y")}, 5000ms);
  EXPECT_EQ(text(get(second).at(0)), "ok: echo:y");
  rogue.join();
  EXPECT_EQ(late_calls, 0);
  EXPECT_EQ(fanout.stats().late_replies, 0u);
  EXPECT_EQ(fanout.stats().dropped_replies, 1u);
}

TEST(FanOut, DestructorCompletesPendingCallsAtOnce) {
  zmq::context_t ctx;
  FakeWorker hung(ctx, FakeWorker::never_answer());
  auto fanout = std::make_unique<FanOut>(ctx);
  auto future = fanout->call({target("h", hung.endpoint(), "x")}, 60000ms);
  std::this_thread::sleep_for(50ms);  // let the request leave
  const auto begin = Clock::now();
  fanout.reset();
  EXPECT_LT(Clock::now() - begin, 1000ms);
  ASSERT_EQ(future.wait_for(0s), std::future_status::ready);
  const auto results = future.get();
  ASSERT_FALSE(results.at(0).ok());
  EXPECT_EQ(results[0].error().message, "controller shutting down");
}

}  // namespace
}  // namespace kvnode::controller
