// kvctl's exit codes against a controller whose workers answer as a test scripts them (issue 19
// item 8): 0 for a whole move, 3 for a move that moved less than the source held (a destination
// full, killed or frozen), 1 for a health code other than 0 and a check-finish of a failed call;
// --json prints the controller's JSON whatever the exit code.
#include "api_fixture.hpp"
#include "support/process.hpp"

namespace kvnode::controller::testing {
namespace {

struct Kvctl {
  int code = -1;
  std::string out, err;
};

class KvctlExitTest : public ApiTest {
 protected:
  Kvctl kvctl(std::vector<std::string> args) const {
    args.insert(args.begin(), {KVCTL_PATH});
    args.insert(args.begin() + 2, {"--controller", "127.0.0.1:" + std::to_string(port_)});
    const test::ProcessResult r = test::run_process(args, {}, std::chrono::seconds(30));
    return Kvctl{r.exit_code, r.out, r.err};
  }
  // inst-A holds tokens 0:1024 (4 chunks) by the index; its worker answers moves with `moved`.
  void source_holding_1024(std::int64_t moved) {
    add_worker("inst-A", 0, tokens(moved));
    add_worker("inst-B", 0, tokens(0), "127.0.0.1:18602");
    std::vector<std::int64_t> t(1024);
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::int64_t>(i);
    admit("inst-A", 0, hashes_of(t));
  }
};

TEST_F(KvctlExitTest, AWholeMoveExits0) {
  source_holding_1024(1024);
  const Kvctl r = kvctl({"move", "--from", "inst-A", "--to", "inst-B", "--token-range", "0:1024"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("moved 1024 tokens"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("partial"), std::string::npos) << r.out;
}

TEST_F(KvctlExitTest, AMoveThatMovedNothingOfWhatTheSourceHeldExits3) {
  source_holding_1024(0);  // the destination was killed or frozen: nothing confirmed
  Kvctl r = kvctl({"move", "--from", "inst-A", "--to", "inst-B", "--token-range", "0:1024"});
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_NE(r.out.find("moved 0 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("partial: inst-A held 1024 of these tokens"), std::string::npos) << r.out;
  // --json: the controller's JSON as before, the status tells.
  r = kvctl({"move", "--from", "inst-A", "--to", "inst-B", "--token-range", "0:1024", "--json"});
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  const Json j = Json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["num_tokens"], 0) << r.out;
  EXPECT_TRUE(j.contains("event_id")) << r.out;
}

TEST_F(KvctlExitTest, AMoveOfPartOfWhatTheSourceHeldExits3) {
  source_holding_1024(512);  // the destination had room for two chunks
  const Kvctl r = kvctl({"move", "--from", "inst-A", "--to", "inst-B", "--token-range", "0:1024"});
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_NE(r.out.find("moved 512 tokens"), std::string::npos) << r.out;
}

TEST_F(KvctlExitTest, AMoveOfTokensTheSourceNeverHeldIsNotPartial) {
  add_worker("inst-A", 0, tokens(0));
  add_worker("inst-B", 0, tokens(0), "127.0.0.1:18602");
  const Kvctl r = kvctl({"move", "--from", "inst-A", "--to", "inst-B", "--token-range", "0:1024"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

TEST_F(KvctlExitTest, AMoveTheControllerRefusesExits1) {
  add_worker("inst-A", 0, tokens(0), "127.0.0.1:18601");
  const Kvctl r = kvctl({"move", "--from", "inst-A", "--to", "inst-A", "--token-range", "0:256"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("HTTP 400"), std::string::npos) << r.err;
}

TEST_F(KvctlExitTest, HealthExits1OnAnyErrorCodeOr0WhenAllAreHealthy) {
  add_worker("inst-A", 0, tokens(0));
  add_worker("inst-B", 0, tokens(0));
  add_worker("inst-B", 1, always(Answer::reply(wire::ErrorMsg{"sick"})));
  Kvctl r = kvctl({"health", "--instance", "inst-A"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("worker 0: healthy"), std::string::npos) << r.out;
  r = kvctl({"health", "--instance", "inst-B"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("worker 1: error"), std::string::npos) << r.out;
  r = kvctl({"health", "--instance", "inst-B", "--json"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(Json::parse(r.out, nullptr, false).contains("error_codes")) << r.out;
  r = kvctl({"health", "--instance", "nope"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("has no workers"), std::string::npos) << r.out;
}

TEST_F(KvctlExitTest, CheckFinishOfAFailedCallExits1) {
  add_worker("inst-A", 0, always(Answer::reply(wire::ErrorMsg{"no"})));
  add_worker("inst-B", 0, tokens(7));
  ASSERT_EQ(handle(wire::ClearMsg{"failed-clear", "inst-A", kCpu}).http_status, 500);
  ASSERT_EQ(handle(wire::ClearMsg{"done-clear", "inst-B", kCpu}).http_status, 200);
  Kvctl r = kvctl({"check-finish", "failed-clear"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("failed"), std::string::npos) << r.out;
  r = kvctl({"check-finish", "done-clear"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

}  // namespace
}  // namespace kvnode::controller::testing
