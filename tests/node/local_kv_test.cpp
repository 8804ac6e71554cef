// store and load by block table against a LocalService in this process (the process-level suite
// is kv_engine_test): a round trip through other blocks, a store larger than the pool keeps its
// longest prefix, a load stops at the first missing chunk, and a chunk stored by block table is
// byte for byte what gather() makes of those blocks (KV_2LTD).
#include <algorithm>
#include <numeric>
#include <random>

#include "kvnode/client/kv_layout.hpp"
#include "kvnode/client/kv_memory.hpp"
#include "local_rig.hpp"

namespace kvnode::node {
namespace {

using namespace local_rig;

constexpr std::uint32_t kBlocks = 512;
constexpr std::uint32_t kBlockSize = 16;
constexpr std::size_t kTokensPerChunk = 256;  // the engine's default chunk size
constexpr std::size_t kBlocksPerChunk = kTokensPerChunk / kBlockSize;

// One layer, one head of 64 bf16: a 256-token chunk is the rig's 64 KiB page.
struct Cache {
  client::HostKvMemory memory;
  client::KvLayout layout;
};
Cache make_cache() {
  auto m = client::HostKvMemory::create(2ull * kBlocks * kBlockSize * 64 * 2, "local-kv-test");
  EXPECT_TRUE(m);
  const client::KvBuffer layer{m->data(), m->size(), 0};
  auto l = client::vllm_flash_attn_layout({kBlocks, kBlockSize, 1, 64, 2}, std::span(&layer, 1));
  EXPECT_TRUE(l) << l.error().message;
  std::mt19937 rng(7);
  for (std::size_t i = 0; i < m->size(); ++i) m->data()[i] = static_cast<std::byte>(rng());
  return {std::move(m).value(), std::move(l).value()};
}

std::vector<std::uint32_t> random_table(std::size_t n, unsigned seed) {
  std::vector<std::uint32_t> all(kBlocks);
  std::iota(all.begin(), all.end(), 0u);
  std::shuffle(all.begin(), all.end(), std::mt19937(seed));
  all.resize(n);
  return all;
}

std::vector<std::byte> gathered(const Cache& c, const std::vector<std::uint32_t>& table,
                                std::size_t chunk) {
  std::vector<std::byte> out(kBytes);
  const Status s = client::gather(c.layout, table, chunk * kTokensPerChunk, kTokensPerChunk, out);
  EXPECT_TRUE(s) << s.error().message;
  return out;
}

struct Rig {
  ServiceRig service;
  Cache cache = make_cache();
  std::unique_ptr<client::LocalClient> client = client_of(service.path());
  std::uint64_t kv = 0;
  explicit Rig(const std::string& name, std::size_t pages = 16) : service(name, {}, pages) {
    const client::KvAllocation a = cache.memory.allocation();
    auto r = client->register_kv(cache.layout, std::span(&a, 1));
    EXPECT_TRUE(r) << r.error().message;
    kv = r ? *r : 0;
  }
  Result<client::KvTransferReply> run(bool store, const std::vector<std::int64_t>& toks,
                                      const std::vector<std::uint32_t>& table) {
    client::KvTransfer t;
    t.kv = kv;
    t.keys = ChunkKeys::of_tokens(toks);
    t.block_ids = table;
    return store ? client->store(t) : client->load(t);
  }
};

TEST(LocalKv, StoreThenLoadIntoOtherBlocksGivesBackEveryByte) {
  Rig rig("kv-roundtrip");
  const std::vector<std::int64_t> toks = tokens(3 * kTokensPerChunk);
  const auto from = random_table(3 * kBlocksPerChunk, 1);
  std::vector<std::vector<std::byte>> want;
  for (std::size_t i = 0; i < 3; ++i) want.push_back(gathered(rig.cache, from, i));
  auto stored = rig.run(true, toks, from);
  ASSERT_TRUE(stored) << stored.error().message;
  EXPECT_EQ(stored->chunks, 3u);
  EXPECT_EQ(stored->tokens, toks.size());
  // A chunk means the same bytes as a put's: KV_2LTD of those blocks.
  std::vector<std::byte> got(3 * kBytes);
  ASSERT_EQ(or0(rig.client->get(ChunkKeys::of_tokens(toks), got)), 3u);
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_TRUE(std::equal(want[i].begin(), want[i].end(), got.begin() + i * kBytes)) << i;

  for (std::uint32_t b : from)  // the engine reuses the blocks
    std::memset(rig.cache.memory.data() + b * kBlockSize * 128, 0, kBlockSize * 128);
  const auto to = random_table(3 * kBlocksPerChunk, 2);
  const std::vector<std::byte> untouched(rig.cache.memory.data(),
                                         rig.cache.memory.data() + rig.cache.memory.size());
  auto loaded = rig.run(false, toks, to);
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->chunks, 3u);
  EXPECT_EQ(loaded->tokens, toks.size());
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(gathered(rig.cache, to, i), want[i]) << i;
  // Nothing outside the loaded blocks changed.
  std::vector<bool> loaded_block(kBlocks, false);
  for (std::uint32_t b : to) loaded_block[b] = true;
  const std::size_t half = std::size_t{kBlocks} * kBlockSize * 128;  // K, then V
  for (std::size_t i = 0; i < untouched.size(); ++i) {
    const std::size_t block = (i % half) / (kBlockSize * 128);
    if (!loaded_block[block] && untouched[i] != rig.cache.memory.data()[i]) {
      ADD_FAILURE() << "byte " << i << " of block " << block << " changed";
      break;
    }
  }
}

TEST(LocalKv, AStoreLargerThanThePoolKeepsItsLongestPrefix) {
  Rig rig("kv-full", 4);
  const std::vector<std::int64_t> toks = tokens(6 * kTokensPerChunk);
  auto stored = rig.run(true, toks, random_table(6 * kBlocksPerChunk, 3));
  ASSERT_TRUE(stored) << stored.error().message;
  EXPECT_EQ(stored->chunks, 4u);
  EXPECT_EQ(stored->tokens, 4 * kTokensPerChunk);
  auto present = rig.client->contains(ChunkKeys::of_tokens(toks));
  ASSERT_TRUE(present);
  EXPECT_EQ(std::count(present->begin(), present->end(), true), 4);
  EXPECT_TRUE((*present)[0] && (*present)[3] && !(*present)[4]);
}

TEST(LocalKv, ALoadStopsAtTheFirstMissingChunk) {
  Rig rig("kv-hole");
  const std::vector<std::int64_t> toks = tokens(4 * kTokensPerChunk);
  const auto table = random_table(4 * kBlocksPerChunk, 4);
  ASSERT_TRUE(rig.run(true, toks, table));
  auto hashes = rig.client->hashes(toks);
  ASSERT_TRUE(hashes);
  rig.service.store().remove((*hashes)[2]);
  auto loaded = rig.run(false, toks, table);
  ASSERT_TRUE(loaded) << loaded.error().message;
  EXPECT_EQ(loaded->chunks, 2u);
  EXPECT_EQ(loaded->tokens, 2 * kTokensPerChunk);
  // By hashes with a token count: the same answer.
  client::KvTransfer t;
  t.kv = rig.kv;
  t.keys = ChunkKeys::of_hashes(*hashes);
  t.block_ids = table;
  t.num_tokens = toks.size();
  auto by_hash = rig.client->load(t);
  ASSERT_TRUE(by_hash) << by_hash.error().message;
  EXPECT_EQ(by_hash->tokens, 2 * kTokensPerChunk);
}

TEST(LocalKv, BadRequestsAreRefusedByFieldAndChangeNothing) {
  Rig rig("kv-bad");
  const std::vector<std::int64_t> toks = tokens(2 * kTokensPerChunk);
  auto table = random_table(2 * kBlocksPerChunk, 5);
  table[9] = kBlocks;  // out of range
  auto r = rig.run(true, toks, table);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kInvalid);
  EXPECT_NE(r.error().message.find("block_ids[9]: 512 is out of range"), std::string::npos)
      << r.error().message;
  table.resize(kBlocksPerChunk);  // covers one chunk of two
  r = rig.run(true, toks, table);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("request.block_ids: 16 blocks"), std::string::npos)
      << r.error().message;
  EXPECT_EQ(rig.service.store().counters().chunks, 0u) << "nothing was stored";

  client::KvTransfer t;
  t.kv = rig.kv;
  t.keys = ChunkKeys::of_tokens(toks);
  t.block_ids = random_table(2 * kBlocksPerChunk, 6);
  t.wait_event.emplace();
  r = rig.client->store(t);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("wait_event"), std::string::npos) << r.error().message;
  t.wait_event.reset();
  t.kv = 999;
  r = rig.client->store(t);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kNotFound);
  EXPECT_TRUE(rig.client->info().chunk_bytes > 0) << "the connection still serves";
  EXPECT_EQ(rig.client->info().memory, "host");
}

}  // namespace
}  // namespace kvnode::node
