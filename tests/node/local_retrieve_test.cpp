// The local socket's retrieve, which crosses the network (seconds) and so runs on the service's
// executor, never on the socket thread: other clients are answered meanwhile; a retrieve whose
// client left is not run, and an answer made for one that left is dropped (and counted); any
// exception a retrieve throws is an error answer, not the end of the process; and a service
// stopped while retrieves keep arriving ends cleanly. The node is a FakeNode (fake_transport.hpp):
// its store, engine and moves as the daemon assembles them, with no network below.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <stdexcept>
#include <thread>

#include "fake_transport.hpp"
#include "kvnode/client/local_protocol.hpp"
#include "local_handlers.hpp"
#include "local_rig.hpp"

namespace kvnode::node {
namespace {

using namespace local_rig;
using client::RetrieveReply;
using Where = Result<std::pair<std::string, std::size_t>>;

Where nobody() {
  return std::pair<std::string, std::size_t>{"", 0};
}

// A LocalService over a FakeNode; `locate` says who holds the chunks (a test makes it slow).
struct RetrieveRig {
  RetrieveRig(const std::string& name, Locate locate, LocalServiceOptions o = {})
      : node(net, "127.0.0.1:1001", 64) {
    o.path = temp_socket(name);
    auto s = LocalService::start(o, node.engine, &node.moves, std::move(locate));
    EXPECT_TRUE(s) << s.error().message;
    if (s) service = std::move(s).value();
  }
  const std::string& path() const { return service->path(); }

  fake::FakeNetwork net;
  fake::FakeNode node;
  std::unique_ptr<LocalService> service;
};

TEST(LocalService, ARetrieveDoesNotHoldUpOtherClients) {
  std::atomic<int> located{0};
  RetrieveRig rig("slow-retrieve", [&](const std::vector<ChunkHash>&) {
    ++located;
    std::this_thread::sleep_for(1500ms);
    return nobody();
  });
  ASSERT_TRUE(rig.service);
  auto a = client_of(rig.path(), false);
  auto b = client_of(rig.path(), false);
  ASSERT_TRUE(a && b);

  auto retrieving = std::async(std::launch::async, [&] {
    return a->retrieve(ChunkKeys::of_hashes({11, 12}));
  });
  ASSERT_TRUE(eventually([&] { return located == 1; }));
  const auto t0 = Clock::now();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(b->contains(ChunkKeys::of_hashes({11})));
  EXPECT_LT(Clock::now() - t0, 700ms) << "answered while the retrieve ran";
  EXPECT_EQ(retrieving.wait_for(0s), std::future_status::timeout) << "the retrieve had ended";
  Result<RetrieveReply> r = retrieving.get();
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->chunks, 0u);
  EXPECT_EQ(r->pulled, 0u);
  EXPECT_EQ(rig.service->dropped_replies(), 0u);

