#include "kvnode/node/daemon.hpp"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>

#include "daemon_parts.hpp"
#include "kvnode/httpd/metrics.hpp"

namespace kvnode::node {

namespace {

int port_for(const std::vector<int>& ports, std::int64_t rank) {
  return ports.empty() ? 0 : ports[static_cast<std::size_t>(rank)];
}

httpd::Limits http_limits(const NodeConfig& c) {
  httpd::Limits l;
  l.max_connections = static_cast<std::size_t>(c.http_max_connections);
  l.handler_threads = 4;        // the handlers only read counters
  l.max_body_bytes = 64 << 10;  // nothing takes a body
  return l;
}

// The chunk pool, shareable when asked (a memfd that same-host peers map). A host or pinned pool
// that cannot be shareable is still a pool: made again unshared, with a warning.
Result<gpu::ChunkPool> create_pool(gpu::PoolOptions po, const std::string& memory) {
  Result<gpu::ChunkPool> pool = gpu::ChunkPool::create(po);
  if (pool || !po.region.shareable || po.region.kind == gpu::MemoryKind::kDevice) return pool;
  spdlog::warn(
      "kvnode: shareable {} memory failed ({}): the pool is not shared with same-host peers",
      memory, pool.error().message);
  po.region.shareable = false;
  return gpu::ChunkPool::create(po);
}

// The engines' host KV the node maps at once: the setting, or half the host's memory.
std::size_t max_kv_bytes(const NodeConfig& c) {
  if (c.max_kv_registration_gb > 0) return static_cast<std::size_t>(c.max_kv_registration_gb * 1e9);
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return SIZE_MAX;
  return static_cast<std::size_t>(pages) / 2 * static_cast<std::size_t>(page);
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
    spdlog::info("kvnode: faulting in {:.2f} GB of {} memory for {} chunks...", gb, c.memory,
                 po.pages);
  const auto pool_start = std::chrono::steady_clock::now();
  Result<transfer::SameHost> same_host = transfer::parse_same_host(c.same_host);
  if (!same_host) return same_host.error();
  // Shared with same-host peers (a memfd); a pool that cannot be is still a pool, unshared.
  po.region.shareable = *same_host == transfer::SameHost::kAuto;
  Result<gpu::ChunkPool> pool = create_pool(po, c.memory);
  if (!pool) return wrap_error("chunk memory: ", std::move(pool).error());
  p->pool.emplace(std::move(pool).value());
  spdlog::info(
      "kvnode: {} chunks of {} bytes in {} memory, ready in {:.1f} s", po.pages, po.page_bytes,
      c.memory,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - pool_start).count());

  Parts* raw = p.get();
  const std::string location = "LocalCPUBackend";
  p->store.emplace(*p->pool, location, [raw, location](const StoreEvent& e) {
    if (auto* a = raw->agent_ptr.load())
      a->report(location,
                e.kind == StoreEvent::Kind::kAdmit ? wire::OpType::kAdmit : wire::OpType::kEvict,
                e.hash);
  });
  EngineOptions eo;
  eo.hashing.chunk_size = c.chunk_size;
  eo.hashing.save_unfull_chunk = c.save_unfull_chunk;
  eo.hashing.generation = *keys::parse_hash_generation(c.hash_generation);  // validated
  eo.hashing.init_hash = *keys::parse_wide_int(c.hash_init);
  spdlog::info(
      "kvnode: chunk hashes of {} (init hash {}), {} tokens a chunk, partial last chunk {}",
      keys::hash_generation_name(eo.hashing.generation), c.hash_init, c.chunk_size,
      c.save_unfull_chunk ? "kept" : "dropped");
  p->engine.emplace(*p->store, eo);
  // Peers' asks are answered from the plane's first moment, so the service comes first; the
  // moves need the plane, the control handler both.
  p->peers.emplace(*p->engine);

  transfer::PlaneOptions plane;
  plane.host = c.p2p_host;
  plane.port = static_cast<std::uint16_t>(port_for(c.p2p_init_ports, c.worker_id));
  plane.tls = c.ucx_tls;
  plane.net_devices = c.ucx_net_devices;
  Result<transfer::GpuDirect> gpudirect = transfer::parse_gpudirect(c.gpudirect);
  if (!gpudirect) return gpudirect.error();
  plane.gpudirect = *gpudirect;  // the plane logs which way a device pool goes, and why
  plane.same_host = *same_host;
  plane.copy_threads = c.copy_threads;
  plane.on_ask = [peers = &*p->peers](const std::string& peer, const std::vector<std::byte>& r) {
    return peers->on_ask(peer, r);
  };
  Result<std::unique_ptr<transfer::TransferPlane>> started =
      transfer::TransferPlane::start(plane, *p->pool);
  if (!started) return started.error();
  p->plane = std::move(started).value();
  p->moves.emplace(*p->engine, *p->plane);
  p->control.emplace(*p->engine, &*p->moves);

  agent::AgentOptions ao;
  ao.instance_id = c.lmcache_instance_id;
  ao.worker_id = c.worker_id;
  ao.controller_pull_url = c.controller_pull_url;
  ao.controller_reply_url = c.controller_reply_url;
  ao.ip = c.advertise_ip;
  ao.worker_port = port_for(c.lmcache_worker_ports, c.worker_id);
  ao.peer_init_url = p->plane->url();
  ao.heartbeat_period =
      std::chrono::milliseconds(static_cast<long>(c.lmcache_worker_heartbeat_time * 1000));
  ao.full_sync_startup_delay =
      std::chrono::milliseconds(static_cast<long>(c.full_sync_startup_delay * 1000));
  agent::AgentHandlers h;
  h.control = [control = &*p->control](const wire::Msg& m) { return (*control)(m); };
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
    lo.max_kv_bytes = max_kv_bytes(c);
    if (c.local_staging_mb > 0) {  // device pools too: slots reach their pages by cudaMemcpy
      lo.staging_slots = std::max<std::size_t>(1, (c.local_staging_mb << 20) / po.page_bytes);
      lo.staging_name =
          "/kvnode" + socket_path;  // one name per socket: a restarted node reclaims it
      for (std::size_t i = 1; i < lo.staging_name.size(); ++i)
        if (lo.staging_name[i] == '/') lo.staging_name[i] = '_';
    }
    Locate locate = locate_through([raw](const wire::Msg& m) { return raw->agent->call(m); },
                                   c.lmcache_instance_id, c.worker_id);
    Result<std::unique_ptr<LocalService>> local =
        LocalService::start(lo, *p->engine, &*p->moves, locate);
    if (!local) return local.error();
    p->local = std::move(local).value();
    spdlog::info("kvnode: local clients at {}{}", socket_path,
                 lo.staging_slots == 0 ? " (bytes inline)"
                                       : ", staging " + std::to_string(lo.staging_slots) +
                                             " chunks in " + lo.staging_name);
  }

  if (c.http_port >= 0) {
    // Liveness: 200 while the process serves. Readiness (/ready): 503 until the controller
    // answered a registration, so traffic waits for a node the cluster can find.
    p->http.emplace("kvn/http", http_limits(c));
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
  return DaemonPorts{parts_->agent->port(), std::stoi(url.substr(url.rfind(':') + 1)),
                     parts_->http_port};
}

std::string Daemon::peer_init_url() const {
  return parts_->plane->url();
}

std::string Daemon::local_socket() const {
  return parts_->local ? parts_->local->path() : "";
}

std::string Daemon::metrics() const {
  return metrics_text(*parts_);
}

}  // namespace kvnode::node
