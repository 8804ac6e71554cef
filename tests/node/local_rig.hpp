// What the local socket's tests share (local_api_test, local_transport_test,
// local_retrieve_test): chunk bytes and tokens, a LocalClient with a short timeout, requests
// framed by hand on a raw connection and their answers read field by field, and ServiceRig, a
// store and a LocalService in this process for what a test tunes (timeouts, caps, slots).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <msgpack.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "client/raw_local_socket.hpp"
#include "kvnode/client/local_client.hpp"
#include "kvnode/node/local_service.hpp"
#include "node_rig.hpp"

namespace kvnode::node::local_rig {

using namespace rig;
using client::ChunkKeys;
using client::LocalClient;
using client::LocalClientOptions;
using test::RawLocalSocket;

inline constexpr std::size_t kBytes = 64 << 10;  // per chunk
inline constexpr std::size_t kChunkTokens = 16;

inline std::size_t or0(const Result<std::size_t>& r) {
  return r ? *r : 0;
}

inline std::string temp_socket(const std::string& name) {
  return "/tmp/kvnode-test-" + std::to_string(getpid()) + "-" + name + ".sock";
}

inline std::vector<std::byte> bytes_of(const std::vector<std::int64_t>& hashes,
                                       std::size_t chunk = kBytes) {
  std::vector<std::byte> out;
  for (std::int64_t h : hashes) {
    const std::vector<std::byte> b = chunk_bytes(h, chunk);
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

inline std::vector<std::int64_t> tokens(std::size_t n, std::int64_t first = 1) {
  std::vector<std::int64_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

inline std::unique_ptr<LocalClient> client_of(const std::string& path, bool shared = true,
                                              std::chrono::milliseconds timeout = 5s) {
  LocalClientOptions o;
  o.use_shared_memory = shared;
  o.timeout = timeout;
  auto c = LocalClient::connect(path, o);
  EXPECT_TRUE(c) << c.error().message;
  return c ? std::move(c).value() : nullptr;
}

// A request framed by hand on a raw connection: its answer's "ok", "error", "code" and, when
// present, "hold" and "count".
struct Answer {
  bool answered = false;
  bool ok = false;
  std::string error{};
  std::string code{};
  std::uint64_t hold = 0;
  std::uint64_t count = 0;
  std::uint64_t kv = 0;  // register_kv: the registration
};

inline Answer answer_of(const std::optional<std::string>& reply) {
  if (!reply) return {};
  msgpack::object_handle h = msgpack::unpack(reply->data(), reply->size());
  std::map<std::string, msgpack::object> m;
  h.get().convert(m);
  Answer a;
  a.answered = true;
  a.ok = m.at("ok").as<bool>();
  if (!a.ok) {
    a.error = m.at("error").as<std::string>();
    a.code = m.at("code").as<std::string>();
  }
  if (auto it = m.find("hold"); it != m.end()) a.hold = it->second.as<std::uint64_t>();
  if (auto it = m.find("count"); it != m.end()) a.count = it->second.as<std::uint64_t>();
  if (auto it = m.find("kv"); it != m.end()) a.kv = it->second.as<std::uint64_t>();
  return a;
}

// An error answer: its code first (what a program acts on), then the text a person reads.
inline void expect_error(const Answer& a, const std::string& code, const std::string& text) {
  ASSERT_TRUE(a.answered) << "no answer (wanted " << code << ")";
  EXPECT_FALSE(a.ok);
  EXPECT_EQ(a.code, code) << a.error;
  EXPECT_NE(a.error.find(text), std::string::npos) << a.error;
}

inline Answer ask(RawLocalSocket& s, const std::string& payload) {
  if (!s.connected() || !s.send_frame(payload)) return {};
  return answer_of(s.read_frame(5000ms));
}

inline Answer ask(const std::string& path, const std::string& payload) {
  RawLocalSocket s(path);
  return ask(s, payload);
}

template <class Write>
std::string pack(Write write) {
  msgpack::sbuffer b;
  msgpack::packer<msgpack::sbuffer> pk(b);
  write(pk);
  return std::string(b.data(), b.size());
}

inline std::string request(const std::string& op, const std::vector<std::int64_t>& hashes) {
  return pack([&](auto& pk) {
    pk.pack_map(2);
    pk.pack(std::string("op"));
    pk.pack(op);
    pk.pack(std::string("hashes"));
    pk.pack(hashes);
  });
}

// commit, abort or release of a hold.
inline std::string finish(const std::string& op, std::uint64_t hold) {
  return pack([&](auto& pk) {
    pk.pack_map(2);
    pk.pack(std::string("op"));
    pk.pack(op);
    pk.pack(std::string("hold"));
    pk.pack(hold);
  });
}

// A store and a LocalService in this process (no daemon): a pool of `pages` chunks of kBytes.
class ServiceRig {
 public:
  ServiceRig(const std::string& name, LocalServiceOptions o, std::size_t pages = 8,
             PeerMoves* moves = nullptr, Locate locate = nullptr)
      : pool_(make_pool(pages)), store_(pool_, kCpu, [](const StoreEvent&) {}), engine_(store_) {
    o.path = temp_socket(name);
    if (o.staging_slots > 0)
      o.staging_name = "/kvnode-test-" + std::to_string(getpid()) + "-" + name;
    auto s = LocalService::start(o, engine_, moves, std::move(locate));
    EXPECT_TRUE(s) << s.error().message;
    if (s) service_ = std::move(s).value();
  }
  LocalService& service() { return *service_; }
  const std::string& path() const { return service_->path(); }
  ChunkStore& store() { return store_; }
  Engine& engine() { return engine_; }

 private:
  static gpu::ChunkPool make_pool(std::size_t pages) {
    gpu::PoolOptions po;
    po.page_bytes = kBytes;
    po.pages = pages;
    return std::move(gpu::ChunkPool::create(po)).value();
  }
  gpu::ChunkPool pool_;
  ChunkStore store_;
  Engine engine_;
  std::unique_ptr<LocalService> service_;
};

}  // namespace kvnode::node::local_rig
