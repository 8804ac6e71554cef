#include "kvnode/node/daemon.hpp"

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <sstream>
#include <thread>

#include "kvnode/agent/worker_agent.hpp"
#include "kvnode/httpd/metrics.hpp"
#include "kvnode/httpd/server.hpp"
#include "kvnode/node/local_service.hpp"
#include "kvnode/node/peer_moves.hpp"
#include "instance_lock.hpp"

namespace kvnode::node {

// Declared in the order they start; destroyed in reverse (HTTP, agent, plane, moves, ...).
struct Daemon::Parts {
  std::optional<InstanceLock> instance_lock;  // released last: the node is gone by then
  NodeConfig config;
  std::optional<gpu::ChunkPool> pool;
  std::atomic<agent::WorkerAgent*> agent_ptr{nullptr};
  std::optional<ChunkStore> store;
  std::optional<Engine> engine;
  std::optional<PeerMoves> moves;
  std::unique_ptr<transfer::TransferPlane> plane;
  std::unique_ptr<agent::WorkerAgent> agent;
  std::unique_ptr<LocalService> local;
  // /health, /ready and /metrics: a probe must be answered whatever other clients hold open.
  std::optional<httpd::Server> http;
  int http_port = -1;

  static httpd::Limits http_limits(const NodeConfig& c) {
    httpd::Limits l;
    l.max_connections = static_cast<std::size_t>(c.http_max_connections);
    l.handler_threads = 4;        // the handlers only read counters
    l.max_body_bytes = 64 << 10;  // nothing takes a body
    return l;
  }

  ~Parts() {
    if (http) http->stop();
    local.reset();  // aborts clients' unfinished writes
    agent_ptr = nullptr;
    agent.reset();  // flushes events, de-registers
    if (engine) engine->set_mover(nullptr);
    plane.reset();
  }
};

namespace {

int port_for(const std::vector<int>& ports, std::int64_t rank) {
  return ports.empty() ? 0 : ports[static_cast<std::size_t>(rank)];
}

// Prometheus text: what an SRE watches on a node. Every value is a count, printed as an integer
// (a double in an ostream prints 33554432 as 3.35544e+07, and loses digits beyond six).
std::string metrics_text(const Daemon::Parts& p) {
  std::ostringstream out;
  auto metric = [&](const char* name, const char* type, const char* help, const std::string& labels,
                    std::uint64_t value) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n"
        << name << labels << " " << value << "\n";
  };
  const StoreCounters s = p.store->counters();
  const std::string loc = "{location=\"" + p.store->location() + "\"}";
  metric("kvnode_chunks", "gauge", "Readable chunks.", loc, static_cast<std::uint64_t>(s.chunks));
  metric("kvnode_chunks_capacity", "gauge", "Pages in the chunk pool.", loc, static_cast<std::uint64_t>(s.capacity));
  metric("kvnode_chunks_pinned", "gauge", "Readable chunks pinned.", loc, static_cast<std::uint64_t>(s.pinned));
  metric("kvnode_chunk_bytes", "gauge", "Bytes per chunk.", "", static_cast<std::uint64_t>(p.pool->page_bytes()));
  metric("kvnode_chunks_admitted_total", "counter", "Chunks that became readable.", loc, static_cast<std::uint64_t>(s.admitted));
  metric("kvnode_chunks_evicted_total", "counter", "Chunks that stopped being readable.", loc, static_cast<std::uint64_t>(s.evicted));
  metric("kvnode_chunks_evicted_for_space_total", "counter", "LRU evictions under pressure.", loc,
         static_cast<std::uint64_t>(s.evicted_for_space));
  const transfer::PlaneCounters t = p.plane->counters();
  out << "# HELP kvnode_transfers_total Transfers this node started, by result.\n"
         "# TYPE kvnode_transfers_total counter\n";
  for (std::size_t f = 0; f < transfer::kFailureCount; ++f)
    out << "kvnode_transfers_total{result=\"" << transfer::to_string(static_cast<transfer::Failure>(f))
        << "\"} " << t.failures[f] << "\n";
  out << "# HELP kvnode_transfer_bytes_total Bytes moved by the transfer plane.\n"
         "# TYPE kvnode_transfer_bytes_total counter\n"
      << "kvnode_transfer_bytes_total{direction=\"pulled\"} " << t.bytes_pulled << "\n"
      << "kvnode_transfer_bytes_total{direction=\"pushed\"} " << t.bytes_pushed << "\n"
      << "kvnode_transfer_bytes_total{direction=\"served\"} " << t.bytes_served << "\n";
  metric("kvnode_transfer_sessions_opened_total", "counter", "Sessions opened to peers.", "", static_cast<std::uint64_t>(t.sessions_opened));
  metric("kvnode_transfer_sessions_reset_total", "counter", "Sessions reset (peer lost, deadline, cancel).", "",
         static_cast<std::uint64_t>(t.sessions_reset));
  metric("kvnode_transfer_requests_rejected_total", "counter", "Peer requests refused.", "",
         static_cast<std::uint64_t>(t.requests_rejected));
  const agent::AgentCounters a = p.agent->counters();
  metric("kvnode_controller_registered", "gauge", "1 once the controller answered registration.", "", a.registered ? 1U : 0U);
  metric("kvnode_controller_registration_failures_total", "counter",
         "Registration attempts unanswered or refused.", "", static_cast<std::uint64_t>(a.register_failures));
  metric("kvnode_controller_heartbeats_total", "counter", "Heartbeats answered.", "", static_cast<std::uint64_t>(a.heartbeats));
  metric("kvnode_controller_heartbeat_failures_total", "counter", "Heartbeats unanswered.", "",
         static_cast<std::uint64_t>(a.heartbeat_failures));
  metric("kvnode_controller_events_sent_total", "counter", "Admit/evict ops sent.", "", static_cast<std::uint64_t>(a.events_sent));
  metric("kvnode_controller_events_dropped_total", "counter", "Admit/evict ops that could not be sent.", "",
         static_cast<std::uint64_t>(a.events_dropped));
  metric("kvnode_control_requests_total", "counter", "Control requests served.", "", static_cast<std::uint64_t>(a.control_requests));
  metric("kvnode_control_errors_total", "counter", "Control requests answered with ErrorMsg.", "",
         static_cast<std::uint64_t>(a.control_errors));
  metric("kvnode_full_syncs_completed_total", "counter", "Full syncs the controller confirmed.", "",
         static_cast<std::uint64_t>(a.full_syncs_completed));
  if (p.local) {
    metric("kvnode_local_requests_total", "counter", "Local client requests served.", "",
           static_cast<std::uint64_t>(p.local->requests()));
    metric("kvnode_local_errors_total", "counter", "Local client requests answered with an error.", "",
           static_cast<std::uint64_t>(p.local->errors()));
  }
  return out.str();
}

// /health and /ready: "registered" and, until then, why not ("not registered: <why>"). Liveness
// says "ok" while the process serves; readiness says "ready" only once registered.
std::string health_json(const Daemon::Parts& p, bool readiness) {
  const agent::AgentCounters a = p.agent->counters();
  const char* status = !readiness ? "ok" : a.registered ? "ready" : "not ready";
  std::string out = std::string("{\"status\":\"") + status + "\",\"registered\":" + (a.registered ? "true" : "false");
  if (!a.registered) {
    const std::string why = a.last_register_error.empty()
                                ? "registering with " + p.config.controller_reply_url
                                : a.last_register_error + " (" + std::to_string(a.register_failures) +
                                      " failed attempts)";
    out += ",\"detail\":" + nlohmann::json("not registered: " + why).dump();
  }
  return out + ",\"peer_init_url\":" + nlohmann::json(p.plane->url()).dump() + "}";
}

}  // namespace

