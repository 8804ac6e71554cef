// Cross-node moves and P2P retrieval end to end, in one process with real sockets: a controller
// and two nodes (node_rig.hpp). The orchestrator's HTTP /move (and kvctl, as a process) drives
// it; lookups through the controller and the destination's bytes check it. Over tcp, over UCX's
// default transports (shared memory), and same-host (each node maps its peer's pool).
#include <future>

#include "node_rig.hpp"
#include "support/child_process.hpp"

namespace kvnode::node {
namespace {

using namespace rig;

class Moves : public ::testing::TestWithParam<Transport> {};

TEST_P(Moves, AMoveCarriesEveryByteAndOnlyConfirmedChunksLeaveTheSource) {
  TwoNodes rig(GetParam());
  ASSERT_TRUE(rig.synced());
  auto& ctl = rig.ctl;
  Node& a = rig.a;
  Node& b = rig.b;
  const MappedPath a_to_b(a, b, GetParam(), 9'000'000), b_to_a(b, a, GetParam(), 9'500'000);
  ASSERT_TRUE(a_to_b.ready() && b_to_a.ready()) << "the nodes never mapped each other's pools";

  httplib::Client http("127.0.0.1", ctl->ports().http);
  http.set_read_timeout(30s);
  auto post = [&](const std::string& path, const Json& body) {
    auto r = http.Post(path, body.dump(), "application/json");
    return r && r->status == 200 ? Json::parse(r->body) : Json{{"failed", r ? r->body : path}};
  };
  std::vector<std::int64_t> tokens(8 * 256);
  std::iota(tokens.begin(), tokens.end(), 40000);
  const std::vector<ChunkHash> hashes = a.engine().hashes(tokens).value();
  for (ChunkHash h : hashes) ASSERT_TRUE(a.engine().put(h, chunk_bytes(h)));
  const Json lookup{{"tokens", tokens}};
  ASSERT_TRUE(eventually([&] {
    return post("/lookup", lookup)["layout_info"].dump() ==
           R"({"inst-A":["LocalCPUBackend",2048]})";
  }));

  // B already holds chunk 3: it is neither re-sent nor re-admitted, and still counts as moved.
  ASSERT_TRUE(b.engine().put(hashes[3], chunk_bytes(hashes[3])));
  const Json moved = post("/move", Json{{"old_position", {"inst-A", kCpu}},
                                        {"new_position", {"inst-B", kCpu}},
                                        {"tokens", tokens}});  // should_copy defaults to false
  EXPECT_EQ(moved["num_tokens"], 2048) << moved.dump();
  a_to_b.expect_copied(7 * kChunkBytes);  // chunk 3 stayed
  std::vector<std::byte> out(kChunkBytes);
  for (ChunkHash h : hashes) {
    ASSERT_EQ(b.engine().get(h, out).value(), kChunkBytes);
    ASSERT_EQ(out, chunk_bytes(h)) << "chunk " << h << " at B";
  }
  EXPECT_EQ(a.store().counters().chunks, 0u) << "copy=false: every confirmed chunk left A";
  ASSERT_TRUE(eventually([&] {
    return post("/lookup", lookup)["layout_info"].dump() ==
           R"({"inst-B":["LocalCPUBackend",2048]})";
  })) << post("/lookup", lookup).dump();

  // And back with copy=true: both hold every chunk.
  const Json copied = post("/move", Json{{"old_position", {"inst-B", kCpu}},
                                         {"new_position", {"inst-A", kCpu}},
                                         {"tokens", tokens},
                                         {"should_copy", true}});
  EXPECT_EQ(copied["num_tokens"], 2048) << copied.dump();
  b_to_a.expect_copied(8 * kChunkBytes);
  EXPECT_EQ(a.store().counters().chunks, 8u);
  EXPECT_EQ(b.store().counters().chunks, 8u);
  for (ChunkHash h : hashes) {
    ASSERT_EQ(a.engine().get(h, out).value(), kChunkBytes);
    ASSERT_EQ(out, chunk_bytes(h));
  }
}

TEST_P(Moves, ADestinationWithoutRoomTakesWhatFitsAndTheSourceKeepsTheRest) {
  TwoNodes rig(GetParam());
  ASSERT_TRUE(rig.synced());
  auto& ctl = rig.ctl;
  Node& a = rig.a;
  Node& b = rig.b;
  const MappedPath a_to_b(a, b, GetParam(), 9'000'000);
  ASSERT_TRUE(a_to_b.ready()) << "A never mapped B's pool";
  // B: 28 of its 32 pages hold pinned chunks, so only 4 can be reserved.
  std::vector<ChunkHash> pinned;
  for (ChunkHash h = 1; h <= 28; ++h) {
    ASSERT_TRUE(b.engine().put(h, chunk_bytes(h)));
    pinned.push_back(h);
  }
  ASSERT_EQ(b.store().leading(pinned, "hold"), 28u);

  std::vector<std::int64_t> tokens(8 * 256);
  std::iota(tokens.begin(), tokens.end(), 90000);
  const std::vector<ChunkHash> hashes = a.engine().hashes(tokens).value();
  for (ChunkHash h : hashes) ASSERT_TRUE(a.engine().put(h, chunk_bytes(h)));
  httplib::Client http("127.0.0.1", ctl->ports().http);
  http.set_read_timeout(30s);
  auto r = http.Post("/move",
                     Json{{"old_position", {"inst-A", kCpu}},
                          {"new_position", {"inst-B", kCpu}},
                          {"tokens", tokens}}
                         .dump(),
                     "application/json");
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no reply");
  EXPECT_EQ(Json::parse(r->body)["num_tokens"], 1024) << "the 4 chunks B could take";
  a_to_b.expect_copied(4 * kChunkBytes);
  for (std::size_t i = 0; i < hashes.size(); ++i) {
    EXPECT_EQ(a.store().contains(hashes[i]), i >= 4)
        << "A keeps exactly what B did not confirm: " << i;
    EXPECT_EQ(b.store().contains(hashes[i]), i < 4) << i;
  }
  EXPECT_EQ(b.store().counters().reserved, 0u) << "no reservation left behind";
}

// A full sync reports the keys a node held when it froze, and the controller drops the node's
// events until the sync ends; so while frozen a node neither takes nor gives up a chunk. A move
// into a frozen node waits for the sync; a commit refused because a sync began mid-batch is
// pushed again; a frozen source keeps what it sent until its sync ends, then evicts it.
TEST_P(Moves, AFullSyncAtEitherEndChangesNothingTheSyncDoesNotReport) {
  TwoNodes rig(GetParam());
  ASSERT_TRUE(rig.synced());
  Node& a = rig.a;
  Node& b = rig.b;
  const MappedPath a_to_b(a, b, GetParam(), 9'000'000), b_to_a(b, a, GetParam(), 9'500'000);
  ASSERT_TRUE(a_to_b.ready() && b_to_a.ready()) << "the nodes never mapped each other's pools";
  httplib::Client http("127.0.0.1", rig.ctl->ports().http);
  http.set_read_timeout(60s);
  auto move = [&](const char* from, const char* to, const std::vector<std::int64_t>& tokens) {
    auto r = http.Post(
        "/move",
        Json{{"old_position", {from, kCpu}}, {"new_position", {to, kCpu}}, {"tokens", tokens}}
            .dump(),
        "application/json");
    return r && r->status == 200 ? Json::parse(r->body)
                                 : Json{{"failed", r ? r->body : "no reply"}};
  };
  std::vector<std::int64_t> tokens(8 * 256);
  std::iota(tokens.begin(), tokens.end(), 70000);
  const std::vector<ChunkHash> hashes = a.engine().hashes(tokens).value();
  for (ChunkHash h : hashes) ASSERT_TRUE(a.engine().put(h, chunk_bytes(h)));

  // Into a frozen destination: the move waits until the sync ends.
  b.engine().freeze(true);
  auto moving = std::async(std::launch::async, [&] { return move("inst-A", "inst-B", tokens); });
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(b.store().counters().chunks, 0u) << "nothing lands while B is frozen";
  b.engine().freeze(false);
  EXPECT_EQ(moving.get()["num_tokens"], 2048);
  EXPECT_EQ(b.store().counters().chunks, 8u);
  EXPECT_EQ(a.store().counters().chunks, 0u);
  a_to_b.expect_copied(8 * kChunkBytes);

  // A sync that begins between reserve and finish: the finish answers kFrozen and the reserved
  // page goes back.
  auto ask = [&](const peer::Request& q) {
    return peer::decode_answer(a.peers().on_ask("peer-x", peer::encode(q)).value()).value();
  };
  const auto reserved = std::get<peer::ReserveAnswer>(ask(peer::ReserveRequest{7, {424242}}));
  EXPECT_EQ(reserved.chunks.at(0).outcome, peer::ReserveOutcome::kPage) << "reserve: a page";
  a.engine().freeze(true);
  const auto finished = std::get<peer::FinishAnswer>(ask(peer::FinishRequest{7, {{424242, true}}}));
  EXPECT_EQ(finished.chunks.at(0), peer::FinishOutcome::kFrozen) << "finish while frozen";
  EXPECT_EQ(a.store().counters().reserved, 0u);
  EXPECT_FALSE(a.store().contains(424242));
  a.engine().freeze(false);

  // From a frozen source with copy=false: B sends everything and A confirms it; B keeps the
  // chunks while its sync runs and evicts them when it ends, so the controller ends up with A only.
  b.engine().freeze(true);
  EXPECT_EQ(move("inst-B", "inst-A", tokens)["num_tokens"], 2048);
  EXPECT_EQ(b.store().counters().chunks, 8u) << "no EVICT while B's sync runs";
  b.engine().freeze(false);
  EXPECT_EQ(a.store().counters().chunks, 8u);
  EXPECT_EQ(b.store().counters().chunks, 0u) << "the move's evictions, once the sync ended";
  b_to_a.expect_copied(8 * kChunkBytes);
  const Json lookup{{"tokens", tokens}};
  auto holders = [&] {
    auto r = http.Post("/lookup", lookup.dump(), "application/json");
    return r && r->status == 200 ? Json::parse(r->body)["layout_info"].dump()
                                 : std::string("no reply");
  };
  EXPECT_TRUE(eventually([&] { return holders() == R"({"inst-A":["LocalCPUBackend",2048]})"; }))
      << holders();
}

// A move of more chunks than one batch into a destination with little room: the second batch's
// reservations evict chunks the first batch stored there. The source asks what the destination
// still holds before it evicts anything, so no chunk ends up nowhere.
TEST_P(Moves, ChunksTheDestinationEvictsMidMoveStayAtTheSource) {
  auto ctl = start_controller();
  NodeOptions oa = TwoNodes::options(GetParam());
  oa.pages = 420;
  oa.page_bytes = 4096;
  NodeOptions ob = oa;
  ob.pages = 300;
  Node a(ctl->ports(), "inst-A", GetParam().tls, oa);
  Node b(ctl->ports(), "inst-B", GetParam().tls, ob);
  ASSERT_TRUE(eventually([&] { return a.settled() && b.settled(); }));
  const MappedPath a_to_b(a, b, GetParam(), 9'000'000);
  ASSERT_TRUE(a_to_b.ready()) << "A never mapped B's pool";
  std::vector<std::int64_t> tokens(400 * 256);
  std::iota(tokens.begin(), tokens.end(), 500000);
  const std::vector<ChunkHash> hashes = a.engine().hashes(tokens).value();
  for (ChunkHash h : hashes) ASSERT_TRUE(a.engine().put(h, chunk_bytes(h, 4096)));
  httplib::Client http("127.0.0.1", ctl->ports().http);
  http.set_read_timeout(60s);
  auto r = http.Post("/move",
                     Json{{"old_position", {"inst-A", kCpu}},
                          {"new_position", {"inst-B", kCpu}},
                          {"tokens", tokens}}
                         .dump(),
                     "application/json");
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no reply");
  const std::size_t prefix_at_b = b.store().leading(hashes);
  EXPECT_EQ(Json::parse(r->body)["num_tokens"], prefix_at_b * 256)
      << "the answer is what B holds from the first";
  std::size_t nowhere = 0;
  for (ChunkHash h : hashes) nowhere += a.store().contains(h) || b.store().contains(h) ? 0 : 1;
  EXPECT_EQ(nowhere, 0u) << "chunks the move lost";
  EXPECT_LT(b.store().counters().chunks, hashes.size())
      << "B cannot hold them all: the case under test";
  a_to_b.expect_copied(b.store().counters().chunks * 4096);  // B's chunks all came from A
}

TEST_P(Moves, ALocalMissIsPulledFromThePeerTheControllerNames) {
  TwoNodes rig(GetParam());
  ASSERT_TRUE(rig.synced());
  Node& a = rig.a;
  Node& b = rig.b;
  const MappedPath b_from_a(b, a, GetParam(), 9'000'000);  // B dials A: B maps A's pool
  ASSERT_TRUE(b_from_a.ready()) << "B never mapped A's pool";
  std::vector<std::int64_t> tokens(8 * 256);
  std::iota(tokens.begin(), tokens.end(), 7000);
  const std::vector<ChunkHash> hashes = a.engine().hashes(tokens).value();
  for (std::size_t i = 0; i < 6; ++i)
    ASSERT_TRUE(a.engine().put(hashes[i], chunk_bytes(hashes[i])));
  ASSERT_TRUE(b.engine().put(hashes[0], chunk_bytes(hashes[0])));  // B has the first already
  ASSERT_TRUE(eventually([&] {  // the controller has heard of A's chunks
    wire::BatchedP2PLookupMsg q{{}, "inst-B", 0};
    for (ChunkHash h : hashes) q.hashes.emplace_back(h);
    auto r = b.agent().call(q);
    const auto* ret = r ? std::get_if<wire::BatchedP2PLookupRetMsg>(&*r) : nullptr;
    return ret && !ret->layout_info.empty() && ret->layout_info[0].num_hit_chunks == 6;
  }));
  const RetrieveResult r = b.retrieve(tokens);
  EXPECT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.chunks_local, 1u);
  EXPECT_EQ(r.chunks_pulled, 5u);
  EXPECT_EQ(r.tokens, 6u * 256);
  b_from_a.expect_copied(5 * kChunkBytes);
  std::vector<std::byte> out(kChunkBytes);
  for (std::size_t i = 0; i < 6; ++i) {
    ASSERT_EQ(b.engine().get(hashes[i], out).value(), kChunkBytes);
    ASSERT_EQ(out, chunk_bytes(hashes[i])) << "chunk " << i;
  }
  EXPECT_FALSE(b.store().contains(hashes[6]));
  EXPECT_EQ(a.store().counters().chunks, 6u) << "retrieval copies; the holder keeps its chunks";
  const RetrieveResult again = b.retrieve(tokens);
  EXPECT_EQ(again.chunks_local, 6u);
  EXPECT_EQ(again.chunks_pulled, 0u) << "nobody holds more than B now";
}

INSTANTIATE_TEST_SUITE_P(Transports, Moves, ::testing::Values(kTcp, kShm, kSameHost),
                         transport_name);

}  // namespace
}  // namespace kvnode::node

