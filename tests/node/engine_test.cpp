// The engine's operations on a real store, and the node flow end to end: engine + chunk store +
// worker agent against the real controller (in-process, real sockets), driven through the
// controller's HTTP API as an orchestrator drives it.
#include "control_handler.hpp"
#include "node_rig.hpp"

namespace kvnode::node {
namespace {

using namespace rig;
constexpr std::size_t kSmallChunk = 4096;  // the unit test's pool

gpu::ChunkPool make_pool(std::size_t pages) {
  gpu::PoolOptions o;
  o.page_bytes = kSmallChunk;
  o.pages = pages;
  return std::move(gpu::ChunkPool::create(o)).value();
}

std::vector<std::int64_t> tokens(std::int64_t first, std::size_t n) {
  std::vector<std::int64_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(Engine, LookupPinClearHealthAndWhatItRefuses) {
  gpu::ChunkPool pool = make_pool(8);
  ChunkStore store(pool, kCpu, nullptr);
  Engine engine(store);
  const ControlHandler control(engine, nullptr);  // the controller's requests, without a mover
  const auto t = tokens(1000, 1124);              // 4 full chunks + 100 tokens
  const std::vector<ChunkHash> h = engine.hashes(t).value();
  ASSERT_EQ(h.size(), 5u);
  for (std::size_t i = 0; i < 3; ++i) ASSERT_TRUE(engine.put(h[i], chunk_bytes(h[i], kSmallChunk)));
  EXPECT_EQ(engine.lookup_tokens(t), 768u);
  ASSERT_TRUE(engine.put(h[3], chunk_bytes(h[3], kSmallChunk)));
  ASSERT_TRUE(engine.put(h[4], chunk_bytes(h[4], kSmallChunk)));
  EXPECT_EQ(engine.lookup_tokens(t), 1124u) << "the partial last chunk ends at the last token";

  std::vector<std::byte> out(kSmallChunk);
  EXPECT_EQ(engine.get(h[2], out).value(), kSmallChunk);
  EXPECT_EQ(out, chunk_bytes(h[2], kSmallChunk));
  EXPECT_EQ(engine.get(12345, out).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(engine.put(99, std::vector<std::byte>(10)).error().code, ErrorCode::kInvalid)
      << "not a whole chunk";

  const wire::Msg pinned = control(wire::PinWorkerMsg{"pin-1", kCpu, tokens(1000, 512)});
  EXPECT_EQ(std::get<wire::PinWorkerRetMsg>(pinned).num_tokens, 512);
  EXPECT_EQ(std::get<wire::PinWorkerRetMsg>(control(wire::PinWorkerMsg{"p", "LocalDiskBackend", t}))
                .num_tokens,
            0);
  // Clear removes the unpinned chunks only: 5 stored, the first 2 pinned.
  EXPECT_EQ(std::get<wire::ClearWorkerRetMsg>(control(wire::ClearWorkerMsg{"c", kCpu})).num_tokens,
            768);
  EXPECT_EQ(engine.lookup_tokens(t), 512u);
  EXPECT_EQ(std::get<wire::HealthWorkerRetMsg>(control(wire::HealthWorkerMsg{"h"})).error_code, 0);
  for (const wire::Msg& m :
       {wire::Msg{wire::CompressWorkerMsg{"x", "cachegen", kCpu, std::nullopt}},
        wire::Msg{wire::DecompressWorkerMsg{"x", "cachegen", kCpu, std::nullopt}},
        wire::Msg{wire::CheckFinishWorkerMsg{"x"}},
        wire::Msg{wire::MoveWorkerMsg{"x", kCpu, {"127.0.0.1:1", kCpu}, t, false}}}) {
    const wire::Msg reply = control(m);
    const auto* e = std::get_if<wire::ErrorMsg>(&reply);
    ASSERT_NE(e, nullptr);
    EXPECT_TRUE(e->error.starts_with("kvnode: ")) << e->error;
  }
  engine.freeze(true);
  EXPECT_NE(engine.put(7, chunk_bytes(7, kSmallChunk)).error().message.find("frozen"),
            std::string::npos);
  const wire::Msg refused = control(wire::ClearWorkerMsg{"c", kCpu});
  ASSERT_TRUE(std::holds_alternative<wire::ErrorMsg>(refused))
      << "a clear would emit EVICTs the sync drops";
  EXPECT_EQ(engine.clear().error().code, ErrorCode::kFrozen);
  EXPECT_EQ(engine.lookup_tokens(t), 512u);
  engine.freeze(false);
  EXPECT_TRUE(engine.put(7, chunk_bytes(7, kSmallChunk)));
}

TEST(NodeFlow, StoredChunksAreFoundClearedAndPinnedThroughTheController) {
  auto ctl = start_controller();
  Node node(ctl->ports(), "inst-A", "tcp");
  ASSERT_TRUE(eventually([&] { return node.agent().counters().full_syncs_completed >= 1; }));

  httplib::Client http("127.0.0.1", ctl->ports().http);
  http.set_read_timeout(10s);
  auto post = [&](const std::string& path, const nlohmann::json& body) {
    auto r = http.Post(path, body.dump(), "application/json");
    return r && r->status == 200 ? nlohmann::json::parse(r->body)
                                 : nlohmann::json{{"failed", path}};
  };
  const auto t = tokens(5000, 1024);  // 4 chunks
  const std::vector<ChunkHash> hashes = node.engine().hashes(t).value();
  for (ChunkHash h : hashes) ASSERT_TRUE(node.engine().put(h, chunk_bytes(h)));
  const nlohmann::json lookup{{"tokens", t}};
  ASSERT_TRUE(eventually([&] {
    return post("/lookup", lookup)["layout_info"].dump() ==
           R"({"inst-A":["LocalCPUBackend",1024]})";
  })) << post("/lookup", lookup).dump();

  // Pin the first two chunks, then clear: the controller fans out to the node's REP port, the
  // node evicts the unpinned two and reports it, and the controller's answer says so.
  const nlohmann::json pin{
      {"instance_id", "inst-A"}, {"location", kCpu}, {"tokens", tokens(5000, 512)}};
  EXPECT_EQ(post("/pin", pin)["num_tokens"], 512);
  EXPECT_EQ(
      post("/clear", nlohmann::json{{"instance_id", "inst-A"}, {"location", kCpu}})["num_tokens"],
      512);
  ASSERT_TRUE(eventually([&] {
    return post("/lookup", lookup)["layout_info"].dump() == R"({"inst-A":["LocalCPUBackend",512]})";
  })) << post("/lookup", lookup).dump();
  EXPECT_EQ(node.store().counters().chunks, 2u);
}

}  // namespace
}  // namespace kvnode::node
