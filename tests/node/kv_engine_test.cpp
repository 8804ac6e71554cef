// The engine's KV path (issue 21) against real kvnode processes, this test process being the
// engine: it registers a paged KV cache held in memfds and stores and loads chunks by block
// table; every byte is checked against copies made by the element formula (kv_engine_rig.hpp).
// Per layout: a store by tokens (5 whole chunks and an unfull tail), garbage over the blocks, a
// load into other blocks that writes those tokens' bytes and no other byte. Then: by hashes, a
// load stopping at a missing chunk, a stored chunk meaning what a put's means, two ranks, an
// engine killed mid-store, unregister and disconnect unmapping everything, every validation error.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv_engine_rig.hpp"
#include "local_rig.hpp"

namespace kvnode::node {
namespace {

using namespace kv_rig;

constexpr std::size_t kTotal = 5 * kChunkTokens + 7;  // 5 whole chunks and an unfull tail
constexpr std::size_t kChunks = 6;

class KvEngineRoundTrip : public ::testing::TestWithParam<CacheSpec> {};

TEST_P(KvEngineRoundTrip, ALoadIntoOtherBlocksWritesEveryStoredByteThereAndNoOther) {
  const CacheSpec spec = GetParam();
  Registered e(std::string("kvrt-") + preset_name(spec.preset), spec);
  ASSERT_TRUE(e.ready());
  const auto tokens = token_range(kTotal, 1000);
  const std::size_t blocks = blocks_for(kTotal, spec.block_size);
  const auto stored_in = random_blocks(spec.num_blocks, blocks, 11);
  const auto ref = reference_chunks(e.cache->layout, stored_in, kTotal);
  ASSERT_EQ(ref.size(), kChunks);
  for (std::size_t i = 0; i < kChunks; ++i) {  // the client's gather means the same bytes
    std::vector<std::byte> g(ref[i].size());
    const std::size_t count = std::min(kChunkTokens, kTotal - i * kChunkTokens);
    ASSERT_TRUE(client::gather(e.cache->layout, stored_in, i * kChunkTokens, count, g));
    EXPECT_EQ(bytes_difference(g, ref[i]), "") << "chunk " << i;
  }

  expect_reply(store_when_ready(*e.c, transfer(e.kv, ChunkKeys::of_tokens(tokens), stored_in)),
               kChunks, kTotal);

  e.cache->fill(2);  // garbage over every block
  const auto before = e.cache->snapshot();
  const auto loaded_in = random_blocks(spec.num_blocks, blocks, 22);
  ASSERT_NE(loaded_in, stored_in);
  expect_reply(e.c->load(transfer(e.kv, ChunkKeys::of_tokens(tokens), loaded_in)), kChunks, kTotal);
  EXPECT_EQ(chunks_difference(reference_chunks(e.cache->layout, loaded_in, kTotal), ref), "");
  EXPECT_EQ(load_difference(*e.cache, before, loaded_in, ref, kTotal), "");
}

INSTANTIATE_TEST_SUITE_P(KvEngine, KvEngineRoundTrip,
                         ::testing::Values(CacheSpec{Preset::kVllm, 64, 16},
                                           CacheSpec{Preset::kFlashInfer, 64, 4},
                                           CacheSpec{Preset::kMla, 32, 8},
                                           CacheSpec{Preset::kSglang, 256, 1},
                                           CacheSpec{Preset::kHnd, 64, 4}),
                         [](const ::testing::TestParamInfo<CacheSpec>& p) {
                           return std::string(preset_name(p.param.preset)) + "_block" +
                                  std::to_string(p.param.block_size);
                         });

TEST(KvEngine, StoreAndLoadByHashesAndALoadStopsAtTheFirstMissingChunk) {
  const CacheSpec spec{Preset::kFlashInfer, 64, 4};
  Registered e("kvhash", spec);
  ASSERT_TRUE(e.ready());
  const auto tokens = token_range(kTotal, 2000);
  const Result<std::vector<std::int64_t>> h = e.c->hashes(tokens);
  ASSERT_TRUE(h && h->size() == kChunks) << (h ? std::to_string(h->size()) : h.error().message);
  const auto stored_in = random_blocks(spec.num_blocks, blocks_for(kTotal, 4), 11);
  const auto ref = reference_chunks(e.cache->layout, stored_in, kTotal);
  expect_reply(store_when_ready(*e.c, transfer(e.kv, ChunkKeys::of_hashes(*h), stored_in, kTotal)),
               kChunks, kTotal);
  Result<std::size_t> held = e.c->lookup(tokens);  // by tokens, the same chunks
  EXPECT_EQ(held ? *held : 0, kTotal);

  e.cache->fill(2);
  auto before = e.cache->snapshot();
  const auto loaded_in = random_blocks(spec.num_blocks, blocks_for(kTotal, 4), 22);
  expect_reply(e.c->load(transfer(e.kv, ChunkKeys::of_hashes(*h), loaded_in, kTotal)), kChunks,
               kTotal);
  EXPECT_EQ(load_difference(*e.cache, before, loaded_in, ref, kTotal), "");
  // num_tokens 0: whole chunks.
  const std::vector<std::int64_t> three(h->begin(), h->begin() + 3);
  expect_reply(e.c->load(transfer(e.kv, ChunkKeys::of_hashes(three), loaded_in)), 3u,
               3 * kChunkTokens);

  // A sequence of 4 chunks whose chunk 2 is missing: chunks 0-1, then chunk 3 on its own.
  const auto seq = token_range(4 * kChunkTokens, 50000);
  const Result<std::vector<std::int64_t>> h4 = e.c->hashes(seq);
  ASSERT_TRUE(h4 && h4->size() == 4u);
  e.cache->fill(3);
  const auto table = random_blocks(spec.num_blocks, 16, 33);  // 4 blocks of 4 tokens per chunk
  const auto ref4 = reference_chunks(e.cache->layout, table, seq.size());
  const std::vector<std::uint32_t> head(table.begin(), table.begin() + 8),
      last(table.begin() + 12, table.end());
  expect_reply(e.c->store(transfer(e.kv, ChunkKeys::of_hashes({(*h4)[0], (*h4)[1]}), head, 32)), 2u,
               32u);
  expect_reply(e.c->store(transfer(e.kv, ChunkKeys::of_hashes({(*h4)[3]}), last, 16)), 1u, 16u);
  const auto present = e.c->contains(ChunkKeys::of_hashes(*h4));
  ASSERT_TRUE(present);
  EXPECT_EQ(*present, (std::vector<bool>{true, true, false, true}));
  e.cache->fill(4);
  before = e.cache->snapshot();
  const auto target = random_blocks(spec.num_blocks, 16, 44);
  expect_reply(e.c->load(transfer(e.kv, ChunkKeys::of_hashes(*h4), target, seq.size())), 2u, 32u);
  EXPECT_EQ(load_difference(*e.cache, before, target, {ref4[0], ref4[1]}, seq.size()), "");
  expect_reply(e.c->load(transfer(e.kv, ChunkKeys::of_tokens(seq), target)), 2u, 32u);

  // Nothing stored: nothing loaded, no byte written.
  before = e.cache->snapshot();
  expect_reply(e.c->load(transfer(e.kv, ChunkKeys::of_tokens(token_range(64, 90000)), target)), 0u,
               0u);
  EXPECT_EQ(load_difference(*e.cache, before, target, {}, 64), "");
}

TEST(KvEngine, AStoredChunkIsWhatAPutStoresAndAPutChunkLoadsIntoBlocks) {
  const CacheSpec spec{Preset::kVllm, 64, 16};
  Registered e("kvput", spec);
  ASSERT_TRUE(e.ready());
  const auto tokens = token_range(kTotal, 3000);
  const auto table = random_blocks(spec.num_blocks, blocks_for(kTotal, 16), 11);
  const auto ref = reference_chunks(e.cache->layout, table, kTotal);
  expect_reply(store_when_ready(*e.c, transfer(e.kv, ChunkKeys::of_tokens(tokens), table)), kChunks,
               kTotal);
  // get answers KV_2LTD chunks: whole pages, and the unfull tail's bytes first in its page.
  std::vector<std::byte> out(kChunks * kPageBytes);
  Result<std::size_t> got = e.c->get(ChunkKeys::of_tokens(tokens), out);
  ASSERT_TRUE(got) << got.error().message;
  ASSERT_EQ(*got, kChunks);
  for (std::size_t i = 0; i < kChunks; ++i) {
    ASSERT_EQ(ref[i].size(), i + 1 < kChunks ? kPageBytes : 7 * kPageBytes / kChunkTokens);
    const std::span<const std::byte> page(out.data() + i * kPageBytes, ref[i].size());
    EXPECT_EQ(bytes_difference(page, ref[i]), "") << "chunk " << i;
  }
  // A put's chunks (two whole ones) load into blocks as those bytes.
  const auto put_tokens = token_range(2 * kChunkTokens, 70000);
  std::vector<std::byte> put_bytes(ref[2]);
  put_bytes.insert(put_bytes.end(), ref[3].begin(), ref[3].end());
  Result<std::size_t> put = e.c->put(ChunkKeys::of_tokens(put_tokens), put_bytes);
  ASSERT_TRUE(put && *put == 2u) << (put ? std::to_string(*put) : put.error().message);
  e.cache->fill(5);
  const auto before = e.cache->snapshot();
  const auto into = random_blocks(spec.num_blocks, 2, 55);
  expect_reply(e.c->load(transfer(e.kv, ChunkKeys::of_tokens(put_tokens), into)), 2u,
               2 * kChunkTokens);
  EXPECT_EQ(load_difference(*e.cache, before, into, {ref[2], ref[3]}, 2 * kChunkTokens), "");
}

TEST(KvEngine, TwoRanksEachLoadTheirOwnBytesForTheSameTokens) {
  const CacheSpec spec{Preset::kVllm, 64, 16};
  auto ctl = start_controller();
  NodeProcessOptions one;  // rank 1: its ports are the second of each list
  one.extra = {"--worker-id",      "1",
               "--worker-ports",   std::to_string(free_port()),
               "--p2p-init-ports", std::to_string(free_port())};
  NodeProcess node0("kvrank0", ctl->ports().pull, ctl->ports().reply);
  NodeProcess node1("kvrank1", ctl->ports().pull, ctl->ports().reply, one);
  NodeProcess* nodes[2] = {&node0, &node1};
  const auto tokens = token_range(kTotal, 4000);
  const auto stored_in = random_blocks(spec.num_blocks, blocks_for(kTotal, 16), 11);
  const auto loaded_in = random_blocks(spec.num_blocks, blocks_for(kTotal, 16), 22);
  std::vector<KvCache> caches;
  std::unique_ptr<LocalClient> c[2];
  std::uint64_t kv[2] = {0, 0};
  std::vector<std::vector<std::byte>> ref[2];
  for (int r : {0, 1}) {
    ASSERT_TRUE(nodes[r]->up()) << nodes[r]->log();
    c[r] = connect_to(nodes[r]->socket());
    ASSERT_TRUE(c[r]);
    EXPECT_EQ(c[r]->info().worker_id, r);
    caches.push_back(KvCache::shared(spec).value());
    caches[r].fill(100 + r);
    Result<std::uint64_t> id = c[r]->register_kv(caches[r].layout, caches[r].allocations);
    ASSERT_TRUE(id) << id.error().message;
    kv[r] = *id;
    ref[r] = reference_chunks(caches[r].layout, stored_in, kTotal);
  }
  EXPECT_EQ(c[0]->hashes(tokens).value(), c[1]->hashes(tokens).value());
  ASSERT_NE(bytes_difference(ref[0][0], ref[1][0]), "");
  for (int r : {0, 1}) {
    expect_reply(store_when_ready(*c[r], transfer(kv[r], ChunkKeys::of_tokens(tokens), stored_in)),
                 kChunks, kTotal);
  }
  for (int r : {0, 1}) {
    std::vector<std::byte> first(kPageBytes);
    Result<std::size_t> got = c[r]->get(ChunkKeys::of_tokens(token_range(16, 4000)), first);
    ASSERT_TRUE(got && *got == 1u);
    EXPECT_EQ(bytes_difference(first, ref[r][0]), "") << "rank " << r;
    caches[r].fill(200 + r);
    const auto before = caches[r].snapshot();
    expect_reply(c[r]->load(transfer(kv[r], ChunkKeys::of_tokens(tokens), loaded_in)), kChunks,
                 kTotal);
    EXPECT_EQ(load_difference(caches[r], before, loaded_in, ref[r], kTotal), "") << "rank " << r;
  }
}

// The engine killed mid-store: HND rows, so the node's store (128 chunks of 2048 copies of 128
// bytes) takes long enough to be cut part-way.
constexpr CacheSpec kKilledSpec{Preset::kHnd, 160, 16};
constexpr std::size_t kKilledTokens = 128 * kChunkTokens;
std::vector<std::uint32_t> killed_table(std::uint64_t seed) {
  return random_blocks(kKilledSpec.num_blocks, kKilledTokens / 16,
                       static_cast<std::uint32_t>(seed));
}

// An engine in a child process, forked at construction (before the test starts a thread). It
// reads the node's socket (a line) on `go`, registers its cache (`seed`'s bytes), says 'S', and
// once told (any byte on `go`) stores all of it, says 'D' and waits to be killed. 'E' and a
// message: it failed.
class ForkedEngine {
 public:
  ForkedEngine(std::uint64_t seed, std::int64_t first_token) {
    int go[2], say[2];
    if (::pipe2(go, O_CLOEXEC) != 0 || ::pipe2(say, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) run(UniqueFd(go[0]), UniqueFd(say[1]), seed, first_token);
    ::close(go[0]);
    ::close(say[1]);
    go_ = UniqueFd(go[1]);
    say_ = UniqueFd(say[0]);
  }
  ~ForkedEngine() { kill(); }

  bool tell(const std::string& what) {
    return pid_ > 0 && ::write(go_.get(), what.data(), what.size()) == ssize_t(what.size());
  }
  char next() {  // blocks; 0 at the end
    char ch = 0;
    return ::read(say_.get(), &ch, 1) == 1 ? ch : 0;
  }
  std::string rest() {  // what it says until it ends
    std::string s;
    for (char ch; (ch = next()) != 0;) s += ch;
    return s;
  }
  void kill() {
    if (pid_ > 0 && ::kill(pid_, SIGKILL) == 0) ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  [[noreturn]] static void run(UniqueFd go, UniqueFd say, std::uint64_t seed, std::int64_t first) {
    auto fail = [&](const std::string& why) {
      (void)!::write(say.get(), ("E" + why).data(), why.size() + 1);
      ::_exit(1);
    };
    std::string socket;
    char ch = 0;
    while (::read(go.get(), &ch, 1) == 1 && ch != '\n') socket += ch;
    if (ch != '\n') ::_exit(2);  // the test gave up
    Result<KvCache> cache = KvCache::shared(kKilledSpec, "kvnode-kv-killed");
    if (!cache) fail(cache.error().message);
    cache->fill(seed);
    auto c = LocalClient::connect(socket);
    if (!c) fail(c.error().message);
    Result<std::uint64_t> kv = (*c)->register_kv(cache->layout, cache->allocations);
    if (!kv) fail(kv.error().message);
    if (::write(say.get(), "S", 1) != 1 || ::read(go.get(), &ch, 1) != 1) ::_exit(3);
    const ChunkKeys keys = ChunkKeys::of_tokens(token_range(kKilledTokens, first));
    auto r = (*c)->store(transfer(*kv, keys, killed_table(seed)));
    if (!r) fail(r.error().message);
    (void)!::write(say.get(), "D", 1);
    for (;;) ::pause();
  }

  pid_t pid_ = -1;
  UniqueFd go_, say_;
};

TEST(KvEngine, AnEngineKilledMidStoreLeavesOnlyWholeChunksAndNoMapping) {
  // Killed with its store in the socket of a stopped node, about halfway through it, at once.
  enum Round { kNodeStopped, kHalfway, kAtOnce, kRounds };
  std::vector<std::unique_ptr<ForkedEngine>> engines;
  for (int i = 0; i < kRounds; ++i)
    engines.push_back(std::make_unique<ForkedEngine>(500 + i, 1'000'000 * (i + 1)));
  NodeProcessOptions o;
  o.gigabytes = "0.05";  // 190 pages: a whole store fits
  OneNode n("kvkill", o);
  ASSERT_TRUE(n.node.up()) << n.node.log();
  auto p = connect_to(n.node.socket());
  ASSERT_TRUE(p && wait_unfrozen(*p));
  // How long such a store takes here (the second one: pages faulted in), with a cache of ours.
  KvCache timed = KvCache::shared(kKilledSpec).value();
  timed.fill(7);
  const std::uint64_t kv = p->register_kv(timed.layout, timed.allocations).value();
  Clock::duration store_time{};
  for (std::int64_t first : {10, 100'000}) {
    const auto t0 = Clock::now();
    auto stored = p->store(
        transfer(kv, ChunkKeys::of_tokens(token_range(kKilledTokens, first)), killed_table(1)));
    store_time = Clock::now() - t0;
    ASSERT_TRUE(stored && stored->chunks == 128u) << (stored ? "" : stored.error().message);
  }
  const pid_t pid = n.node.pid();
  const Footprint base = settled_footprint(pid);
  for (int i = 0; i < kRounds; ++i) {
    ASSERT_TRUE(engines[i]->tell(n.node.socket() + "\n"));
    const char said = engines[i]->next();
    ASSERT_EQ(said, 'S') << said << engines[i]->rest();
    if (i == kNodeStopped) ::kill(pid, SIGSTOP);
    ASSERT_TRUE(engines[i]->tell("!"));
    if (i == kNodeStopped) std::this_thread::sleep_for(50ms);  // the request is in the socket
    if (i == kHalfway) std::this_thread::sleep_for(store_time / 2);
    engines[i]->kill();
    if (i == kNodeStopped) ::kill(pid, SIGCONT);
    const std::string after = engines[i]->rest();
    ASSERT_TRUE(n.node.running()) << n.node.describe_exit() << "\n" << n.node.log();
    EXPECT_TRUE(footprint_returns(pid, base))
        << describe(footprint(pid)) << ", before the engine came " << describe(base);

    // Every chunk the node holds is whole, and they are the sequence's leading ones.
    KvCache plain = KvCache::plain(kKilledSpec);
    plain.fill(500 + i);
    const auto ref = reference_chunks(plain.layout, killed_table(500 + i), kKilledTokens);
    const auto hashes = p->hashes(token_range(kKilledTokens, 1'000'000 * (i + 1))).value();
    const auto present = p->contains(ChunkKeys::of_hashes(hashes)).value();
    const std::size_t held = std::count(present.begin(), present.end(), true);
    EXPECT_TRUE(std::is_partitioned(present.begin(), present.end(), [](bool b) { return b; }));
    std::vector<std::byte> page(kPageBytes);
    for (std::size_t c = 0; c < held; ++c) {
      Result<std::size_t> got = p->get(ChunkKeys::of_hashes({hashes[c]}), page);
      ASSERT_TRUE(got && *got == 1u) << "chunk " << c;
      EXPECT_EQ(bytes_difference(page, ref[c]), "") << "round " << i << ", chunk " << c;
    }
    std::printf(
        "[          ] round %d (a store takes %.1f ms): the node holds %zu of 128 chunks%s\n", i,
        std::chrono::duration<double, std::milli>(store_time).count(), held,
        after.empty() ? "" : (", the engine said " + after).c_str());
  }
}

TEST(KvEngine, UnregisterAndDisconnectUnmapEveryAllocationAndCloseEveryDescriptor) {
  OneNode n("kvfoot");
  ASSERT_TRUE(n.node.up()) << n.node.log();
  const pid_t pid = n.node.pid();
  const Footprint base = settled_footprint(pid);
  auto c = connect_to(n.node.socket());
  ASSERT_TRUE(c && wait_unfrozen(*c));
  const Footprint connected{base.fds + 1, base.memfd_maps};
  ASSERT_TRUE(footprint_returns(pid, connected)) << describe(footprint(pid));
  KvCache flashinfer = KvCache::shared({Preset::kFlashInfer, 16, 16}).value();  // 8 memfds
  KvCache sglang = KvCache::shared({Preset::kSglang, 256, 1}).value();          // 2 memfds
  auto use = [&](KvCache& cache, std::uint64_t first) -> std::uint64_t {
    Result<std::uint64_t> kv = c->register_kv(cache.layout, cache.allocations);
    EXPECT_TRUE(kv) << kv.error().message;
    if (!kv) return 0;
    auto stored =
        c->store(transfer(*kv, ChunkKeys::of_tokens(token_range(32, first)),
                          random_blocks(cache.spec.num_blocks, 32 / cache.spec.block_size, 1)));
    EXPECT_TRUE(stored && stored->chunks == 2u) << (stored ? "" : stored.error().message);
    return *kv;
  };
  // Mapped once each, their descriptors closed once mapped.
  const std::uint64_t kv = use(flashinfer, 100);
  EXPECT_EQ(footprint(pid), (Footprint{connected.fds, base.memfd_maps + 8}))
      << describe(footprint(pid));
  ASSERT_TRUE(c->unregister_kv(kv).ok());
  EXPECT_TRUE(footprint_returns(pid, connected)) << describe(footprint(pid));
  expect_error(c->store(transfer(kv, ChunkKeys::of_tokens(token_range(16, 100)), {0})),
               ErrorCode::kNotFound, {"no KV registration"});
  expect_error(c->unregister_kv(kv), ErrorCode::kNotFound, {"no KV registration"});

  use(flashinfer, 200);
  use(sglang, 300);
  EXPECT_EQ(footprint(pid), (Footprint{connected.fds, base.memfd_maps + 10}))
      << describe(footprint(pid));
  c.reset();  // the connection closes: both registrations go
  EXPECT_TRUE(footprint_returns(pid, base))
      << describe(footprint(pid)) << ", before " << describe(base);

  // 64 registrations a connection (the same memory, mapped each time), then kNoRoom; all go.
  c = connect_to(n.node.socket());
  ASSERT_TRUE(c);
  KvCache small = KvCache::shared({Preset::kVllm, 4, 16}).value();
  for (int i = 0; i < 64; ++i) ASSERT_TRUE(c->register_kv(small.layout, small.allocations)) << i;
  expect_error(c->register_kv(small.layout, small.allocations), ErrorCode::kNoRoom,
               {"holds 64 KV registrations already"});
  EXPECT_EQ(footprint(pid), (Footprint{connected.fds, base.memfd_maps + 64}))
      << describe(footprint(pid));
  c.reset();
  EXPECT_TRUE(footprint_returns(pid, base))
      << describe(footprint(pid)) << ", before " << describe(base);
  EXPECT_TRUE(n.node.running());
}

// A store request framed by hand, naming registration `kv` (a client sends only its own).
std::string raw_store(std::uint64_t kv) {
  return local_rig::pack([kv](auto& pk) {
    pk.pack_map(4);
    pk.pack(std::string("op"));
    pk.pack(std::string("store"));
    pk.pack(std::string("kv"));
    pk.pack(kv);
    pk.pack(std::string("hashes"));
    pk.pack(std::vector<std::int64_t>{1});
    pk.pack(std::string("block_ids"));
    pk.pack(std::vector<std::uint32_t>{0});
  });
}

TEST(KvEngine, EveryValidationErrorIsAnsweredClearlyAndTheNodeKeepsServing) {
  const CacheSpec spec{Preset::kVllm, 64, 16};
  Registered e("kvbad", spec);
  ASSERT_TRUE(e.ready());
  LocalClient& c = *e.c;
  const auto tokens = token_range(kTotal, 5000);
  const auto table = random_blocks(64, kChunks, 7);
  const auto ref = reference_chunks(e.cache->layout, table, kTotal);
  expect_reply(store_when_ready(c, transfer(e.kv, ChunkKeys::of_tokens(tokens), table)), kChunks,
               kTotal);
  const pid_t pid = e.n.node.pid();
  const Footprint registered = settled_footprint(pid);
  const auto by_tokens = [&](std::vector<std::uint32_t> t) {
    return transfer(e.kv, ChunkKeys::of_tokens(tokens), std::move(t));
  };

  // Block tables (checked by the node).
  auto bad = table;
  bad[3] = 64;
  expect_error(c.store(by_tokens(bad)), ErrorCode::kInvalid,
               {"request.block_ids[3]: 64 is out of range (num_blocks 64)"});
  bad = table;
  bad[5] = 1000;
  expect_error(c.load(by_tokens(bad)), ErrorCode::kInvalid, {"block_ids[5]: 1000 is out of range"});
  expect_error(c.store(by_tokens({table.begin(), table.end() - 1})), ErrorCode::kInvalid,
               {"request.block_ids: 5 blocks", "87 tokens"});
  const auto hashes = c.hashes(tokens).value();
  expect_error(c.store(transfer(e.kv, ChunkKeys::of_hashes(hashes), table, 200)),
               ErrorCode::kInvalid, {"request.num_tokens: 200 tokens for 6 chunks of 16"});
  expect_error(c.store(transfer(e.kv, ChunkKeys::of_tokens(tokens), table, 87)),
               ErrorCode::kInvalid, {"request.num_tokens: only with hashes"});
  KvTransfer t = by_tokens(table);
  t.retrieve = true;
  expect_error(c.store(t), ErrorCode::kInvalid, {"request.retrieve: only with load"});
  t = by_tokens(table);
  t.wait_event = client::CudaIpcHandle{};
  expect_error(c.store(t), ErrorCode::kInvalid, {"CUDA events need GPU copies"});
  t.wait_event.reset();
  t.done_event = client::CudaIpcHandle{};
  expect_error(c.load(t), ErrorCode::kInvalid, {"CUDA events need GPU copies"});
  // An unknown registration: the client knows none, nor (asked directly) does the node.
  expect_error(c.store(transfer(e.kv + 1000, ChunkKeys::of_tokens(tokens), table)),
               ErrorCode::kNotFound, {"no KV registration"});
  test::RawLocalSocket raw(e.n.node.socket());
  local_rig::expect_error(local_rig::ask(raw, raw_store(12345)), to_string(ErrorCode::kNotFound),
                          "request.kv: no KV registration 12345 on this connection");
  raw.close();

  // Registrations.
  const KvAllocation& mine = e.cache->allocations[0];
  std::vector<client::KvBuffer> four;  // 4 of the 8 layers: a chunk of 131072 bytes
  for (std::size_t l = 0; l < 4; ++l)
    four.push_back({mine.base, mine.bytes, kPad + l * 2 * tensor_bytes(spec)});
  const KvLayout half =
      client::vllm_flash_attn_layout({64, 16, kHeads, kHeadSize, kElem}, four).value();
  expect_error(c.register_kv(half, e.cache->allocations), ErrorCode::kInvalid,
               {"is 131072 bytes", "pool pages are 262144 bytes"});
  KvLayout outside = e.cache->layout;
  outside.layers[2].v.offset += mine.bytes;
  expect_error(c.register_kv(outside, e.cache->allocations), ErrorCode::kInvalid,
               {"layers[2].v.block_stride", "past the allocation"});
  KvLayout shifted = e.cache->layout;
  shifted.layers[1].k.base += 4096;
  shifted.layers[1].k.offset -= 4096;
  shifted.layers[1].k.allocation_bytes -= 4096;
  expect_error(c.register_kv(shifted, e.cache->allocations), ErrorCode::kInvalid,
               {"layers[1].k.base: not the base of any allocation given"});
  KvLayout larger = e.cache->layout;  // claims 1 MiB more than the memfd holds
  for (auto& l : larger.layers)
    l.k.allocation_bytes = l.v.allocation_bytes = mine.bytes + (1 << 20);
  KvAllocation beyond = mine;
  beyond.bytes += 1 << 20;
  expect_error(c.register_kv(larger, std::vector<KvAllocation>{beyond}), ErrorCode::kInvalid,
               {"allocations[0].bytes: " + std::to_string(beyond.bytes),
                "the file holds " + std::to_string(mine.bytes)});
  {
    UniqueFd unsealed(::memfd_create("kvnode-kv-unsealed", MFD_CLOEXEC));
    ASSERT_TRUE(unsealed && ::ftruncate(unsealed.get(), static_cast<off_t>(mine.bytes)) == 0);
    void* p = ::mmap(nullptr, mine.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, unsealed.get(), 0);
    ASSERT_NE(p, MAP_FAILED);
    KvAllocation a = mine;
    a.base = static_cast<std::byte*>(p);
    a.fd = unsealed.get();
    const KvLayout over = layout_over(spec, {a.base}).value();
    expect_error(c.register_kv(over, std::vector<KvAllocation>{a}), ErrorCode::kInvalid,
                 {"allocations[0]", "F_SEAL_SHRINK"});
    ::munmap(p, mine.bytes);
  }
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  const UniqueFd pipe_read(pipe_fds[0]), pipe_write(pipe_fds[1]);
  KvAllocation not_memory = mine;
  not_memory.fd = pipe_read.get();
  expect_error(c.register_kv(e.cache->layout, std::vector<KvAllocation>{not_memory}),
               ErrorCode::kInvalid, {"allocations[0]: the descriptor is not a memory file"});
  KvAllocation gpu = mine;  // GPU KV against a host pool: refused before any CUDA call
  gpu.kind = client::KvMemoryKind::kCudaIpc;
  gpu.fd = -1;
  expect_error(c.register_kv(e.cache->layout, std::vector<KvAllocation>{gpu}), ErrorCode::kInvalid,
               {"needs a pinned or device pool"});

  // Still serving, on the same connection, with nothing left of the refused registrations.
  ASSERT_TRUE(e.n.node.running()) << e.n.node.log();
  EXPECT_TRUE(footprint_returns(pid, registered))
      << describe(footprint(pid)) << ", before " << describe(registered);
  e.cache->fill(9);
  const auto before = e.cache->snapshot();
  const auto into = random_blocks(64, kChunks, 8);
  expect_reply(c.load(by_tokens(into)), kChunks, kTotal);
  EXPECT_EQ(load_difference(*e.cache, before, into, ref, kTotal), "");
}

}  // namespace
}  // namespace kvnode::node
