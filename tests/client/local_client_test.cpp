// kvnode::client against real kvnode processes (no controller: none is needed for local
// clients), from a binary that links only the client library: put/get/contains/lookup/hashes
// over the shared staging region and inline, several clients at once, an owner-only socket, and
// a node killed and restarted on the same socket, which the same client reaches again (mapping
// the new node's staging region, not writing into the dead one's), on its first call once the
// new node serves.
#include "kvnode/client/local_client.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "client/node_args.hpp"
#include "client/raw_local_socket.hpp"
#include "kvnode/client/local_protocol.hpp"
#include "support/child_process.hpp"
#include "support/eventually.hpp"

namespace kvnode::client {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kChunkBytes = 64 << 10;
constexpr std::size_t kChunkTokens = 16;

bool eventually(const std::function<bool()>& done, Clock::duration patience = 30s) {
  return test::eventually(done, patience, 20ms);
}

// A chunk's bytes: a function of its hash, so a copy can be checked.
std::vector<std::byte> chunk_of(std::int64_t hash) {
  std::vector<std::byte> b(kChunkBytes);
  for (std::size_t i = 0; i < b.size(); ++i)
    b[i] = static_cast<std::byte>((static_cast<std::uint64_t>(hash) * 7 + i / 8) & 0xff);
  return b;
}

std::vector<std::byte> chunks_of(const std::vector<std::int64_t>& hashes) {
  std::vector<std::byte> out;
  for (std::int64_t h : hashes) {
    const std::vector<std::byte> c = chunk_of(h);
    out.insert(out.end(), c.begin(), c.end());
  }
  return out;
}

std::vector<std::int64_t> tokens(std::size_t n, std::int64_t first) {
  std::vector<std::int64_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A kvnode process with a local socket of its own: 64 KiB chunks, ~150 of them, 16 staging
// slots. Its controller never answers, which local clients do not need.
class NodeProcess {
 public:
  explicit NodeProcess(const std::string& name)
      : instance_("client-" + name + "-" + std::to_string(::getpid())),
        socket_("/tmp/kvnode-" + instance_ + ".sock") {
    start();
  }
  void start() {
    process_ = std::make_unique<test::ChildProcess>(
        test::client_test_node_args(instance_, socket_, kChunkBytes, kChunkTokens));
  }
  void kill_hard() {
    process_->signal(SIGKILL);
    EXPECT_TRUE(eventually([&] { return !process_->running(); }));
  }
  // A client, once the node serves (retried while it starts).
  std::unique_ptr<LocalClient> client(bool shared = true) {
    LocalClientOptions o;
    o.use_shared_memory = shared;
    o.timeout = 10s;
    std::unique_ptr<LocalClient> c;
    std::string last;
    const bool up = eventually([&] {
      if (!process_->running()) return true;
      auto r = LocalClient::connect(socket_, o);
      if (r)
        c = std::move(r).value();
      else
        last = r.error().message;
      return c != nullptr;
    });
    EXPECT_TRUE(up && c) << last << "\n" << process_->output();
    return c;
  }
  const std::string& socket() const { return socket_; }
  std::string log() const { return process_->output(); }

 private:
  std::string instance_, socket_;
  std::unique_ptr<test::ChildProcess> process_;
};

std::size_t or0(const Result<std::size_t>& r) {
  return r ? *r : 0;
}

void round_trip(LocalClient& c, std::int64_t first_token) {
  const std::vector<std::int64_t> t = tokens(40 * kChunkTokens, first_token);
  Result<std::vector<std::int64_t>> h = c.hashes(t);
  ASSERT_TRUE(h) << h.error().message;
  ASSERT_EQ(h->size(), 40u);
  const std::vector<std::byte> data = chunks_of(*h);
  Result<std::size_t> put = c.put(ChunkKeys::of_tokens(t), data);  // 40 chunks, 16 slots
  ASSERT_TRUE(put) << put.error().message;
  EXPECT_EQ(*put, 40u);
  std::vector<std::byte> out(data.size());
  Result<std::size_t> got = c.get(ChunkKeys::of_hashes(*h), out);
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(*got, 40u);
  EXPECT_TRUE(out == data);
  Result<std::vector<bool>> has = c.contains(ChunkKeys::of_hashes({(*h)[0], 777, (*h)[39]}));
  ASSERT_TRUE(has);
  EXPECT_EQ(*has, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(or0(c.lookup(tokens(45 * kChunkTokens, first_token))), 40 * kChunkTokens);
  Result<std::size_t> wrong =
      c.put(ChunkKeys::of_hashes({1, 2}), std::span(data).first(kChunkBytes));
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.error().code, ErrorCode::kInvalid);
  std::vector<std::byte> small(3 * kChunkBytes);
  EXPECT_FALSE(c.get(ChunkKeys::of_hashes(*h), small));
}

TEST(LocalClientAgainstKvnode, RoundTripsThroughSharedStagingAndInline) {
  NodeProcess node("round-trip");
  auto shared = node.client(true);
  auto inline_client = node.client(false);
  ASSERT_TRUE(shared && inline_client);
  EXPECT_TRUE(shared->shared_memory());
  EXPECT_FALSE(inline_client->shared_memory());
  EXPECT_EQ(shared->info().chunk_bytes, kChunkBytes);
  EXPECT_EQ(shared->info().chunk_size, kChunkTokens);
  EXPECT_TRUE(shared->info().save_unfull_chunk);
  round_trip(*shared, 1);
  round_trip(*inline_client, 100000);
  // Owner only, like the staging region.
  struct stat st {};
  ASSERT_EQ(::stat(node.socket().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(LocalClientAgainstKvnode, ClientsOnSeveralThreadsAreServedTogether) {
  NodeProcess node("threads");
  ASSERT_TRUE(node.client());
  std::vector<std::thread> threads;
  std::vector<std::string> failures(4);
  for (std::size_t i = 0; i < failures.size(); ++i)
    threads.emplace_back([&, i] {
      auto c = node.client(i % 2 == 0);
      if (!c) return;
      for (std::int64_t round = 0; round < 10 && failures[i].empty(); ++round) {
        const std::vector<std::int64_t> h = {static_cast<std::int64_t>(i) * 1000 + round * 2 + 1,
                                             static_cast<std::int64_t>(i) * 1000 + round * 2 + 2};
        const std::vector<std::byte> data = chunks_of(h);
        if (or0(c->put(ChunkKeys::of_hashes(h), data)) != 2) failures[i] = "put";
        std::vector<std::byte> out(data.size());
        if (or0(c->get(ChunkKeys::of_hashes(h), out)) != 2 || out != data) failures[i] = "get";
      }
    });
  for (std::thread& t : threads) t.join();
  for (const std::string& f : failures) EXPECT_EQ(f, "");
}

// One client shared by threads against its contract: every answer is right or "busy", never a
// wrong one or a timeout (before, 519 of 1,600 such calls were).
TEST(LocalClientAgainstKvnode, ACallOverlappingAnotherOnOneClientIsRefusedAsBusy) {
  NodeProcess node("busy");
  auto c = node.client();
  ASSERT_TRUE(c);
  const std::vector<std::int64_t> held = {7001, 7002, 7003};
  ASSERT_EQ(or0(c->put(ChunkKeys::of_hashes(held), chunks_of(held))), 3u);
  std::atomic<std::size_t> right{0}, busy{0}, wrong{0};
  std::vector<std::string> samples;
  std::mutex sample_lock;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        Result<std::vector<bool>> r = c->contains(ChunkKeys::of_hashes(held));
        if (r && *r == std::vector<bool>{true, true, true}) {
          ++right;
        } else if (!r && r.error().code == ErrorCode::kInvalid &&
                   r.error().message.rfind("busy: one call at a time per client", 0) == 0) {
          ++busy;
        } else {
          ++wrong;
          const std::lock_guard<std::mutex> g(sample_lock);
          samples.push_back(r ? "a wrong answer" : r.error().message);
        }
      }
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0u) << (samples.empty() ? "" : samples.front());
  EXPECT_GT(right.load(), 0u);
  EXPECT_EQ(right + busy, 800u);
  // Alone again, it serves.
  EXPECT_EQ(or0(c->lookup(tokens(4, 1))), 0u);
}

// More tokens than a request may carry: refused by name before anything is sent (the node's
// decoder said only "array size overflow").
TEST(LocalClientAgainstKvnode, TooManyTokensForOneRequestAreRefusedByName) {
  NodeProcess node("too-many");
  auto c = node.client();
  ASSERT_TRUE(c);
  const std::size_t n = protocol::kMaxKeys + 1;
  Result<std::size_t> r = c->lookup(tokens(n, 1));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kInvalid);
  EXPECT_NE(r.error().message.find("tokens: " + std::to_string(n) + " in one request"),
            std::string::npos)
      << r.error().message;
  EXPECT_EQ(or0(c->lookup(tokens(protocol::kMaxKeys, 1))), 0u);  // the limit itself passes
}

// A descriptor that is not open is the caller's mistake, named; not a lost connection.
TEST(LocalClientAgainstKvnode, ARegistrationWithAClosedDescriptorIsInvalid) {
  NodeProcess node("badfd");
  auto c = node.client();
  ASSERT_TRUE(c);
  Result<HostKvMemory> m = HostKvMemory::create(kChunkBytes * 4);
  ASSERT_TRUE(m);
  KvAllocation a = m->allocation();
  const int closed = ::dup(a.fd);
  ASSERT_GE(closed, 0);
  ::close(closed);
  a.fd = closed;
  KvLayout layout;
  layout.format = KvFormat::kMla;
  layout.num_blocks = 4;
  layout.block_size = kChunkTokens;
  layout.kv_heads = 1;
  layout.head_size = kChunkBytes / kChunkTokens / 2;
  layout.elem_bytes = 2;
  KvLayerTensors lt;
  lt.k = KvTensor{a.base, a.bytes, 0, kChunkBytes, layout.head_size * 2, 0};
  layout.layers.push_back(lt);
  Result<std::uint64_t> r = c->register_kv(layout, std::span(&a, 1));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kInvalid);
  EXPECT_NE(r.error().message.find("allocations[0].fd: " + std::to_string(closed) +
                                   " is not an open descriptor"),
            std::string::npos)
      << r.error().message;
  EXPECT_EQ(or0(c->lookup(tokens(4, 1))), 0u);  // the connection is fine
}

// kill -9 leaves the socket file behind: the restarted node replaces it, and a client of the
// dead node reaches the new one on its next call, with the new staging region mapped (the old
// mapping is memory nobody reads any more: a put through it would store the wrong bytes).
TEST(LocalClientAgainstKvnode, ANodeRestartedOnItsSocketIsReachedAgain) {
  NodeProcess node("restart");
  auto c = node.client(true);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->shared_memory());
  ASSERT_EQ(or0(c->put(ChunkKeys::of_hashes({5}), chunk_of(5))), 1u);
  node.kill_hard();
  struct stat st {};
  ASSERT_EQ(::stat(node.socket().c_str(), &st), 0) << "the dead node's socket file stays";

