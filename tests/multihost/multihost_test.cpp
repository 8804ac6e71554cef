// Multi-host: kvcontroller and three kvnode processes as four hosts, each in a network namespace
// of its own with its own address, joined by veth pairs to a bridge (netns_rig.hpp). Real
// processes, ZeroMQ and HTTP across hosts, UCX over tcp on the veth interfaces. In turn:
// - registration across hosts: the controller binds 0.0.0.0 and advertises its address for
//   heartbeats; every node registers with its own address and heartbeats get through;
// - P2P: chunks put on node 1 are looked up there, moved to node 2 (copy=false; every byte checked
//   at node 2), and node 3 pulls them from node 2 by a P2P retrieve (every byte checked);
// - a link cut mid-move: node 2's switch port goes down while a 1024-chunk move into it runs (held
//   mid-way by stopping the source while it is looked at); the controller reaps node 2, the link
//   comes back, node 2 re-registers. Nothing is lost: every chunk is at the source or at node 2,
//   byte for byte, every chunk the move's answer confirmed is at node 2 only, and the index
//   converges (per-instance key counts are what each node really holds; the lookup names a node
//   that holds the longest prefix);
// - node 3's host disappears (SIGKILL): the controller reaps it, the lookup stops naming it; it
//   returns on the same address and ports, re-registers and pulls the chunks again;
// - the controller's host restarts (SIGKILL, then the same address and ports; node 1 stores more
//   while it is away): the nodes re-register through heartbeats and full syncs restore the index.
// Needs root and iproute2 (`ip netns add`); skips with the reason where the machine refuses.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <future>
#include <iomanip>
#include <iostream>
#include <map>
#include <numeric>

#include "kvctl/chunk_pattern.hpp"
#include "kvnode/client/local_client.hpp"
#include "netns_rig.hpp"

