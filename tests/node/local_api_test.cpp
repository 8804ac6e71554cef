// The local client API against real daemons (in-process, real unix sockets, real shared memory,
// a real controller): put/get/contains/lookup by hash and by tokens over the staging region and
// inline, requests larger than the staging region, P2P retrieve between two nodes, hostile
// requests and hostile connections on the socket, holds a client abandons, error codes in
// replies, and a retrieve that does not hold up the other clients.
#include <gtest/gtest.h>
#include <unistd.h>

#include <future>
#include <msgpack.hpp>

#include "client/raw_local_socket.hpp"
#include "kvnode/client/local_client.hpp"
#include "kvnode/client/local_protocol.hpp"
#include "kvnode/node/daemon.hpp"
#include "kvnode/node/local_service.hpp"
#include "node_rig.hpp"

namespace kvnode::node {
namespace {

using namespace rig;
using client::ChunkKeys;
using client::LocalClient;
using client::LocalClientOptions;
using client::PutSeries;
using client::RetrieveReply;
using test::RawLocalSocket;

constexpr std::size_t kBytes = 64 << 10;  // per chunk
constexpr std::size_t kChunkTokens = 16;

std::size_t or0(const Result<std::size_t>& r) {
  return r ? *r : 0;
}

std::string temp_socket(const std::string& name) {
  return "/tmp/kvnode-test-" + std::to_string(getpid()) + "-" + name + ".sock";
}

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

std::vector<std::byte> bytes_of(const std::vector<std::int64_t>& hashes) {
  std::vector<std::byte> out;
  for (std::int64_t h : hashes) {
    const std::vector<std::byte> b = chunk_bytes(h, kBytes);
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

std::vector<std::int64_t> tokens(std::size_t n, std::int64_t first = 1) {
  std::vector<std::int64_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::unique_ptr<LocalClient> client_of(const std::string& path, bool shared = true) {
  LocalClientOptions o;
  o.use_shared_memory = shared;
  o.timeout = 5s;
  auto c = LocalClient::connect(path, o);
  EXPECT_TRUE(c) << c.error().message;
  return c ? std::move(c).value() : nullptr;
}

// Puts 40 chunks (more than the 16 staging slots: the client splits) by tokens, reads them back
// by hash, checks every byte, and asks contains/lookup.
void round_trip(LocalClient& c) {
  const std::vector<std::int64_t> t = tokens(40 * kChunkTokens);
  Result<std::vector<std::int64_t>> h = c.hashes(t);
  ASSERT_TRUE(h) << h.error().message;
  ASSERT_EQ(h->size(), 40u);
  const std::vector<std::byte> data = bytes_of(*h);
  // The node refuses writes while its start-up full sync runs (milliseconds with no delay).
  Result<std::size_t> put{make_error("not tried")};
  ASSERT_TRUE(eventually([&] {
    put = c.put(ChunkKeys::of_tokens(t), data);
    return put || put.error().code != ErrorCode::kFrozen;
  }));
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
  std::unique_ptr<Daemon> start(const NodeConfig& c) {
    auto d = Daemon::start(c);
    EXPECT_TRUE(d) << d.error().message;
    return d ? std::move(d).value() : nullptr;
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
    Result<std::size_t> put{make_error("not tried")};
    ASSERT_TRUE(eventually([&] {  // past the start-up full sync
      put = c->put(ChunkKeys::of_hashes(older), bytes_of(older));
      return put || put.error().code != ErrorCode::kFrozen;
    }));
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
  // A node refuses writes during its start-up full sync; the sync is quick with no delay.
  ASSERT_TRUE(eventually([&] { return or0(ca->put(ChunkKeys::of_tokens(t), data)) == 20; }));
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

// A request framed by hand on a raw connection: its answer's "ok", "error" and "code".
struct Answer {
  bool answered = false;
  bool ok = false;
  std::string error{};
  std::string code{};
};
Answer answer_of(const std::optional<std::string>& reply) {
  if (!reply) return {};
  msgpack::object_handle h = msgpack::unpack(reply->data(), reply->size());
  std::map<std::string, msgpack::object> m;
  h.get().convert(m);
  Answer a;
  a.answered = true;
  a.ok = m.at("ok").as<bool>();
  if (!a.ok) {
    a.error = m.at("error").as<std::string>();
    a.code = m.at("code").as<std::string>();
  }
  return a;
}
Answer ask(const std::string& path, const std::string& payload) {
  RawLocalSocket s(path);
  if (!s.connected() || !s.send_frame(payload)) return {};
  return answer_of(s.read_frame(5000ms));
}

template <class Write>
std::string pack(Write write) {
  msgpack::sbuffer b;
  msgpack::packer<msgpack::sbuffer> pk(b);
  write(pk);
  return std::string(b.data(), b.size());
}
std::string request(const std::string& op, const std::vector<std::int64_t>& hashes) {
  return pack([&](auto& pk) {
    pk.pack_map(2);
    pk.pack(std::string("op"));
    pk.pack(op);
    pk.pack(std::string("hashes"));
    pk.pack(hashes);
  });
}

// Raw requests: what a hostile or broken client can send. Each gets an error naming the field,
// and the node keeps serving.
TEST_F(LocalApiTest, BadRequestsGetClearErrorsAndTheNodeKeepsServing) {
  auto d = start(config_for(ctl_->ports(), "local-bad"));
  ASSERT_TRUE(d);
  const std::string path = d->local_socket();
  const Answer garbage = ask(path, "\xc1 garbage");
  EXPECT_NE(garbage.error.find("not a valid msgpack"), std::string::npos);
  EXPECT_EQ(garbage.code, "invalid");
  EXPECT_NE(ask(path, pack([](auto& pk) { pk.pack(42); })).error.find("request: expected a map"),
            std::string::npos);
  EXPECT_NE(ask(path, pack([](auto& pk) {
                  pk.pack_map(1);
                  pk.pack(std::string("hashes"));
                  pk.pack(std::vector<std::int64_t>{1});
                }))
                .error.find("request.op: missing"),
            std::string::npos);
  EXPECT_NE(ask(path, pack([](auto& pk) {
                  pk.pack_map(2);
                  pk.pack(std::string("op"));
                  pk.pack(std::string("contains"));
                  pk.pack(std::string("hashes"));
                  pk.pack_array(2);
                  pk.pack(1);
                  pk.pack(std::string("two"));
                }))
                .error.find("request.hashes[1]: expected an integer"),
            std::string::npos);
  const Answer unknown = ask(path, pack([](auto& pk) {
                               pk.pack_map(1);
                               pk.pack(std::string("op"));
                               pk.pack(std::string("format-disk"));
                             }));
  EXPECT_NE(unknown.error.find("unknown operation 'format-disk'"), std::string::npos);
  EXPECT_EQ(unknown.code, "invalid");
  const Answer no_hold = ask(path, pack([](auto& pk) {
                               pk.pack_map(2);
                               pk.pack(std::string("op"));
                               pk.pack(std::string("commit"));
                               pk.pack(std::string("hold"));
                               pk.pack(77);
                             }));
  EXPECT_NE(no_hold.error.find("no such hold"), std::string::npos);
  EXPECT_EQ(no_hold.code, "not_found");
  // A put whose bytes do not match its chunk count stores nothing.
  EXPECT_NE(ask(path, pack([](auto& pk) {
                  pk.pack_map(3);
                  pk.pack(std::string("op"));
                  pk.pack(std::string("put"));
                  pk.pack(std::string("hashes"));
                  pk.pack(std::vector<std::int64_t>{5, 6});
                  pk.pack(std::string("data"));
                  pk.pack_bin(10);
                  pk.pack_bin_body("0123456789", 10);
                }))
                .error.find("request.data: 2 chunks need"),
            std::string::npos);
  // An array header claiming 2^32-1 entries is refused without allocating them.
  const std::string huge =
      std::string("\x82\xa2op\xa8") + "contains" + "\xa6" + "hashes" + "\xdd\xff\xff\xff\xff";
  EXPECT_NE(ask(path, huge).error.find("not a valid msgpack"), std::string::npos);
  // An empty frame is a request too: an error answer.
  EXPECT_NE(ask(path, "").error.find("not a valid msgpack"), std::string::npos);
  // Still serving.
  auto c = client_of(path);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->contains(ChunkKeys::of_hashes({5, 6})).value(), (std::vector<bool>{false, false}));
}

// A store and a LocalService in this process (no daemon), for what a test tunes: timeouts, caps.
class ServiceRig {
 public:
  ServiceRig(const std::string& name, LocalServiceOptions o, PeerMoves* moves = nullptr,
             Locate locate = nullptr)
      : pool_(make_pool()), store_(pool_, kCpu, [](const StoreEvent&) {}), engine_(store_) {
    o.path = temp_socket(name);
    if (o.staging_slots > 0)
      o.staging_name = "/kvnode-test-" + std::to_string(getpid()) + "-" + name;
    auto s = LocalService::start(o, engine_, moves, std::move(locate));
    EXPECT_TRUE(s) << s.error().message;
    if (s) service_ = std::move(s).value();
  }
  LocalService& service() { return *service_; }
  const std::string& path() const { return service_->path(); }
  ChunkStore& store() { return store_; }
  Engine& engine() { return engine_; }

 private:
  static gpu::ChunkPool make_pool() {
    gpu::PoolOptions po;
    po.page_bytes = kBytes;
    po.pages = 8;
    return std::move(gpu::ChunkPool::create(po)).value();
  }
  gpu::ChunkPool pool_;
  ChunkStore store_;
  Engine engine_;
  std::unique_ptr<LocalService> service_;
};

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

// Hostile connections (garbage, a huge declared length, half a frame then silence, floods of
// connect-and-close) cost only themselves: the node answers every other client meanwhile.
TEST(LocalService, HostileConnectionsCostOnlyThemselves) {
  LocalServiceOptions o;
  o.stall_timeout = 300ms;
  ServiceRig rig("hostile", o);
  const std::string path = rig.path();
  auto served = [&] {
    auto c = client_of(path);
    Result<std::vector<bool>> has = c ? c->contains(ChunkKeys::of_hashes({1})) : make_error("no");
    return has && *has == std::vector<bool>{false};
  };

  // Garbage in a frame: an error answer, and the connection still serves a good request.
  RawLocalSocket garbage(path);
  ASSERT_TRUE(garbage.send_frame("\xc1\xc1\xc1"));
  EXPECT_NE(answer_of(garbage.read_frame(5000ms)).error.find("not a valid msgpack"),
            std::string::npos);
  ASSERT_TRUE(garbage.send_frame(request("contains", {1})));
  EXPECT_TRUE(answer_of(garbage.read_frame(5000ms)).ok);
  garbage.close();
  // Bytes that are no frame at all: the first four read as a length (here 542 MB): closed at once.
  RawLocalSocket noise(path);
  ASSERT_TRUE(noise.send_raw("GET / HTTP/1.1\r\n\r\n"));
  EXPECT_TRUE(noise.closed_within(2s));
  // A declared length over the limit, just over it and far over it: closed at once.
  for (const std::uint32_t length :
       {static_cast<std::uint32_t>(client::protocol::kMaxMessageBytes + 1), 0xffffffffu}) {
    RawLocalSocket huge(path);
    ASSERT_TRUE(huge.send_raw(RawLocalSocket::header(length)));
    EXPECT_TRUE(huge.closed_within(2s)) << length;
  }
  // Half a frame, then silence: everyone else is served meanwhile; it is cut after the stall
  // timeout. So is a client that stops inside the length.
  RawLocalSocket half(path), half_header(path);
  ASSERT_TRUE(half.send_raw(RawLocalSocket::header(100) + "0123456789"));
  ASSERT_TRUE(half_header.send_raw(std::string("\x10\x00", 2)));
  const auto t0 = Clock::now();
  EXPECT_TRUE(served());
  EXPECT_LT(Clock::now() - t0, 1s);
  EXPECT_TRUE(half.closed_within(5s));
  EXPECT_TRUE(half_header.closed_within(5s));
  // Floods of connections that close at once, some mid-frame.
  for (int i = 0; i < 2000; ++i) {
    RawLocalSocket s(path);
    ASSERT_TRUE(s.connected()) << i;
    if (i % 3 == 0) (void)s.send_raw(RawLocalSocket::header(1000) + "x");
    if (i % 3 == 1) (void)s.send_frame(request("contains", {1}));
  }
  EXPECT_TRUE(served());
  EXPECT_TRUE(eventually([&] { return rig.service().connections() == 0; }))
      << rig.service().connections() << " connections still open";
}

TEST(LocalService, ConnectionsBeyondTheCapAreClosedUntilOneLeaves) {
  LocalServiceOptions o;
  o.max_connections = 4;
  ServiceRig rig("cap", o);
  std::vector<std::unique_ptr<RawLocalSocket>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<RawLocalSocket>(rig.path()));
    ASSERT_TRUE(held.back()->send_frame(request("contains", {1})));
    ASSERT_TRUE(answer_of(held.back()->read_frame(5000ms)).ok) << i;  // accepted and served
  }
  RawLocalSocket extra(rig.path());
  EXPECT_TRUE(extra.closed_within(2s));
  LocalClientOptions co;
  co.timeout = 2s;
  auto refused = LocalClient::connect(rig.path(), co);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kPeerLost) << refused.error().message;
  held.pop_back();
  std::unique_ptr<LocalClient> c;
  ASSERT_TRUE(eventually([&] {
    auto again = LocalClient::connect(rig.path(), co);
    if (again) c = std::move(again).value();
    return c != nullptr;
  }));
  EXPECT_TRUE(c->contains(ChunkKeys::of_hashes({1})));
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

// A retrieve crosses the network (seconds): it runs on its own executor, so the other clients'
// requests are answered meanwhile; an answer for a client that left is dropped.
TEST(LocalService, ARetrieveDoesNotHoldUpOtherClients) {
  auto ctl = start_controller();
  Node node(ctl->ports(), "slow-retrieve", "tcp");
  std::atomic<int> located{0};
  Locate slow = [&](const std::vector<ChunkHash>&) -> Result<std::pair<std::string, std::size_t>> {
    ++located;
    std::this_thread::sleep_for(1500ms);
    return std::pair<std::string, std::size_t>{"", 0};  // nobody holds them
  };
  LocalServiceOptions o;
  o.path = temp_socket("slow-retrieve");
  auto service = LocalService::start(o, node.engine(), &node.moves(), slow);
  ASSERT_TRUE(service) << service.error().message;
  auto a = client_of(o.path, false);
  auto b = client_of(o.path, false);
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

  // Its client leaves before the answer: dropped, and the service serves on.
  {
    RawLocalSocket gone(o.path);
    ASSERT_TRUE(gone.send_frame(request("retrieve", {13})));
  }
  ASSERT_TRUE(eventually([&] { return located == 2; }));
  std::this_thread::sleep_for(1700ms);  // its answer came and found no connection
  EXPECT_TRUE(b->contains(ChunkKeys::of_hashes({13})));
  EXPECT_TRUE(a->retrieve(ChunkKeys::of_hashes({14})));
}

TEST(LocalClient, NoDaemonIsAnErrorWithinTheTimeout) {
  LocalClientOptions o;
  o.timeout = 300ms;
  const auto t0 = Clock::now();
  auto c = LocalClient::connect(temp_socket("nobody"), o);
  ASSERT_FALSE(c);
  // No socket file: said at once (issue 19, item 13), not after the timeout.
  EXPECT_NE(c.error().message.find("the file does not exist"), std::string::npos)
      << c.error().message;
  EXPECT_EQ(c.error().code, ErrorCode::kNotFound);
  EXPECT_LT(Clock::now() - t0, 3s);
}

}  // namespace
}  // namespace kvnode::node
