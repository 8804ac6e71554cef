// The local client API against real daemons (in-process, real unix sockets, real shared memory,
// a real controller): put/get/contains/lookup by hash and by tokens over the staging region and
// inline, requests larger than the staging region, P2P retrieve between two nodes, bad requests
// and the code each is answered with, holds (their owner, and what ends them when a client leaves
// or dies), and error codes in replies. The socket's hardening is local_transport_test.cpp; the
// retrieve executor, local_retrieve_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <msgpack.hpp>

#include "kvnode/client/local_client.hpp"
#include "kvnode/client/local_protocol.hpp"
#include "kvnode/node/daemon.hpp"
#include "kvnode/node/local_service.hpp"
#include "local_rig.hpp"

namespace kvnode::node {
namespace {

using namespace local_rig;
using client::PutSeries;
using client::RetrieveReply;

NodeConfig config_for(const controller::BoundPorts& ports, const std::string& instance,
                      std::size_t staging_mb = 1) {
  NodeConfig c;
  c.lmcache_instance_id = instance;
  c.controller_pull_url = "127.0.0.1:" + std::to_string(ports.pull);
  c.controller_reply_url = "127.0.0.1:" + std::to_string(ports.reply);
  c.chunk_size = kChunkTokens;
  c.chunk_bytes = kBytes;
  c.max_local_cpu_size = 64.0 * kBytes / 1e9;  // 64 chunks
  c.lmcache_worker_heartbeat_time = 0.2;
  c.full_sync_startup_delay = 0;
  c.http_port = -1;
  c.ucx_tls = "tcp";
  c.ucx_net_devices = "lo";
  c.local_socket = temp_socket(instance);
  c.local_staging_mb = staging_mb;  // 16 slots of 64 KiB
  return c;
}

// Puts 40 chunks (more than the 16 staging slots: the client splits) by tokens, reads them back
// by hash, checks every byte, and asks contains/lookup.
void round_trip(LocalClient& c) {
  const std::vector<std::int64_t> t = tokens(40 * kChunkTokens);
  Result<std::vector<std::int64_t>> h = c.hashes(t);
  ASSERT_TRUE(h) << h.error().message;
  ASSERT_EQ(h->size(), 40u);
  const std::vector<std::byte> data = bytes_of(*h);
  Result<std::size_t> put = c.put(ChunkKeys::of_tokens(t), data);
  ASSERT_TRUE(put) << put.error().message;
  EXPECT_EQ(*put, 40u);
  // Again: nothing changes, every chunk counts as stored.
  Result<std::size_t> again = c.put(ChunkKeys::of_hashes(*h), data);
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(*again, 40u);

  std::vector<std::byte> out(data.size());
  Result<std::size_t> got = c.get(ChunkKeys::of_hashes(*h), out);
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(*got, 40u);
  EXPECT_TRUE(out == data);

  std::vector<std::int64_t> probe = {(*h)[0], 12345, (*h)[39]};
  Result<std::vector<bool>> has = c.contains(ChunkKeys::of_hashes(probe));
  ASSERT_TRUE(has);
  EXPECT_EQ(*has, (std::vector<bool>{true, false, true}));
  Result<std::size_t> tokens_held = c.lookup(tokens(45 * kChunkTokens));
  ASSERT_TRUE(tokens_held);
  EXPECT_EQ(*tokens_held, 40 * kChunkTokens);

  // A buffer too small for what is stored is an error, not a silent truncation.
  std::vector<std::byte> small(3 * kBytes);
  EXPECT_FALSE(c.get(ChunkKeys::of_hashes(*h), small));
  // A key that is absent ends the prefix.
  std::vector<std::int64_t> gap = {(*h)[0], 999, (*h)[2]};
  Result<std::size_t> prefix = c.get(ChunkKeys::of_hashes(gap), out);
  ASSERT_TRUE(prefix);
  EXPECT_EQ(*prefix, 1u);
  // Wrong data size.
  EXPECT_FALSE(c.put(ChunkKeys::of_hashes({1, 2}), std::span(data).first(kBytes)));
}

class LocalApiTest : public ::testing::Test {
 protected:
  void SetUp() override { ctl_ = start_controller(); }
  // Started and settled: a fresh controller asks each worker for a full sync at its first
  // heartbeat, and the store refuses writes (kFrozen) while it runs. A test whose puts came
  // before that heartbeat met the freeze halfway through (a loaded CI machine did).
  std::unique_ptr<Daemon> start(const NodeConfig& c) {
    auto d = Daemon::start(c);
    EXPECT_TRUE(d) << d.error().message;
    if (!d) return nullptr;
    EXPECT_TRUE(eventually([&] { return settled(**d); })) << (*d)->metrics();
    return std::move(d).value();
  }
  // Registered, past the heartbeat that may ask for a full sync, and not frozen in one.
  static bool settled(const Daemon& d) {
    const std::string m = d.metrics();
    return prometheus_sample(m, "kvnode_controller_registered") == 1 &&
           prometheus_sample(m, "kvnode_controller_heartbeats_total") >= 3 &&
           prometheus_sample(m, "kvnode_full_sync_running") == 0;
  }
  std::unique_ptr<controller::Controller> ctl_;
};

TEST_F(LocalApiTest, RoundTripThroughSharedStaging) {
  auto d = start(config_for(ctl_->ports(), "local-shm"));
  ASSERT_TRUE(d);
  auto c = client_of(d->local_socket());
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->shared_memory());
  EXPECT_EQ(c->info().chunk_bytes, kBytes);
  EXPECT_EQ(c->info().chunk_size, kChunkTokens);
  EXPECT_EQ(c->info().instance, "local-shm");
  round_trip(*c);
  // The daemon's metrics count what the client asked.
  EXPECT_NE(d->metrics().find("kvnode_local_requests_total"), std::string::npos);
}

TEST_F(LocalApiTest, RoundTripInline) {
  auto d = start(config_for(ctl_->ports(), "local-inline"));
  ASSERT_TRUE(d);
  auto c = client_of(d->local_socket(), /*shared=*/false);
  ASSERT_TRUE(c);
  EXPECT_FALSE(c->shared_memory());
  round_trip(*c);
}

TEST_F(LocalApiTest, RoundTripWithoutStagingRegion) {
  auto d = start(config_for(ctl_->ports(), "local-nostaging", /*staging_mb=*/0));
  ASSERT_TRUE(d);
  auto c = client_of(d->local_socket());
  ASSERT_TRUE(c);
  EXPECT_FALSE(c->shared_memory());
  EXPECT_TRUE(c->info().shm.empty());
  round_trip(*c);
}

// A put larger than the room the node has (issue 19 item 3), over shared staging and inline:
// it evicts the older chunks, never its own leading ones (also across the calls of one
// PutSeries), and answers the longest prefix it stored.
TEST_F(LocalApiTest, APutLargerThanThePoolStoresTheLongestPrefixThatFits) {
  for (const bool shared : {true, false}) {
    SCOPED_TRACE(shared ? "shared staging" : "inline");
    auto d = start(config_for(ctl_->ports(), shared ? "room-shm" : "room-inline"));  // 64 pages
    ASSERT_TRUE(d);
    auto c = client_of(d->local_socket(), shared);
    ASSERT_TRUE(c);
    const std::vector<std::int64_t> older = c->hashes(tokens(20 * kChunkTokens, 5000)).value();
    Result<std::size_t> put = c->put(ChunkKeys::of_hashes(older), bytes_of(older));
    ASSERT_EQ(or0(put), 20u) << (put ? "" : put.error().message);
    const std::vector<std::int64_t> big = c->hashes(tokens(100 * kChunkTokens, 90000)).value();
    const std::vector<std::byte> data = bytes_of(big);
    put = c->put(ChunkKeys::of_hashes(big), data);
    ASSERT_TRUE(put) << put.error().message;
    EXPECT_EQ(*put, 64u) << "every older chunk made room, none of the put's own";
    std::vector<std::byte> out(data.size());
    EXPECT_EQ(or0(c->get(ChunkKeys::of_hashes(big), out)), 64u);
    EXPECT_TRUE(std::equal(out.begin(), out.begin() + 64 * kBytes, data.begin()));
    EXPECT_EQ(or0(c->get(ChunkKeys::of_hashes(older), out)), 0u);

    // One put in two calls: the second cannot evict what the first stored.
    const std::vector<std::int64_t> next = c->hashes(tokens(100 * kChunkTokens, 300000)).value();
    const std::vector<std::byte> next_data = bytes_of(next);
    PutSeries series;
    const std::span<const std::byte> all(next_data);
    put = c->put(ChunkKeys::of_hashes({next.begin(), next.begin() + 40}), all.first(40 * kBytes),
                 &series);
    EXPECT_EQ(or0(put), 40u);
    put = c->put(ChunkKeys::of_hashes({next.begin() + 40, next.end()}), all.subspan(40 * kBytes),
                 &series);
    EXPECT_EQ(or0(put), 24u) << "64 pages: 40 of the first call and 24 of the second";
    EXPECT_EQ(or0(c->get(ChunkKeys::of_hashes(next), out)), 64u);
    EXPECT_TRUE(std::equal(out.begin(), out.begin() + 64 * kBytes, next_data.begin()));
  }
}

TEST_F(LocalApiTest, ChunksPutAreIndexedAndRetrievedByAPeer) {
  auto a = start(config_for(ctl_->ports(), "local-A"));
  auto b = start(config_for(ctl_->ports(), "local-B"));
  ASSERT_TRUE(a && b);
  auto ca = client_of(a->local_socket());
  auto cb = client_of(b->local_socket());
  ASSERT_TRUE(ca && cb);
  const std::vector<std::int64_t> t = tokens(20 * kChunkTokens, 100);
  const std::vector<std::int64_t> h = ca->hashes(t).value();
  const std::vector<std::byte> data = bytes_of(h);
  ASSERT_EQ(or0(ca->put(ChunkKeys::of_tokens(t), data)), 20u);
  // A's admits reach the controller in batches: a retrieve may find a shorter prefix first.
  Result<RetrieveReply> r{make_error("not tried")};
  std::size_t pulled = 0;
  ASSERT_TRUE(eventually([&] {
    r = cb->retrieve(ChunkKeys::of_tokens(t));
    if (r) pulled += r->pulled;
    return r && r->chunks == 20;
  })) << (r ? "held " + std::to_string(r->chunks) : r.error().message);
  EXPECT_EQ(r->tokens, t.size());
  EXPECT_EQ(pulled, 20u);
  EXPECT_EQ(r->peer, a->peer_init_url());
  std::vector<std::byte> out(data.size());
  ASSERT_EQ(or0(cb->get(ChunkKeys::of_tokens(t), out)), 20u);
  EXPECT_TRUE(out == data);
  // Held locally now: a second retrieve pulls nothing.
  Result<RetrieveReply> again = cb->retrieve(ChunkKeys::of_hashes(h));
  ASSERT_TRUE(again);
  EXPECT_EQ(again->pulled, 0u);
  EXPECT_EQ(again->chunks, 20u);
}

// Raw requests: what a hostile or broken client can send. Each gets an error naming the field,
// and the node keeps serving.
TEST_F(LocalApiTest, BadRequestsGetClearErrorsAndTheNodeKeepsServing) {
  auto d = start(config_for(ctl_->ports(), "local-bad"));
  ASSERT_TRUE(d);
  const std::string path = d->local_socket();
  expect_error(ask(path, "\xc1 garbage"), "invalid", "not a valid msgpack");
  expect_error(ask(path, pack([](auto& pk) { pk.pack(42); })), "invalid",
               "request: expected a map");
  expect_error(ask(path, pack([](auto& pk) {
                     pk.pack_map(1);
                     pk.pack(std::string("hashes"));
                     pk.pack(std::vector<std::int64_t>{1});
                   })),
               "invalid", "request.op: missing");
  expect_error(ask(path, pack([](auto& pk) {
                     pk.pack_map(2);
                     pk.pack(std::string("op"));
                     pk.pack(std::string("contains"));
                     pk.pack(std::string("hashes"));
                     pk.pack_array(2);
                     pk.pack(1);
                     pk.pack(std::string("two"));
                   })),
               "invalid", "request.hashes[1]: expected an integer");
  expect_error(ask(path, pack([](auto& pk) {
                     pk.pack_map(1);
                     pk.pack(std::string("op"));
                     pk.pack(std::string("format-disk"));
                   })),
               "invalid", "unknown operation 'format-disk'");
  expect_error(ask(path, finish("commit", 77)), "not_found", "no such hold");
  // A put whose bytes do not match its chunk count stores nothing.
  expect_error(ask(path, pack([](auto& pk) {
                     pk.pack_map(3);
                     pk.pack(std::string("op"));
                     pk.pack(std::string("put"));
                     pk.pack(std::string("hashes"));
                     pk.pack(std::vector<std::int64_t>{5, 6});
                     pk.pack(std::string("data"));
                     pk.pack_bin(10);
                     pk.pack_bin_body("0123456789", 10);
                   })),
               "invalid", "request.data: 2 chunks need");
  // An array header claiming 2^32-1 entries is refused without allocating them.
  const std::string huge =
      std::string("\x82\xa2op\xa8") + "contains" + "\xa6" + "hashes" + "\xdd\xff\xff\xff\xff";
  expect_error(ask(path, huge), "invalid", "not a valid msgpack");
  // An empty frame is a request too: an error answer.
  expect_error(ask(path, ""), "invalid", "not a valid msgpack");
  // Still serving.
  auto c = client_of(path);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->contains(ChunkKeys::of_hashes({5, 6})).value(), (std::vector<bool>{false, false}));
}

