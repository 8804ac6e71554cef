// A retrieve into a full node (issue 19 item 3's rule for retrieves): the pages for the chunks
// it pulls come only from chunks older than the retrieve, never from the leading chunks it held
// already (or pulled), so it ends with the longest prefix that fits. Before, its reservations
// evicted least recently used first, and once the other chunks were gone they took the node's
// own leading chunks: a prefix with a hole, worth nothing.
#include "node_rig.hpp"

namespace kvnode::node {
namespace {

using namespace rig;

TEST(RetrieveRoom, ARetrieveIntoAFullNodeKeepsTheChunksItHeldAndPullsWhatFits) {
  TwoNodes rig("tcp");  // 32 pages each: A holds chunks 4..35
  ASSERT_TRUE(rig.synced());
  Node& a = rig.a;
  Node& b = rig.b;
  std::vector<std::int64_t> tokens(40 * 256);
  std::iota(tokens.begin(), tokens.end(), 90000);
  const std::vector<ChunkHash> hashes = a.engine().hashes(tokens).value();
  for (std::size_t i = 4; i < 36; ++i)
    ASSERT_TRUE(a.engine().put(hashes[i], chunk_bytes(hashes[i])));
  // B: the first 4 chunks, then 28 others: full.
  for (std::size_t i = 0; i < 4; ++i)
    ASSERT_TRUE(b.engine().put(hashes[i], chunk_bytes(hashes[i])));
  std::vector<std::int64_t> other(28 * 256);
  std::iota(other.begin(), other.end(), 500000);
  for (ChunkHash h : b.engine().hashes(other).value())
    ASSERT_TRUE(b.engine().put(h, chunk_bytes(h)));
  ASSERT_EQ(b.store().counters().chunks, 32u);
  ASSERT_TRUE(eventually([&] {  // the controller has heard of A's chunks
    wire::BatchedP2PLookupMsg q{{}, "inst-B", 0};
    for (std::size_t i = 4; i < hashes.size(); ++i) q.hashes.emplace_back(hashes[i]);
    auto r = b.agent().call(q);
    const auto* ret = r ? std::get_if<wire::BatchedP2PLookupRetMsg>(&*r) : nullptr;
    return ret && !ret->layout_info.empty() && ret->layout_info[0].num_hit_chunks == 32;
  }));
  const RetrieveResult r = b.retrieve(tokens);
  EXPECT_EQ(r.chunks_local, 4u);
  EXPECT_EQ(r.chunks_pulled, 28u) << r.error;  // the 28 older chunks made room, nothing else
  const std::size_t leading = b.store().leading(hashes);
  EXPECT_EQ(leading, 32u) << "B must hold the longest prefix that fits, from chunk 0";
  std::vector<std::byte> out(kChunkBytes);
  for (std::size_t i = 0; i < leading; ++i) {
    ASSERT_EQ(b.engine().get(hashes[i], out).value(), kChunkBytes);
    ASSERT_EQ(out, chunk_bytes(hashes[i])) << "chunk " << i;
  }
}

}  // namespace
}  // namespace kvnode::node
