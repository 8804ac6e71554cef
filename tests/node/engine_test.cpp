// The engine's operations on a real store, and the node flow end to end: engine + chunk store +
// worker agent against the real controller (in-process, real sockets), driven through the
// controller's HTTP API as an orchestrator drives it.
#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
#define CPPHTTPLIB_OPENSSL_SUPPORT
#endif
#ifndef CPPHTTPLIB_ZLIB_SUPPORT
#define CPPHTTPLIB_ZLIB_SUPPORT
#endif
#ifndef CPPHTTPLIB_BROTLI_SUPPORT
#define CPPHTTPLIB_BROTLI_SUPPORT
#endif
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>

#include "kvnode/agent/worker_agent.hpp"
#include "kvnode/controller/controller.hpp"
#include "kvnode/node/engine.hpp"

namespace kvnode::node {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
constexpr const char* kCpu = "LocalCPUBackend";
constexpr std::size_t kChunkBytes = 4096;

gpu::ChunkPool make_pool(std::size_t pages) {
  gpu::PoolOptions o;
  o.page_bytes = kChunkBytes;
  o.pages = pages;
  return std::move(gpu::ChunkPool::create(o)).value();
}

std::vector<std::int64_t> tokens(std::int64_t first, std::size_t n) {
  std::vector<std::int64_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<std::byte> chunk_bytes(ChunkHash h) {
  std::vector<std::byte> b(kChunkBytes);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>((h + i) & 0xff);
  return b;
}

TEST(Engine, LookupPinClearHealthAndWhatItRefuses) {
  gpu::ChunkPool pool = make_pool(8);
  ChunkStore store(pool, kCpu, nullptr);
  Engine engine(store);
  const auto t = tokens(1000, 1124);  // 4 full chunks + 100 tokens
  const std::vector<ChunkHash> h = engine.hashes(t).value();
  ASSERT_EQ(h.size(), 5u);
  for (std::size_t i = 0; i < 3; ++i) ASSERT_TRUE(engine.put(h[i], chunk_bytes(h[i])));
  EXPECT_EQ(engine.lookup_tokens(t), 768u);
  ASSERT_TRUE(engine.put(h[3], chunk_bytes(h[3])));
  ASSERT_TRUE(engine.put(h[4], chunk_bytes(h[4])));
  EXPECT_EQ(engine.lookup_tokens(t), 1124u) << "the partial last chunk ends at the last token";

  std::vector<std::byte> out(kChunkBytes);
  EXPECT_EQ(engine.get(h[2], out).value(), kChunkBytes);
  EXPECT_EQ(out, chunk_bytes(h[2]));
  EXPECT_FALSE(engine.get(12345, out));
  EXPECT_FALSE(engine.put(99, std::vector<std::byte>(10))) << "not a whole chunk";

  const wire::Msg pinned = engine.on_control(wire::PinWorkerMsg{"pin-1", kCpu, tokens(1000, 512)});
  EXPECT_EQ(std::get<wire::PinWorkerRetMsg>(pinned).num_tokens, 512);
  EXPECT_EQ(std::get<wire::PinWorkerRetMsg>(engine.on_control(wire::PinWorkerMsg{"p", "LocalDiskBackend", t})).num_tokens, 0);
  // Clear removes the unpinned chunks only: 5 stored, the first 2 pinned.
  EXPECT_EQ(std::get<wire::ClearWorkerRetMsg>(engine.on_control(wire::ClearWorkerMsg{"c", kCpu})).num_tokens, 768);
  EXPECT_EQ(engine.lookup_tokens(t), 512u);
  EXPECT_EQ(std::get<wire::HealthWorkerRetMsg>(engine.on_control(wire::HealthWorkerMsg{"h"})).error_code, 0);
  for (const wire::Msg& m : {wire::Msg{wire::CompressWorkerMsg{"x", "cachegen", kCpu, std::nullopt}},
                             wire::Msg{wire::DecompressWorkerMsg{"x", "cachegen", kCpu, std::nullopt}},
                             wire::Msg{wire::CheckFinishWorkerMsg{"x"}}}) {
    const wire::Msg reply = engine.on_control(m);
    const auto* e = std::get_if<wire::ErrorMsg>(&reply);
    ASSERT_NE(e, nullptr);
    EXPECT_TRUE(e->error.starts_with("kvnode: ")) << e->error;
  }
  engine.freeze(true);
  EXPECT_NE(engine.put(7, chunk_bytes(7)).error().message.find("frozen"), std::string::npos);
  engine.freeze(false);
  EXPECT_TRUE(engine.put(7, chunk_bytes(7)));
}

// A node (pool, store, engine, agent) registered with a controller.
struct Node {
  Node(const controller::BoundPorts& ports, const std::string& instance)
      : pool(make_pool(16)),
        store(pool, kCpu,
              [this](const StoreEvent& e) {
                if (agent_ptr)
                  agent_ptr.load()->report(kCpu, e.kind == StoreEvent::Kind::kAdmit
                                                     ? wire::OpType::kAdmit
                                                     : wire::OpType::kEvict,
                                           e.hash);
              }),
        engine(store) {
    agent::AgentOptions o;
    o.instance_id = instance;
    o.controller_pull_url = "127.0.0.1:" + std::to_string(ports.pull);
    o.controller_reply_url = "127.0.0.1:" + std::to_string(ports.reply);
    o.heartbeat_period = 100ms;
    o.request_timeout = 2s;
    o.full_sync_startup_delay = 0ms;
    o.full_sync_poll_interval = 50ms;
    agent::AgentHandlers h;
    h.control = [this](const wire::Msg& m) { return engine.on_control(m); };
    h.snapshot = [this] { return engine.snapshot(); };
    h.freeze = [this](bool on) { engine.freeze(on); };
    agent = std::move(agent::WorkerAgent::start(o, h)).value();
    agent_ptr = agent.get();
  }
  gpu::ChunkPool pool;
  std::atomic<agent::WorkerAgent*> agent_ptr{nullptr};
  ChunkStore store;
  Engine engine;
  std::unique_ptr<agent::WorkerAgent> agent;
};

bool eventually(const std::function<bool()>& c) {
  for (const auto until = Clock::now() + 10s; !c();) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

TEST(NodeFlow, StoredChunksAreFoundClearedAndPinnedThroughTheController) {
  controller::ControllerConfig c;
  c.controller_host = "127.0.0.1";
  c.controller_port = 0;
  c.controller_monitor_ports = {0, 0, 0};
  c.log_level = "warn";
  auto ctl = std::move(controller::Controller::start(c)).value();
  Node node(ctl->ports(), "inst-A");
  ASSERT_TRUE(eventually([&] { return node.agent->counters().full_syncs_completed >= 1; }));

  httplib::Client http("127.0.0.1", ctl->ports().http);
  http.set_read_timeout(10s);
  auto post = [&](const std::string& path, const nlohmann::json& body) {
    auto r = http.Post(path, body.dump(), "application/json");
    return r && r->status == 200 ? nlohmann::json::parse(r->body) : nlohmann::json{{"failed", path}};
  };
  const auto t = tokens(5000, 1024);  // 4 chunks
  const std::vector<ChunkHash> hashes = node.engine.hashes(t).value();
  for (ChunkHash h : hashes) ASSERT_TRUE(node.engine.put(h, chunk_bytes(h)));
  const nlohmann::json lookup{{"tokens", t}};
  ASSERT_TRUE(eventually([&] {
    return post("/lookup", lookup)["layout_info"].dump() == R"({"inst-A":["LocalCPUBackend",1024]})";
  })) << post("/lookup", lookup).dump();

  // Pin the first two chunks, then clear: the controller fans out to the node's REP port, the
  // node evicts the unpinned two and reports it, and the controller's answer says so.
  const nlohmann::json pin{{"instance_id", "inst-A"}, {"location", kCpu}, {"tokens", tokens(5000, 512)}};
  EXPECT_EQ(post("/pin", pin)["num_tokens"], 512);
  EXPECT_EQ(post("/clear", nlohmann::json{{"instance_id", "inst-A"}, {"location", kCpu}})["num_tokens"], 512);
  ASSERT_TRUE(eventually([&] {
    return post("/lookup", lookup)["layout_info"].dump() == R"({"inst-A":["LocalCPUBackend",512]})";
  })) << post("/lookup", lookup).dump();
  EXPECT_EQ(node.store.counters().chunks, 2u);
}

}  // namespace
}  // namespace kvnode::node