// A client that reserves slots and vanishes: its hold expires, its slots return, and the chunk
// it never committed is never readable.
TEST(LocalService, AbandonedHoldsExpireAndNothingHalfWrittenIsReadable) {
  LocalServiceOptions o;
  o.hold_ttl = 300ms;
  o.staging_slots = 2;
  ServiceRig rig("expiry", o);
  ChunkStore& store = rig.store();

  RawLocalSocket s(rig.path());
  ASSERT_TRUE(s.connected());
  ASSERT_TRUE(s.send_frame(request("reserve", {7, 8})));
  const std::optional<std::string> reply = s.read_frame(5000ms);
  ASSERT_TRUE(reply);
  ASSERT_NE(reply->find("hold"), std::string::npos);

  // Both slots are held: another client cannot reserve until the hold expires.
  LocalClientOptions co;
  co.timeout = 5s;
  auto c = LocalClient::connect(rig.path(), co);
  ASSERT_TRUE(c) << c.error().message;
  const std::vector<std::byte> data = bytes_of({9});
  Result<std::size_t> refused = (*c)->put(ChunkKeys::of_hashes({9}), data);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kNoRoom) << refused.error().message;
  EXPECT_FALSE(store.contains(7));
  ASSERT_TRUE(eventually([&] { return or0((*c)->put(ChunkKeys::of_hashes({9}), data)) == 1; }));
  EXPECT_FALSE(store.contains(7));
  EXPECT_FALSE(store.contains(8));
  EXPECT_TRUE(store.contains(9));
  EXPECT_EQ(store.counters().reserved, 0u);
}

