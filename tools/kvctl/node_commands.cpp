// kvctl's commands against a node on this host, over its local socket (kvnode::client): put
// (generated or file data), get (to a file) and verify (every byte against what put wrote).
// Generated data is a function of --seed and each chunk's hash, so a chunk can be verified on
// any node it was moved or copied to. Exit 0 on success, 1 when the node fails or a check does
// not hold, 2 on bad input.
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "chunk_pattern.hpp"
#include "cli_support.hpp"
#include "commands.hpp"
#include "kvnode/client/local_client.hpp"

namespace kvctl {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using kvnode::client::ChunkKeys;
using kvnode::client::LocalClient;

constexpr std::size_t kBatch = 8;  // chunks per request: bounds kvctl's memory

struct NodeArgs {
  std::string socket;
  bool json_out = false;
  TokenArgs tokens;
  std::uint64_t seed = 1;
  std::string file;
  bool retrieve = false;
  double wait_s = 30;  // put: how long to wait out a node's full sync
};

std::unique_ptr<LocalClient> connect(const NodeArgs& a) {
  if (a.socket.empty()) fail(2, "--node: the node's local socket path is required");
  auto c = LocalClient::connect(a.socket);
  if (!c) fail(1, c.error().message);
  return std::move(c).value();
}

std::vector<std::int64_t> hashes_of(LocalClient& c, const NodeArgs& a) {
  const std::vector<std::int64_t> tokens = a.tokens.get();
  if (tokens.empty()) fail(2, "no tokens: give --tokens, --token-range or --token-file");
  auto h = c.hashes(tokens);
  if (!h) fail(1, h.error().message);
  return std::move(h).value();
}

std::string where(const LocalClient& c) {
  const auto& i = c.info();
  return i.instance + " rank " + std::to_string(i.worker_id) +
         (c.shared_memory() ? " (shared memory)" : " (inline)");
}

std::string mib(double bytes) {
  std::ostringstream o;
  o.precision(1);
  o << std::fixed << bytes / (1 << 20) << " MiB";
  return o.str();
}

void print(const NodeArgs& a, const json& j, const std::string& human) {
  std::cout << (a.json_out ? j.dump() : human) << "\n";
}

// With --retrieve: pull what the node lacks from its peers first (P2P).
json maybe_retrieve(LocalClient& c, const NodeArgs& a, const std::vector<std::int64_t>& hashes) {
  if (!a.retrieve) return nullptr;
  const auto t0 = Clock::now();
  auto r = c.retrieve(ChunkKeys::of_hashes(hashes));
  if (!r) fail(1, "retrieve: " + r.error().message);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!a.json_out)
    std::cerr << "retrieved " << r->pulled << " chunks from "
              << (r->peer.empty() ? "no peer" : r->peer) << " in " << s * 1e3 << " ms; "
              << r->chunks << " of " << hashes.size() << " held\n";
  return json{{"pulled", r->pulled}, {"held", r->chunks}, {"peer", r->peer}, {"seconds", s}};
}

void add_common(CLI::App* c, NodeArgs& a) {
  c->add_option("--node", a.socket, "the node's local socket (kvnode logs it at start)")
      ->required();
  c->add_flag("--json", a.json_out, "print JSON");
  a.tokens.add(c);
}

