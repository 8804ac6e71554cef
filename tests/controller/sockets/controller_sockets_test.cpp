// kvcontroller's ZMQ sockets end to end: framing, bad frames on each socket, JSON payloads,
// registration and heartbeats, ingest, P2P lookup, the reaper and full sync after a restart.
#include <gtest/gtest.h>

#include <thread>

#include "zmq_peers.hpp"

namespace kvnode::test {
namespace {

using namespace controller;
using wire::ChunkHash;

constexpr const char* kCpu = "LocalCPUBackend";

wire::RegisterMsg worker(const std::string& inst, std::int64_t wid, std::int64_t port) {
  return wire::RegisterMsg{inst, wid, "127.0.0.1", port, "127.0.0.1:" + std::to_string(port + 100)};
}
wire::HeartbeatMsg heartbeat_of(const wire::RegisterMsg& r) {
  return wire::HeartbeatMsg{r.instance_id, r.worker_id, r.ip, r.port, r.peer_init_url};
}
wire::BatchedKVOperationMsg admits(const std::string& inst, std::int64_t first, std::int64_t n,
                                   std::int64_t seq0 = 0) {
  wire::BatchedKVOperationMsg m{inst, 0, kCpu, {}};
  for (std::int64_t i = 0; i < n; ++i)
    m.operations.push_back({wire::OpType::kAdmit, ChunkHash(first + i), seq0 + i});
  return m;
}
std::vector<ChunkHash> hashes(std::int64_t first, std::int64_t n) {
  std::vector<ChunkHash> v;
  for (std::int64_t i = 0; i < n; ++i) v.emplace_back(first + i);
  return v;
}
std::optional<std::string> reason_of(const wire::HeartbeatRetMsg& r) {
  if (r.commands.empty()) return std::nullopt;
  return std::get<wire::FullSyncCommand>(r.commands.at(0)).reason;
}

class ControllerSockets : public ::testing::Test {
 protected:
  void SetUp() override {
    ctl = start_controller();
    ASSERT_TRUE(ctl);
  }
  std::int64_t hits(Dealer& d, std::int64_t first, std::int64_t n, const std::string& from) {
    auto r = d.call_as<wire::BatchedP2PLookupRetMsg>(
        wire::BatchedP2PLookupMsg{hashes(first, n), from, 0});
    return r.layout_info.empty() ? -1 : r.layout_info[0].num_hit_chunks;
  }
  zmq::context_t ctx;
  std::unique_ptr<Controller> ctl;
};

TEST_F(ControllerSockets, RegisterAnswersWithHeartbeatUrlOnBothFramings) {
  Dealer d(ctx, ctl->ports().reply);
  auto ret = d.call_as<wire::RegisterRetMsg>(worker("inst-A", 0, 18501));
  ASSERT_NE(ret.extra_config.find("heartbeat_url"), nullptr);
  EXPECT_EQ(*ret.extra_config.find("heartbeat_url"),
            "127.0.0.1:" + std::to_string(ctl->ports().heartbeat));
  EXPECT_EQ(d.last_reply_frames(), 2u);  // ["", reply]
  // [identity, payload] without the delimiter is answered too (current upstream, D2).
  const std::string raw = d.request_frames({wire::encode(worker("inst-A", 1, 18502))});
  auto decoded = wire::decode(raw);
  ASSERT_TRUE(decoded);
  EXPECT_TRUE(std::holds_alternative<wire::RegisterRetMsg>(*decoded));
}

TEST_F(ControllerSockets, BadFramesOnRoutersGetErrorMsgAndServiceContinues) {
  Dealer reply(ctx, ctl->ports().reply);
  Dealer hb(ctx, ctl->ports().heartbeat);
  for (Dealer* d : {&reply, &hb}) {
    auto err = wire::decode(d->request(std::string("\xc1", 1)));
    ASSERT_TRUE(err);
    ASSERT_TRUE(std::holds_alternative<wire::ErrorMsg>(*err));
    EXPECT_EQ(std::get<wire::ErrorMsg>(*err).error,
              "MessagePack data is malformed: invalid opcode '\\xc1' (byte 0)");
    auto json_err = wire::decode(d->request("{not json"));
    ASSERT_TRUE(json_err);
    EXPECT_TRUE(std::holds_alternative<wire::ErrorMsg>(*json_err));
  }
  auto wrong = reply.call(wire::LookupMsg{"e", {1, 2}});
  ASSERT_TRUE(std::holds_alternative<wire::ErrorMsg>(wrong));
  EXPECT_EQ(std::get<wire::ErrorMsg>(wrong).error,
            "Unknown message type: <class 'lmcache.v1.cache_controller.message.LookupMsg'>");
  auto wrong_hb = hb.call(wire::BatchedP2PLookupMsg{{}, "x", 0});
  ASSERT_TRUE(std::holds_alternative<wire::ErrorMsg>(wrong_hb));
  EXPECT_EQ(std::get<wire::ErrorMsg>(wrong_hb).error,
            "Expected HeartbeatMsg, got <class "
            "'lmcache.v1.cache_controller.message.BatchedP2PLookupMsg'>");
  // Still serving.
  EXPECT_TRUE(std::holds_alternative<wire::RegisterRetMsg>(reply.call(worker("inst-A", 0, 1))));
}

TEST_F(ControllerSockets, BadPullFramesAreSkippedAndIngestNeverStops) {
  Dealer d(ctx, ctl->ports().reply);
  d.call_as<wire::RegisterRetMsg>(worker("inst-A", 0, 18501));
  Pusher p(ctx, ctl->ports().pull);
  // Garbage first, then a frame of the wrong class, then good frames, in one multipart message.
  p.send_frames({std::string("\xc1\x00garbage", 9), wire::encode(worker("inst-A", 5, 1)),
                 wire::encode(admits("inst-A", 1, 10))});
  p.send_frames({"{\"type\": \"Nope\"}"});
  p.send(admits("inst-A", 11, 10, 10));
  EXPECT_TRUE(eventually([&] { return hits(d, 1, 20, "inst-B") == 20; }));
}

// A frame over kMaxMessageBytes closes the connection that sent it (ZMQ allocates nothing for
// it): no ErrorMsg comes back, and every other peer, the sender's next connection too, is served.
TEST_F(ControllerSockets, FramesOverTheSizeLimitCloseTheirConnectionOnly) {
  const std::string huge(static_cast<std::size_t>(kMaxMessageBytes) + 1, '\xc1');
  Dealer d(ctx, ctl->ports().reply);
  d.call_as<wire::RegisterRetMsg>(worker("inst-A", 0, 18501));
  {
    zmq::socket_t big(ctx, zmq::socket_type::dealer);
    big.set(zmq::sockopt::linger, 0);
    big.set(zmq::sockopt::rcvtimeo, 1000);
    big.connect("tcp://127.0.0.1:" + std::to_string(ctl->ports().reply));
    big.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
    big.send(zmq::buffer(huge), zmq::send_flags::none);
    zmq::message_t reply;  // a frame this size below the limit would get an ErrorMsg
    EXPECT_FALSE(big.recv(reply));
  }
  {
    Pusher p(ctx, ctl->ports().pull);
    p.send_frames({huge});
  }
  Pusher p(ctx, ctl->ports().pull);
  p.send(admits("inst-A", 1, 10));
  EXPECT_TRUE(eventually([&] { return hits(d, 1, 10, "inst-B") == 10; }));
  EXPECT_TRUE(std::holds_alternative<wire::RegisterRetMsg>(d.call(worker("inst-A", 1, 18502))));
}

TEST_F(ControllerSockets, JsonPayloadsWorkOnEverySocket) {
  Dealer d(ctx, ctl->ports().reply);
  Dealer hb(ctx, ctl->ports().heartbeat);
  auto reg = wire::decode(d.request(
      R"({"type":"RegisterMsg","instance_id":"inst-J","worker_id":0,"ip":"127.0.0.1","port":1,"peer_init_url":"127.0.0.1:2"})"));
  ASSERT_TRUE(reg);
  EXPECT_TRUE(std::holds_alternative<wire::RegisterRetMsg>(*reg));
  Pusher p(ctx, ctl->ports().pull);
  p.send_frames(
      {R"({"type":"KVAdmitMsg","instance_id":"inst-J","worker_id":0,"key":42,"location":"LocalCPUBackend","seq_num":0})"});
  EXPECT_TRUE(eventually([&] { return hits(d, 42, 1, "inst-B") == 1; }));
  auto beat = wire::decode(hb.request(
      R"({"type":"HeartbeatMsg","instance_id":"inst-J","worker_id":0,"ip":"127.0.0.1","port":1,"peer_init_url":"127.0.0.1:2","extra":1})"));
  ASSERT_TRUE(beat);
  EXPECT_TRUE(std::holds_alternative<wire::HeartbeatRetMsg>(*beat));
}

TEST_F(ControllerSockets, P2PLookupAndDeregistration) {
  Dealer d(ctx, ctl->ports().reply);
  d.call_as<wire::RegisterRetMsg>(worker("inst-A", 0, 18501));
  Pusher p(ctx, ctl->ports().pull);
  p.send(admits("inst-A", 1, 100));
  ASSERT_TRUE(eventually([&] { return hits(d, 1, 100, "inst-B") == 100; }));
  auto r =
      d.call_as<wire::BatchedP2PLookupRetMsg>(wire::BatchedP2PLookupMsg{hashes(1, 5), "inst-B", 0});
  EXPECT_EQ(r.layout_info.at(0), (wire::P2PLayout{"inst-A", kCpu, 5, "127.0.0.1:18601"}));
  p.send(wire::DeRegisterMsg{"inst-A", 0, "127.0.0.1", 18501});
  EXPECT_TRUE(eventually([&] { return hits(d, 1, 100, "inst-B") == 0; }));
}

TEST_F(ControllerSockets, FullSyncAfterControllerRestart) {
  auto w = worker("inst-A", 0, 18501);
  {
    Dealer d(ctx, ctl->ports().reply);
    d.call_as<wire::RegisterRetMsg>(w);
    Pusher(ctx, ctl->ports().pull).send(admits("inst-A", 1, 30));
    ASSERT_TRUE(eventually([&] { return hits(d, 1, 30, "inst-B") == 30; }));
  }
  ctl->stop();
  ctl = start_controller();  // a new controller knows nothing
  ASSERT_TRUE(ctl);
  Dealer d(ctx, ctl->ports().reply);
  Dealer hb(ctx, ctl->ports().heartbeat);
  EXPECT_EQ(hits(d, 1, 30, "inst-B"), 0);
  EXPECT_EQ(reason_of(hb.call_as<wire::HeartbeatRetMsg>(heartbeat_of(w))), "worker_re_registered");
  auto start = d.call_as<wire::FullSyncStartRetMsg>(
      wire::FullSyncStartMsg{"inst-A", 0, kCpu, "inst-A_0_abcd1234", 30, 2});
  EXPECT_TRUE(start.accepted);
  Pusher p(ctx, ctl->ports().pull);
  p.send_frames({wire::encode(wire::FullSyncBatchMsg{"inst-A", 0, kCpu, "inst-A_0_abcd1234", 0,
                                                     hashes(1, 15)}),
                 wire::encode(wire::FullSyncEndMsg{"inst-A", 0, kCpu, "inst-A_0_abcd1234", 30})});
  wire::FullSyncStatusRetMsg st;
  ASSERT_TRUE(eventually([&] {
    st = d.call_as<wire::FullSyncStatusRetMsg>(
        wire::FullSyncStatusMsg{"inst-A", 0, "inst-A_0_abcd1234"});
    return st.missing_batches == std::vector<std::int64_t>{1};
  }));
  EXPECT_FALSE(st.is_complete);
  p.send(wire::FullSyncBatchMsg{"inst-A", 0, kCpu, "inst-A_0_abcd1234", 1, hashes(16, 15)});
  ASSERT_TRUE(eventually([&] {
    st = d.call_as<wire::FullSyncStatusRetMsg>(
        wire::FullSyncStatusMsg{"inst-A", 0, "inst-A_0_abcd1234"});
    return st.is_complete;
  }));
  EXPECT_TRUE(st.can_exit_freeze);
  EXPECT_EQ(hits(d, 1, 30, "inst-B"), 30);
  EXPECT_EQ(reason_of(hb.call_as<wire::HeartbeatRetMsg>(heartbeat_of(w))), std::nullopt);
}

TEST(ControllerReaper, SilentWorkerDisappearsAndComesBackThroughHeartbeat) {
  auto c = loopback_config();
  c.health_check_interval = 1;
  c.lmcache_worker_timeout = 1;
  auto ctl = start_controller(c);
  ASSERT_TRUE(ctl);
  zmq::context_t ctx;
  Dealer d(ctx, ctl->ports().reply);
  Dealer hb(ctx, ctl->ports().heartbeat);
  auto w = worker("inst-A", 0, 18501);
  // Never heartbeats, as LMCache's workers by default: kept while its port answers (D5).
  zmq::socket_t rep(ctx, zmq::socket_type::rep);
  rep.set(zmq::sockopt::linger, 0);
  rep.bind("tcp://127.0.0.1:*");
  const std::string rep_endpoint = rep.get(zmq::sockopt::last_endpoint);
  auto quiet = worker("inst-Q", 0, std::stoi(rep_endpoint.substr(rep_endpoint.rfind(':') + 1)));
  d.call_as<wire::RegisterRetMsg>(w);
  d.call_as<wire::RegisterRetMsg>(quiet);
  hb.call_as<wire::HeartbeatRetMsg>(heartbeat_of(w));
  Pusher p(ctx, ctl->ports().pull);
  p.send(admits("inst-A", 1, 5));
  p.send(admits("inst-Q", 100, 5));
  auto lookup = [&](std::int64_t first) {
    auto r = d.call_as<wire::BatchedP2PLookupRetMsg>(
        wire::BatchedP2PLookupMsg{hashes(first, 5), "inst-B", 0});
    return r.layout_info.at(0).num_hit_chunks;
  };
  ASSERT_TRUE(eventually([&] { return lookup(1) == 5; }));
  EXPECT_TRUE(eventually([&] { return lookup(1) == 0; }, std::chrono::seconds(6)));
  EXPECT_EQ(lookup(100), 5);
  EXPECT_EQ(reason_of(hb.call_as<wire::HeartbeatRetMsg>(heartbeat_of(w))), "worker_re_registered");
}

TEST(ControllerStartup, PortInUseIsAClearError) {
  auto first = start_controller();
  ASSERT_TRUE(first);
  auto c = loopback_config();
  c.controller_monitor_ports.pull = first->ports().pull;
  auto second = Controller::start(c);
  ASSERT_FALSE(second);
  EXPECT_NE(second.error().message.find("cannot bind the PULL socket to tcp://127.0.0.1:" +
                                        std::to_string(first->ports().pull)),
            std::string::npos)
      << second.error().message;
}

}  // namespace
}  // namespace kvnode::test
