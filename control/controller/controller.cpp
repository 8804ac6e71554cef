#include "kvnode/controller/controller.hpp"

#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <zmq.hpp>

#include "kvnode/controller/fanout.hpp"
#include "kvnode/controller/http_api.hpp"
#include "kvnode/controller/orchestrator.hpp"
#include "kvnode/zmtp/server.hpp"
#include "port_probe.hpp"
#include "request_handler.hpp"
#include "thread_name.hpp"

namespace kvnode::controller {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(100);  // how soon stop() is noticed
constexpr std::size_t kMaxQueuedOrchestratorMsgs = 1024;
constexpr int kIngestNice = 5;  // the PULL thread's nice value, relative to the process's
// Interrupt moderation for ingest: a wake-up that drained the endpoint of fewer than
// kCoalesceFrames messages and kCoalesceBytes is followed by a nap of kIngestCoalesce before the
// next poll. A message arriving alone is applied at once; one arriving in the nap waits at most
// kIngestCoalesce, then goes with the others (admits are fire-and-forget, so only how soon a
// lookup sees them moves). Under a paced load of thousands of small batches a second one wake-up
// and one read then take several batches instead of one each. The byte bound stays well under a
// TCP receive buffer, so a fast sender is never held to what one buffer carries per nap.
constexpr auto kIngestCoalesce = std::chrono::milliseconds(1);
constexpr std::size_t kCoalesceFrames = 256;
constexpr std::size_t kCoalesceBytes = 32 << 10;
// The ZMQ context's one I/O thread serves the fan-out's DEALERs (calls to workers). The bound
// ports (PULL, the ROUTERs) are zmtp::Servers, read by their own threads without one.
constexpr int kRequestIoThread = 0;
// Reaper probes of workers without heartbeats: how long one may wait for a connection, how
// many run at once, and how long a round may probe before leaving the rest to the next (a
// round of refused local ports takes milliseconds; hosts that are gone take the timeout).
constexpr auto kProbeTimeout = std::chrono::milliseconds(500);
constexpr std::size_t kProbeBatch = 256;
constexpr auto kProbeRoundBudget = std::chrono::seconds(2);
constexpr std::size_t kMaxProbesPerRound = 65536;
constexpr std::size_t kReapedLinesLogged = 16;  // more are summed up in one line
// Reaping this many at once (a flood of registrations) is worth handing memory back for.
constexpr std::size_t kTrimAfterReaping = 1024;

double epoch_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The address other hosts reach us at: the local end of a UDP socket "connected" to a public
// address (nothing is sent), as LMCache does; empty when there is no route.
std::string outbound_ip() {
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return {};
  sockaddr_in remote{};
  remote.sin_family = AF_INET;
  remote.sin_port = htons(80);
  ::inet_pton(AF_INET, "8.8.8.8", &remote.sin_addr);
  std::string ip;
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&remote), sizeof(remote)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
    char buf[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf))) ip = buf;
  }
  ::close(fd);
  return ip;
}

std::string bind_address(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return "tcp://" + (v6 ? "[" + host + "]" : host) + ":" +
         (port == 0 ? std::string("*") : std::to_string(port));
}

// Orchestrator messages that arrive on PULL run here, so a slow fan-out never stalls ingest.
class OrchestratorQueue {
 public:
  explicit OrchestratorQueue(Orchestrator& orchestrator)
      : orchestrator_(orchestrator), thread_([this] { run(); }) {}
  ~OrchestratorQueue() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void push(wire::Msg msg) {
    {
      std::lock_guard lock(mutex_);
      if (queue_.size() >= kMaxQueuedOrchestratorMsgs) {
        spdlog::warn("dropping an orchestrator message from PULL: {} already queued",
                     queue_.size());
        return;
      }
      queue_.push_back(std::move(msg));
    }
    cv_.notify_one();
  }

 private:
  void run() {
    name_this_thread("kvc/orchestrate");
    std::unique_lock lock(mutex_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      wire::Msg msg = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      const OrchReply r = orchestrator_.handle(msg);  // PULL has no reply: log failures only
      if (const auto* err = std::get_if<wire::ErrorMsg>(&r.reply))
        spdlog::warn("{} from PULL failed: {}", wire::tag_of(msg), err->error);
      lock.lock();
    }
  }