void put(const NodeArgs& a) {
  auto c = connect(a);
  const std::vector<std::int64_t> hashes = hashes_of(*c, a);
  const std::size_t chunk = c->info().chunk_bytes;
  std::ifstream file;
  if (!a.file.empty()) {
    file.open(a.file, std::ios::binary | std::ios::ate);
    if (!file) fail(2, "--file: cannot read '" + a.file + "'");
    const auto size = static_cast<std::size_t>(file.tellg());
    if (size != hashes.size() * chunk)
      fail(2, "--file: " + std::to_string(hashes.size()) + " chunks of " + std::to_string(chunk) +
                  " bytes need " + std::to_string(hashes.size() * chunk) + " bytes, the file has " +
                  std::to_string(size));
    file.seekg(0);
  }
  std::vector<std::byte> buffer(kBatch * chunk);
  std::size_t stored = 0;
  double busy = 0;  // seconds in the node's put, not generating data
  bool told = false;
  kvnode::client::PutSeries series;  // the batches are one put: none evicts an earlier one's chunks
  for (std::size_t first = 0; first < hashes.size(); first += kBatch) {
    const std::size_t n = std::min(kBatch, hashes.size() - first);
    for (std::size_t i = 0; i < n; ++i) {
      std::span<std::byte> out(buffer.data() + i * chunk, chunk);
      if (file.is_open()) {
        if (!file.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(chunk)))
          fail(1, "--file: read failed");
      } else {
        fill_chunk_pattern(out, a.seed, hashes[first + i]);
      }
    }
    const std::vector<std::int64_t> batch(hashes.begin() + static_cast<std::ptrdiff_t>(first),
                                          hashes.begin() + static_cast<std::ptrdiff_t>(first + n));
    auto t0 = Clock::now();
    auto r = c->put(ChunkKeys::of_hashes(batch), std::span(buffer.data(), n * chunk), &series);
    // A node refuses writes while a full sync with the controller runs (seconds, at its start).
    for (const auto until = t0 + std::chrono::duration<double>(a.wait_s);
         !r && r.error().code == kvnode::ErrorCode::kFrozen && Clock::now() < until;) {
      if (!a.json_out && !told) std::cerr << "the node is syncing with its controller; waiting\n";
      told = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      t0 = Clock::now();
      r = c->put(ChunkKeys::of_hashes(batch), std::span(buffer.data(), n * chunk), &series);
    }
    busy += std::chrono::duration<double>(Clock::now() - t0).count();
    if (!r)
      fail(1,
           "put: " + r.error().message + " (" + std::to_string(stored) + " chunks stored before)");
    stored += *r;
    if (*r < n) break;  // the node is full: it keeps the longest prefix that fits
  }
  const double bytes = static_cast<double>(stored * chunk);
  std::ostringstream human;
  human << "stored " << stored;
  if (stored < hashes.size()) human << " of " << hashes.size();
  human << " chunks (" << mib(bytes) << ") at " << where(*c) << " in " << busy << " s ("
        << bytes / busy / 1e9 << " GB/s)";
  if (stored < hashes.size())
    human << "; the node has no room for the rest (it keeps the longest prefix that fits and "
             "evicts only older chunks)";
  print(a,
        {{"chunks", stored},
         {"bytes", stored * chunk},
         {"seconds", busy},
         {"shared_memory", c->shared_memory()}},
        human.str());
  if (stored < hashes.size()) throw CLI::RuntimeError(1);
}

// Reads the leading stored chunks batch by batch; calls each(index, bytes). Returns how many.
template <class Each>
std::size_t read_chunks(LocalClient& c, const std::vector<std::int64_t>& hashes, Each each) {
  const std::size_t chunk = c.info().chunk_bytes;
  std::vector<std::byte> buffer(kBatch * chunk);
  std::size_t read = 0;
  while (read < hashes.size()) {
    const std::size_t n = std::min(kBatch, hashes.size() - read);
    const std::vector<std::int64_t> batch(hashes.begin() + static_cast<std::ptrdiff_t>(read),
                                          hashes.begin() + static_cast<std::ptrdiff_t>(read + n));
    auto got = c.get(ChunkKeys::of_hashes(batch), buffer);
    if (!got) fail(1, "get: " + got.error().message);
    for (std::size_t i = 0; i < *got; ++i)
      each(read + i, std::span<const std::byte>(buffer.data() + i * chunk, chunk));
    read += *got;
    if (*got < n) break;
  }
  return read;
}

void get(const NodeArgs& a) {
  auto c = connect(a);
  const std::vector<std::int64_t> hashes = hashes_of(*c, a);
  json j = {{"retrieve", maybe_retrieve(*c, a, hashes)}};
  std::ofstream out;
  if (!a.file.empty()) {
    out.open(a.file, std::ios::binary | std::ios::trunc);
    if (!out) fail(2, "--out: cannot write '" + a.file + "'");
  }
  const std::size_t chunk = c->info().chunk_bytes;
  const std::size_t n = read_chunks(*c, hashes, [&](std::size_t, std::span<const std::byte> bytes) {
    if (out.is_open())
      out.write(reinterpret_cast<const char*>(bytes.data()),
                static_cast<std::streamsize>(bytes.size()));
  });
  if (out.is_open() && !out.flush()) fail(1, "--out: write failed");
  j["chunks"] = n;
  j["bytes"] = n * chunk;
  print(a, j,
        "read " + std::to_string(n) + " of " + std::to_string(hashes.size()) + " chunks (" +
            mib(static_cast<double>(n * chunk)) + ") from " + where(*c) +
            (out.is_open() ? " into " + a.file : ""));
  if (n < hashes.size()) throw CLI::RuntimeError(1);
}