namespace kvnode::multihost {
namespace {

using client::ChunkKeys;
using client::LocalClient;

constexpr std::size_t kChunkTokens = 16;
constexpr std::size_t kChunkBytes = 256 << 10;
constexpr std::size_t kMoveBatch = 256;  // chunks a move sends per round (PeerMoves::kBatch)
constexpr std::uint64_t kSeed = 11;
constexpr const char* kWorkerPort = "8500";
constexpr const char* kP2pPort = "8200";

// Token ranges, chunk-aligned: chunks of kChunkTokens tokens from `first`.
struct Range {
  std::int64_t first;
  std::size_t chunks;
  std::string arg() const {
    return std::to_string(first) + ":" +
           std::to_string(first + static_cast<std::int64_t>(chunks * kChunkTokens));
  }
  std::vector<std::int64_t> tokens() const {
    std::vector<std::int64_t> t(chunks * kChunkTokens);
    std::iota(t.begin(), t.end(), first);
    return t;
  }
  std::int64_t token_count() const { return static_cast<std::int64_t>(chunks * kChunkTokens); }
};

std::size_t count(const std::vector<bool>& v) {
  return static_cast<std::size_t>(std::count(v.begin(), v.end(), true));
}
std::size_t leading(const std::vector<bool>& v) {
  return static_cast<std::size_t>(std::find(v.begin(), v.end(), false) - v.begin());
}
// A `kvctl verify --retrieve --json` answer's retrieve part.
Json retrieved(const Json& verify) {
  return verify.contains("retrieve") && verify["retrieve"].is_object() ? verify["retrieve"]
                                                                       : Json::object();
}
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct NodeHost {
  std::string instance;
  std::string socket;  // its local client socket
  std::unique_ptr<HostProcess> process;
};

class MultiHost : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure()) {
      auto tail = [](const std::string& s) {
        return s.size() > 6000 ? "..." + s.substr(s.size() - 6000) : s;
      };
      if (controller_)
        std::cout << "---- controller log ----\n" << tail(controller_->log()) << "\n";
      for (std::size_t i = 0; i < nodes_.size(); ++i)
        if (nodes_[i].process)
          std::cout << "---- node " << i + 1 << " log ----\n"
                    << tail(nodes_[i].process->log()) << "\n";
    }
    // KVNODE_MULTIHOST_LOGS=DIR keeps every process's log there, passed or failed.
    if (const char* dir = std::getenv("KVNODE_MULTIHOST_LOGS"); dir && *dir) {
      if (controller_) std::ofstream(std::string(dir) + "/controller.log") << controller_->log();
      for (std::size_t i = 0; i < nodes_.size(); ++i)
        if (nodes_[i].process)
          std::ofstream(std::string(dir) + "/node" + std::to_string(i + 1) + ".log")
              << nodes_[i].process->log();
    }
    // Processes first (before their namespaces go), then the namespaces, then files they left.
    controller_.reset();
    nodes_.clear();
    if (net_) {
      const std::string prefix = net_->prefix();
      net_.reset();
      remove_files_named("/tmp", prefix + "-");
      remove_files_named("/dev/shm", prefix + "-");
    }
  }

  const Host& ctl() const { return net_->host("ctl"); }
  const Host& host_of(std::size_t i) const { return net_->host("n" + std::to_string(i + 1)); }
  std::string controller_api() const { return ctl().addr + ":9000"; }

  // kvctl run on a host; its JSON output with "exit" added, or {"failed": stderr, "exit": code}.
  Json kvctl_at(const Host& h, std::vector<std::string> args, std::chrono::seconds patience = 60s) {
    std::vector<std::string> argv = {ip_binary(), "netns", "exec", h.ns, KVCTL_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--json");
    const test::ProcessResult r = test::run_process(argv, {}, patience);
    Json j = Json::parse(r.out, nullptr, false);
    if (!j.is_object()) j = Json{{"failed", r.err + r.out}};
    j["exit"] = r.exit_code;
    return j;
  }
  // kvctl against the controller's HTTP API, from the controller's host.
  Json api(std::vector<std::string> args, std::chrono::seconds patience = 60s) {
    args.insert(args.end(), {"--controller", controller_api()});
    return kvctl_at(ctl(), std::move(args), patience);
  }
  // instance -> its worker's JSON (rank 0); nullopt when the controller does not answer.
  std::optional<std::map<std::string, Json>> workers() {
    const Json j = api({"workers"}, 20s);
    if (!j.contains("workers") || !j["workers"].is_array()) return std::nullopt;
    std::map<std::string, Json> out;
    for (const Json& w : j["workers"]) out[w.value("instance_id", "")] = w;
    return out;
  }
  // The controller answers, and no longer lists node i.
  bool gone(std::size_t i) {
    const auto w = workers();
    return w && !w->contains(nodes_[i].instance);
  }

  // instance -> indexed keys; nullopt when the controller does not answer.
  std::optional<std::map<std::string, std::int64_t>> key_counts() {
    const Json j = api({"key-stats"}, 20s);
    if (!j.contains("instances")) return std::nullopt;
    std::map<std::string, std::int64_t> out;
    for (const Json& i : j["instances"])
      if (i.value("key_count", 0) > 0) out[i.value("instance_id", "")] = i.value("key_count", 0);
    return out;
  }
  // The lookup's answer: {instance, tokens}, {"", 0} for none, {"?", -1} when it failed.
  std::pair<std::string, std::int64_t> lookup(const Range& r) {
    const Json j = api({"lookup", "--token-range", r.arg()}, 20s);
    if (!j.contains("layout_info") || !j["layout_info"].is_object()) return {"?", -1};
    for (const auto& [instance, where] : j["layout_info"].items())
      if (where.is_array() && where.size() == 2) return {instance, where[1].get<std::int64_t>()};
    return {"", 0};
  }

  std::vector<std::string> node_argv(std::size_t i, const std::string& gigabytes) const {
    const Host& h = host_of(i);
    return {KVNODE_PATH,
            "--instance-id",
            nodes_[i].instance,
            "--controller-pull-url",
            ctl().addr + ":8300",
            "--controller-reply-url",
            ctl().addr + ":8400",
            "--worker-ports",
            kWorkerPort,
            "--p2p-host",
            h.addr,
            "--p2p-init-ports",
            kP2pPort,
            "--advertise-ip",
            h.addr,
            "--http-port",
            "9100",
            "--ucx-tls",
            "tcp",
            "--ucx-net-devices",
            Topology::kIface,
            "--full-sync-startup-delay",
            "0",
            "--heartbeat-time",
            "0.5",
            "--local-socket",
            nodes_[i].socket,
            "--local-staging-mb",
            "16",
            "--chunk-bytes",
            std::to_string(kChunkBytes),
            "--chunk-size",
            std::to_string(kChunkTokens),
            "--max-local-cpu-size",
            gigabytes,
            "--log-level",
            "info"};
  }

  // Registered with its own address and transfer plane, as the controller lists it.
  bool registered(std::size_t i, const std::optional<std::map<std::string, Json>>& listed) const {
    if (!listed) return false;
    const auto it = listed->find(nodes_[i].instance);
    return it != listed->end() && it->second.value("ip", "") == host_of(i).addr &&
           it->second.value("peer_init_url", "") == host_of(i).addr + ":" + kP2pPort;
  }
  bool registered(std::size_t i) { return registered(i, workers()); }
  bool all_registered() {
    const auto listed = workers();
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      if (!registered(i, listed)) return false;
    return true;
  }

  std::unique_ptr<LocalClient> client(std::size_t i) {
    auto c = LocalClient::connect(nodes_[i].socket);
    if (!c) {
      ADD_FAILURE() << "node " << i + 1 << "'s local socket: " << c.error().message;
      return nullptr;
    }
    return std::move(c).value();
  }
  std::vector<std::int64_t> hashes(std::size_t i, const Range& r) {
    auto c = client(i);
    if (!c) return {};
    auto h = c->hashes(r.tokens());
    if (!h) ADD_FAILURE() << h.error().message;
    return h ? *h : std::vector<std::int64_t>{};
  }
  // Which of the chunks node i holds.
  std::vector<bool> held(std::size_t i, const std::vector<std::int64_t>& chunk_hashes) {
    auto c = client(i);
    if (!c) return std::vector<bool>(chunk_hashes.size(), false);
    auto h = c->contains(ChunkKeys::of_hashes(chunk_hashes));
    if (!h) ADD_FAILURE() << "node " << i + 1 << ": " << h.error().message;
    return h ? *h : std::vector<bool>(chunk_hashes.size(), false);
  }
  // Reads every chunk node i is said to hold and checks its bytes; the chunks that differ or
  // could not be read.
  std::vector<std::size_t> bad_bytes(std::size_t i, const std::vector<std::int64_t>& chunk_hashes,
                                     const std::vector<bool>& present) {
    std::vector<std::size_t> bad;
    auto c = client(i);
    if (!c) return bad;
    std::vector<std::byte> got(kChunkBytes), want(kChunkBytes);
    for (std::size_t k = 0; k < chunk_hashes.size(); ++k) {
      if (!present[k]) continue;
      auto n = c->get(ChunkKeys::of_hashes({chunk_hashes[k]}), got);
      kvctl::fill_chunk_pattern(want, kSeed, chunk_hashes[k]);
      if (!n || *n != 1 || got != want) bad.push_back(k);
    }
    return bad;
  }

  Json put(std::size_t i, const Range& r) {
    return kvctl_at(host_of(i), {"put", "--node", nodes_[i].socket, "--token-range", r.arg(),
                                 "--seed", std::to_string(kSeed)});
  }
  Json verify(std::size_t i, const Range& r, bool retrieve) {
    std::vector<std::string> args = {"verify", "--node", nodes_[i].socket,     "--token-range",
                                     r.arg(),  "--seed", std::to_string(kSeed)};
    if (retrieve) args.push_back("--retrieve");
    return kvctl_at(host_of(i), args);
  }
  Json move(std::size_t from, std::size_t to, const Range& r, std::chrono::seconds patience = 60s) {
    return api(
        {"move", "--from", nodes_[from].instance, "--to", nodes_[to].instance, "--token-range",
         r.arg(), "--chunk-size", std::to_string(kChunkTokens), "--chunk-bytes",
         std::to_string(kChunkBytes), "--timeout", std::to_string(patience.count())},
        patience + 30s);
  }

  std::unique_ptr<Topology> net_;
  std::unique_ptr<HostProcess> controller_;
  std::vector<NodeHost> nodes_;
};