Result<std::unique_ptr<Daemon>> Daemon::start(const NodeConfig& c) {
  auto p = std::make_unique<Parts>();
  p->config = c;
  // One node per local socket (so per instance and rank by default): refused before anything is
  // allocated, registered, bound or unlinked, so the running node keeps all of it.
  if (const std::string socket_path = local_socket_path(c); !socket_path.empty()) {
    Result<InstanceLock> lock = InstanceLock::acquire(socket_path);
    if (!lock) return lock.error();
    p->instance_lock.emplace(std::move(lock).value());
  }
  Result<std::pair<std::size_t, std::size_t>> geometry = pool_geometry(c);
  if (!geometry) return geometry.error();
  Result<gpu::MemoryKind> kind = gpu::parse_memory_kind(c.memory);
  if (!kind) return kind.error();
  gpu::PoolOptions po;
  po.page_bytes = geometry->first;
  po.pages = geometry->second;
  po.region.kind = *kind;
  // Host memory is faulted in (mlock or populate) before the node serves: seconds per GB.
  const double gb = static_cast<double>(po.pages * po.page_bytes) / 1e9;
  if (*kind != gpu::MemoryKind::kDevice)
    spdlog::info("kvnode: faulting in {:.2f} GB of {} memory for {} chunks...", gb, c.memory, po.pages);
  const auto pool_start = std::chrono::steady_clock::now();
  Result<gpu::ChunkPool> pool = gpu::ChunkPool::create(po);
  if (!pool) return make_error("chunk memory: " + pool.error().message);
  p->pool.emplace(std::move(pool).value());
  spdlog::info("kvnode: {} chunks of {} bytes in {} memory, ready in {:.1f} s", po.pages, po.page_bytes,
               c.memory, std::chrono::duration<double>(std::chrono::steady_clock::now() - pool_start).count());

  Parts* raw = p.get();
  const std::string location = "LocalCPUBackend";
  p->store.emplace(*p->pool, location, [raw, location](const StoreEvent& e) {
    if (auto* a = raw->agent_ptr.load())
      a->report(location, e.kind == StoreEvent::Kind::kAdmit ? wire::OpType::kAdmit : wire::OpType::kEvict,
                e.hash);
  });
  EngineOptions eo;
  eo.hashing.chunk_size = c.chunk_size;
  p->engine.emplace(*p->store, eo);
  p->moves.emplace(*p->engine, nullptr);

  transfer::PlaneOptions plane;
  plane.host = c.p2p_host;
  plane.port = static_cast<std::uint16_t>(port_for(c.p2p_init_ports, c.worker_id));
  plane.tls = c.ucx_tls;
  plane.net_devices = c.ucx_net_devices;
  plane.on_ask = [raw](const std::string& peer, const std::vector<std::byte>& r) {
    return raw->moves->on_ask(peer, r);
  };
  Result<std::unique_ptr<transfer::TransferPlane>> started = transfer::TransferPlane::start(plane, *p->pool);
  if (!started) return started.error();
  p->plane = std::move(started).value();
  p->moves->set_plane(p->plane.get());
  p->engine->set_mover([raw](const wire::MoveWorkerMsg& m) { return raw->moves->on_move(m); });

  agent::AgentOptions ao;
  ao.instance_id = c.lmcache_instance_id;
  ao.worker_id = c.worker_id;
  ao.controller_pull_url = c.controller_pull_url;
  ao.controller_reply_url = c.controller_reply_url;
  ao.ip = c.advertise_ip;
  ao.worker_port = port_for(c.lmcache_worker_ports, c.worker_id);
  ao.peer_init_url = p->plane->url();
  ao.heartbeat_period = std::chrono::milliseconds(static_cast<long>(c.lmcache_worker_heartbeat_time * 1000));
  ao.full_sync_startup_delay = std::chrono::milliseconds(static_cast<long>(c.full_sync_startup_delay * 1000));
  agent::AgentHandlers h;
  h.control = [raw](const wire::Msg& m) { return raw->engine->on_control(m); };
  h.snapshot = [raw] { return raw->engine->snapshot(); };
  h.freeze = [raw](bool on) { raw->engine->freeze(on); };
  Result<std::unique_ptr<agent::WorkerAgent>> a = agent::WorkerAgent::start(ao, h);
  if (!a) return a.error();
  p->agent = std::move(a).value();
  p->agent_ptr = p->agent.get();

  if (const std::string socket_path = local_socket_path(c); !socket_path.empty()) {
    LocalServiceOptions lo;
    lo.path = socket_path;
    lo.instance = c.lmcache_instance_id;
    lo.worker_id = c.worker_id;
    if (*kind != gpu::MemoryKind::kDevice && c.local_staging_mb > 0) {
      lo.staging_slots = std::max<std::size_t>(1, (c.local_staging_mb << 20) / po.page_bytes);
      lo.staging_name = "/kvnode" + socket_path;  // one name per socket: a restarted node reclaims it
      for (std::size_t i = 1; i < lo.staging_name.size(); ++i)
        if (lo.staging_name[i] == '/') lo.staging_name[i] = '_';
    }
    Locate locate = locate_through([raw](const wire::Msg& m) { return raw->agent->call(m); },
                                   c.lmcache_instance_id, c.worker_id);
    Result<std::unique_ptr<LocalService>> local = LocalService::start(lo, *p->engine, &*p->moves, locate);
    if (!local) return local.error();
    p->local = std::move(local).value();
    spdlog::info("kvnode: local clients at {}{}", socket_path,
                 lo.staging_slots == 0 ? " (bytes inline)"
                                       : ", staging " + std::to_string(lo.staging_slots) + " chunks in " + lo.staging_name);
  }

  if (c.http_port >= 0) {
    // Liveness: 200 while the process serves. Readiness (/ready): 503 until the controller
    // answered a registration, so traffic waits for a node the cluster can find.
    p->http.emplace("kvn/http", Parts::http_limits(c));
    p->http->get("/health", [raw](const httplib::Request&, httplib::Response& res) {
      res.status = 200;
      res.set_content(health_json(*raw, false), "application/json");
    });
    p->http->get("/ready", [raw](const httplib::Request&, httplib::Response& res) {
      res.status = raw->agent->registered() ? 200 : 503;
      res.set_content(health_json(*raw, true), "application/json");
    });
    const httpd::Server* server = &*p->http;
    p->http->get("/metrics", [raw, server](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_text(*raw) + httpd::prometheus_text(server->counters(), "kvnode"),
                      "text/plain; version=0.0.4; charset=utf-8");
    });
    Result<int> port = p->http->start(c.http_host, c.http_port);
    if (!port) return port.error();
    p->http_port = *port;
  }
  return std::unique_ptr<Daemon>(new Daemon(std::move(p)));
}

Daemon::Daemon(std::unique_ptr<Parts> parts) : parts_(std::move(parts)) {}
Daemon::~Daemon() = default;

DaemonPorts Daemon::ports() const {
  const std::string url = parts_->plane->url();
  return DaemonPorts{parts_->agent->port(), std::stoi(url.substr(url.rfind(':') + 1)), parts_->http_port};
}

std::string Daemon::peer_init_url() const { return parts_->plane->url(); }

std::string Daemon::local_socket() const { return parts_->local ? parts_->local->path() : ""; }

std::string Daemon::metrics() const { return metrics_text(*parts_); }

}  // namespace kvnode::node
