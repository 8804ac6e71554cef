// The local service's lifecycle: the staging region, the handlers, the retrieve executor and the
// socket server, assembled in that order. Stopping: the socket thread first (no request reaches
// the executor after it, and a reply posted then only queues), then the executor (a running
// retrieve ends, still finding the server and the handlers), then the server, then the holds.
#include "kvnode/node/local_service.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <thread>

#include "kvnode/client/local_protocol.hpp"
#include "local_executor.hpp"
#include "local_handlers.hpp"
#include "local_socket_server.hpp"

namespace kvnode::node {

namespace protocol = client::protocol;

namespace {
// How long an unregister waits for GPU copies still holding its registration: the copier's bound.
constexpr std::chrono::seconds kRegistrationReleaseWait{60};
}  // namespace

struct LocalService::Impl {
  LocalServiceOptions options;
  std::unique_ptr<local::LocalHandlers> handlers;
  std::unique_ptr<local::LocalSocketServer> server;
  std::unique_ptr<local::SerialExecutor> executor;
  std::unique_ptr<local::KvTransfers> transfers;  // used on kv_executor only
  std::unique_ptr<local::SerialExecutor> kv_executor;
  std::atomic<std::uint64_t> requests{0}, errors{0}, retrieves_skipped{0};
  std::atomic<std::uint64_t> kv_registrations{0}, kv_stores{0}, kv_loads{0}, kv_chunks_stored{0},
      kv_chunks_loaded{0};

  ~Impl() {
    if (server) server->stop();  // the socket thread ends: nothing submits or serves any more
    executor.reset();            // a running retrieve ends (its reply only queues); queued dropped
    kv_executor.reset();         // likewise a running store or load
    server.reset();              // stopped already: its descriptors go
    handlers.reset();  // every hold ends (uncommitted writes dropped), the staging region goes
  }

  std::vector<std::byte> answer(const protocol::Reply& reply) {
    ++requests;
    if (!reply.ok) ++errors;
    return protocol::encode(reply);
  }

  // On the socket thread: every op is answered here but retrieve, which goes to the executor.
  std::optional<std::vector<std::byte>> on_request(local::ConnectionId connection,
                                                   std::vector<std::byte> bytes,
                                                   std::vector<UniqueFd> fds) {
    Result<protocol::Request> decoded = protocol::decode_request(bytes);
    if (!decoded) return answer(protocol::failure(decoded.error()));
    switch (decoded->op) {
      case protocol::LocalOp::kRetrieve:
        break;
      case protocol::LocalOp::kRegisterKv: {
        const protocol::Reply r = handlers->register_kv(connection, *decoded, std::move(fds),
                                                        server->peer_pid(connection));
        kv_registrations = handlers->kv_registrations();
        // Faulted in on the KV executor, ahead of this registration's first store or load (a
        // full queue only leaves the faults to the first copies).
        if (auto reg = r.ok ? handlers->kv_registration(connection, r.kv) : nullptr)
          (void)kv_executor->submit([reg] { reg->populate(); });
        return answer(r);
      }
      case protocol::LocalOp::kUnregisterKv:
        return queue_unregister(connection, decoded->kv);
      case protocol::LocalOp::kStore:
      case protocol::LocalOp::kLoad:
        return queue_kv_job(connection, *decoded);
      default:
        return answer(handlers->serve(connection, std::move(decoded).value()));
    }
    Result<local::Chunks> chunks = handlers->retrieve_request(*decoded);
    if (!chunks) return answer(protocol::failure(chunks.error()));
    return queue(*executor, "retrieves", [this, connection, c = std::move(chunks).value()] {
      run_retrieve(connection, c);
    });
  }

  // A job for `executor`: its answer comes later (nullopt), or at once when the queue is full.
  std::optional<std::vector<std::byte>> queue(local::SerialExecutor& executor, const char* what,
                                              std::function<void()> job) {
    if (executor.submit(std::move(job))) return std::nullopt;
    return answer(protocol::failure(
        make_error(ErrorCode::kNoRoom, std::string("too many ") + what + " queued (" +
                                           std::to_string(options.max_queued_retrieves) +
                                           "); ask again shortly")));
  }