namespace kvnode::node {
namespace {

using namespace rig;

// kvctl as the orchestrator's tool, a process against the same rig: lookup, move with its
// achieved rate, clear, health, workers, and a clear exit code when the controller is away.
std::string run_kvctl(const std::vector<std::string>& args, int* code) {
  test::ChildProcess p(args);
  for (auto until = Clock::now() + 30s; Clock::now() < until && p.running();)
    std::this_thread::sleep_for(10ms);
  const std::string exit = p.describe_exit();
  *code = exit.starts_with("exited with code ") ? std::stoi(exit.substr(17)) : -1;
  return p.output();
}

TEST(Kvctl, DrivesTheControllerAsAnOrchestratorDoes) {
  TwoNodes rig("tcp");
  ASSERT_TRUE(rig.synced());
  auto& ctl = rig.ctl;
  Node& a = rig.a;
  Node& b = rig.b;
  std::vector<std::int64_t> tokens(4 * 256);
  std::iota(tokens.begin(), tokens.end(), 0);
  const std::vector<ChunkHash> hashes = a.engine().hashes(tokens).value();
  for (ChunkHash h : hashes) ASSERT_TRUE(a.engine().put(h, chunk_bytes(h)));
  const std::string ctl_url = "127.0.0.1:" + std::to_string(ctl->ports().http);
  int code = -1;
  ASSERT_TRUE(eventually([&] {
    return run_kvctl({KVCTL_PATH, "lookup", "--controller", ctl_url, "--token-range", "0:1024"},
                     &code)
               .find("inst-A  LocalCPUBackend  1024 tokens") != std::string::npos;
  }));
  std::string out =
      run_kvctl({KVCTL_PATH, "move", "--controller", ctl_url, "--from", "inst-A", "--to", "inst-B",
                 "--token-range", "0:1024", "--chunk-bytes", std::to_string(kChunkBytes), "--json"},
                &code);
  EXPECT_EQ(code, 0) << out;
  const Json moved = Json::parse(out.substr(out.find('{')));
  EXPECT_EQ(moved["num_tokens"], 1024) << out;
  EXPECT_GT(moved["gbps"].get<double>(), 0.0) << out;
  EXPECT_EQ(b.store().counters().chunks, 4u);
  out = run_kvctl({KVCTL_PATH, "clear", "--controller", ctl_url, "--instance", "inst-B"}, &code);
  EXPECT_EQ(code, 0);
  EXPECT_NE(out.find("cleared 1024 tokens"), std::string::npos) << out;
  out = run_kvctl({KVCTL_PATH, "health", "--controller", ctl_url, "--instance", "inst-A"}, &code);
  EXPECT_NE(out.find("worker 0: healthy"), std::string::npos) << out;
  out = run_kvctl({KVCTL_PATH, "workers", "--controller", ctl_url, "--json"}, &code);
  EXPECT_NE(out.find("inst-B"), std::string::npos) << out;
  // Without --json: a table a person reads, a row per worker with its keys (issue 34 item 16).
  out = run_kvctl({KVCTL_PATH, "workers", "--controller", ctl_url}, &code);
  EXPECT_EQ(code, 0);
  EXPECT_EQ(out.rfind("instance\tworker\tip:port\tpeer_init_url\tkeys\tlast heartbeat\n", 0), 0u)
      << out;
  EXPECT_NE(out.find("inst-B\t0\t"), std::string::npos) << out;
  EXPECT_EQ(out.find('{'), std::string::npos) << "no JSON without --json: " << out;
  out = run_kvctl({KVCTL_PATH, "key-stats", "--controller", ctl_url}, &code);
  EXPECT_EQ(code, 0);
  EXPECT_EQ(out.rfind("instance\tkeys\tworkers\n", 0), 0u) << out;
  EXPECT_NE(out.find("total: "), std::string::npos) << out;
  EXPECT_EQ(out.find('{'), std::string::npos) << "no JSON without --json: " << out;
  out = run_kvctl({KVCTL_PATH, "lookup", "--controller", ctl_url, "--tokens", "1,2,x"}, &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("'x' is not an integer"), std::string::npos) << out;
  out = run_kvctl({KVCTL_PATH, "workers", "--controller", "127.0.0.1:1"}, &code);
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("cannot connect to the controller at 127.0.0.1:1"), std::string::npos) << out;
}

}  // namespace
}  // namespace kvnode::node