TEST_F(MultiHost, ThreeNodesAndAControllerOnSeparateHostsLoseNoChunk) {
  const auto test_start = Clock::now();
  if (::geteuid() != 0)
    GTEST_SKIP() << "the multi-host test needs root: it makes network namespaces and veth pairs "
                    "(ip netns add)";
  if (ip_binary().empty())
    GTEST_SKIP()
        << "the multi-host test needs iproute2's `ip` (Debian package iproute2); not found";
  remove_leftovers();
  net_ = std::make_unique<Topology>(std::vector<std::string>{"ctl", "n1", "n2", "n3"});
  if (!net_->error().empty())
    GTEST_SKIP()
        << "this machine does not allow the multi-host test's network namespaces, veth pairs and "
           "bridge (needs CAP_SYS_ADMIN and CAP_NET_ADMIN, e.g. a privileged container): "
        << net_->error();
  auto say = [&](const std::string& what) {
    std::cout << "[ multihost ] " << std::fixed << std::setprecision(1) << seconds_since(test_start)
              << " s: " << what << std::endl;
  };
  say("hosts up: controller " + ctl().addr + ", nodes " + host_of(0).addr + ", " + host_of(1).addr +
      ", " + host_of(2).addr + " on a bridge");

  // ---- Registration across hosts ---------------------------------------------------------------
  controller_ = std::make_unique<HostProcess>(
      ctl(),
      std::vector<std::string>{
          KVCONTROLLER_PATH, "--host", "0.0.0.0", "--port", "9000", "--monitor-ports",
          R"({"pull": 8300, "reply": 8400, "heartbeat": 8082})", "--advertise-host", ctl().addr,
          "--chunk-size", std::to_string(kChunkTokens), "--health-check-interval", "1",
          "--lmcache-worker-timeout", "3", "--fanout-timeout", "60", "--log-level", "info"});
  controller_->start();
  for (std::size_t i = 0; i < 3; ++i) {
    const std::string tag = net_->prefix() + "-n" + std::to_string(i + 1);
    nodes_.push_back(NodeHost{tag, "/tmp/" + tag + ".sock", nullptr});
  }
  // Pools: nodes 1 and 2 take the 1024-chunk move and more (1335 chunks of 256 KiB), node 3 a
  // little.
  const std::vector<std::string> sizes = {"0.35", "0.35", "0.05"};
  for (std::size_t i = 0; i < 3; ++i) {
    nodes_[i].process = std::make_unique<HostProcess>(host_of(i), node_argv(i, sizes[i]));
    nodes_[i].process->start();
  }
  ASSERT_TRUE(
      eventually(
          [&] { return !controller_->running() || api({"workers"}, 10s).contains("workers"); },
          30s) &&
      controller_->running())
      << "the controller did not come up on " << controller_api();
  ASSERT_TRUE(eventually(
                  [&] {
                    for (std::size_t i = 0; i < 3; ++i)
                      if (!nodes_[i].process->running()) return true;
                    return all_registered();
                  },
                  60s) &&
              all_registered())
      << "every node registers with its own address: " << api({"workers"}).dump();
  // Heartbeats reach the address the controller advertised: every last_heartbeat_time moves.
  std::map<std::string, double> beat;
  for (const auto& [instance, w] : workers().value_or(std::map<std::string, Json>{}))
    beat[instance] = w.value("last_heartbeat_time", 0.0);
  ASSERT_EQ(beat.size(), 3u);
  ASSERT_TRUE(eventually(
      [&] {
        const auto w = workers();
        if (!w) return false;
        for (const NodeHost& n : nodes_)
          if (!w->contains(n.instance) ||
              w->at(n.instance).value("last_heartbeat_time", 0.0) <= beat[n.instance])
            return false;
        return true;
      },
      20s))
      << "heartbeats from every host: " << api({"workers"}).dump();
  say("3 nodes registered across hosts, heartbeating to " + ctl().addr + ":8082");

  // ---- P2P lookup and move between hosts
  // ---------------------------------------------------------
  const Range a{0, 64};
  Json r = put(0, a);
  ASSERT_EQ(r.value("chunks", 0), 64) << r.dump();
  ASSERT_TRUE(eventually(
      [&] { return lookup(a) == std::make_pair(nodes_[0].instance, a.token_count()); }, 20s))
      << api({"lookup", "--token-range", a.arg()}).dump();
  r = move(0, 1, a);
  ASSERT_EQ(r.value("num_tokens", -1), a.token_count()) << r.dump();
  r = verify(1, a, false);
  ASSERT_EQ(r.value("exit", -1), 0) << "every byte arrived at node 2: " << r.dump();
  const std::vector<std::int64_t> a_hashes = hashes(0, a);
  EXPECT_EQ(count(held(0, a_hashes)), 0u) << "a move (not a copy) leaves nothing at the source";
  ASSERT_TRUE(eventually(
      [&] { return lookup(a) == std::make_pair(nodes_[1].instance, a.token_count()); }, 20s))
      << api({"lookup", "--token-range", a.arg()}).dump();
  // Node 3 asks the controller who holds them and pulls from that host.
  r = verify(2, a, true);
  ASSERT_EQ(r.value("exit", -1), 0) << r.dump();
  EXPECT_EQ(retrieved(r).value("pulled", 0), 64) << r.dump();
  EXPECT_EQ(retrieved(r).value("peer", ""), host_of(1).addr + ":" + kP2pPort) << r.dump();
  say("64 chunks put on node 1, moved to node 2 over UCX tcp, pulled by node 3 (P2P), every byte "
      "checked");

  // ---- A link cut mid-move ----------------------------------------------------------------------
  const Range b{1'000'000, 4 * kMoveBatch};  // four of the move's rounds
  r = put(0, b);
  ASSERT_EQ(r.value("chunks", 0), static_cast<int>(b.chunks)) << r.dump();
  const std::vector<std::int64_t> b_hashes = hashes(0, b);
  ASSERT_EQ(b_hashes.size(), b.chunks);
  ASSERT_TRUE(eventually(
      [&] { return lookup(b) == std::make_pair(nodes_[0].instance, b.token_count()); }, 20s));
  const pid_t source = nodes_[0].process->pid();
  ASSERT_GT(source, 0);
  auto destination = client(1);
  ASSERT_TRUE(destination);
  std::future<Json> moving = std::async(std::launch::async, [&] { return move(0, 1, b, 120s); });
  // Stop the source, look how far the move got at node 2, cut the link once at least one round
  // (but not all) is committed there, let the source go on. Stopped, the source cannot finish
  // the move between the look and the cut, whatever the machine's load.
  bool cut = false;
  std::size_t at_cut = 0;
  Clock::time_point cut_at;
  for (const auto until = Clock::now() + 60s; Clock::now() < until;) {
    ASSERT_EQ(::kill(source, SIGSTOP), 0);
    if (!eventually([&] { return proc_state(source) == 'T'; }, 5s)) {
      ::kill(source, SIGCONT);
      FAIL() << "node 1 (pid " << source << ") did not stop";
    }
    auto there = destination->contains(ChunkKeys::of_hashes(b_hashes));
    if (!there) {
      ::kill(source, SIGCONT);
      FAIL() << there.error().message;
    }
    at_cut = count(*there);
    if (at_cut >= kMoveBatch && at_cut < b.chunks) {
      const std::string e = net_->set_link("n2", false);
      cut_at = Clock::now();
      ::kill(source, SIGCONT);
      ASSERT_EQ(e, "");
      cut = true;
      break;
    }
    ::kill(source, SIGCONT);
    if (moving.wait_for(0s) == std::future_status::ready) break;
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(cut) << "the move ended before the link could be cut under it: "
                   << (moving.wait_for(0s) == std::future_status::ready ? moving.get().dump() : "");
  say("link to node 2 cut with " + std::to_string(at_cut) + " of " + std::to_string(b.chunks) +
      " chunks committed there");
  destination.reset();
  // Node 2's heartbeats stop: the controller reaps it.
  ASSERT_TRUE(eventually([&] { return gone(1); }, 30s))
      << "node 2 is reaped while its link is down: " << api({"workers"}).dump();
  say("node 2 reaped " + std::to_string(seconds_since(cut_at)).substr(0, 4) + " s after the cut");
  // The link stays down past the transfer deadline (10 s) unless the move has answered by then.
  (void)moving.wait_until(cut_at + 11s);
  ASSERT_EQ(net_->set_link("n2", true), "");
  say(std::string("link back up; the move ") +
      (moving.wait_for(0s) == std::future_status::ready ? "had answered" : "is still running"));
  ASSERT_EQ(moving.wait_for(150s), std::future_status::ready) << "the move never answered";
  const Json moved = moving.get();
  const std::size_t confirmed =
      moved.contains("num_tokens") ? moved["num_tokens"].get<std::size_t>() / kChunkTokens : 0;
  say("the move answered " + moved.dump().substr(0, 200) + ": " + std::to_string(confirmed) +
      " chunks confirmed");
  ASSERT_TRUE(eventually([&] { return registered(1); }, 30s))
      << "node 2 re-registers once its link is back: " << api({"workers"}).dump();

  // Nothing lost: each chunk at the source or at node 2, byte for byte; the confirmed ones at
  // node 2 only.
  const std::vector<bool> b_at_1 = held(0, b_hashes), b_at_2 = held(1, b_hashes);
  for (std::size_t k = 0; k < b.chunks; ++k) {
    ASSERT_TRUE(b_at_1[k] || b_at_2[k])
        << "chunk " << k << " of " << b.chunks << " is lost: at neither node";
    if (k < confirmed) {
      EXPECT_TRUE(b_at_2[k]) << "chunk " << k << " was confirmed but is not at node 2";
      EXPECT_FALSE(b_at_1[k]) << "chunk " << k
                              << " was confirmed (moved, not copied) but stayed at node 1";
    }
  }
  EXPECT_EQ(bad_bytes(0, b_hashes, b_at_1), std::vector<std::size_t>{})
      << "chunks at node 1 whose bytes differ";
  EXPECT_EQ(bad_bytes(1, b_hashes, b_at_2), std::vector<std::size_t>{})
      << "chunks at node 2 whose bytes differ";
  say("nothing lost: " + std::to_string(count(b_at_1)) + " chunks at node 1, " +
      std::to_string(count(b_at_2)) + " at node 2, every byte checked");

  // The index converges to what the nodes hold.
  std::map<std::string, std::int64_t> expected = {
      {nodes_[0].instance, static_cast<std::int64_t>(count(b_at_1))},
      {nodes_[1].instance, static_cast<std::int64_t>(a.chunks + count(b_at_2))},
      {nodes_[2].instance, static_cast<std::int64_t>(a.chunks)}};
  std::erase_if(expected, [](const auto& e) { return e.second == 0; });
  const std::size_t b_best = std::max(leading(b_at_1), leading(b_at_2));
  auto b_indexed = [&] {
    const auto [instance, tokens] = lookup(b);
    if (b_best == 0) return tokens == 0;
    const std::size_t have = instance == nodes_[0].instance   ? leading(b_at_1)
                             : instance == nodes_[1].instance ? leading(b_at_2)
                                                              : 0;
    return tokens == static_cast<std::int64_t>(b_best * kChunkTokens) && have == b_best;
  };
  ASSERT_TRUE(eventually([&] { return key_counts() == expected && b_indexed(); }, 30s))
      << "the index converges: key-stats " << api({"key-stats"}).dump() << ", lookup "
      << api({"lookup", "--token-range", b.arg()}).dump() << "; node 1 holds " << count(b_at_1)
      << " (leading " << leading(b_at_1) << "), node 2 " << count(b_at_2) << " (leading "
      << leading(b_at_2) << ")";
  say("the index converged");

  // ---- Node 3's host disappears and returns -----------------------------------------------------
  ASSERT_TRUE(nodes_[2].process->kill());
  const auto killed_at = Clock::now();
  ASSERT_TRUE(eventually([&] { return gone(2); }, 30s))
      << "the controller reaps node 3: " << api({"workers"}).dump();
  say("node 3 killed, reaped after " + std::to_string(seconds_since(killed_at)).substr(0, 4) +
      " s");
  std::erase_if(expected, [&](const auto& e) { return e.first == nodes_[2].instance; });
  EXPECT_TRUE(eventually([&] { return key_counts() == expected; }, 10s))
      << api({"key-stats"}).dump();
  EXPECT_EQ(lookup(a), std::make_pair(nodes_[1].instance, a.token_count()))
      << "the lookup no longer names node 3";
  nodes_[2].process->keep_log();
  nodes_[2].process->start();
  ASSERT_TRUE(eventually([&] { return !nodes_[2].process->running() || registered(2); }, 60s) &&
              nodes_[2].process->running())
      << "node 3 returns on the same address and ports: " << api({"workers"}).dump();
  r = verify(2, a, true);
  ASSERT_EQ(r.value("exit", -1), 0) << r.dump();
  EXPECT_EQ(retrieved(r).value("pulled", 0), 64)
      << "the returned node 3 starts empty and pulls again: " << r.dump();
  expected[nodes_[2].instance] = static_cast<std::int64_t>(a.chunks);
  ASSERT_TRUE(eventually([&] { return key_counts() == expected; }, 20s))
      << api({"key-stats"}).dump();
  say("node 3 back, re-registered, pulled 64 chunks from node 2 again");

  // ---- The controller's host restarts -----------------------------------------------------------
  ASSERT_TRUE(controller_->kill());
  // While it is away, node 1 stores more: the controller never hears of it but from a full sync.
  const Range c{2'000'000, 32};
  r = put(0, c);
  ASSERT_EQ(r.value("chunks", 0), 32) << r.dump();
  expected[nodes_[0].instance] += static_cast<std::int64_t>(c.chunks);
  controller_->keep_log();
  controller_->start();
  const auto restarted = Clock::now();
  // A node whose heartbeat was in flight when the controller died waits out the agent's request
  // timeout (30 s, AgentOptions::request_timeout; kvnode has no flag for it) before its next
  // heartbeat re-registers it: hence 45 s here, where 1 s is the usual.
  ASSERT_TRUE(eventually([&] { return all_registered(); }, 45s))
      << "the nodes re-register with the restarted controller: " << api({"workers"}).dump();
  const double reregistered = seconds_since(restarted);
  say("controller restarted; 3 nodes re-registered after " +
      std::to_string(reregistered).substr(0, 4) + " s" +
      (reregistered > 10
           ? " (a heartbeat lost with the old controller waited out the 30 s request timeout)"
           : ""));
  const auto a_indexed = [&] {
    const auto l = lookup(a);
    return (l.first == nodes_[1].instance || l.first == nodes_[2].instance) &&
           l.second == a.token_count();
  };
  ASSERT_TRUE(eventually(
      [&] {
        return key_counts() == expected && a_indexed() && b_indexed() &&
               lookup(c) == std::make_pair(nodes_[0].instance, c.token_count());
      },
      30s))
      << "full syncs restore the index: key-stats " << api({"key-stats"}).dump() << "; lookup A "
      << api({"lookup", "--token-range", a.arg()}).dump() << ", B "
      << api({"lookup", "--token-range", b.arg()}).dump() << ", C "
      << api({"lookup", "--token-range", c.arg()}).dump();
  say("full syncs restored the index " + std::to_string(seconds_since(restarted)).substr(0, 4) +
      " s after the restart");

  // ---- Everything stops cleanly (SIGTERM: exit 0; under sanitizers, no report) ------------------
  for (std::size_t i = 0; i < 3; ++i) {
    const std::optional<int> code = nodes_[i].process->stop(SIGTERM, 20s);
    EXPECT_EQ(code, std::optional<int>(0))
        << "node " << i + 1 << " " << nodes_[i].process->describe_exit();
  }
  EXPECT_EQ(controller_->stop(SIGTERM, 20s), std::optional<int>(0)) << controller_->describe_exit();
  say("done");
}

}  // namespace
}  // namespace kvnode::multihost