  Orchestrator& orchestrator_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<wire::Msg> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

// Receives whatever is queued on the socket without blocking; false when nothing was.
// Receives one whole multipart message; false when none came (EAGAIN: dontwait, or RCVTIMEO).
}  // namespace

struct Controller::Impl {
  ControllerConfig config;
  zmq::context_t ctx{1};  // one I/O thread: kRequestIoThread
  Metrics metrics;
  Guarded<Registry> registry;
  std::unique_ptr<FanOut> fanout;
  std::unique_ptr<Orchestrator> orchestrator;
  std::unique_ptr<OrchestratorQueue> orchestrator_queue;
  std::unique_ptr<HttpApi> http;
  BoundPorts ports;
  std::atomic<bool> stopping{false};
  std::mutex stop_mutex;
  std::condition_variable stop_cv;
  std::vector<std::thread> threads;

  explicit Impl(const ControllerConfig& c) : config(c), registry(registry_options(c)) {}

  static RegistryOptions registry_options(const ControllerConfig& c) {
    RegistryOptions o;
    o.full_sync_threshold = c.full_sync_threshold;
    o.full_sync_timeout = c.full_sync_timeout;
    o.worker_timeout = c.lmcache_worker_timeout;
    o.max_workers = static_cast<std::size_t>(c.max_workers);
    return o;  // heartbeat_url stays unset: RequestHandler advertises it per worker
  }

  RequestHandler make_handler(HeartbeatAdvert advert) {
    return RequestHandler(registry, *fanout, metrics, std::move(advert), epoch_seconds,
                          [this](wire::Msg m) { orchestrator_queue->push(std::move(m)); });
  }

  // Hands each frame read on the PULL port to the handler.
  class PullMessages final : public zmtp::MessageHandler {
   public:
    PullMessages(RequestHandler& handler, Metrics& metrics)
        : handler_(handler), metrics_(metrics) {}
    std::optional<std::string> message(std::span<const std::string_view> frames) override {
      for (std::string_view f : frames) {
        ++metrics_.pull_messages;
        metrics_.pull_active = 1;
        handler_.on_pull(f);
        metrics_.pull_active = 0;
      }
      return std::nullopt;
    }

   private:
    RequestHandler& handler_;
    Metrics& metrics_;
  };

  // Answers each request on a ROUTER port; the payload is the last frame (a REQ peer sends an
  // empty delimiter before it, a DEALER peer nothing).
  class RouterMessages final : public zmtp::MessageHandler {
   public:
    RouterMessages(RequestHandler& handler, Metrics& metrics, RouterKind kind)
        : handler_(handler), metrics_(metrics), kind_(kind) {}
    std::optional<std::string> message(std::span<const std::string_view> frames) override {
      const bool reply_port = kind_ == RouterKind::kReply;
      ++(reply_port ? metrics_.reply_messages : metrics_.heartbeat_messages);
      if (reply_port) metrics_.reply_has_pending = metrics_.reply_active = 1;
      std::string reply = handler_.on_router(frames.back(), kind_);
      if (reply_port) metrics_.reply_has_pending = metrics_.reply_active = 0;
      return reply;
    }

   private:
    RequestHandler& handler_;
    Metrics& metrics_;
    RouterKind kind_;
  };

