// What the engine KV path's process tests share (kv_engine_test, kv_engine_gpu_test): this test
// process is the engine, a real kvnode process the node. A KV cache of one of the layouts engines
// use (vLLM FlashAttention, FlashInfer, MLA, SGLang, and an HND layout made by hand), shared with
// the node (memfds) or plain (the test's reference copy); chunk copies written out here, by the
// element formula, independent of the client library's gather/scatter; random block tables; and
// the node's descriptor and memfd mapping counts, read from /proc.
//
// Every layout's 16-token chunk is exactly one 262144-byte page, NodeProcess's --chunk-bytes:
// 8 layers x 8 KV heads x head_size 64 x 2 bytes (MLA: 16 layers x head_size 512 x 2 bytes).
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvnode/client/local_client.hpp"
#include "node_process.hpp"

namespace kvnode::node::kv_rig {

using namespace proc;
using client::ChunkKeys;
using client::HostKvMemory;
using client::KvAllocation;
using client::KvLayout;
using client::KvTransfer;
using client::KvTransferReply;
using client::LocalClient;

inline constexpr std::size_t kPageBytes = 262144;  // NodeProcess's --chunk-bytes
inline constexpr std::size_t kChunkTokens = 16;    // NodeProcess's --chunk-size
inline constexpr std::uint32_t kLayers = 8, kHeads = 8, kHeadSize = 64, kElem = 2;
inline constexpr std::uint32_t kMlaLayers = 16, kMlaHeadSize = 512;
inline constexpr std::size_t kPad = 4096;  // bytes before the first tensor and after the last

enum class Preset : std::uint8_t { kVllm, kFlashInfer, kMla, kSglang, kHnd };
inline const char* preset_name(Preset p) {
  constexpr const char* kNames[] = {"vLLM", "FlashInfer", "MLA", "SGLang", "HND"};
  return kNames[static_cast<int>(p)];
}

struct CacheSpec {
  Preset preset = Preset::kVllm;
  std::uint32_t num_blocks = 64;
  std::uint32_t block_size = 16;
};

// How gtest names a spec (ctest's test names hold it).
inline void PrintTo(const CacheSpec& s, std::ostream* os) {
  *os << preset_name(s.preset) << ", " << s.num_blocks << " blocks of " << s.block_size;
}

inline std::uint32_t layers_of(Preset p) {
  return p == Preset::kMla ? kMlaLayers : kLayers;
}
// Bytes of one tensor (one layer's K, V or MLA latent) over all blocks.
inline std::size_t tensor_bytes(const CacheSpec& s) {
  const std::size_t row = std::size_t{s.preset == Preset::kMla ? kMlaHeadSize : kHeadSize} * kElem;
  return std::size_t{s.num_blocks} * s.block_size * row * (s.preset == Preset::kMla ? 1 : kHeads);
}

// The allocations a spec's cache is made of, in order: vLLM and MLA one for all layers, FlashInfer
// one per layer, SGLang one for every K and one for every V, HND one with a gap between layers.
inline std::vector<std::size_t> allocation_sizes(const CacheSpec& s) {
  const std::size_t t = tensor_bytes(s), layers = layers_of(s.preset);
  switch (s.preset) {
    case Preset::kVllm:
      return {kPad + layers * 2 * t + kPad};
    case Preset::kMla:
      return {kPad + layers * t + kPad};
    case Preset::kFlashInfer:
      return std::vector<std::size_t>(layers, kPad + 2 * t + kPad);
    case Preset::kSglang:
      return {kPad + layers * t + kPad, kPad + layers * t + kPad};
    case Preset::kHnd:
      return {kPad + layers * (2 * t + kPad)};
  }
  return {};
}

// HND by hand, FlashInfer's other order: a layer is [num_blocks, 2, heads, block_size, head],
// the layers one after another in one allocation with a gap between them.
inline Result<KvLayout> hnd_layout(const CacheSpec& s, std::byte* base, std::size_t bytes) {
  const std::size_t row = std::size_t{kHeadSize} * kElem, half = kHeads * s.block_size * row;
  KvLayout l;
  l.num_blocks = s.num_blocks;
  l.block_size = s.block_size;
  l.kv_heads = kHeads;
  l.head_size = kHeadSize;
  l.elem_bytes = kElem;
  for (std::size_t i = 0; i < kLayers; ++i) {
    client::KvTensor k;
    k.base = base;
    k.allocation_bytes = bytes;
    k.offset = kPad + i * (2 * tensor_bytes(s) + kPad);
    k.block_stride = 2 * half;
    k.token_stride = row;
    k.head_stride = s.block_size * row;
    client::KvTensor v = k;
    v.offset += half;
    l.layers.push_back({k, v});
  }
  if (Status st = client::validate(l); !st) return st.error();
  return l;
}

// The spec's layout over allocations at `bases` (sizes from allocation_sizes()).
inline Result<KvLayout> layout_over(const CacheSpec& s, const std::vector<std::byte*>& bases) {
  const std::vector<std::size_t> sizes = allocation_sizes(s);
  const std::size_t t = tensor_bytes(s);
  const client::KvCacheShape shape{s.num_blocks, s.block_size, kHeads,
                                   s.preset == Preset::kMla ? kMlaHeadSize : kHeadSize, kElem};
  const bool per_layer = s.preset == Preset::kFlashInfer;
  const std::size_t layer_stride = s.preset == Preset::kVllm ? 2 * t : t;  // in one allocation
  std::vector<client::KvBuffer> a, b;
  for (std::size_t l = 0; l < layers_of(s.preset); ++l) {
    const std::size_t i = per_layer ? l : 0;
    a.push_back({bases[i], sizes[i], kPad + (per_layer ? 0 : l * layer_stride)});
    if (s.preset == Preset::kSglang) b.push_back({bases[1], sizes[1], kPad + l * t});
  }
  switch (s.preset) {
    case Preset::kVllm:
      return client::vllm_flash_attn_layout(shape, a);
    case Preset::kMla:
      return client::mla_layout(shape, a);
    case Preset::kFlashInfer:
      return client::flashinfer_layout(shape, a);
    case Preset::kSglang:
      return client::sglang_layout(shape, a, b);
    case Preset::kHnd:
      break;
  }
  return hnd_layout(s, bases[0], sizes[0]);
}

// A KV cache: in memfds shared with the node (shared()), or plain memory (plain(): a reference).
struct KvCache {
  CacheSpec spec{};
  std::vector<HostKvMemory> memfds{};
  std::vector<std::vector<std::byte>> plain_buffers{};
  std::vector<std::span<std::byte>> regions{};
  std::vector<KvAllocation> allocations{};  // of the memfds
  KvLayout layout{};

