// The plane's progress thread: it owns every UCX object (context, listener worker, sessions),
// takes commands from callers through a queue and an eventfd, progresses, reports transfers,
// enforces deadlines, and sleeps on the workers' event fds when there is nothing to do.
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "plane_impl.hpp"

namespace kvnode::transfer {

namespace {

// Accepted sessions hold at most this share of the process's descriptors (a UCX worker costs
// several), so peers' hellos cannot starve the rest of the node of them.
constexpr rlim_t kSessionShareOfDescriptors = 8;

std::size_t session_cap(std::size_t wanted) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return wanted;
  return std::max<std::size_t>(
      1, std::min<std::size_t>(wanted, limit.rlim_cur / kSessionShareOfDescriptors));
}

}  // namespace

// ---- Start and stop ---------------------------------------------------------------------------

Status TransferPlane::Impl::start_staging() {
  gpu::PoolOptions ring;
  ring.page_bytes = pool_.page_bytes;
  ring.pages = options_.staging_slots;
  if (memory_kind_ == gpu::MemoryKind::kDevice) {
    Result<std::unique_ptr<gpu::CopyEngine>> engine = gpu::make_cuda_copy_engine(device_);
    if (!engine) return engine.error();
    engine_ = std::move(engine).value();
    ring.region.kind = gpu::MemoryKind::kPinnedHost;
  } else {
    engine_ = gpu::make_host_copy_engine();
  }
  if (ring.pages == 0) return make_error("staging needs at least one slot");
  Result<gpu::ChunkPool> slots = gpu::ChunkPool::create(ring);
  if (!slots) return make_error("staging ring: " + slots.error().message);
  ring_.emplace(std::move(slots).value());
  staging_ = Staging{engine_.get(), &*ring_};
  spdlog::info("transfer plane: {} pool staged through {} slots of {} bytes ({})",
               gpu::to_string(memory_kind_), ring.pages, ring.page_bytes, engine_->name());
  return {};
}

// Which way the pool reaches UCX (device_path.hpp), from the memory types the context registers,
// logged once: "device pool: GPUDirect through UCX (memory types: host, cuda)".
Status TransferPlane::Impl::choose_path() {
  if (Result<std::uint64_t> types = context_->memory_types())
    ucx_memory_types_ = *types;
  else
    spdlog::warn("transfer plane: {}", types.error().message);
  path_ = choose_pool_path(memory_kind_, ucx_memory_types_, options_.gpudirect);
  // A host pool staged on request is the tests' stand-in: start_staging() logs that.
  if (memory_kind_ != gpu::MemoryKind::kDevice && options_.stage_through_host)
    return start_staging();
  spdlog::info("transfer plane: {} pool: {}", gpu::to_string(memory_kind_),
               describe(path_, ucx_memory_types_));
  if (path_.path == PoolPath::kStaged) return start_staging();
  if (path_.path == PoolPath::kGpuDirect) {
    // Eager active messages land in host buffers UCX owns: only a CUDA copy takes them into the
    // pool (RMA and rendezvous go to GPU memory directly).
    Result<std::unique_ptr<gpu::CopyEngine>> engine = gpu::make_cuda_copy_engine(device_);
    if (!engine) return engine.error();
    engine_ = std::move(engine).value();
  }
  return {};
}

// UCX's CUDA transports work in the calling thread's CUDA context: the copy engine makes the
// pool's device current before each copy, so an empty copy binds the progress thread to it.
void TransferPlane::Impl::bind_device() {
  Result<gpu::CopyEngine::Ticket> ticket = engine_->copy(pool_.base, pool_.base, 0);
  if (!ticket) {
    spdlog::warn("transfer plane: binding the progress thread to GPU {}: {}", device_,
                 ticket.error().message);
    return;
  }
  for (Result<bool> done = engine_->done(*ticket); done && !*done;) done = engine_->done(*ticket);
}

// One registration for everything UCX touches: the pool (as CUDA memory for GPUDirect), or the
// staging ring instead. A device pool UCX cannot register after all is staged.
Result<ucx::Registration> TransferPlane::Impl::register_memory() {
  if (ring_)
    return ucx::Registration::map(*context_, ring_->region().data(), ring_->region().size());
  const bool gpudirect = path_.path == PoolPath::kGpuDirect;
  Result<ucx::Registration> reg =
      ucx::Registration::map(*context_, pool_.base, pool_.page_bytes * pool_.pages,
                             gpudirect ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_UNKNOWN);
  if (reg || !gpudirect) return reg;
  spdlog::warn("transfer plane: GPUDirect registration of the device pool failed ({})",
               reg.error().message);
  path_ = {PoolPath::kStaged, PathReason::kUcxRefusedPool};
  engine_.reset();
  spdlog::info("transfer plane: {} pool: {}", gpu::to_string(memory_kind_),
               describe(path_, ucx_memory_types_));
  if (Status s = start_staging(); !s) return s.error();
  return register_memory();
}

