// Orchestrator::handle against scripted workers over real ZMQ: the exact worker payloads and
// worker_event_id formats LMCache sends, the verdicts on their answers (D3, D12), health codes,
// move pairing and check_finish records, late replies included (D13).
#include "api_fixture.hpp"

namespace kvnode::controller::testing {
namespace {

const std::string kEvent = "Clear00cc49ee-7b80-4946-a1ab-54a0231a2d77";

template <class T>
const T& as(const OrchReply& r) {
  static const T kEmpty{};
  const T* p = std::get_if<T>(&r.reply);
  EXPECT_NE(p, nullptr) << "reply is " << wire::tag_of(r.reply) << ": "
                        << wire::to_builtins(r.reply).dump();
  return p ? *p : kEmpty;
}

template <class T>
T received_as(const ScriptedWorker& w, std::size_t i = 0) {
  const auto all = w.received();
  if (i >= all.size()) {
    ADD_FAILURE() << "worker received " << all.size() << " messages";
    return T{};
  }
  const T* p = std::get_if<T>(&all[i]);
  EXPECT_NE(p, nullptr) << "worker received " << wire::tag_of(all[i]);
  return p ? *p : T{};
}

using OrchestratorTest = ApiTest;

TEST_F(OrchestratorTest, ClearSendsLmcachePayloadToEveryRankAndReturnsCommonCount) {
  auto& w1 = add_worker("inst-A", 1, tokens(42));
  auto& w0 = add_worker("inst-A", 0, tokens(42));
  auto r = handle(wire::ClearMsg{kEvent, "inst-A", kCpu});
  EXPECT_EQ(r.http_status, 200);
  EXPECT_EQ(as<wire::ClearRetMsg>(r), (wire::ClearRetMsg{kEvent, 42}));
  EXPECT_EQ(received_as<wire::ClearWorkerMsg>(w0),
            (wire::ClearWorkerMsg{"Worker0" + kEvent, kCpu}));
  EXPECT_EQ(received_as<wire::ClearWorkerMsg>(w1),
            (wire::ClearWorkerMsg{"Worker1" + kEvent, kCpu}));
}

TEST_F(OrchestratorTest, PinCarriesTokens) {
  auto& w = add_worker("inst-A", 0, tokens(512));
  auto r = handle(wire::PinMsg{"Pin1", "inst-A", kCpu, {1, 2, 3}});
  EXPECT_EQ(as<wire::PinRetMsg>(r), (wire::PinRetMsg{"Pin1", 512}));
  EXPECT_EQ(received_as<wire::PinWorkerMsg>(w),
            (wire::PinWorkerMsg{"Worker0Pin1", kCpu, {1, 2, 3}}));
}

TEST_F(OrchestratorTest, CompressAndDecompressUseTheirOwnWorkerEventIds) {
  auto& w0 = add_worker("inst-A", 0, tokens(256));
  auto& w1 = add_worker("inst-A", 1, tokens(256));
  auto c =
      handle(wire::CompressMsg{"C1", "inst-A", "cachegen", kCpu, std::vector<std::int64_t>{7}});
  EXPECT_EQ(as<wire::CompressRetMsg>(c), (wire::CompressRetMsg{"C1", 256}));
  auto d = handle(wire::DecompressMsg{"D1", "inst-A", "cachegen", kCpu, std::nullopt});
  EXPECT_EQ(as<wire::DecompressRetMsg>(d), (wire::DecompressRetMsg{"D1", 256}));

  const auto c0 = received_as<wire::CompressWorkerMsg>(w0, 0);
  const auto c1 = received_as<wire::CompressWorkerMsg>(w1, 0);
  EXPECT_TRUE(is_event_id(c0.worker_event_id, "CompressWorker0")) << c0.worker_event_id;
  EXPECT_TRUE(is_event_id(c1.worker_event_id, "CompressWorker1")) << c1.worker_event_id;
  EXPECT_NE(c0.worker_event_id.substr(15), c1.worker_event_id.substr(15));  // one uuid each
  EXPECT_EQ(c0.method, "cachegen");
  EXPECT_EQ(c0.location, kCpu);
  EXPECT_EQ(c0.tokens, std::vector<std::int64_t>{7});

  const auto d0 = received_as<wire::DecompressWorkerMsg>(w0, 1);
  EXPECT_TRUE(is_event_id(d0.worker_event_id, "DecompressWorker0")) << d0.worker_event_id;
  EXPECT_EQ(d0.tokens, std::nullopt);  // passed through as given
}

TEST_F(OrchestratorTest, WorkerErrorTextIsReportedNotOperationNotSupported) {
  add_worker("inst-A", 0, tokens(42));
  auto& w1 =
      add_worker("inst-A", 1, always(Answer::reply(wire::ErrorMsg{"backend LocalDisk not found"})));
  auto r = handle(wire::ClearMsg{"E1", "inst-A", "LocalDisk"});
  EXPECT_EQ(r.http_status, 500);
  EXPECT_EQ(error_text(r),
            "worker 1 of inst-A (" + w1.endpoint() + "): backend LocalDisk not found");
}

TEST_F(OrchestratorTest, UnexpectedAndUndecodableRepliesNameTheWorker) {
  auto& w0 = add_worker("inst-A", 0, always(Answer::reply(wire::PinWorkerRetMsg{1})));
  auto& w1 = add_worker("inst-A", 1, always(Answer::bytes("\xc1garbage")));
  auto r = handle(wire::ClearMsg{"E2", "inst-A", kCpu});
  EXPECT_EQ(r.http_status, 500);
  const std::string text = error_text(r);
  EXPECT_NE(text.find("worker 0 of inst-A (" + w0.endpoint() +
                      "): unexpected reply PinWorkerRetMsg (expected ClearWorkerRetMsg)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("; worker 1 of inst-A (" + w1.endpoint() + "): undecodable reply: "),
            std::string::npos)
      << text;
}

TEST_F(OrchestratorTest, RanksThatDisagreeAreReported) {
  add_worker("inst-A", 0, tokens(256));
  add_worker("inst-A", 1, tokens(512));
  auto r = handle(wire::PinMsg{"P", "inst-A", kCpu, {1}});
  EXPECT_EQ(r.http_status, 500);
  EXPECT_EQ(error_text(r), "workers disagree on num_tokens: worker 0: 256, worker 1: 512");
}

TEST_F(OrchestratorTest, UnknownInstanceIs404ForEveryFanOut) {
  for (const wire::Msg& m : std::vector<wire::Msg>{
           wire::ClearMsg{"e", "nope", kCpu}, wire::PinMsg{"e", "nope", kCpu, {}},
           wire::CompressMsg{"e", "nope", "cachegen", kCpu, {}},
           wire::DecompressMsg{"e", "nope", "cachegen", kCpu, {}}}) {
    auto r = handle(m);
    EXPECT_EQ(r.http_status, 404) << wire::tag_of(m);
    EXPECT_EQ(error_text(r), "unknown instance 'nope'");
  }
}

TEST_F(OrchestratorTest, SilentWorkerFailsWithinTheDeadline) {
  add_worker("inst-A", 0, tokens(42));
  auto& hung = add_worker("inst-A", 1, always(Answer::hang()));
  const auto start = Clock::now();
  auto r = handle(wire::ClearMsg{"T1", "inst-A", kCpu});
  const auto took = Clock::now() - start;
  EXPECT_EQ(r.http_status, 504);
  EXPECT_EQ(error_text(r), "worker 1 of inst-A (" + hung.endpoint() + "): no reply within 300 ms");
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 3s);
  EXPECT_EQ(metrics_.fanout_timeouts.load(), 1u);
}

TEST_F(OrchestratorTest, HealthMapsEveryKindOfAnswerToACode) {
  auto& w0 = add_worker("inst-A", 0, always(Answer::reply(wire::HealthWorkerRetMsg{0})));
  add_worker("inst-A", 1, always(Answer::reply(wire::HealthWorkerRetMsg{-1})));
  add_worker("inst-A", 2, always(Answer::reply(wire::ErrorMsg{"boom"})));
  add_worker("inst-A", 3, always(Answer::reply(wire::ClearWorkerRetMsg{0})));
  add_worker("inst-A", 4, always(Answer::bytes("not msgpack \xc1")));
  add_worker("inst-A", 5, always(Answer::hang()));
  auto r = handle(wire::HealthMsg{"health1", "inst-A"});
  EXPECT_EQ(r.http_status, 200);
  const auto& ret = as<wire::HealthRetMsg>(r);
  EXPECT_EQ(ret.event_id, "health1");
  wire::Dict<std::int64_t, std::int64_t> want;
  for (auto [wid, code] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {0, 0}, {1, -1}, {2, -1001}, {3, -1002}, {4, -1003}, {5, -1004}})
    want.set(wid, code);
  EXPECT_EQ(ret.error_codes, want);
  const auto msg = received_as<wire::HealthWorkerMsg>(w0);
  EXPECT_TRUE(is_event_id(msg.worker_event_id, "HealthWorker0")) << msg.worker_event_id;
}

TEST_F(OrchestratorTest, HealthOfUnknownInstanceIsEmptyAnd200) {
  auto r = handle(wire::HealthMsg{"h", "nope"});
  EXPECT_EQ(r.http_status, 200);
  EXPECT_EQ(as<wire::HealthRetMsg>(r), (wire::HealthRetMsg{"h", {}}));
}

TEST_F(OrchestratorTest, MovePairsRanksAndSendsDestinationPeerUrls) {
  auto& a1 = add_worker("inst-A", 1, tokens(768));
  auto& a0 = add_worker("inst-A", 0, tokens(768));
  auto& b0 = add_worker("inst-B", 0, tokens(0), "10.0.0.2:18600");
  auto& b1 = add_worker("inst-B", 1, tokens(0), "10.0.0.2:18601");
  auto r = handle(wire::MoveMsg{
      "Move1", {"inst-A", kCpu}, {"inst-B", kCpu}, std::vector<std::int64_t>{5, 6}, true});
  EXPECT_EQ(as<wire::MoveRetMsg>(r), (wire::MoveRetMsg{"Move1", 768}));
  const auto m0 = received_as<wire::MoveWorkerMsg>(a0);
  const auto m1 = received_as<wire::MoveWorkerMsg>(a1);
  EXPECT_TRUE(is_event_id(m0.worker_event_id, "MoveWorker0")) << m0.worker_event_id;
  EXPECT_TRUE(is_event_id(m1.worker_event_id, "MoveWorker1")) << m1.worker_event_id;
  EXPECT_EQ(m0.old_position, kCpu);
  EXPECT_EQ(m0.new_position, (wire::Position{"10.0.0.2:18600", kCpu}));
  EXPECT_EQ(m1.new_position, (wire::Position{"10.0.0.2:18601", kCpu}));
  EXPECT_EQ(m0.tokens, (std::vector<std::int64_t>{5, 6}));
  EXPECT_EQ(m0.copy, true);
  EXPECT_EQ(b0.received_count(), 0u);  // the destination reads; only sources get requests
  EXPECT_EQ(b1.received_count(), 0u);
}

TEST_F(OrchestratorTest, MoveDefaultsCopyToFalse) {
  auto& a0 = add_worker("inst-A", 0, tokens(256));
  add_worker("inst-B", 0, tokens(0), "10.0.0.2:18600");
  auto r = handle(wire::MoveMsg{"Move2", {"inst-A", kCpu}, {"inst-B", kCpu}, std::nullopt});
  EXPECT_EQ(r.http_status, 200) << error_text(r);
  EXPECT_EQ(received_as<wire::MoveWorkerMsg>(a0).copy, false);
}

TEST_F(OrchestratorTest, MoveRejectsMismatchedRanksMissingPeerUrlAndUnknownInstances) {
  add_worker("inst-A", 0, tokens(1));
  add_worker("inst-A", 1, tokens(1));
  add_worker("inst-B", 0, tokens(1), "10.0.0.2:18600");
  add_worker("inst-C", 0, tokens(1), "10.0.0.3:18600");
  add_worker("inst-C", 1, tokens(1));  // no peer_init_url

  auto r = handle(wire::MoveMsg{"m1", {"inst-A", kCpu}, {"inst-B", kCpu}, std::nullopt});
  EXPECT_EQ(r.http_status, 400);
  EXPECT_EQ(error_text(r),
            "move pairs workers by rank, but source inst-A has 2 workers and destination inst-B "
            "has 1");
  r = handle(wire::MoveMsg{"m2", {"inst-A", kCpu}, {"inst-C", kCpu}, std::nullopt});
  EXPECT_EQ(r.http_status, 400);
  EXPECT_EQ(error_text(r),
            "destination worker 1 of inst-C has no peer_init_url, so worker 1 of inst-A cannot "
            "reach it");
  r = handle(wire::MoveMsg{"m3", {"nope", kCpu}, {"inst-B", kCpu}, std::nullopt});
  EXPECT_EQ(r.http_status, 404);
  EXPECT_EQ(error_text(r), "move source: unknown instance 'nope'");
  r = handle(wire::MoveMsg{"m4", {"inst-B", kCpu}, {"nope", kCpu}, std::nullopt});
  EXPECT_EQ(r.http_status, 404);
  EXPECT_EQ(error_text(r), "move destination: unknown instance 'nope'");
  for (const auto& w : workers_) EXPECT_EQ(w->received_count(), 0u);
}

TEST_F(OrchestratorTest, LookupCreditsTheAdmittedPrefix) {
  add_worker("inst-A", 0, tokens(0));
  auto r = handle(wire::LookupMsg{"L0", tokens_1000_2123()});
  EXPECT_EQ(as<wire::LookupRetMsg>(r), (wire::LookupRetMsg{"L0", {}}));
  const auto hashes = hashes_of(tokens_1000_2123());
  ASSERT_EQ(hashes.size(), 5u);
  admit("inst-A", 0, {hashes.begin(), hashes.begin() + 3});
  r = handle(wire::LookupMsg{"L1", tokens_1000_2123()});
  wire::Dict<std::string, wire::LookupLayout> want;
  want.set("inst-A", {kCpu, 768});
  EXPECT_EQ(as<wire::LookupRetMsg>(r), (wire::LookupRetMsg{"L1", want}));
  admit("inst-A", 0, {hashes.begin() + 3, hashes.end()});
  r = handle(wire::LookupMsg{"L2", tokens_1000_2123()});
  want.set("inst-A", {kCpu, 1124});
  EXPECT_EQ(as<wire::LookupRetMsg>(r), (wire::LookupRetMsg{"L2", want}));
  EXPECT_EQ(metrics_.lookup_latency.count(), 3u);
}

TEST_F(OrchestratorTest, QueryInstanceAndWorkerInfo) {
  add_worker("inst-A", 1, tokens(0), "127.0.0.1:18601");
  add_worker("inst-A", 0, tokens(0), "127.0.0.1:18600");
  auto q = handle(wire::QueryInstMsg{"Q", "127.0.0.1"});
  EXPECT_EQ(as<wire::QueryInstRetMsg>(q), (wire::QueryInstRetMsg{"Q", "inst-A"}));
  q = handle(wire::QueryInstMsg{"Q", "10.9.9.9"});
  EXPECT_EQ(as<wire::QueryInstRetMsg>(q), (wire::QueryInstRetMsg{"Q", std::nullopt}));

  auto w = handle(wire::QueryWorkerInfoMsg{"W", "inst-A", std::nullopt});
  const auto& infos = as<wire::QueryWorkerInfoRetMsg>(w).worker_infos;
  ASSERT_EQ(infos.size(), 2u);
  EXPECT_EQ(infos[0].worker_id, 0);
  EXPECT_EQ(infos[0].peer_init_url, "127.0.0.1:18600");
  w = handle(wire::QueryWorkerInfoMsg{"W", "inst-A", std::vector<std::int64_t>{1}});
  ASSERT_EQ(as<wire::QueryWorkerInfoRetMsg>(w).worker_infos.size(), 1u);
  EXPECT_EQ(as<wire::QueryWorkerInfoRetMsg>(w).worker_infos[0].worker_id, 1);
  w = handle(wire::QueryWorkerInfoMsg{"W", "nope", std::nullopt});
  EXPECT_TRUE(as<wire::QueryWorkerInfoRetMsg>(w).worker_infos.empty());
}

TEST_F(OrchestratorTest, NonOrchestratorMessagesAre400NamingTheType) {
  auto r = handle(wire::RegisterMsg{"i", 0, "127.0.0.1", 1, std::nullopt});
  EXPECT_EQ(r.http_status, 400);
  EXPECT_NE(error_text(r).find("lmcache.v1.cache_controller.message.RegisterMsg"),
            std::string::npos)
      << error_text(r);
  EXPECT_FALSE(Orchestrator::is_orchestrator_msg(wire::ClearWorkerMsg{}));
  EXPECT_TRUE(Orchestrator::is_orchestrator_msg(wire::CheckFinishMsg{}));
}

// ---- check_finish ----

EventRecord event_of(Orchestrator& o, const std::string& id) {
  auto r = o.handle(wire::CheckFinishMsg{id});
  EXPECT_EQ(r.http_status, 200) << error_text(r);
  EXPECT_TRUE(r.event.has_value());
  if (const auto* ret = std::get_if<wire::CheckFinishRetMsg>(&r.reply); ret && r.event) {
    EXPECT_EQ(ret->status, to_string(r.event->state));
  }
  return r.event.value_or(EventRecord{});
}

TEST_F(OrchestratorTest, CheckFinishReportsDoneAndFailedCalls) {
  add_worker("inst-A", 0, tokens(42));
  add_worker("inst-B", 0, always(Answer::reply(wire::ErrorMsg{"disk full"})));
  ASSERT_EQ(handle(wire::ClearMsg{"ok1", "inst-A", kCpu}).http_status, 200);
  ASSERT_EQ(handle(wire::ClearMsg{"bad1", "inst-B", kCpu}).http_status, 500);
  ASSERT_EQ(handle(wire::ClearMsg{"gone1", "nope", kCpu}).http_status, 404);
  ASSERT_EQ(handle(wire::HealthMsg{"h1", "inst-A"}).http_status, 200);

  auto e = event_of(*orch_, "ok1");
  EXPECT_EQ(e.state, EventRecord::State::kDone);
  EXPECT_EQ(e.operation, "clear");
  EXPECT_EQ(e.num_tokens, 42);
  e = event_of(*orch_, "bad1");
  EXPECT_EQ(e.state, EventRecord::State::kFailed);
  EXPECT_NE(e.reason.find("disk full"), std::string::npos) << e.reason;
  e = event_of(*orch_, "gone1");
  EXPECT_EQ(e.state, EventRecord::State::kFailed);
  EXPECT_EQ(e.reason, "unknown instance 'nope'");
  e = event_of(*orch_, "h1");
  EXPECT_EQ(e.state, EventRecord::State::kDone);
  EXPECT_EQ(e.operation, "health");

  auto unknown = handle(wire::CheckFinishMsg{"never-seen"});
  EXPECT_EQ(unknown.http_status, 404);
  EXPECT_EQ(error_text(unknown), "unknown event_id 'never-seen'");
}

TEST_F(OrchestratorTest, LateReplyTurnsAFailedMoveIntoDone) {
  // The source answers 900 ms after the 300 ms deadline: the call fails, the record catches up.
  add_worker("inst-A", 0, tokens(512, 900ms));
  add_worker("inst-B", 0, tokens(0), "10.0.0.2:18600");
  auto r = handle(wire::MoveMsg{"slow-move", {"inst-A", kCpu}, {"inst-B", kCpu}, std::nullopt});
  EXPECT_EQ(r.http_status, 504) << error_text(r);
  auto e = event_of(*orch_, "slow-move");
  EXPECT_EQ(e.state, EventRecord::State::kFailed);
  EXPECT_NE(e.reason.find("no reply within 300 ms"), std::string::npos) << e.reason;
  EXPECT_TRUE(
      eventually([&] { return event_of(*orch_, "slow-move").state == EventRecord::State::kDone; }));
  e = event_of(*orch_, "slow-move");
  EXPECT_EQ(e.num_tokens, 512);
  EXPECT_EQ(e.operation, "move");
}

TEST_F(OrchestratorTest, LateReplyThatDisagreesKeepsTheCallFailed) {
  add_worker("inst-A", 0, tokens(256));
  add_worker("inst-A", 1, tokens(128, 700ms));
  auto r = handle(wire::PinMsg{"late-pin", "inst-A", kCpu, {1}});
  EXPECT_EQ(r.http_status, 504);
  EXPECT_TRUE(eventually(
      [&] { return event_of(*orch_, "late-pin").reason.starts_with("workers disagree"); }));
  auto e = event_of(*orch_, "late-pin");
  EXPECT_EQ(e.state, EventRecord::State::kFailed);
  EXPECT_EQ(e.reason, "workers disagree on num_tokens: worker 0: 256, worker 1: 128");
}

class SlowOrchestratorTest : public ApiTest {
 protected:
  std::chrono::milliseconds deadline() const override { return 5000ms; }
};

TEST_F(SlowOrchestratorTest, CheckFinishSaysPendingWhileWorkersRun) {
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  auto& w = add_worker("inst-A", 0, [gate](const wire::Msg&) {
    Answer a = Answer::reply(wire::ClearWorkerRetMsg{9});
    a.gate = gate;
    return a;
  });
  auto call = std::async(std::launch::async, [&] {
    return handle(wire::ClearMsg{"p1", "inst-A", kCpu});
  });
  ASSERT_TRUE(eventually([&] { return w.received_count() == 1; }));
  auto e = event_of(*orch_, "p1");
  EXPECT_EQ(e.state, EventRecord::State::kPending);
  EXPECT_EQ(e.operation, "clear");
  release.set_value();
  ASSERT_EQ(call.wait_for(kPatience), std::future_status::ready);
  EXPECT_EQ(call.get().http_status, 200);
  e = event_of(*orch_, "p1");
  EXPECT_EQ(e.state, EventRecord::State::kDone);
  EXPECT_EQ(e.num_tokens, 9);
}

class BoundedEventsTest : public ApiTest {
 protected:
  std::size_t max_events() const override { return 2; }
};

TEST_F(BoundedEventsTest, OldestRecordsAreDropped) {
  for (const char* id : {"e1", "e2", "e3"}) handle(wire::HealthMsg{id, "nope"});
  EXPECT_EQ(handle(wire::CheckFinishMsg{"e1"}).http_status, 404);
  EXPECT_EQ(handle(wire::CheckFinishMsg{"e2"}).http_status, 200);
  EXPECT_EQ(handle(wire::CheckFinishMsg{"e3"}).http_status, 200);
  // Reusing an id refreshes it: e2 is now the newest, so e3 goes next.
  handle(wire::HealthMsg{"e2", "nope"});
  handle(wire::HealthMsg{"e4", "nope"});
  EXPECT_EQ(handle(wire::CheckFinishMsg{"e3"}).http_status, 404);
  EXPECT_EQ(handle(wire::CheckFinishMsg{"e2"}).http_status, 200);
  EXPECT_EQ(handle(wire::CheckFinishMsg{"e4"}).http_status, 200);
}

}  // namespace
}  // namespace kvnode::controller::testing