  static Result<KvCache> shared(const CacheSpec& s, const std::string& name = "kvnode-kv-test") {
    KvCache c;
    c.spec = s;
    std::vector<std::byte*> bases;
    for (std::size_t bytes : allocation_sizes(s)) {
      Result<HostKvMemory> m = HostKvMemory::create(bytes, name);
      if (!m) return m.error();
      c.regions.emplace_back(m->data(), m->size());
      c.allocations.push_back(m->allocation());
      bases.push_back(m->data());
      c.memfds.push_back(std::move(m).value());
    }
    Result<KvLayout> l = layout_over(s, bases);
    if (!l) return l.error();
    c.layout = std::move(l).value();
    return c;
  }
  // A plain copy of `bytes` (regions in allocation order), or zeroes.
  static KvCache plain(const CacheSpec& s, const std::vector<std::vector<std::byte>>& bytes = {}) {
    KvCache c;
    c.spec = s;
    std::vector<std::byte*> bases;
    const std::vector<std::size_t> sizes = allocation_sizes(s);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      c.plain_buffers.push_back(i < bytes.size() ? bytes[i] : std::vector<std::byte>(sizes[i]));
      c.regions.emplace_back(c.plain_buffers.back());
      bases.push_back(c.plain_buffers.back().data());
    }
    c.layout = layout_over(s, bases).value();
    return c;
  }
  KvCache(KvCache&&) = default;
  KvCache& operator=(KvCache&&) = default;