  // Its client leaves while it runs: the answer is dropped, counted, and the service serves on.
  {
    RawLocalSocket gone(rig.path());
    ASSERT_TRUE(gone.send_frame(request("retrieve", {13})));
    ASSERT_TRUE(eventually([&] { return located == 2; }));
  }
  EXPECT_TRUE(eventually([&] { return rig.service->dropped_replies() == 1; }, 5s))
      << rig.service->dropped_replies() << " answers dropped";
  EXPECT_EQ(rig.service->retrieves_skipped(), 0u) << "it had started: it ran";
  EXPECT_TRUE(b->contains(ChunkKeys::of_hashes({13})));
  EXPECT_TRUE(a->retrieve(ChunkKeys::of_hashes({14})));
  EXPECT_EQ(rig.service->dropped_replies(), 1u);
}

// Clients that time out and leave while their retrieves wait in the queue cost nothing: their
// retrieves are skipped, not run one after another for nobody, and a fresh retrieve is answered
// about when the one running ends.
TEST(LocalRetrieve, RetrievesWhoseClientLeftAreNotRun) {
  std::atomic<int> slow_located{0};
  RetrieveRig rig("left-queue", [&](const std::vector<ChunkHash>& missing) {
    if (missing.front() < 200) {
      ++slow_located;
      std::this_thread::sleep_for(1500ms);
    }
    return nobody();
  });
  ASSERT_TRUE(rig.service);
  auto impatient = client_of(rig.path(), false, 300ms);
  ASSERT_TRUE(impatient);
  for (std::int64_t key = 100; key < 105; ++key) {
    Result<RetrieveReply> r = impatient->retrieve(ChunkKeys::of_hashes({key}));
    ASSERT_FALSE(r) << key;
    EXPECT_EQ(r.error().code, ErrorCode::kDeadline) << r.error().message;
  }
  auto patient = client_of(rig.path(), false, 10s);
  ASSERT_TRUE(patient);
  const auto t0 = Clock::now();
  Result<RetrieveReply> fresh = patient->retrieve(ChunkKeys::of_hashes({200}));
  const auto took = Clock::now() - t0;
  ASSERT_TRUE(fresh) << fresh.error().message;
  // Run for nobody, four queued retrieves of 1.5 s each would have kept it for about 6 s.
  EXPECT_LT(took, 2500ms);
  EXPECT_LE(slow_located, 2) << "the first one, and at most the last (its client was still there)";
  EXPECT_GE(rig.service->retrieves_skipped(), 3u);
}

// The service stopped while clients keep sending retrieves and one runs: the socket thread ends
// first, so no retrieve reaches an executor being torn down (it crashed there, or ASan saw the
// use after free), and the running one ends with the server still there to take its answer.
TEST(LocalRetrieve, StoppingWhileRetrievesArriveIsClean) {
  std::atomic<int> located{0};
  RetrieveRig rig("stop-race", [&](const std::vector<ChunkHash>&) {
    ++located;
    std::this_thread::sleep_for(300ms);
    return nobody();
  });
  ASSERT_TRUE(rig.service);
  const std::string path = rig.path();
  std::atomic<bool> done{false};
  std::atomic<int> sent{0};
  std::thread sender([&] {
    while (!done) {
      RawLocalSocket s(path);
      if (s.connected() && s.send_frame(request("retrieve", {1}))) ++sent;
      if (!s.connected()) std::this_thread::sleep_for(1ms);
    }
  });
  ASSERT_TRUE(eventually([&] { return located >= 1 && sent > 10; }));
  rig.service.reset();  // while the sender keeps sending
  done = true;
  sender.join();
  EXPECT_FALSE(RawLocalSocket(path).connected()) << "the socket file is gone";
}

// Nothing but the executor runs a retrieve: serve(), on the socket thread, refuses it.
TEST(LocalRetrieve, TheSocketThreadNeverRunsARetrieve) {
  fake::FakeNetwork net;
  fake::FakeNode node(net, "127.0.0.1:1001", 64);
  int located = 0;
  local::LocalHandlers handlers(
      {}, node.engine, &node.moves,
      [&](const std::vector<ChunkHash>&) {
        ++located;
        return nobody();
      },
      nullptr);
  client::protocol::Request q;
  q.op = client::protocol::LocalOp::kRetrieve;
  q.hashes = {1, 2};
  const client::protocol::Reply refused = handlers.serve(1, q);
  EXPECT_FALSE(refused.ok);
  EXPECT_EQ(refused.code, ErrorCode::kInternal) << refused.error;
  EXPECT_EQ(located, 0);
  // The executor's way: the checked request, then the retrieve.
  Result<local::Chunks> chunks = handlers.retrieve_request(q);
  ASSERT_TRUE(chunks) << chunks.error().message;
  EXPECT_TRUE(handlers.retrieve(*chunks).ok);
  EXPECT_EQ(located, 1);
}

// A retrieve that throws, a std::exception or anything else, is an error answer (kInternal) to
// its client; the process and the service go on.
TEST(LocalRetrieve, AnyExceptionInARetrieveIsAnErrorAnswer) {
  RetrieveRig rig("throws", [](const std::vector<ChunkHash>& missing) -> Where {
    if (missing.front() == 1) throw std::runtime_error("the lookup broke");
    throw 42;  // not a std::exception
  });
  ASSERT_TRUE(rig.service);
  auto c = client_of(rig.path(), false);
  ASSERT_TRUE(c);
  Result<RetrieveReply> std_exception = c->retrieve(ChunkKeys::of_hashes({1}));
  ASSERT_FALSE(std_exception);
  EXPECT_EQ(std_exception.error().code, ErrorCode::kInternal);
  EXPECT_NE(std_exception.error().message.find("the lookup broke"), std::string::npos)
      << std_exception.error().message;
  Result<RetrieveReply> other = c->retrieve(ChunkKeys::of_hashes({2}));
  ASSERT_FALSE(other);
  EXPECT_EQ(other.error().code, ErrorCode::kInternal) << other.error().message;
  Result<std::vector<bool>> still = c->contains(ChunkKeys::of_hashes({1}));
  ASSERT_TRUE(still) << still.error().message;
  EXPECT_EQ(*still, std::vector<bool>{false});
}

}  // namespace
}  // namespace kvnode::node