  void pull_loop(std::unique_ptr<zmtp::Server> server, RequestHandler handler) {
    name_this_thread("kvc/ingest");
    // Requests before ingest: on busy cores the scheduler should run a ROUTER thread with a
    // waiting lookup before this one (raising one's own nice value needs no privilege). Tried
    // and measured worse: serving the reply ROUTER from this thread between slices.
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), kIngestNice) != 0)
      spdlog::debug("could not lower the ingest thread's priority: {}", std::strerror(errno));
    PullMessages messages(handler, metrics);
    while (!stopping.load(std::memory_order_relaxed)) {
      const zmtp::Server::Polled got = server->poll(kPollInterval, messages);
      metrics.pull_has_pending = got.drained ? 0 : 1;
      if (got.drained && got.messages > 0 && got.messages < kCoalesceFrames &&
          got.bytes < kCoalesceBytes)
        std::this_thread::sleep_for(kIngestCoalesce);
    }
  }

  // Requests are answered as they come: a lookup's caller waits for it.
  void router_loop(std::unique_ptr<zmtp::Server> server, RouterKind kind, RequestHandler handler) {
    name_this_thread(kind == RouterKind::kReply ? "kvc/reply" : "kvc/heartbeat");
    RouterMessages messages(handler, metrics, kind);
    while (!stopping.load(std::memory_order_relaxed)) (void)server->poll(kPollInterval, messages);
  }

  // Workers without a heartbeat contract (LMCache's default) not seen for the worker timeout:
  // their ports are probed outside the lock, and those that refuse are removed.
  std::vector<WorkerEndpoint> reap_unreachable(double now) {
    const auto due =
        registry.read([&](const Registry& r) { return r.unconfirmed(now, kMaxProbesPerRound); });
    if (due.empty()) return {};
    std::vector<ProbeOutcome> probes;
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t first = 0; first < due.size() && !stopping; first += kProbeBatch) {
      if (std::chrono::steady_clock::now() - start > kProbeRoundBudget) break;
      const std::vector<WorkerEndpoint> batch(
          due.begin() + static_cast<std::ptrdiff_t>(first),
          due.begin() + static_cast<std::ptrdiff_t>(std::min(due.size(), first + kProbeBatch)));
      for (ProbeOutcome& p : probe_ports(batch, kProbeTimeout)) probes.push_back(std::move(p));
    }
    return registry.write([&](Registry& r) { return r.settle_probes(probes, epoch_seconds()); });
  }

  void log_reaped(const std::vector<WorkerEndpoint>& reaped, const std::string& why) {
    for (std::size_t i = 0; i < reaped.size(); ++i) {
      const WorkerEndpoint& w = reaped[i];
      fanout->forget(w.key());
      if (i < kReapedLinesLogged)
        spdlog::warn("reaped worker {}/{} ({}): {}", w.instance_id, w.worker_id, w.endpoint(), why);
    }
    if (reaped.size() > kReapedLinesLogged)
      spdlog::warn("reaped {} more workers: {}", reaped.size() - kReapedLinesLogged, why);
  }

  void housekeeping_loop() {
    name_this_thread("kvc/housekeep");
    const double interval = config.health_check_interval;
    double next_reap = epoch_seconds() + interval;
    double next_probe = next_reap;
    std::unique_lock lock(stop_mutex);
    while (!stopping) {
      stop_cv.wait_for(lock, std::chrono::seconds(1), [&] { return stopping.load(); });
      if (stopping) return;
      const double now = epoch_seconds();
      std::vector<WorkerEndpoint> reaped;
      std::size_t expired = 0;
      registry.write([&](Registry& r) {
        expired = r.expire_syncs(now);
        if (interval > 0 && now >= next_reap) reaped = r.reap(now);
      });
      if (interval > 0 && now >= next_reap) next_reap = now + interval;
      std::vector<WorkerEndpoint> unreachable;
      if (interval > 0 && now >= next_probe) {
        unreachable = reap_unreachable(now);
        next_probe = epoch_seconds() + interval;
      }
      const double timeout = config.lmcache_worker_timeout;
      log_reaped(reaped, fmt::format("no heartbeat for {} s", timeout));
      log_reaped(unreachable, fmt::format("never heartbeated, not seen for {} s and its worker "
                                          "port refused a connection",
                                          timeout));
      metrics.workers_reaped += reaped.size() + unreachable.size();
      if (reaped.size() + unreachable.size() >= kTrimAfterReaping) ::malloc_trim(0);
      if (expired)
        spdlog::warn("{} full sync(s) timed out; those workers will be asked to retry", expired);
    }
  }

  Status start() {
    const auto& c = config;
    FanOutOptions fanout_options;
    fanout_options.io_affinity = std::uint64_t{1} << kRequestIoThread;
    fanout_options.max_reply_bytes = kMaxMessageBytes;
    fanout = std::make_unique<FanOut>(ctx, fanout_options);
    OrchestratorOptions orch;
    orch.fanout_deadline =
        std::chrono::milliseconds(static_cast<std::int64_t>(c.fanout_timeout * 1000));
    orch.hashing = c.hashing;
    orchestrator = std::make_unique<Orchestrator>(registry, *fanout, metrics, orch);
    orchestrator_queue = std::make_unique<OrchestratorQueue>(*orchestrator);

    zmtp::ServerLimits port_limits;
    port_limits.max_frame_bytes = static_cast<std::uint64_t>(kMaxMessageBytes);
    // Binds one port of `server`, named as the error says it.
    auto listen = [&](zmtp::Server& server, int port, const char* what) -> Result<int> {
      auto bound = server.listen(c.controller_host, port);
      if (!bound)
        return make_error(bound.error().code,
                          std::string("cannot bind the ") + what + " socket to " +
                              bind_address(c.controller_host, port) + ": " + bound.error().message);
      return bound;
    };
    auto pulls = zmtp::Server::create(zmtp::SocketType::kPull, port_limits);
    if (!pulls) return pulls.error();
    auto pull = listen(**pulls, c.controller_monitor_ports.pull, "PULL");
    if (!pull) return pull.error();
    ports.pull = *pull;
    if (c.monitor_port) {
      auto legacy = listen(**pulls, *c.monitor_port, "legacy --monitor-port PULL");
      if (!legacy) return legacy.error();
      ports.legacy_pull = *legacy;
    }
    auto reply = zmtp::Server::create(zmtp::SocketType::kRouter, port_limits);
    if (!reply) return reply.error();
    auto reply_port = listen(**reply, c.controller_monitor_ports.reply, "reply ROUTER");
    if (!reply_port) return reply_port.error();
    ports.reply = *reply_port;
    std::unique_ptr<zmtp::Server> heartbeat;
    if (c.controller_monitor_ports.heartbeat >= 0) {
      auto hb = zmtp::Server::create(zmtp::SocketType::kRouter, port_limits);
      if (!hb) return hb.error();
      auto hb_port = listen(**hb, c.controller_monitor_ports.heartbeat, "heartbeat ROUTER");
      if (!hb_port) return hb_port.error();
      ports.heartbeat = *hb_port;
      heartbeat = std::move(*hb);
    }
    httpd::Limits limits = HttpApi::default_limits();
    limits.max_connections = static_cast<std::size_t>(c.http_max_connections);
    limits.max_body_bytes = static_cast<std::size_t>(c.http_max_body_mb) << 20;
    limits.max_bodies_in_flight_bytes = static_cast<std::size_t>(c.http_max_bodies_mb) << 20;
    http = std::make_unique<HttpApi>(*orchestrator, registry, metrics, limits);
    auto http_port = http->start(c.controller_host, c.controller_port);
    if (!http_port) return http_port.error();
    ports.http = *http_port;

    const HeartbeatAdvert advert{c.controller_advertise_host, c.controller_host, outbound_ip(),
                                 ports.heartbeat};
    threads.emplace_back(&Impl::pull_loop, this, std::move(*pulls), make_handler(advert));
    threads.emplace_back(&Impl::router_loop, this, std::move(*reply), RouterKind::kReply,
                         make_handler(advert));
    if (heartbeat)
      threads.emplace_back(&Impl::router_loop, this, std::move(heartbeat), RouterKind::kHeartbeat,
                           make_handler(advert));
    threads.emplace_back(&Impl::housekeeping_loop, this);
    return {};
  }

  void stop() {
    if (stopping.exchange(true)) return;
    stop_cv.notify_all();
    if (http) http->stop();
    for (auto& t : threads) t.join();
    threads.clear();
    orchestrator_queue.reset();
    http.reset();
    orchestrator.reset();
    fanout.reset();
  }
};

Controller::Controller(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Controller::~Controller() {
  stop();
}

Result<std::unique_ptr<Controller>> Controller::start(const ControllerConfig& config) {
  if (Status valid = validate(config); !valid) return valid.error();
  auto impl = std::make_unique<Impl>(config);
  if (Status started = impl->start(); !started) {
    impl->stop();
    return started.error();
  }
  return std::make_unique<Controller>(std::move(impl));
}

void Controller::stop() {
  impl_->stop();
}
const BoundPorts& Controller::ports() const {
  return impl_->ports;
}

}  // namespace kvnode::controller