// A client killed mid-put leaves its reserve unfinished: its connection closes, and its holds
// end with it (slots back, writes dropped), not after hold_ttl: every other client's put finds
// the slots at once.
TEST(LocalHolds, AClosedConnectionsHoldsEndAtOnce) {
  LocalServiceOptions o;
  o.staging_slots = 2;  // hold_ttl stays 30 s
  ServiceRig rig("holds-closed", o);
  {
    RawLocalSocket dies(rig.path());
    const Answer reserved = ask(dies, request("reserve", {7, 8}));
    ASSERT_TRUE(reserved.ok) << reserved.error;
    ASSERT_NE(reserved.hold, 0u);
  }  // closed, the hold unfinished
  auto c = client_of(rig.path());
  ASSERT_TRUE(c);
  const std::vector<std::byte> data = bytes_of({9, 10});
  const auto t0 = Clock::now();
  Result<std::size_t> put{make_error("not tried")};
  // The close and the put may reach the socket thread in either order: a put or two may still
  // find the slots taken, for milliseconds.
  ASSERT_TRUE(eventually(
      [&] {
        put = c->put(ChunkKeys::of_hashes({9, 10}), data);
        return put || put.error().code != ErrorCode::kNoRoom;
      },
      5s))
      << "the slots came back only after hold_ttl";
  ASSERT_TRUE(put) << put.error().message;
  EXPECT_EQ(*put, 2u);
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_FALSE(rig.store().contains(7));
  EXPECT_FALSE(rig.store().contains(8));
  EXPECT_EQ(rig.store().counters().reserved, 0u);
}

