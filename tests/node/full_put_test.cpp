// A put larger than what the node has room for (issue 19 item 3), with real kvnode and kvctl
// processes: the put never evicts its own leading chunks to make room for its later ones. It
// evicts the older chunks (least recently used first), stores the longest prefix that fits,
// says "stored N of M chunks" and exits 1; every byte of that prefix verifies. Before, kvctl
// said "stored M chunks" and the node kept only the put's tail (a prefix with a hole: worthless).
#include <regex>

#include "node_process.hpp"

namespace kvnode::node {
namespace {

using namespace proc;

TEST(FullPut, APutLargerThanThePoolKeepsTheLongestPrefixThatFitsAndSaysSo) {
  auto ctl = start_controller();
  NodeProcess node("fullput", ctl->ports().pull, ctl->ports().reply);  // a pool of about 38 chunks
  ASSERT_TRUE(node.up()) << node.log();
  // Older chunks first: 20 of them, half the pool.
  auto older = kvctl({"put", "--node", node.socket(), "--token-range", "0:320", "--seed", "3"});
  ASSERT_EQ(older.exit_code, 0) << older.out << older.err << node.log();

  // 100 chunks (1600 tokens) into a pool of ~38, in kvctl's batches and the staging rounds.
  auto big =
      kvctl({"put", "--node", node.socket(), "--token-range", "100000:101600", "--seed", "4"});
  EXPECT_EQ(big.exit_code, 1) << big.out << big.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(big.out, m, std::regex("stored (\\d+) of 100 chunks")))
      << big.out << big.err;
  const int stored = std::stoi(m[1]);
  // All the older chunks made room (none pinned), and no chunk of the put's own prefix did.
  EXPECT_GT(stored, 20) << big.out;
  EXPECT_LT(stored, 100) << big.out;
  const std::string prefix = "100000:" + std::to_string(100000 + 16 * stored);
  auto verify = kvctl({"verify", "--node", node.socket(), "--token-range", prefix, "--seed", "4"});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  EXPECT_NE(verify.out.find("verified " + std::to_string(stored) + " of " + std::to_string(stored) +
                            " chunks"),
            std::string::npos)
      << verify.out;
  auto gone = kvctl({"get", "--node", node.socket(), "--token-range", "0:320"});
  EXPECT_NE(gone.out.find("read 0 of 20"), std::string::npos) << gone.out << gone.err;

  // Putting the same tokens again stores nothing new and still stops at the same prefix: what
  // the node holds of this put is its own now, never evicted for the rest.
  auto again =
      kvctl({"put", "--node", node.socket(), "--token-range", "100000:101600", "--seed", "4"});
  EXPECT_EQ(again.exit_code, 1) << again.out << again.err;
  EXPECT_NE(again.out.find("stored " + std::to_string(stored) + " of 100 chunks"),
            std::string::npos)
      << again.out;
  verify = kvctl({"verify", "--node", node.socket(), "--token-range", prefix, "--seed", "4"});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;

  // A put that fits is whole, as before: "stored N chunks", exit 0, evicting the older put.
  auto small =
      kvctl({"put", "--node", node.socket(), "--token-range", "500000:500160", "--seed", "5"});
  EXPECT_EQ(small.exit_code, 0) << small.out << small.err;
  EXPECT_NE(small.out.find("stored 10 chunks"), std::string::npos) << small.out;
}

}  // namespace
}  // namespace kvnode::node