  // Every byte a function of (seed, region, offset): splitmix64 of each 8-byte word's index.
  void fill(std::uint64_t seed) {
    for (std::size_t r = 0; r < regions.size(); ++r) {
      std::uint64_t x = seed * 0x9e3779b97f4a7c15ULL + (r + 1) * 0xbf58476d1ce4e5b9ULL;
      for (std::size_t at = 0; at < regions[r].size(); at += 8) {
        std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        std::memcpy(regions[r].data() + at, &z, std::min<std::size_t>(8, regions[r].size() - at));
      }
    }
  }
  std::vector<std::vector<std::byte>> snapshot() const {
    std::vector<std::vector<std::byte>> s;
    for (std::span<std::byte> r : regions) s.emplace_back(r.begin(), r.end());
    return s;
  }

 private:
  KvCache() = default;
};

// Where (kv, layer, token t of the sequence, head) lies in the cache, by the element formula.
inline std::byte* slot_of(const KvLayout& l, const std::vector<std::uint32_t>& table,
                          std::size_t kv, std::size_t layer, std::size_t t, std::size_t head) {
  const client::KvTensor& x = kv == 0 ? l.layers[layer].k : l.layers[layer].v;
  return x.base + x.offset + table[t / l.block_size] * x.block_stride +
         (t % l.block_size) * x.token_stride + head * x.head_stride;
}

// Copies chunk i of a sequence of `total` tokens between the cache and `chunk`, KV_2LTD
// ([kv, layer, token, head * head_size]) for the chunk's tokens: gather (cache -> chunk) or
// scatter (chunk -> cache), one head_size row at a time.
enum class Way : std::uint8_t { kGather, kScatter };
inline std::size_t reference_chunk_bytes(const KvLayout& l, std::size_t tokens) {
  const std::size_t kvs = l.format == client::KvFormat::kMla ? 1 : 2;
  return kvs * l.layers.size() * tokens * l.kv_heads * l.head_size * l.elem_bytes;
}
inline void copy_chunk(const KvLayout& l, const std::vector<std::uint32_t>& table, std::size_t i,
                       std::size_t total, std::byte* chunk, Way way) {
  const std::size_t first = i * kChunkTokens, count = std::min(kChunkTokens, total - first);
  const std::size_t kvs = l.format == client::KvFormat::kMla ? 1 : 2, layers = l.layers.size();
  const std::size_t row = std::size_t{l.head_size} * l.elem_bytes;
  for (std::size_t kv = 0; kv < kvs; ++kv)
    for (std::size_t layer = 0; layer < layers; ++layer)
      for (std::size_t t = 0; t < count; ++t)
        for (std::size_t h = 0; h < l.kv_heads; ++h) {
          std::byte* at = chunk + (((kv * layers + layer) * count + t) * l.kv_heads + h) * row;
          std::byte* cache = slot_of(l, table, kv, layer, first + t, h);
          if (way == Way::kGather) {
            std::memcpy(at, cache, row);
          } else {
            std::memcpy(cache, at, row);
          }
        }
}
// The chunks of a sequence of `total` tokens (the last one unfull when total is).
inline std::vector<std::vector<std::byte>> reference_chunks(const KvLayout& l,
                                                            const std::vector<std::uint32_t>& table,
                                                            std::size_t total) {
  std::vector<std::vector<std::byte>> out;
  for (std::size_t i = 0; i * kChunkTokens < total; ++i) {
    out.emplace_back(reference_chunk_bytes(l, std::min(kChunkTokens, total - i * kChunkTokens)));
    copy_chunk(l, table, i, total, out.back().data(), Way::kGather);
  }
  return out;
}
// Writes chunks [0, chunks.size()) of a sequence of `total` tokens into the cache.
inline void reference_scatter(const KvLayout& l, const std::vector<std::uint32_t>& table,
                              std::vector<std::vector<std::byte>> chunks, std::size_t total) {
  for (std::size_t i = 0; i < chunks.size(); ++i)
    copy_chunk(l, table, i, total, chunks[i].data(), Way::kScatter);
}

