// load(retrieve=true) with real processes: an engine stores its KV by block table at node A, and
// a load at node B (which holds nothing) first pulls the chunks from A through the controller's
// P2P lookup, then scatters them into the engine's blocks: every byte as stored.
#include <algorithm>
#include <numeric>
#include <random>

#include "kvnode/client/kv_layout.hpp"
#include "kvnode/client/kv_memory.hpp"
#include "kvnode/client/local_client.hpp"
#include "node_process.hpp"

namespace kvnode::node {
namespace {

using namespace proc;
namespace kc = client;

// 8 layers, 8 KV heads of 64 bf16: a 16-token chunk is the test nodes' 256 KiB page.
constexpr std::uint32_t kBlocks = 64, kBlockSize = 16;
constexpr kc::KvCacheShape kShape{kBlocks, kBlockSize, 8, 64, 2};
constexpr std::size_t kLayerBytes = 2ull * kBlocks * kBlockSize * 8 * 64 * 2;

std::unique_ptr<kc::LocalClient> connect(const NodeProcess& n) {
  auto c = kc::LocalClient::connect(n.socket());
  EXPECT_TRUE(c) << c.error().message;
  return c ? std::move(c).value() : nullptr;
}

TEST(KvRetrieve, ALoadPullsWhatItsNodeLacksFromAPeerFirst) {
  auto ctl = start_controller([](controller::ControllerConfig& c) { c.hashing.chunk_size = 16; });
  NodeProcess a("kvr-A", ctl->ports().pull, ctl->ports().reply);
  NodeProcess b("kvr-B", ctl->ports().pull, ctl->ports().reply);
  ASSERT_TRUE(a.up()) << a.log();
  ASSERT_TRUE(b.up()) << b.log();

  auto memory = kc::HostKvMemory::create(8 * kLayerBytes, "kv-retrieve-test");
  ASSERT_TRUE(memory);
  std::mt19937 rng(11);
  for (std::size_t i = 0; i < memory->size(); ++i) memory->data()[i] = std::byte(rng() | 1);
  std::vector<kc::KvBuffer> layers;
  for (std::size_t l = 0; l < 8; ++l)
    layers.push_back({memory->data(), memory->size(), l * kLayerBytes});
  auto layout = kc::vllm_flash_attn_layout(kShape, layers);
  ASSERT_TRUE(layout) << layout.error().message;
  const kc::KvAllocation shared = memory->allocation();

  auto at_a = connect(a);
  auto at_b = connect(b);
  ASSERT_TRUE(at_a && at_b);
  auto kv_a = at_a->register_kv(*layout, std::span(&shared, 1));
  auto kv_b = at_b->register_kv(*layout, std::span(&shared, 1));
  ASSERT_TRUE(kv_a) << kv_a.error().message;
  ASSERT_TRUE(kv_b) << kv_b.error().message;

  std::vector<std::int64_t> tokens(64);  // 4 chunks
  std::iota(tokens.begin(), tokens.end(), 5000);
  std::vector<std::uint32_t> all(kBlocks);
  std::iota(all.begin(), all.end(), 0u);
  std::shuffle(all.begin(), all.end(), rng);
  const std::vector<std::uint32_t> from(all.begin(), all.begin() + 4);
  const std::vector<std::uint32_t> to(all.begin() + 4, all.begin() + 8);

  kc::KvTransfer t;
  t.kv = *kv_a;
  t.keys = kc::ChunkKeys::of_tokens(tokens);
  t.block_ids = from;
  auto stored = at_a->store(t);
  ASSERT_TRUE(stored) << stored.error().message;
  ASSERT_EQ(stored->chunks, 4u);

  // The controller hears of A's admits in batches: ask until B's load finds them there.
  t.kv = *kv_b;
  t.block_ids = to;
  t.retrieve = true;
  Result<kc::KvTransferReply> loaded = make_error("not asked");
  EXPECT_TRUE(eventually(
      [&] {
        loaded = at_b->load(t);
        return loaded && loaded->chunks == 4;
      },
      30s))
      << (loaded ? std::to_string(loaded->chunks) : loaded.error().message) << b.log();
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->pulled, 4u);
  EXPECT_EQ(loaded->tokens, 64u);
  EXPECT_EQ(loaded->peer.empty(), false);
  const std::size_t bytes = kc::chunk_bytes(*layout, 16).value();
  for (std::size_t c = 0; c < 4; ++c) {
    std::vector<std::byte> want(bytes), got(bytes);
    ASSERT_TRUE(kc::gather(*layout, from, c * 16, 16, want));
    ASSERT_TRUE(kc::gather(*layout, to, c * 16, 16, got));
    EXPECT_EQ(want, got) << "chunk " << c;
  }
}

}  // namespace
}  // namespace kvnode::node
