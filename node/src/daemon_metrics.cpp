// The daemon's /metrics and /health text, from its parts' counters.
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "daemon_parts.hpp"

namespace kvnode::node {

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
  metric("kvnode_chunks_capacity", "gauge", "Pages in the chunk pool.", loc,
         static_cast<std::uint64_t>(s.capacity));
  metric("kvnode_chunks_pinned", "gauge", "Readable chunks pinned.", loc,
         static_cast<std::uint64_t>(s.pinned));
  metric("kvnode_chunk_bytes", "gauge", "Bytes per chunk.", "",
         static_cast<std::uint64_t>(p.pool->page_bytes()));
  metric("kvnode_chunks_admitted_total", "counter", "Chunks that became readable.", loc,
         static_cast<std::uint64_t>(s.admitted));
  metric("kvnode_chunks_evicted_total", "counter", "Chunks that stopped being readable.", loc,
         static_cast<std::uint64_t>(s.evicted));
  metric("kvnode_chunks_evicted_for_space_total", "counter", "LRU evictions under pressure.", loc,
         static_cast<std::uint64_t>(s.evicted_for_space));
  metric("kvnode_peer_reservations", "gauge", "Pages reserved here for peers' moves.", "",
         static_cast<std::uint64_t>(p.peers->reservations()));
  metric("kvnode_peer_leases", "gauge", "Chunks held here for peers' retrieves.", "",
         static_cast<std::uint64_t>(p.peers->leases()));
  const transfer::PlaneCounters t = p.plane->counters();
  out << "# HELP kvnode_transfers_total Transfers this node started, by result.\n"
         "# TYPE kvnode_transfers_total counter\n";
  for (std::size_t f = 0; f < transfer::kFailureCount; ++f)
    out << "kvnode_transfers_total{result=\""
        << transfer::to_string(static_cast<transfer::Failure>(f)) << "\"} " << t.failures[f]
        << "\n";
  out << "# HELP kvnode_transfer_bytes_total Bytes moved by the transfer plane.\n"
         "# TYPE kvnode_transfer_bytes_total counter\n"
      << "kvnode_transfer_bytes_total{direction=\"pulled\"} " << t.bytes_pulled << "\n"
      << "kvnode_transfer_bytes_total{direction=\"pushed\"} " << t.bytes_pushed << "\n"
      << "kvnode_transfer_bytes_total{direction=\"served\"} " << t.bytes_served << "\n";
  metric("kvnode_transfer_same_host_bytes_total", "counter",
         "Of the bytes pulled and pushed, those copied through a same-host peer's mapped pool.", "",
         static_cast<std::uint64_t>(t.bytes_same_host));
  metric("kvnode_transfer_sessions_opened_total", "counter", "Sessions opened to peers.", "",
         static_cast<std::uint64_t>(t.sessions_opened));
  metric("kvnode_transfer_sessions_reset_total", "counter",
         "Sessions reset (peer lost, deadline, cancel).", "",
         static_cast<std::uint64_t>(t.sessions_reset));
  metric("kvnode_transfer_requests_rejected_total", "counter", "Peer requests refused.", "",
         static_cast<std::uint64_t>(t.requests_rejected));
  const agent::AgentCounters a = p.agent->counters();
  metric("kvnode_controller_registered", "gauge", "1 once the controller answered registration.",
         "", a.registered ? 1U : 0U);
  metric("kvnode_controller_registration_failures_total", "counter",
         "Registration attempts unanswered or refused.", "",
         static_cast<std::uint64_t>(a.register_failures));
  metric("kvnode_controller_heartbeats_total", "counter", "Heartbeats answered.", "",
         static_cast<std::uint64_t>(a.heartbeats));
  metric("kvnode_controller_heartbeat_failures_total", "counter", "Heartbeats unanswered.", "",
         static_cast<std::uint64_t>(a.heartbeat_failures));
  metric("kvnode_controller_events_sent_total", "counter", "Admit/evict ops sent.", "",
         static_cast<std::uint64_t>(a.events_sent));
  metric("kvnode_controller_events_dropped_total", "counter",
         "Admit/evict ops that could not be sent.", "",
         static_cast<std::uint64_t>(a.events_dropped));
  metric("kvnode_control_requests_total", "counter", "Control requests served.", "",
         static_cast<std::uint64_t>(a.control_requests));
  metric("kvnode_control_errors_total", "counter", "Control requests answered with ErrorMsg.", "",
         static_cast<std::uint64_t>(a.control_errors));
  metric("kvnode_full_syncs_completed_total", "counter", "Full syncs the controller confirmed.", "",
         static_cast<std::uint64_t>(a.full_syncs_completed));
  metric("kvnode_full_sync_running", "gauge",
         "1 while a full sync freezes the store (writes are refused: kFrozen).", "",
         p.store->frozen() ? 1U : 0U);
  metric("kvnode_moves_running", "gauge", "Moves running on the move executor (0 or 1).", "",
         a.moves_running);
  metric("kvnode_moves_queued", "gauge", "Moves waiting behind the running one.", "",
         a.moves_queued);
  metric("kvnode_moves_refused_total", "counter", "Moves answered busy: the move queue was full.",
         "", a.moves_refused);
  if (p.local) {
    metric("kvnode_local_requests_total", "counter", "Local client requests served.", "",
           static_cast<std::uint64_t>(p.local->requests()));
    metric("kvnode_local_errors_total", "counter", "Local client requests answered with an error.",
           "", static_cast<std::uint64_t>(p.local->errors()));
    metric("kvnode_local_connections", "gauge", "Local client connections open.", "",
           p.local->connections());
    const LocalKvCounters kv = p.local->kv_counters();
    metric("kvnode_local_kv_registrations", "gauge", "Engine KV caches registered (mapped) now.",
           "", kv.registrations);
    metric("kvnode_local_kv_stores_total", "counter", "store requests (by block table) run.", "",
           kv.stores);
    metric("kvnode_local_kv_loads_total", "counter", "load requests (by block table) run.", "",
           kv.loads);
    metric("kvnode_local_kv_chunks_stored_total", "counter",
           "Chunks stored from engines' KV caches (new or already held).", "", kv.chunks_stored);
    metric("kvnode_local_kv_chunks_loaded_total", "counter",
           "Chunks copied into engines' KV caches.", "", kv.chunks_loaded);
  }
  return out.str();
}

// /health and /ready: "registered" and, until then, why not ("not registered: <why>"). Liveness
// says "ok" while the process serves; readiness says "ready" only once registered.
std::string health_json(const Daemon::Parts& p, bool readiness) {
  const agent::AgentCounters a = p.agent->counters();
  const char* status = !readiness ? "ok" : a.registered ? "ready" : "not ready";
  std::string out = std::string("{\"status\":\"") + status +
                    "\",\"registered\":" + (a.registered ? "true" : "false");
  if (!a.registered) {
    const std::string why = a.last_register_error.empty()
                                ? "registering with " + p.config.controller_reply_url
                                : a.last_register_error + " (" +
                                      std::to_string(a.register_failures) + " failed attempts)";
    out += ",\"detail\":" + nlohmann::json("not registered: " + why).dump();
  }
  return out + ",\"peer_init_url\":" + nlohmann::json(p.plane->url()).dump() +
         ",\"same_host\":" + nlohmann::json(p.plane->same_host_status()).dump() + "}";
}

}  // namespace kvnode::node