Status TransferPlane::Impl::init() {
  ask_handler_ = options_.on_ask;
  options_.max_sessions = session_cap(options_.max_sessions);
  ucx::ContextOptions co;
  co.tls = options_.tls;
  co.net_devices = options_.net_devices;
  co.wakeup = true;
  Result<ucx::Context> context = ucx::Context::create(co);
  if (!context) return context.error();
  context_.emplace(std::move(context).value());
  if (Status s = choose_path(); !s) return s;
  const auto t0 = Clock::now();
  Result<ucx::Registration> reg = register_memory();
  if (!reg) return reg.error();
  registration_.emplace(std::move(reg).value());
  spdlog::info("transfer plane: registered {} pages of {} bytes in {} ms", pool_.pages,
               pool_.page_bytes,
               std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());

  Result<ucx::Bytes> rkey = registration_->packed_rkey();
  if (!rkey) return rkey.error();
  pool_descriptor_.rkey = std::move(rkey).value();
  pool_descriptor_.base = reinterpret_cast<std::uint64_t>(pool_.base);
  pool_descriptor_.page_bytes = pool_.page_bytes;
  pool_descriptor_.pages = pool_.pages;
  pool_descriptor_.host = host_identity();
  pool_descriptor_.rma = !ring_;
  pool_descriptor_.instance =
      std::random_device{}() | (std::uint64_t{std::random_device{}()} << 32);

  ListenerHooks hooks;
  hooks.answer = [this](const ucx::Bytes& hello, LinkId link) { return answer(hello, link); };
  hooks.lost = [this](LinkId link, const std::string& why) { lost(link, why); };
  Result<std::unique_ptr<Listener>> listener =
      Listener::bind(options_.host, options_.port, std::move(hooks));
  if (!listener) return listener.error();
  listener_ = std::move(listener).value();
  url_ =
      (options_.host.find(':') != std::string::npos ? "[" + options_.host + "]" : options_.host) +
      ":" + std::to_string(listener_->port());
  pool_descriptor_.node = url_;

  epoll_ = UniqueFd(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_) return make_error(ErrorCode::kIo, std::string("epoll: ") + std::strerror(errno));
  Result<EventFd> wake = EventFd::create();
  if (!wake) return wake.error();
  wake_.emplace(std::move(wake).value());
  Result<Epoll> links = Epoll::create();
  if (!links) return links.error();
  links_.emplace(std::move(links).value());
  watch(wake_->fd(), true);
  watch(listener_->event_fd(), true);
  watch(links_->fd(), true);
  start_same_host();
  thread_ = std::thread([this] { run(); });
  return {};
}

void TransferPlane::Impl::stop() {
  if (thread_.joinable()) {
    stopping_ = true;
    wake_->signal();
    thread_.join();
  }
  // After the thread, which asks the mapper for mappings; what the mapper still posts is never
  // read. Peers map no more of our pool (mappings they hold stay theirs).
  mapper_.reset();
  share_.reset();
}

void TransferPlane::Impl::watch(int fd, bool add) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  (void)epoll_ctl(epoll_.get(), add ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, fd, &ev);
}

// ---- Caller side ------------------------------------------------------------------------------

TransferId TransferPlane::Impl::submit(bool pull, const std::string& peer,
                                       std::vector<PageCopy> pages, Callback cb,
                                       TransferOptions options) {
  auto x = std::make_unique<Xfer>();
  x->id = next_id_++;
  x->pull = pull;
  x->peer = peer;
  x->pages = std::move(pages);
  x->callback = std::move(cb);
  x->submitted = Clock::now();
  x->deadline = x->submitted + options.deadline.value_or(options_.default_deadline);
  const TransferId id = x->id;
  {
    std::lock_guard lock(commands_mutex_);
    commands_.push_back(Command{Command::kSubmit, std::move(x), id, {}, {}, {}});
  }
  wake_->signal();
  return id;
}

void TransferPlane::Impl::cancel(TransferId id) {
  {
    std::lock_guard lock(commands_mutex_);
    commands_.push_back(Command{Command::kCancel, nullptr, id, {}, {}, {}});
  }
  wake_->signal();
}

// ---- The progress thread ----------------------------------------------------------------------