  Result<std::vector<bool>> lost = c->contains(ChunkKeys::of_hashes({5}));
  ASSERT_FALSE(lost);
  EXPECT_EQ(lost.error().code, ErrorCode::kPeerLost) << lost.error().message;
  Result<std::vector<bool>> nobody = c->contains(ChunkKeys::of_hashes({5}));
  ASSERT_FALSE(nobody);
  EXPECT_EQ(nobody.error().code, ErrorCode::kPeerLost) << nobody.error().message;
  EXPECT_NE(nobody.error().message.find("nothing listens"), std::string::npos)
      << nobody.error().message;

  node.start();
  Result<std::vector<bool>> has{make_error("not tried")};
  ASSERT_TRUE(eventually([&] { return (has = c->contains(ChunkKeys::of_hashes({5}))).ok(); }))
      << has.error().message << "\n"
      << node.log();
  EXPECT_EQ(*has, std::vector<bool>{false}) << "a new node holds nothing";
  ASSERT_TRUE(c->shared_memory());
  const std::vector<std::byte> six = chunk_of(6);
  ASSERT_EQ(or0(c->put(ChunkKeys::of_hashes({6}), six)), 1u);
  // What the node stored, read by a client that never knew the dead node (inline) and by this
  // one: a put or get through the dead node's region would read back its own bytes, but store
  // (and serve) something else.
  auto fresh = node.client(false);
  ASSERT_TRUE(fresh);
  std::vector<std::byte> out(kChunkBytes);
  ASSERT_EQ(or0(fresh->get(ChunkKeys::of_hashes({6}), out)), 1u);
  EXPECT_TRUE(out == six) << "the bytes went through the new node's staging region";
  const std::vector<std::byte> seven = chunk_of(7);
  ASSERT_EQ(or0(fresh->put(ChunkKeys::of_hashes({7}), seven)), 1u);
  ASSERT_EQ(or0(c->get(ChunkKeys::of_hashes({7}), out)), 1u);
  EXPECT_TRUE(out == seven);
}

