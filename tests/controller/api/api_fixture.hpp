// Test rig for the orchestrator and the HTTP API: a real Registry, FanOut, Orchestrator and
// HttpApi on 127.0.0.1 (ephemeral ports), and scripted fake workers, each a REP socket on its
// own thread that decodes the controller's ControlMsgs, records them and answers per a script.
// Every wait is bounded by kPatience; every thread is joined.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "kvnode/controller/fanout.hpp"
#include "kvnode/controller/guarded.hpp"
#include "kvnode/controller/http_api.hpp"
#include "kvnode/controller/metrics.hpp"
#include "kvnode/controller/orchestrator.hpp"
#include "kvnode/controller/registry.hpp"
#include "kvnode/keys/chunk_hash.hpp"
#include "kvnode/wire/codec.hpp"
#include "kvnode/wire/json.hpp"
#include "support/eventually.hpp"
#include "support/http_client.hpp"

namespace kvnode::controller::testing {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

constexpr auto kPatience = 10s;  // upper bound of every wait
constexpr const char* kCpu = "LocalCPUBackend";
// prefix + a uuid4 as LMCache's uuid.uuid4() prints it: 8-4-4-4-12 lowercase hex, version 4,
// RFC 4122 variant. (Hand-written: std::regex trips GCC 12's -Wmaybe-uninitialized under ASan.)
inline bool is_event_id(std::string_view text, std::string_view prefix) {
  if (!text.starts_with(prefix)) return false;
  const std::string_view u = text.substr(prefix.size());
  if (u.size() != 36) return false;
  for (std::size_t i = 0; i < u.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    const bool hex = (u[i] >= '0' && u[i] <= '9') || (u[i] >= 'a' && u[i] <= 'f');
    if (dash ? u[i] != '-' : !hex) return false;
  }
  return u[14] == '4' && std::string_view("89ab").find(u[19]) != std::string_view::npos;
}

inline bool eventually(const std::function<bool()>& condition) {
  return test::eventually(condition, kPatience);
}

// What a fake worker does with one request.
struct Answer {
  std::optional<wire::Msg> msg;    // reply with this message
  std::optional<std::string> raw;  // or with these bytes
  bool never = false;              // or never reply (a hung worker)
  std::chrono::milliseconds delay{0};
  std::shared_future<void> gate;  // when valid: wait for it before replying

  static Answer reply(wire::Msg m, std::chrono::milliseconds delay = 0ms) {
    Answer a;
    a.msg = std::move(m);
    a.delay = delay;
    return a;
  }
  static Answer bytes(std::string b) {
    Answer a;
    a.raw = std::move(b);
    return a;
  }
  static Answer hang() {
    Answer a;
    a.never = true;
    return a;
  }
};

class ScriptedWorker {
 public:
  using Script = std::function<Answer(const wire::Msg& request)>;

  ScriptedWorker(zmq::context_t& ctx, Script script)
      : socket_(ctx, zmq::socket_type::rep), script_(std::move(script)) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind("tcp://127.0.0.1:*");
    endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
    port_ = std::stoi(endpoint_.substr(endpoint_.rfind(':') + 1));
    thread_ = std::thread([this] { serve(); });
  }
  ~ScriptedWorker() {
    stop_ = true;
    thread_.join();
  }
  ScriptedWorker(const ScriptedWorker&) = delete;
  ScriptedWorker& operator=(const ScriptedWorker&) = delete;

  int port() const { return port_; }
  const std::string& endpoint() const { return endpoint_; }
  std::vector<wire::Msg> received() const {
    std::lock_guard lock(mutex_);
    return received_;
  }
  std::size_t received_count() const {
    std::lock_guard lock(mutex_);
    return received_.size();
  }

 private:
  void serve() {
    while (!stop_) {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(10));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      zmq::message_t request;
      (void)socket_.recv(request);
      auto decoded = wire::decode(request.to_string_view());
      wire::Msg msg = decoded ? *decoded : wire::Msg(wire::ErrorMsg{"undecodable request"});
      {
        std::lock_guard lock(mutex_);
        received_.push_back(msg);
      }
      Answer a = script_(msg);
      if (a.never) {
        while (!stop_) std::this_thread::sleep_for(5ms);
        return;
      }
      const auto until = Clock::now() + a.delay;
      while (!stop_ && Clock::now() < until) std::this_thread::sleep_for(2ms);
      if (a.gate.valid())
        while (!stop_ && a.gate.wait_for(2ms) != std::future_status::ready) {
        }
      if (stop_) return;
      const std::string reply = a.raw ? *a.raw : wire::encode(a.msg.value_or(wire::ErrorMsg{"?"}));
      (void)socket_.send(zmq::buffer(reply), zmq::send_flags::none);
    }
  }

  zmq::socket_t socket_;  // the serving thread's alone once it runs
  std::string endpoint_;
  int port_ = 0;
  Script script_;
  mutable std::mutex mutex_;
  std::vector<wire::Msg> received_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Answers every request the same way.