  // unregister_kv: answered on the KV executor behind every job queued before it (the executor is
  // serial), once the last of them let go of the registration and its mapping is gone.
  std::optional<std::vector<std::byte>> queue_unregister(local::ConnectionId connection,
                                                         std::uint64_t kv) {
    Result<std::shared_ptr<local::KvRegistration>> reg = handlers->unregister_kv(connection, kv);
    if (!reg) return answer(protocol::failure(reg.error()));
    kv_registrations = handlers->kv_registrations();
    auto held = std::make_shared<std::shared_ptr<local::KvRegistration>>(std::move(reg).value());
    auto answer_now = queue(*kv_executor, "stores and loads", [this, connection, held] {
      release_registration(std::move(*held));
      post_or_cut(connection, answer(protocol::Reply{}));
    });
    if (answer_now) {  // the queue is full: the registration stays, the client asks again
      handlers->put_back_kv(connection, kv, std::move(*held));
      kv_registrations = handlers->kv_registrations();
    }
    return answer_now;
  }

  // Drops the last reference to a registration (its mapping goes with it). Jobs queued before ran
  // already; GPU copies they queued may still hold it: wait for them, bounded as the copier is.
  static void release_registration(std::shared_ptr<local::KvRegistration> reg) {
    const auto deadline = std::chrono::steady_clock::now() + kRegistrationReleaseWait;
    while (reg.use_count() > 1 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (reg.use_count() > 1)
      spdlog::error(
          "local: a KV registration is still in use {} s after its unregister; "
          "answering anyway",
          std::chrono::duration_cast<std::chrono::seconds>(kRegistrationReleaseWait).count());
  }

  void post_or_cut(local::ConnectionId connection, std::vector<std::byte> bytes) {
    try {
      server->post(connection, std::move(bytes));
    } catch (...) {
      server->cut(connection);
    }
  }

  // store and load: checked here, copied on the KV executor (large copies, GPU waits).
  std::optional<std::vector<std::byte>> queue_kv_job(local::ConnectionId connection,
                                                     const protocol::Request& q) {
    Result<local::KvJob> job = handlers->kv_job(connection, q);
    if (!job) return answer(protocol::failure(job.error()));
    return queue(*kv_executor, "stores and loads",
                 [this, connection, j = std::move(job).value()] { run_kv_job(connection, j); });
  }

  // On the KV executor. Runs even when the client left: a store's copies are the node's to
  // finish or abort, and the registration stays mapped until the job ends.
  void run_kv_job(local::ConnectionId connection, const local::KvJob& job) {
    auto reply_of = [](const local::KvOutcome& o) {
      protocol::Reply r;
      r.count = o.chunks;
      r.tokens = o.tokens;
      r.pulled = o.pulled;
      r.peer = o.peer;
      return r;
    };
    bool answered = false;
    auto post = [&](const protocol::Reply& r) {
      if (answered) return;
      answered = true;
      post_or_cut(connection, answer(r));
    };
    Result<local::KvOutcome> out = make_error(ErrorCode::kInternal, "not run");
    try {
      out = transfers->run(job, [&](const local::KvOutcome& o) { post(reply_of(o)); });
    } catch (const std::exception& e) {
      out = make_error(ErrorCode::kInternal, std::string("store/load: ") + e.what());
    }
    const bool store = job.kind == local::KvJobKind::kStore;
    ++(store ? kv_stores : kv_loads);
    if (out) (store ? kv_chunks_stored : kv_chunks_loaded) += out->chunks;
    if (!out) {
      if (answered)
        spdlog::error("local {}: {}", job.kind == local::KvJobKind::kStore ? "store" : "load",
                      out.error().message);
      post(protocol::failure(out.error()));
      return;
    }
    post(reply_of(*out));
  }

  // On the executor. A retrieve whose client left (timed out, closed) is not run: nobody would
  // read its answer, and the ones queued behind it would wait for nothing. No exception leaves
  // (it would end the process): a failed retrieve is an error answer; an answer that cannot be
  // made (out of memory) cuts its connection, so the client is not left waiting.
  void run_retrieve(local::ConnectionId connection, const local::Chunks& chunks) {
    if (!server->is_waiting(connection)) {
      ++retrieves_skipped;
      return;
    }
    try {
      protocol::Reply reply;
      try {
        reply = handlers->retrieve(chunks);
      } catch (const std::exception& e) {
        reply = protocol::failure(make_error(ErrorCode::kInternal, e.what()));
      } catch (...) {
        reply = protocol::failure(make_error(ErrorCode::kInternal, "retrieve: unknown exception"));
      }
      server->post(connection, answer(reply));
    } catch (...) {
      try {
        server->cut(connection);
      } catch (...) {  // no memory even for that: the stall cut or the client's timeout ends it
        spdlog::error("local socket: a retrieve's answer was lost (out of memory)");
      }
    }
  }
};

Result<std::unique_ptr<LocalService>> LocalService::start(const LocalServiceOptions& options,
                                                          Engine& engine, PeerMoves* moves,
                                                          Locate locate) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  std::unique_ptr<local::Staging> staging;
  if (options.staging_slots > 0) {
    Result<std::unique_ptr<local::Staging>> s = local::Staging::create(
        options.staging_name, options.staging_slots, engine.pool().page_bytes());
    if (!s) return s.error();
    staging = std::move(s).value();
  }
  local::HandlerOptions ho;
  ho.instance = options.instance;
  ho.worker_id = options.worker_id;
  ho.hold_ttl = options.hold_ttl;
  ho.max_holds = options.max_holds;
  ho.max_kv_bytes = options.max_kv_bytes;
  impl->transfers = std::make_unique<local::KvTransfers>(engine, moves, locate);
  impl->handlers = std::make_unique<local::LocalHandlers>(ho, engine, moves, std::move(locate),
                                                          std::move(staging));
  local::SocketServerOptions so;
  so.path = options.path;
  so.max_connections = options.max_connections;
  so.stall_timeout = options.stall_timeout;
  Result<std::unique_ptr<local::LocalSocketServer>> server = local::LocalSocketServer::listen(so);
  if (!server) return server.error();
  impl->server = std::move(server).value();
  impl->executor = std::make_unique<local::SerialExecutor>(options.max_queued_retrieves);
  impl->kv_executor = std::make_unique<local::SerialExecutor>(options.max_queued_retrieves);
  Impl* raw = impl.get();
  local::SocketServerHandlers h;
  h.on_request = [raw](local::ConnectionId c, std::vector<std::byte> bytes,
                       std::vector<UniqueFd> fds) {
    return raw->on_request(c, std::move(bytes), std::move(fds));
  };
  h.on_tick = [raw] { raw->handlers->expire_holds(); };
  h.on_close = [raw](local::ConnectionId c) {
    raw->handlers->drop_holds_of(c);
    raw->kv_registrations = raw->handlers->kv_registrations();
  };
  if (Status s = impl->server->serve(std::move(h)); !s) return s.error();
  return std::unique_ptr<LocalService>(new LocalService(std::move(impl)));
}

LocalService::LocalService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LocalService::~LocalService() = default;
const std::string& LocalService::path() const {
  return impl_->options.path;
}
std::uint64_t LocalService::requests() const {
  return impl_->requests;
}
std::uint64_t LocalService::errors() const {
  return impl_->errors;
}
std::uint64_t LocalService::connections() const {
  return impl_->server->counters().open;
}
std::uint64_t LocalService::dropped_replies() const {
  return impl_->server->counters().dropped;
}
std::uint64_t LocalService::retrieves_skipped() const {
  return impl_->retrieves_skipped;
}

LocalKvCounters LocalService::kv_counters() const {
  return {impl_->kv_registrations, impl_->kv_stores, impl_->kv_loads, impl_->kv_chunks_stored,
          impl_->kv_chunks_loaded};
}

}  // namespace kvnode::node