void TransferPlane::Impl::run() {
  if (path_.path == PoolPath::kGpuDirect) bind_device();
  while (!stopping_) {
    unsigned n = drain_commands();
    n += listener_->progress();
    n += check_links();
    n += progress_sessions();
    const auto now = Clock::now();
    expire(now);
    if (n)
      last_event_ = now;
    else if (now - last_event_ > options_.spin)
      sleep();
  }
  // Shutdown: nothing in flight survives the plane.
  drain_commands();
  const std::string why = "the transfer plane stopped";
  while (!initiators_.empty()) reset(*initiators_.begin()->second, Failure::kCancelled, 0, why);
  while (!acceptors_.empty()) reset(*acceptors_.begin()->second, Failure::kCancelled, why);
}

unsigned TransferPlane::Impl::drain_commands() {
  std::deque<Command> commands;
  {
    std::lock_guard lock(commands_mutex_);
    commands.swap(commands_);
  }
  for (Command& c : commands) {
    if (c.kind == Command::kAsk) {
      Result<InitiatorSession*> s =
          stopping_ ? Result<InitiatorSession*>(make_error("the transfer plane stopped"))
                    : session_for(c.peer);
      if (s) {
        (*s)->ask(std::move(c.ask));
        continue;
      }
      // A url that cannot be one is the caller's mistake; anything else, the peer is out of reach.
      Error e = std::move(s).error();
      e.code = split_url(c.peer) ? ErrorCode::kPeerLost : ErrorCode::kInvalid;
      c.ask.done(std::move(e));
      continue;
    }
    if (c.kind == Command::kMapped) {
      if (!stopping_) attach_mapping(std::move(c.mapped));
      continue;
    }
    if (c.kind == Command::kSubmit) {
      if (stopping_) {
        c.xfer->fail_all(Failure::kCancelled, "the transfer plane stopped");
        report(std::move(c.xfer));
      } else {
        start(std::move(c.xfer));
      }
      continue;
    }
    const auto it = where_.find(c.id);
    if (it == where_.end()) continue;  // already reported
    const auto s = initiators_.find(it->second);
    if (s != initiators_.end())
      reset(*s->second, Failure::kCancelled, c.id,
            s->second->has(c.id) ? "cancelled" : "cancelled while connecting");
  }
  return static_cast<unsigned>(commands.size());
}

void TransferPlane::Impl::start(std::unique_ptr<Xfer> x) {
  for (std::size_t i = 0; i < x->pages.size(); ++i) {
    if (x->pages[i].local >= pool_.pages) {
      const std::string why = "chunk " + std::to_string(i) + ": local page " +
                              std::to_string(x->pages[i].local) + " is outside this pool of " +
                              std::to_string(pool_.pages) + " pages";
      spdlog::warn("transfer {} refused: {}", x->id, why);
      x->fail_all(Failure::kInvalid, why);
      return report(std::move(x));
    }
  }
  if (x->pages.empty()) {
    x->fail_all(Failure::kInvalid, "no pages to move");
    return report(std::move(x));
  }
  Result<InitiatorSession*> s = session_for(x->peer);
  if (!s) {
    const bool bad_url = !split_url(x->peer);
    x->fail_all(bad_url ? Failure::kInvalid : Failure::kConnect, s.error().message);
    return report(std::move(x));
  }
  where_[x->id] = x->peer;
  (*s)->submit(std::move(x));
}

unsigned TransferPlane::Impl::progress_sessions() {
  unsigned n = 0;
  const auto now = Clock::now();
  std::vector<InitiatorSession*> broken_initiators;
  for (auto& [url, s] : initiators_) {
    n += s->progress();
    for (auto& [a, result] : s->take_answered(now)) a.done(std::move(result));
    for (std::unique_ptr<Xfer>& x : s->take_finished()) report(std::move(x));
    count_served(*s);
    if (s->broken()) broken_initiators.push_back(s.get());
  }
  std::vector<AcceptorSession*> broken_acceptors;
  for (auto& [link, s] : acceptors_) {
    n += s->progress();
    for (const std::vector<gpu::PageId>& pages : s->take_written())
      if (options_.on_written) options_.on_written(s->peer(), pages);
    count_served(*s);
    if (s->broken()) broken_acceptors.push_back(s.get());
  }
  for (InitiatorSession* s : broken_initiators) {
    // A connection refused or reset before the answer (a peer restarting, a stale backlog
    // entry) is tried again while the transfers' deadlines allow.
    const auto deadline = s->earliest_deadline();
    if (!s->ready() && s->dials() < kMaxDials && deadline &&
        *deadline - Clock::now() > kRedialPause) {
      spdlog::info("transfer plane: {}; dialing {} again", s->broken_reason(), s->peer());
      std::this_thread::sleep_for(kRedialPause);
      if (dial_peer(*s)) continue;
    }
    const std::string why = s->broken_reason().empty()
                                ? "the connection to " + s->peer() + " failed"
                                : s->broken_reason();
    reset(*s, s->ready() ? Failure::kPeerLost : Failure::kConnect, 0, why);
  }
  for (AcceptorSession* s : broken_acceptors) {
    const std::string why = s->broken_reason().empty()
                                ? "the connection to " + s->peer() + " failed"
                                : s->broken_reason();
    reset(*s, s->ready() ? Failure::kPeerLost : Failure::kConnect, why);
  }
  return n;
}