inline ScriptedWorker::Script always(Answer a) {
  return [a](const wire::Msg&) { return a; };
}
// Answers each request with the matching *WorkerRetMsg carrying num_tokens (health: code 0).
inline ScriptedWorker::Script tokens(std::int64_t n, std::chrono::milliseconds delay = 0ms) {
  return [n, delay](const wire::Msg& m) {
    const std::string_view tag = wire::tag_of(m);
    if (tag == "ClearWorkerMsg") return Answer::reply(wire::ClearWorkerRetMsg{n}, delay);
    if (tag == "PinWorkerMsg") return Answer::reply(wire::PinWorkerRetMsg{n}, delay);
    if (tag == "CompressWorkerMsg") return Answer::reply(wire::CompressWorkerRetMsg{n}, delay);
    if (tag == "DecompressWorkerMsg") return Answer::reply(wire::DecompressWorkerRetMsg{n}, delay);
    if (tag == "MoveWorkerMsg") return Answer::reply(wire::MoveWorkerRetMsg{n}, delay);
    if (tag == "HealthWorkerMsg") return Answer::reply(wire::HealthWorkerRetMsg{0}, delay);
    return Answer::reply(wire::ErrorMsg{"Unknown message"}, delay);
  };
}

inline std::string error_text(const OrchReply& r) {
  const auto* e = std::get_if<wire::ErrorMsg>(&r.reply);
  return e ? e->error : "(not an ErrorMsg: " + std::string(wire::tag_of(r.reply)) + ")";
}

struct HttpReply {
  int status = 0;  // 0: no response (connection failed or timed out)
  std::string body;
  std::string content_type;
  Json json() const {
    auto j = Json::parse(body, nullptr, false);
    return j;
  }
};

// The rig. Subclasses pick the fan-out deadline; the default is short so that deadline cases
// finish quickly.
class ApiTest : public ::testing::Test {
 protected:
  virtual std::chrono::milliseconds deadline() const { return 300ms; }
  virtual std::size_t max_events() const { return 100000; }

  void SetUp() override {
    RegistryOptions ro;
    ro.index_seed = 11;
    registry_ = std::make_unique<Guarded<Registry>>(ro);
    fanout_ = std::make_unique<FanOut>(ctx_);
    OrchestratorOptions o;
    o.fanout_deadline = deadline();
    o.max_events = max_events();
    orch_ = std::make_unique<Orchestrator>(*registry_, *fanout_, metrics_, o);
    api_ = std::make_unique<HttpApi>(*orch_, *registry_, metrics_);
    auto port = api_->start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.error().message;
    port_ = *port;
  }

  void TearDown() override {
    api_.reset();  // joins the HTTP threads first: no handler may outlive what it uses
    workers_.clear();
    orch_.reset();
    fanout_.reset();
    registry_.reset();
  }

  // Starts a fake worker and registers it as (instance, worker_id).
  ScriptedWorker& add_worker(const std::string& instance, std::int64_t worker_id,
                             ScriptedWorker::Script script,
                             std::optional<std::string> peer_init_url = std::nullopt) {
    workers_.push_back(std::make_unique<ScriptedWorker>(ctx_, std::move(script)));
    ScriptedWorker& w = *workers_.back();
    registry_->write([&](Registry& r) {
      return r.register_worker(
          wire::RegisterMsg{instance, worker_id, "127.0.0.1", w.port(), std::move(peer_init_url)},
          1000.0 + static_cast<double>(workers_.size()));
    });
    return w;
  }

  void admit(const std::string& instance, std::int64_t worker_id,
             const std::vector<wire::ChunkHash>& hashes, const std::string& location = kCpu) {
    wire::BatchedKVOperationMsg m{instance, worker_id, location, {}};
    for (std::size_t i = 0; i < hashes.size(); ++i)
      m.operations.push_back({wire::OpType::kAdmit, hashes[i], static_cast<std::int64_t>(i)});
    const auto result = registry_->write([&](Registry& r) { return r.apply(m); });
    ASSERT_EQ(result.outcome, ApplyOutcome::kApplied);
  }

  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_connection_timeout(std::chrono::seconds(5));
    c->set_read_timeout(kPatience);
    c->set_write_timeout(kPatience);
    return c;
  }

  static HttpReply from(const httplib::Result& r) {
    if (!r) return {};
    return HttpReply{r->status, r->body, r->get_header_value("Content-Type")};
  }
  HttpReply post_text(const std::string& path, const std::string& body) const {
    return from(client()->Post(path.c_str(), body, "application/json"));
  }
  HttpReply post(const std::string& path, const Json& body) const {
    return post_text(path, body.dump());
  }
  HttpReply get(const std::string& path) const { return from(client()->Get(path.c_str())); }

  OrchReply handle(const wire::Msg& m) { return orch_->handle(m); }

  zmq::context_t ctx_;
  Metrics metrics_;
  std::unique_ptr<Guarded<Registry>> registry_;
  std::unique_ptr<FanOut> fanout_;
  std::unique_ptr<Orchestrator> orch_;
  std::unique_ptr<HttpApi> api_;
  std::vector<std::unique_ptr<ScriptedWorker>> workers_;
  int port_ = 0;
};

// Tokens 1000..2123: five chunks (the last partial), as in protocol reference §3.6.
inline std::vector<std::int64_t> tokens_1000_2123() {
  std::vector<std::int64_t> t;
  for (std::int64_t v = 1000; v <= 2123; ++v) t.push_back(v);
  return t;
}
inline std::vector<wire::ChunkHash> hashes_of(const std::vector<std::int64_t>& tokens) {
  auto h = keys::chunk_hashes(tokens);
  EXPECT_TRUE(h.ok());
  return h.ok() ? *h : std::vector<wire::ChunkHash>{};
}

}  // namespace kvnode::controller::testing
