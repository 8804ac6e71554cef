// Tensor parallelism across instances: two instances of two TP ranks each (four nodes with worker
// ids 0 and 1, a controller, real sockets, UCX over loopback). Each rank holds its own shard of a
// chunk (bytes of its own here, so a copy tells which rank it came from). Rank r deals only with
// rank r of another instance: the controller's P2P lookup from B rank r names A rank r, retrieval
// pulls A rank r's bytes (never the other rank's), and an orchestrator move A->B carries rank r's
// chunks to B rank r. Over tcp, over UCX's default same-host transports, and same-host (rank r
// maps rank r's pool).
#include "node_rig.hpp"

namespace kvnode::node {
namespace {

using namespace rig;

std::vector<std::byte> shard_bytes(ChunkHash h, std::int64_t rank) {
  return chunk_bytes(h ^ rank);
}

Json post_json(int port, const std::string& path, const Json& body) {
  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(30s);
  auto r = http.Post(path, body.dump(), "application/json");
  if (!r) return Json{{"failed", path + ": no answer"}};
  return Json::parse(r->body, nullptr, false);
}

class TpRanksTest : public ::testing::TestWithParam<Transport> {};

TEST_P(TpRanksTest, RankRLooksUpPullsAndMovesOnlyWithRankR) {
  auto ctl = start_controller();
  const int http = ctl->ports().http;
  auto rank = [&](const std::string& instance, std::int64_t r) {
    NodeOptions o = TwoNodes::options(GetParam());
    o.worker_id = r;
    return std::make_unique<Node>(ctl->ports(), instance, GetParam().tls, o);
  };
  const std::unique_ptr<Node> a[2] = {rank("inst-A", 0), rank("inst-A", 1)};
  const std::unique_ptr<Node> b[2] = {rank("inst-B", 0), rank("inst-B", 1)};
  ASSERT_TRUE(eventually(
      [&] { return a[0]->settled() && a[1]->settled() && b[0]->settled() && b[1]->settled(); }));
  // B rank r pulls from A rank r (B dials, so B maps A's pool); A rank r moves to B rank r.
  const MappedPath pulls[2] = {MappedPath(*b[0], *a[0], GetParam(), 9'000'000),
                               MappedPath(*b[1], *a[1], GetParam(), 9'100'000)};
  const MappedPath pushes[2] = {MappedPath(*a[0], *b[0], GetParam(), 9'200'000),
                                MappedPath(*a[1], *b[1], GetParam(), 9'300'000)};
  for (std::int64_t r : {0, 1})
    ASSERT_TRUE(pulls[r].ready() && pushes[r].ready()) << "rank " << r << " mapped no pool";
  std::vector<std::byte> out(kChunkBytes);
  auto holds_shard = [&](Node& n, ChunkHash h, std::int64_t r) {
    if (!n.store().contains(h)) return false;
    const Result<std::size_t> got = n.engine().get(h, out);
    return got && *got == kChunkBytes && out == shard_bytes(h, r);
  };

  // Retrieval. A rank 0 holds the first 6 chunks, rank 1 the first 4 (their shards).
  std::vector<std::int64_t> tokens(8 * 256);
  std::iota(tokens.begin(), tokens.end(), 50000);
  const std::vector<ChunkHash> hashes = a[0]->engine().hashes(tokens).value();
  const std::size_t held[2] = {6, 4};
  for (std::int64_t r : {0, 1})
    for (std::size_t i = 0; i < held[r]; ++i)
      ASSERT_TRUE(a[r]->engine().put(hashes[i], shard_bytes(hashes[i], r)));
  for (std::int64_t r : {0, 1}) {
    // The controller names A rank r, with rank r's hits, to B rank r.
    wire::P2PLayout where;
    ASSERT_TRUE(eventually([&] {
      wire::BatchedP2PLookupMsg q{{}, "inst-B", r};
      for (ChunkHash h : hashes) q.hashes.emplace_back(h);
      auto reply = b[r]->agent().call(q);
      const auto* ret = reply ? std::get_if<wire::BatchedP2PLookupRetMsg>(&*reply) : nullptr;
      if (!ret || ret->layout_info.empty()) return false;
      where = ret->layout_info[0];
      return where.num_hit_chunks == static_cast<std::int64_t>(held[r]);
    })) << "rank "
        << r << ": " << where.instance_id << " " << where.peer_init_url << " "
        << where.num_hit_chunks;
    EXPECT_EQ(where.instance_id, "inst-A");
    EXPECT_EQ(where.location, kCpu);
    EXPECT_EQ(where.peer_init_url, a[r]->url()) << "rank " << r << " is sent to A rank " << r;

    const RetrieveResult got = b[r]->retrieve(tokens);
    EXPECT_TRUE(got.error.empty()) << got.error;
    EXPECT_EQ(got.peer, a[r]->url()) << "rank " << r << " pulled from A rank " << r;
    EXPECT_EQ(got.chunks_local, 0u);
    EXPECT_EQ(got.chunks_pulled, held[r]);
    EXPECT_EQ(got.tokens, held[r] * 256);
    pulls[r].expect_copied(held[r] * kChunkBytes);
    for (std::size_t i = 0; i < hashes.size(); ++i) {
      if (i < held[r]) {
        EXPECT_TRUE(holds_shard(*b[r], hashes[i], r))
            << "B rank " << r << " chunk " << i << ": rank " << r << "'s bytes";
      } else {
        EXPECT_FALSE(b[r]->store().contains(hashes[i]))
            << "B rank " << r << " chunk " << i << " is not rank " << r << "'s";
      }
    }
    EXPECT_EQ(a[r]->store().counters().chunks, held[r]) << "retrieval copies";
  }

  // A move of what both ranks hold: rank r's shards land at B rank r, and leave A.
  std::vector<std::int64_t> moved_tokens(8 * 256);
  std::iota(moved_tokens.begin(), moved_tokens.end(), 60000);
  const std::vector<ChunkHash> moved_hashes = a[0]->engine().hashes(moved_tokens).value();
  for (std::int64_t r : {0, 1})
    for (ChunkHash h : moved_hashes) ASSERT_TRUE(a[r]->engine().put(h, shard_bytes(h, r)));
  auto move = [&](const std::vector<std::int64_t>& t) {
    return post_json(http, "/move",
                     Json{{"old_position", {"inst-A", kCpu}},
                          {"new_position", {"inst-B", kCpu}},
                          {"tokens", t},
                          {"should_copy", false}});
  };
  const Json moved = move(moved_tokens);
  EXPECT_EQ(moved.value("num_tokens", -1), 2048) << moved.dump();
  for (std::int64_t r : {0, 1}) {
    pushes[r].expect_copied(8 * kChunkBytes);
    for (ChunkHash h : moved_hashes) {
      EXPECT_TRUE(holds_shard(*b[r], h, r))
          << "B rank " << r << " holds A rank " << r << "'s shard of " << h;
      EXPECT_FALSE(a[r]->store().contains(h));
    }
  }
  EXPECT_TRUE(eventually([&] {
    return post_json(http, "/lookup", Json{{"tokens", moved_tokens}})["layout_info"] ==
           Json{{"inst-B", {kCpu, 2048}}};
  })) << post_json(http, "/lookup", Json{{"tokens", moved_tokens}}).dump();

  // Ranks that hold different prefixes: each moves its own (3 and 2 chunks, to the same rank),
  // and the controller reports the disagreement instead of a number.
  std::vector<std::int64_t> uneven(4 * 256);
  std::iota(uneven.begin(), uneven.end(), 70000);
  const std::vector<ChunkHash> uneven_hashes = a[0]->engine().hashes(uneven).value();
  const std::size_t uneven_held[2] = {3, 2};
  for (std::int64_t r : {0, 1})
    for (std::size_t i = 0; i < uneven_held[r]; ++i)
      ASSERT_TRUE(a[r]->engine().put(uneven_hashes[i], shard_bytes(uneven_hashes[i], r)));
  const Json disagreed = move(uneven);
  EXPECT_FALSE(disagreed.contains("num_tokens")) << disagreed.dump();
  EXPECT_NE(disagreed.dump().find("worker 0: 768, worker 1: 512"), std::string::npos)
      << disagreed.dump();
  for (std::int64_t r : {0, 1}) {
    for (std::size_t i = 0; i < uneven_hashes.size(); ++i) {
      EXPECT_EQ(holds_shard(*b[r], uneven_hashes[i], r), i < uneven_held[r])
          << "B rank " << r << " chunk " << i;
      EXPECT_FALSE(a[r]->store().contains(uneven_hashes[i])) << "A rank " << r << " chunk " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TpRanks, TpRanksTest, ::testing::Values(kTcp, kShm, kSameHost),
                         transport_name);

}  // namespace
}  // namespace kvnode::node