// A hold is its connection's: another one cannot commit, abort or release it (it is told there
// is no such hold, as for one that never was), and the owner still can afterwards.
TEST(LocalHolds, OnlyTheConnectionThatMadeAHoldEndsIt) {
  LocalServiceOptions o;
  o.staging_slots = 4;
  ServiceRig rig("holds-owner", o);
  RawLocalSocket owner(rig.path()), other(rig.path());
  const Answer reserved = ask(owner, request("reserve", {7}));
  ASSERT_TRUE(reserved.ok) << reserved.error;
  const Answer leased = ask(owner, request("lease", {}));
  ASSERT_TRUE(leased.ok) << leased.error;
  for (const char* op : {"commit", "abort"})
    expect_error(ask(other, finish(op, reserved.hold)), "not_found", "no such hold");
  expect_error(ask(other, finish("release", leased.hold)), "not_found", "no such hold");
  EXPECT_FALSE(rig.store().contains(7));
  const Answer committed = ask(owner, finish("commit", reserved.hold));
  ASSERT_TRUE(committed.ok) << committed.error;
  EXPECT_EQ(committed.count, 1u);
  EXPECT_TRUE(rig.store().contains(7));
  EXPECT_TRUE(ask(owner, finish("release", leased.hold)).ok);
}

// Every error the node answers carries its code, and the client hands it back: a frozen store
// is kFrozen on both data paths (what kvctl waits out), a full staging region kNoRoom, a hold
// that is gone kNotFound, what this node cannot do kRefused.
TEST(LocalService, ErrorsCarryTheirCodesToTheClient) {
  LocalServiceOptions o;
  o.staging_slots = 2;
  ServiceRig rig("codes", o);
  auto shared = client_of(rig.path());
  auto inline_client = client_of(rig.path(), /*shared=*/false);
  ASSERT_TRUE(shared && inline_client);
  ASSERT_TRUE(shared->shared_memory());
  const std::vector<std::byte> data = bytes_of({21, 22});
  rig.engine().freeze(true);
  for (LocalClient* c : {shared.get(), inline_client.get()}) {
    Result<std::size_t> put = c->put(ChunkKeys::of_hashes({21, 22}), data);
    ASSERT_FALSE(put);
    EXPECT_EQ(put.error().code, ErrorCode::kFrozen) << put.error().message;
  }
  rig.engine().freeze(false);
  EXPECT_EQ(or0(shared->put(ChunkKeys::of_hashes({21, 22}), data)), 2u);

  const Answer too_many = ask(rig.path(), request("reserve", {31, 32, 33}));
  EXPECT_EQ(too_many.code, "no_room") << too_many.error;
  const Answer retrieve = ask(rig.path(), request("retrieve", {21}));
  EXPECT_EQ(retrieve.code, "refused") << retrieve.error;
  Result<RetrieveReply> r = shared->retrieve(ChunkKeys::of_hashes({21}));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kRefused);

  ServiceRig no_staging("codes-inline", LocalServiceOptions{});
  const Answer lease = ask(no_staging.path(), request("lease", {21}));
  EXPECT_EQ(lease.code, "refused") << lease.error;
}

TEST(LocalClient, NoDaemonIsAnErrorWithinTheTimeout) {
  LocalClientOptions o;
  o.timeout = 300ms;
  const auto t0 = Clock::now();
  auto c = LocalClient::connect(temp_socket("nobody"), o);
  ASSERT_FALSE(c);
  // No socket file: said at once (issue 19, item 13), not after the timeout.
  EXPECT_EQ(c.error().code, ErrorCode::kNotFound) << c.error().message;
  EXPECT_NE(c.error().message.find("the file does not exist"), std::string::npos)
      << c.error().message;
  EXPECT_LT(Clock::now() - t0, 3s);
}

}  // namespace
}  // namespace kvnode::node
