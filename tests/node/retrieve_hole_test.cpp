// A retrieve fills a hole at the front of what a node holds (issue 19 item 10), with real kvnode
// and kvctl processes: after a move of the first chunks from A to B, B asks the controller for
// the run it lacks, from its first missing chunk, and pulls it from A. Before, B asked for the
// whole prefix, whose first chunks it held itself; the lookup (the asker left out, hits counted
// from the first hash) found nobody and the retrieve pulled nothing.
#include "node_process.hpp"

namespace kvnode::node {
namespace {

using namespace proc;

TEST(RetrieveHole, ARetrievePullsTheRunItLacksAfterTheChunksItHolds) {
  auto ctl = start_controller([](controller::ControllerConfig& c) { c.hashing.chunk_size = 16; });
  NodeProcess a("hole-A", ctl->ports().pull, ctl->ports().reply);
  NodeProcess b("hole-B", ctl->ports().pull, ctl->ports().reply);
  ASSERT_TRUE(a.up()) << a.log();
  ASSERT_TRUE(b.up()) << b.log();
  const std::string http = "127.0.0.1:" + std::to_string(ctl->ports().http);
  ASSERT_TRUE(eventually(
      [&] {
        const auto r = kvctl({"workers", "--controller", http});
        return r.out.find(a.instance()) != std::string::npos &&
               r.out.find(b.instance()) != std::string::npos;
      },
      30s));
  auto put =
      kvctl({"put", "--node", a.socket(), "--token-range", "0:256", "--seed", "7"});  // 16 chunks
  ASSERT_EQ(put.exit_code, 0) << put.out << put.err << a.log();
  // The first 4 chunks to B (copy off): B holds 0..3, A holds 4..15.
  auto moved = kvctl({"move", "--controller", http, "--from", a.instance(), "--to", b.instance(),
                      "--token-range", "0:64", "--json"});
  ASSERT_EQ(moved.exit_code, 0) << moved.out << moved.err << a.log() << b.log();
  ASSERT_NE(moved.out.find("\"num_tokens\":64"), std::string::npos) << moved.out;

  // The controller hears of A's evicts and B's admits in batches: retry until it has.
  test::ProcessResult verify;
  EXPECT_TRUE(eventually(
      [&] {
        verify = kvctl({"verify", "--node", b.socket(), "--token-range", "0:256", "--seed", "7",
                        "--retrieve"});
        return verify.exit_code == 0;
      },
      30s))
      << verify.out << verify.err << b.log();
  EXPECT_NE(verify.out.find("verified 16 of 16 chunks"), std::string::npos) << verify.out;
}

}  // namespace
}  // namespace kvnode::node