void TransferPlane::Impl::count_served(Session& s) {
  const ServeCounters served = s.take_serve_counters();
  if (!served.bytes && !served.rejected) return;
  std::lock_guard lock(counters_mutex_);
  counters_.bytes_served += served.bytes;
  counters_.requests_rejected += served.rejected;
}

void TransferPlane::Impl::expire(Clock::time_point now) {
  for (auto it = initiators_.begin(); it != initiators_.end();) {
    InitiatorSession& s = *it->second;
    ++it;
    if (const std::optional<TransferId> id = s.expired(now))
      reset(s, Failure::kTimeout, *id, "transfer " + std::to_string(*id) + " missed its deadline");
  }
}

void TransferPlane::Impl::reset(InitiatorSession& s, Failure failure, TransferId culprit,
                                const std::string& why) {
  std::vector<std::unique_ptr<Xfer>> failed = s.fail_all(failure, culprit, why);
  auto asks = s.take_answered(Clock::now());  // fail_all failed the open asks too
  s.close_link();  // the peer sees the link end: its acceptor session goes too
  const auto it = initiators_.find(s.peer());
  std::unique_ptr<Session> owned = std::move(it->second);
  initiators_.erase(it);
  retire(std::move(owned), failure, culprit, why);
  for (std::unique_ptr<Xfer>& x : failed) report(std::move(x));
  for (auto& [a, result] : asks) a.done(std::move(result));
}

void TransferPlane::Impl::reset(AcceptorSession& s, Failure failure, const std::string& why) {
  const LinkId link = s.link();
  const auto it = acceptors_.find(link);
  std::unique_ptr<Session> owned = std::move(it->second);
  acceptors_.erase(it);
  listener_->drop(link);
  retire(std::move(owned), failure, 0, why);
}

void TransferPlane::Impl::retire(std::unique_ptr<Session> s, Failure failure, TransferId culprit,
                                 const std::string& why) {
  watch(s->event_fd(), false);
  if (failure != Failure::kCancelled || culprit != 0)
    spdlog::warn("transfer plane: session with {} reset ({}): {}", s->peer(), to_string(failure),
                 why);
  s.reset();  // destroys the worker: no operation of the session can touch memory after this
  std::lock_guard lock(counters_mutex_);
  ++counters_.sessions_reset;
}

void TransferPlane::Impl::report(std::unique_ptr<Xfer> x) {
  TransferResult result = x->result(pool_);
  result.stats.complete = Clock::now() - x->submitted;
  where_.erase(x->id);
  {
    std::lock_guard lock(counters_mutex_);
    if (result.ok())
      ++counters_.transfers_ok;
    else
      ++counters_.transfers_failed;
    ++counters_.failures[static_cast<int>(result.failure)];
    (x->pull ? counters_.bytes_pulled : counters_.bytes_pushed) += result.stats.bytes;
    if (x->same_host) counters_.bytes_same_host += result.stats.bytes;
  }
  if (!x->callback) return;
  try {
    x->callback(std::move(result));
  } catch (const std::exception& e) {
    spdlog::error("transfer {}: completion callback threw: {}", x->id, e.what());
  }
}

void TransferPlane::Impl::sleep() {
  bool armed = true;
  for (auto& [url, s] : initiators_) armed = s->worker().arm() && armed;
  for (auto& [link, s] : acceptors_) armed = s->worker().arm() && armed;
  if (!armed) return;
  bool busy = !where_.empty();
  for (auto& [link, s] : acceptors_) busy = busy || s->busy();
  epoll_event events[16];
  const int n = epoll_wait(epoll_.get(), events, 16, busy ? 1 : 100);
  for (int i = 0; i < n; ++i) {
    if (events[i].data.fd == wake_->fd()) wake_->drain();
  }
  last_event_ = Clock::now();
}

}  // namespace kvnode::transfer