// Where two byte ranges differ, in words; "" when they are the same.
inline std::string bytes_difference(std::span<const std::byte> got,
                                    std::span<const std::byte> want) {
  if (got.size() != want.size())
    return std::to_string(got.size()) + " bytes, expected " + std::to_string(want.size());
  std::size_t n = 0, first = got.size();
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    first = std::min(first, i);
    ++n;
  }
  if (n == 0) return "";
  return std::to_string(n) + " bytes differ, the first at " + std::to_string(first);
}
// The first region (cache) or chunk that differs, in words; "" when all are the same.
template <class A, class B>
std::string first_difference(const A& got, const B& want, const char* what = "region") {
  if (got.size() != want.size())
    return std::to_string(got.size()) + " " + what + "s, expected " + std::to_string(want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const std::string d = bytes_difference(got[i], want[i]);
    if (!d.empty()) return std::string(what) + " " + std::to_string(i) + ": " + d;
  }
  return "";
}
inline std::string chunks_difference(const std::vector<std::vector<std::byte>>& got,
                                     const std::vector<std::vector<std::byte>>& want) {
  return first_difference(got, want, "chunk");
}

// `count` distinct block ids of [0, num_blocks), shuffled.
inline std::vector<std::uint32_t> random_blocks(std::uint32_t num_blocks, std::size_t count,
                                                std::uint32_t seed) {
  std::vector<std::uint32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0u);
  std::mt19937 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(count);
  return ids;
}
inline std::size_t blocks_for(std::size_t tokens, std::uint32_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

inline std::vector<std::int64_t> token_range(std::size_t n, std::int64_t first) {
  std::vector<std::int64_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

inline KvTransfer transfer(std::uint64_t kv, ChunkKeys keys, std::vector<std::uint32_t> blocks,
                           std::size_t num_tokens = 0) {
  KvTransfer t;
  t.kv = kv;
  t.keys = std::move(keys);
  t.block_ids = std::move(blocks);
  t.num_tokens = num_tokens;
  return t;
}

// A client of a node that is up; null (with a failure) when it cannot connect. Asked again for
// a while: the socket's file appears at bind(), a moment before the node listens on it.
inline std::unique_ptr<LocalClient> connect_to(const std::string& socket) {
  client::LocalClientOptions o;
  o.timeout = 10s;
  Result<std::unique_ptr<LocalClient>> c = LocalClient::connect(socket, o);
  for (const auto until = Clock::now() + 10s; !c && Clock::now() < until;
       c = LocalClient::connect(socket, o))
    std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(c) << socket << ": " << c.error().message;
  return c ? std::move(c).value() : nullptr;
}

// store, asked again while the node's start-up full sync freezes its store (kFrozen).
inline Result<KvTransferReply> store_when_ready(LocalClient& c, const KvTransfer& t) {
  Result<KvTransferReply> r = c.store(t);
  for (const auto until = Clock::now() + 15s;
       !r && r.error().code == ErrorCode::kFrozen && Clock::now() < until; r = c.store(t))
    std::this_thread::sleep_for(50ms);
  return r;
}

// A controller and one kvnode process (not started up yet: ASSERT_TRUE(node.up())).
struct OneNode {
  explicit OneNode(const std::string& name, const NodeProcessOptions& o = {})
      : ctl(start_controller()), node(name, ctl->ports().pull, ctl->ports().reply, o) {}
  std::unique_ptr<controller::Controller> ctl;
  NodeProcess node;
};

// Waits out the start-up full sync with a put of one chunk (zeroes, under tokens of its own),
// so a store that follows is not refused as frozen; false when the put fails otherwise.
inline bool wait_unfrozen(LocalClient& c) {
  const std::vector<std::byte> zeroes(kPageBytes);
  const ChunkKeys probe = ChunkKeys::of_tokens(token_range(kChunkTokens, 900'000'000));
  Result<std::size_t> r = c.put(probe, zeroes);
  for (const auto until = Clock::now() + 15s;
       !r && r.error().code == ErrorCode::kFrozen && Clock::now() < until; r = c.put(probe, zeroes))
    std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(r) << r.error().message;
  return r && *r == 1;
}

// A store's or load's answer: these leading chunks, covering these tokens.
inline void expect_reply(const Result<KvTransferReply>& r, std::size_t chunks, std::size_t tokens) {
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->chunks, chunks);
  EXPECT_EQ(r->tokens, tokens);
}

// An error with this code whose message holds each of `words`.
template <class R>
void expect_error(const R& r, ErrorCode code, std::initializer_list<std::string> words) {
  ASSERT_FALSE(r.ok()) << "succeeded, expected an error saying " << *words.begin();
  EXPECT_STREQ(to_string(r.error().code), to_string(code)) << r.error().message;
  for (const std::string& w : words) {
    EXPECT_NE(r.error().message.find(w), std::string::npos)
        << "'" << r.error().message << "' does not say '" << w << "'";
  }
}

// A node and a client with `spec`'s cache registered, filled with `seed`'s bytes.
struct Registered {
  Registered(const std::string& name, const CacheSpec& spec, std::uint64_t seed = 1) : n(name) {
    start(spec, seed);
  }
  void start(const CacheSpec& spec, std::uint64_t seed) {
    if (!n.node.up()) {
      ADD_FAILURE() << n.node.log();
      return;
    }
    Result<KvCache> made = KvCache::shared(spec);
    if (!made) {
      ADD_FAILURE() << made.error().message;
      return;
    }
    cache.emplace(std::move(made).value());
    cache->fill(seed);
    c = connect_to(n.node.socket());
    Result<std::uint64_t> id = c ? c->register_kv(cache->layout, cache->allocations)
                                 : Result<std::uint64_t>(make_error("not connected"));
    if (!id) {
      ADD_FAILURE() << id.error().message << "\n" << n.node.log();
      return;
    }
    kv = *id;
  }
  bool ready() const { return kv != 0; }
  OneNode n;
  std::optional<KvCache> cache;
  std::unique_ptr<LocalClient> c;
  std::uint64_t kv = 0;
};

// The cache as it must be after a load of `chunks` into `table`: `before` with those written.
inline std::string load_difference(const KvCache& cache,
                                   const std::vector<std::vector<std::byte>>& before,
                                   const std::vector<std::uint32_t>& table,
                                   const std::vector<std::vector<std::byte>>& chunks,
                                   std::size_t total) {
  KvCache want = KvCache::plain(cache.spec, before);
  reference_scatter(want.layout, table, chunks, total);
  return first_difference(cache.regions, want.regions);
}

// The node's open descriptors and its mappings of memfds (an engine's host KV).
inline std::size_t fd_count(pid_t pid) {
  std::error_code ec;
  std::size_t n = 0;
  for (std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/fd", ec), end;
       !ec && it != end; it.increment(ec))
    ++n;
  return n;
}
inline std::size_t memfd_mappings(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::size_t n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find("memfd:") != std::string::npos;
  return n;
}
struct Footprint {
  std::size_t fds = 0, memfd_maps = 0;
  bool operator==(const Footprint&) const = default;
};
inline Footprint footprint(pid_t pid) {
  return {fd_count(pid), memfd_mappings(pid)};
}
inline std::string describe(const Footprint& f) {
  return std::to_string(f.fds) + " descriptors, " + std::to_string(f.memfd_maps) +
         " memfd mappings";
}
// The node's footprint once it has settled: the same for a whole second (the controller's
// connections and the messaging threads' descriptors come in the node's first second or so).
inline Footprint settled_footprint(pid_t pid) {
  Footprint last = footprint(pid);
  for (auto since = Clock::now(), until = since + 15s; Clock::now() < until;) {
    std::this_thread::sleep_for(100ms);
    const Footprint now = footprint(pid);
    if (now != last) {
      last = now;
      since = Clock::now();
    } else if (Clock::now() - since >= 1s) {
      break;
    }
  }
  return last;
}
// Waits up to 10 s for the node's footprint to be `want`.
inline bool footprint_returns(pid_t pid, const Footprint& want) {
  return eventually([&] { return footprint(pid) == want; }, 10s);
}

}  // namespace kvnode::node::kv_rig