void verify(const NodeArgs& a) {
  auto c = connect(a);
  const std::vector<std::int64_t> hashes = hashes_of(*c, a);
  json j = {{"retrieve", maybe_retrieve(*c, a, hashes)}};
  const std::size_t chunk = c->info().chunk_bytes;
  std::ifstream file;
  if (!a.file.empty()) {
    file.open(a.file, std::ios::binary);
    if (!file) fail(2, "--file: cannot read '" + a.file + "'");
  }
  std::vector<std::byte> expected(chunk);
  std::vector<std::string> bad;
  const std::size_t n =
      read_chunks(*c, hashes, [&](std::size_t i, std::span<const std::byte> bytes) {
        if (file.is_open()) {
          if (!file.read(reinterpret_cast<char*>(expected.data()),
                         static_cast<std::streamsize>(chunk)))
            std::fill(expected.begin(), expected.end(), std::byte{0});
        } else {
          fill_chunk_pattern(expected, a.seed, hashes[i]);
        }
        if (std::memcmp(expected.data(), bytes.data(), chunk) == 0) return;
        std::size_t at = 0;
        while (expected[at] == bytes[at]) ++at;
        bad.push_back("chunk " + std::to_string(i) + " (hash " + std::to_string(hashes[i]) +
                      ") differs from byte " + std::to_string(at));
      });
  j["chunks"] = hashes.size();
  j["present"] = n;
  j["mismatched"] = bad;
  std::ostringstream human;
  human << "verified " << n << " of " << hashes.size() << " chunks ("
        << mib(static_cast<double>(n * chunk)) << ") at " << where(*c) << ": ";
  if (n == hashes.size() && bad.empty()) {
    human << "every byte matches";
  } else {
    human << (hashes.size() - n) << " missing, " << bad.size() << " mismatched";
    for (const std::string& b : bad) human << "\n  " << b;
  }
  print(a, j, human.str());
  if (n < hashes.size() || !bad.empty()) throw CLI::RuntimeError(1);
}

}  // namespace

void add_node_commands(CLI::App& app) {
  auto p = std::make_shared<NodeArgs>();
  auto* put_cmd =
      app.add_subcommand("put", "store chunks at a local node: generated (--seed) or from --file");
  add_common(put_cmd, *p);
  put_cmd->add_option("--seed", p->seed, "generated data's seed (verify with the same)")
      ->capture_default_str();
  put_cmd->add_option("--file", p->file, "raw chunk bytes, chunk after chunk");
  put_cmd
      ->add_option("--wait", p->wait_s, "seconds to wait while the node syncs with its controller")
      ->capture_default_str();
  put_cmd->callback([p] { put(*p); });

  auto g = std::make_shared<NodeArgs>();
  auto* get_cmd = app.add_subcommand("get", "read the stored prefix of chunks from a local node");
  add_common(get_cmd, *g);
  get_cmd->add_option("--out", g->file, "write the chunks' bytes here");
  get_cmd->add_flag("--retrieve", g->retrieve, "first pull missing chunks from peers (P2P)");
  get_cmd->callback([g] { get(*g); });

  auto v = std::make_shared<NodeArgs>();
  auto* verify_cmd = app.add_subcommand(
      "verify", "check every byte of chunks at a local node against what put wrote");
  add_common(verify_cmd, *v);
  verify_cmd->add_option("--seed", v->seed, "the seed put used")->capture_default_str();
  verify_cmd->add_option("--file", v->file, "compare with this file instead");
  verify_cmd->add_flag("--retrieve", v->retrieve, "first pull missing chunks from peers (P2P)");
  verify_cmd->callback([v] { verify(*v); });
}

}  // namespace kvctl
