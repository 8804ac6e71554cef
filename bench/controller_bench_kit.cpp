// bench_controller's kit: the definitions behind controller_bench_kit.hpp, and the child roles
// this program runs as when started with `--child`.
#include "controller_bench_kit.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <iterator>
#include <stdexcept>
#include <thread>
#include <zmq_addon.hpp>

#include "kvnode/common/allocator.hpp"
#include "kvnode/controller/controller.hpp"

namespace bench {

namespace ctl = kvnode::controller;
using namespace std::chrono_literals;

std::string strf(const char* format, ...) {
  char buf[256];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// ---- messages ----

wire::ChunkHash chunk_hash(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = (seed << 40) + i + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return wire::ChunkHash(static_cast<std::int64_t>(z ^ (z >> 31)));
}

std::string admits(const std::string& instance, std::uint64_t seed, std::uint64_t first,
                   std::uint64_t n, std::uint64_t pool) {
  wire::BatchedKVOperationMsg msg{instance, 0, kLocation, {}};
  for (std::uint64_t i = first; i < first + n; ++i)
    msg.operations.push_back(
        {wire::OpType::kAdmit, chunk_hash(seed, i % pool), static_cast<std::int64_t>(i)});
  return wire::encode(wire::Msg{std::move(msg)});
}

std::string lru_ops(const std::string& instance, std::uint64_t seed, std::uint64_t base,
                    std::uint64_t first, std::uint64_t n) {
  wire::BatchedKVOperationMsg msg{instance, 0, kLocation, {}};
  const std::uint64_t k = first / 2;
  std::int64_t seq = static_cast<std::int64_t>(base + first);
  for (std::uint64_t i = k; i < k + n / 2; ++i)
    msg.operations.push_back({wire::OpType::kAdmit, chunk_hash(seed, base + i), seq++});
  for (std::uint64_t i = k; i < k + n / 2; ++i)
    msg.operations.push_back({wire::OpType::kEvict, chunk_hash(seed, i), seq++});
  return wire::encode(wire::Msg{std::move(msg)});
}

std::string lookup_msg(std::uint64_t seed, std::uint64_t first, std::uint64_t n) {
  wire::BatchedP2PLookupMsg msg{{}, kProbe, 0};
  for (std::uint64_t i = first; i < first + n; ++i) msg.hashes.push_back(chunk_hash(seed, i));
  return wire::encode(wire::Msg{std::move(msg)});
}

std::int64_t hits(const std::string& reply) {
  auto msg = wire::decode(reply);
  const auto* ret = msg ? std::get_if<wire::BatchedP2PLookupRetMsg>(&*msg) : nullptr;
  if (!ret) throw std::runtime_error("not a BatchedP2PLookupRetMsg: " + reply);
  return ret->layout_info.at(0).num_hit_chunks;
}

// ---- sockets ----

std::string tcp(int port) {
  return "tcp://127.0.0.1:" + std::to_string(port);
}

zmq::socket_t connect(zmq::context_t& ctx, zmq::socket_type type, int port) {
  zmq::socket_t s(ctx, type);
  s.set(zmq::sockopt::linger, 0);        // teardown never waits on a dead peer
  s.set(zmq::sockopt::rcvtimeo, 30000);  // a dead controller fails the bench, not hangs it
  s.connect(tcp(port));
  return s;
}

int bind_ephemeral(zmq::socket_t& s) {
  s.bind("tcp://127.0.0.1:*");
  const std::string endpoint = s.get(zmq::sockopt::last_endpoint);
  return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
}

void send_request(zmq::socket_t& dealer, std::string_view payload) {
  dealer.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);  // ["", payload]
  dealer.send(zmq::buffer(payload), zmq::send_flags::none);
}

std::string recv_reply(zmq::socket_t& dealer) {
  std::vector<zmq::message_t> frames;
  if (!zmq::recv_multipart(dealer, std::back_inserter(frames)))
    throw std::runtime_error("no reply within 30 s");
  return frames.back().to_string();
}

std::string request(zmq::socket_t& dealer, std::string_view payload) {
  send_request(dealer, payload);
  return recv_reply(dealer);
}

double round_trip_us(zmq::socket_t& dealer, std::string_view payload) {
  const auto start = Clock::now();
  (void)request(dealer, payload);
  return seconds_since(start) * 1e6;
}

void wait_applied(zmq::socket_t& dealer, const std::string& last_key_lookup) {
  const auto start = Clock::now();
  while (hits(request(dealer, last_key_lookup)) == 0) {
    if (seconds_since(start) > 120) throw std::runtime_error("admits not applied after 120 s");
    std::this_thread::sleep_for(200us);
  }
}

// ---- child roles (run as `bench_controller --child ROLE ARGS... FD`) ----

namespace {

// "controller": kvcontroller as its main runs it, on ephemeral ports, until killed.
void serve_controller(int fd) {
  kvnode::keep_freed_memory();             // as kvcontroller's main does
  spdlog::set_level(spdlog::level::warn);  // 10 k registrations would log 10 k info lines
  ctl::ControllerConfig config;
  config.controller_host = "127.0.0.1";
  config.controller_port = 0;
  config.controller_monitor_ports = {0, 0, 0};
  auto c = ctl::Controller::start(config);
  if (!c) throw std::runtime_error(c.error().message);
  const ctl::BoundPorts& p = (*c)->ports();
  bench::report(fd, Ports{p.pull, p.reply, p.heartbeat});
  for (;;) ::pause();
}

// "push": `total` admits from kLoad (0: until killed) in batches of 1000, keys cycling over
// `pool`, as fast as the controller takes them.
void push_admits(int pull_port, std::uint64_t seed, std::uint64_t total, std::uint64_t pool) {
  zmq::context_t ctx(1);
  zmq::socket_t push(ctx, zmq::socket_type::push);
  push.connect(tcp(pull_port));
  for (std::uint64_t sent = 0; total == 0 || sent < total; sent += 1000)
    push.send(zmq::buffer(admits(kLoad, seed, sent, 1000, pool)), zmq::send_flags::none);
}  // ~context_t waits (linger -1) until every frame has left

// "sink": the bare ingest baseline, a PULL that receives n frames and only counts them.
void sink_frames(int fd, std::uint64_t n) {
  zmq::context_t ctx(1);
  zmq::socket_t pull(ctx, zmq::socket_type::pull);
  pull.set(zmq::sockopt::rcvhwm, 1000);  // as the controller's PULL
  bench::report(fd, bind_ephemeral(pull));
  zmq::message_t frame;
  for (std::uint64_t i = 0; i < n; ++i) (void)pull.recv(frame);
  bench::report(fd, std::uint64_t{1});
}

// "echo": the bare request baseline, a ROUTER answering [id, "", request] with
// [id, "", reply_size bytes]: ZMQ's cost alone.
void echo(int fd, std::size_t reply_size) {
  zmq::context_t ctx(1);
  zmq::socket_t router(ctx, zmq::socket_type::router);
  bench::report(fd, bind_ephemeral(router));
  const std::string reply(reply_size, 'x');
  for (std::vector<zmq::message_t> frames;; frames.clear()) {
    (void)zmq::recv_multipart(router, std::back_inserter(frames));
    router.send(frames.front(), zmq::send_flags::sndmore);
    router.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
    router.send(zmq::buffer(reply), zmq::send_flags::none);
  }
}

}  // namespace

void child_main(const std::vector<std::string>& args) {
  const int fd = std::stoi(args.back());
  const auto arg = [&](std::size_t i) { return std::stoull(args.at(i)); };
  const std::string& role = args.at(0);
  if (role == "controller") serve_controller(fd);
  if (role == "sink") sink_frames(fd, arg(1));
  if (role == "echo") echo(fd, arg(1));
  if (role == "push") push_admits(static_cast<int>(arg(1)), arg(2), arg(3), arg(4));
}

// ---- starting children ----

ControllerProc start_controller(int cpu) {
  return spawn<Ports>({"controller"}, cpu);
}
Spawned<int> start_echo(std::size_t reply_size, int cpu) {
  return spawn<int>({"echo", std::to_string(reply_size)}, cpu);
}

Child start_pusher(int pull_port, std::uint64_t seed, std::uint64_t total, std::uint64_t pool,
                   int cpu) {
  return Child({"push", std::to_string(pull_port), std::to_string(seed), std::to_string(total),
                std::to_string(pool)},
               cpu);
}

void register_workers(zmq::context_t& ctx, int reply_port, const std::vector<std::string>& ids) {
  auto dealer = connect(ctx, zmq::socket_type::dealer, reply_port);
  for (std::size_t i = 0; i < ids.size(); i += 500) {  // pipelined, 500 in flight
    const std::size_t end = std::min(ids.size(), i + 500);
    for (std::size_t j = i; j < end; ++j)
      send_request(dealer, wire::encode(wire::Msg{address<wire::RegisterMsg>(ids[j])}));
    for (std::size_t j = i; j < end; ++j) (void)recv_reply(dealer);
  }
}

ControllerProc start_lookup_controller(int cpu) {
  ControllerProc c = start_controller(cpu);
  zmq::context_t ctx;
  register_workers(ctx, c.ports.reply, {kHolder, kLoad});
  auto push = connect(ctx, zmq::socket_type::push, c.ports.pull);
  push.send(zmq::buffer(admits(kHolder, kHeldSeed, 0, 1000)), zmq::send_flags::none);
  auto probe = connect(ctx, zmq::socket_type::dealer, c.ports.reply);
  wait_applied(probe, lookup_msg(kHeldSeed, 999, 1));
  return c;
}

// ---- results ----

std::string verdict(bool met) {
  return met ? "met" : "**missed**";
}

void print(const Report& report) {
  std::printf("\n| measurement | median | baseline (same run) | ratio | target | result |\n");
  std::printf("|---|---:|---:|---:|---|---|\n");
  for (const Row& r : report)
    std::printf("| %s | %s | %s | %s | %s | %s |\n", r.what.c_str(), r.measured.c_str(),
                r.baseline.c_str(), r.ratio.c_str(), r.target.c_str(), r.verdict.c_str());
}

std::string p50_p99(const std::vector<double>& us) {
  return strf("%.0f / %.0f us", bench::median(us), bench::percentile(us, 0.99));
}

}  // namespace bench