// What ZeroMQ did for the engine, kept: after the node restarts, the first call of a client of
// the dead node succeeds. The connection it kept is dead; the call notices before sending (or
// when sending fails: the request never went out), connects again, maps the new staging region
// and asks once, within the same timeout.
TEST(LocalClientAgainstKvnode, TheFirstCallAfterARestartSucceeds) {
  NodeProcess node("first-call");
  auto c = node.client(true);
  ASSERT_TRUE(c);
  ASSERT_EQ(or0(c->put(ChunkKeys::of_hashes({5}), chunk_of(5))), 1u);
  node.kill_hard();
  node.start();
  ASSERT_TRUE(node.client(false)) << "the new node serves";
  Result<std::vector<bool>> has = c->contains(ChunkKeys::of_hashes({5}));
  ASSERT_TRUE(has) << has.error().message;
  EXPECT_EQ(*has, std::vector<bool>{false}) << "a new node holds nothing";
  const std::vector<std::byte> six = chunk_of(6);
  ASSERT_EQ(or0(c->put(ChunkKeys::of_hashes({6}), six)), 1u) << "through the new staging region";
  std::vector<std::byte> out(kChunkBytes);
  ASSERT_EQ(or0(node.client(false)->get(ChunkKeys::of_hashes({6}), out)), 1u);
  EXPECT_TRUE(out == six);
}

// The node's info answer says how it hashes a sequence's last partial chunk (LMCache's
// save_unfull_chunk: on by default), read here off the wire, not through the client's default.
TEST(LocalClientAgainstKvnode, InfoSaysWhetherALastPartialChunkIsAChunk) {
  NodeProcess node("info-unfull");
  ASSERT_TRUE(node.client());  // the node serves
  test::RawLocalSocket raw(node.socket());
  ASSERT_TRUE(raw.connected());
  protocol::Request q;
  q.op = protocol::LocalOp::kInfo;
  const std::vector<std::byte> request = protocol::encode(q);
  ASSERT_TRUE(
      raw.send_frame(std::string(reinterpret_cast<const char*>(request.data()), request.size())));
  const std::optional<std::string> frame = raw.read_frame(5000ms);
  ASSERT_TRUE(frame);
  Result<protocol::Reply> reply =
      protocol::decode_reply(std::as_bytes(std::span(frame->data(), frame->size())));
  ASSERT_TRUE(reply) << reply.error().message;
  EXPECT_EQ(reply->chunk_size, kChunkTokens);
  EXPECT_EQ(reply->save_unfull_chunk, std::optional<bool>(true));
}

}  // namespace
}  // namespace kvnode::client
