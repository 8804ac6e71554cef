#include "engine_bench.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "baselines.hpp"
#include "kvnode/client/local_client.hpp"
#include "kvnode/gpu/cuda_ipc.hpp"
#include "kvnode/gpu/device_probe.hpp"
#include "kvnode/gpu/memory_region.hpp"
#include "processes.hpp"

namespace kvnode::bench {
namespace {

using Clock = std::chrono::steady_clock;
using client::ChunkKeys;
using client::KvTransfer;
using client::LocalClient;
using gpu::MemoryKind;
using nlohmann::ordered_json;

// Llama-3.1-8B on one GPU as vLLM's flash-attn backend keeps it: per layer one tensor
// [2, num_blocks, 16, 8, 128] of bf16; a chunk of 256 tokens is 32 MiB.
constexpr std::uint32_t kLayers = 32, kKvHeads = 8, kHeadSize = 128, kElemBytes = 2;
constexpr std::uint32_t kBlockSize = 16;
constexpr std::size_t kChunkTokens = 256;
constexpr std::size_t kBlockBytes = std::size_t{kBlockSize} * kKvHeads * kHeadSize * kElemBytes;
constexpr std::size_t kChunkBytes = 2 * kLayers * (kChunkTokens / kBlockSize) * kBlockBytes;
constexpr std::size_t kLatencyStores = 100;
constexpr std::uint64_t kSeed = 21;      // the block tables and the cache's bytes
constexpr std::size_t kSparePages = 4;   // pool pages beyond one store's chunks
constexpr std::int64_t kVocab = 128256;  // Llama 3's: tokens stay plausible ids
constexpr std::int64_t kShift = 100003;  // a prime: every sequence starts at another token
constexpr std::size_t kStagingBytes = std::size_t{64} << 20;  // filling GPU memory
constexpr auto kStartWait = std::chrono::seconds(30);
constexpr auto kPoll = std::chrono::milliseconds(100);

std::string dir_of(const std::string& path) {
  return path.substr(0, path.rfind('/') + 1);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The tokens of sequence `s`: each store's are new, so every store writes new chunks.
std::vector<std::int64_t> sequence(std::size_t s, std::size_t tokens) {
  std::vector<std::int64_t> t(tokens);
  for (std::size_t k = 0; k < tokens; ++k)
    t[k] = (static_cast<std::int64_t>(s) * kShift + static_cast<std::int64_t>(k)) % kVocab;
  return t;
}

// Every 8 bytes a function of their offset in the cache, so a block copied to the wrong place,
// or not copied at all, shows.
void fill_pattern(std::byte* p, std::size_t bytes, std::size_t offset) {
  for (std::size_t i = 0; i + sizeof(std::uint64_t) <= bytes; i += sizeof(std::uint64_t)) {
    const std::uint64_t w = ((offset + i) / sizeof(std::uint64_t) + 1) * 0x9E3779B97F4A7C15ull;
    std::memcpy(p + i, &w, sizeof(w));
  }
}

// The engine's KV cache: one allocation holding every layer, a memfd or GPU memory.
struct EngineCache {
  std::optional<client::HostKvMemory> host;
  std::optional<gpu::DeviceBuffer> device;
  client::KvAllocation allocation{};
  std::size_t offset = 0;  // the cache's first byte, from allocation.base
};

Result<EngineCache> make_cache(bool on_gpu, std::size_t bytes) {
  EngineCache c;
  if (!on_gpu) {
    Result<client::HostKvMemory> m = client::HostKvMemory::create(bytes, "kvbench-kv");
    if (!m) return m.error();
    c.host.emplace(std::move(m).value());
    fill_pattern(c.host->data(), bytes, 0);  // and every page is faulted in before the timing
    c.allocation = c.host->allocation();
    return c;
  }
  Result<gpu::DeviceBuffer> d = gpu::DeviceBuffer::allocate(bytes, 0);
  if (!d) return d.error();
  c.device.emplace(std::move(d).value());
  Result<gpu::DeviceExport> e = gpu::export_device_memory(c.device->data());
  if (!e) return e.error();
  c.allocation.kind = client::KvMemoryKind::kCudaIpc;
  c.allocation.base = e->base;
  c.allocation.bytes = e->bytes;
  std::memcpy(c.allocation.ipc_handle.data(), e->handle.data(), e->handle.size());
  c.offset = e->offset;
  std::vector<std::byte> staging(kStagingBytes);
  for (std::size_t at = 0; at < bytes; at += staging.size()) {
    const std::size_t n = std::min(staging.size(), bytes - at);
    fill_pattern(staging.data(), n, at);
    if (Status s = gpu::cuda_copy(c.device->data() + at, staging.data(), n); !s) return s.error();
  }
  return c;
}

// The vLLM flash-attn layout of `blocks` blocks whose layers follow each other from `offset`.
Result<client::KvLayout> layout_over(std::byte* base, std::size_t allocation_bytes,
                                     std::size_t offset, std::uint32_t blocks) {
  const std::size_t layer_bytes = 2 * std::size_t{blocks} * kBlockBytes;
  std::vector<client::KvBuffer> layers;
  for (std::size_t l = 0; l < kLayers; ++l)
    layers.push_back({base, allocation_bytes, offset + l * layer_bytes});
  const client::KvCacheShape shape{blocks, kBlockSize, kKvHeads, kHeadSize, kElemBytes};
  return client::vllm_flash_attn_layout(shape, layers);
}

// kvcontroller and one kvnode (the binaries in `bin`) whose pool holds one store's chunks and a
// few more: each iteration's new chunks evict the last one's (a store evicts only older chunks),
// so nothing needs clearing between iterations. Both are stopped when this goes.
class NodeUnderTest {
 public:
  NodeUnderTest(const std::string& bin, MemoryKind kind, std::size_t pages)
      : socket_("/tmp/kvbench-engine-" + std::to_string(::getpid()) + "-" +
                std::string(gpu::to_string(kind)) + ".sock") {
    const int http = free_port(), pull = free_port(), reply = free_port(), hb = free_port();
    controller_ = std::make_unique<Child>(std::vector<std::string>{
        bin + "kvcontroller", "--host", "127.0.0.1", "--port", std::to_string(http), "--log-level",
        "warn", "--monitor-ports",
        "{\"pull\": " + std::to_string(pull) + ", \"reply\": " + std::to_string(reply) +
            ", \"heartbeat\": " + std::to_string(hb) + "}"});
    // GB (10^9) for `pages` pages and half a page, so the node's rounding down keeps them all.
    const double pool_gb = (static_cast<double>(pages) + 0.5) * kChunkBytes / 1e9;
    const std::string ctl = "127.0.0.1:";
    std::vector<std::string> args;
    args.insert(args.end(),
                {bin + "kvnode", "--instance-id", "kvbench-engine-" + std::to_string(::getpid()),
                 "--controller-pull-url", ctl + std::to_string(pull), "--controller-reply-url",
                 ctl + std::to_string(reply)});
    args.insert(args.end(),
                {"--chunk-size", std::to_string(kChunkTokens), "--kv-layers",
                 std::to_string(kLayers), "--kv-heads", std::to_string(kKvHeads), "--kv-head-size",
                 std::to_string(kHeadSize), "--kv-dtype", "bfloat16"});
    args.insert(args.end(), {"--max-local-cpu-size", std::to_string(pool_gb), "--memory",
                             std::string(gpu::to_string(kind)), "--full-sync-startup-delay", "0",
                             "--http-port", "-1"});
    args.insert(args.end(), {"--log-level", "warn", "--local-socket", socket_});
    node_ = std::make_unique<Child>(std::move(args));
  }

  ~NodeUnderTest() {
    node_.reset();  // stopped first: the lock file kvnode keeps by design is this run's to remove
    std::error_code ignored;
    std::filesystem::remove(socket_ + ".lock", ignored);
    std::filesystem::remove(socket_, ignored);
  }

  Result<std::unique_ptr<LocalClient>> connect() {
    client::LocalClientOptions options;
    options.timeout = std::chrono::seconds(60);  // a 2 GiB store on a loaded 2-core host
    Error last = make_error(ErrorCode::kPeerLost, "the socket " + socket_ + " never appeared");
    for (const auto until = Clock::now() + kStartWait; Clock::now() < until;
         std::this_thread::sleep_for(kPoll)) {
      if (!node_->alive())
        return make_error(ErrorCode::kPeerLost,
                          "kvnode exited at start (is it beside kvbench? its log is above)");
      if (!std::filesystem::exists(socket_)) continue;
      Result<std::unique_ptr<LocalClient>> c = LocalClient::connect(socket_, options);
      if (c) return c;
      last = c.error();
    }
    return last;
  }

 private:
  std::string socket_;
  std::unique_ptr<Child> controller_, node_;  // the node stops first
};

// One chunk stored before the clock starts: the node is past its start-up full sync (stores
// answer kFrozen meanwhile) and its copy path is warm.
Status warm_up(LocalClient& c, std::uint64_t kv, const std::vector<std::uint32_t>& table,
               std::size_t seq) {
  Result<std::vector<std::int64_t>> h = c.hashes(sequence(seq, kChunkTokens));
  if (!h) return h.error();
  KvTransfer t;
  t.kv = kv;
  t.keys = ChunkKeys::of_hashes(std::move(h).value());
  t.block_ids = table;
  for (const auto until = Clock::now() + kStartWait;; std::this_thread::sleep_for(kPoll)) {
    Result<client::KvTransferReply> r = c.store(t);
    if (r && r->chunks == 1) return {};
    if (r && Clock::now() > until) return make_error(ErrorCode::kNoRoom, "stored nothing");
    if (!r && (r.error().code != ErrorCode::kFrozen || Clock::now() > until)) return r.error();
  }
}

// Every loaded chunk (gathered from the `dst` blocks) equals the stored one (from `src`), in
// the cache's bytes as they are now (GPU memory copied back with cudaMemcpy first).
Result<bool> verify(const EngineCache& cache, const client::KvLayout& layout, std::size_t bytes,
                    std::uint32_t blocks, const std::vector<std::uint32_t>& src,
                    const std::vector<std::uint32_t>& dst, std::size_t chunks) {
  std::unique_ptr<std::byte[]> copy;
  Result<client::KvLayout> host = layout;
  if (cache.device) {
    copy = std::make_unique_for_overwrite<std::byte[]>(bytes);
    if (Status s = gpu::cuda_copy(copy.get(), cache.device->data(), bytes); !s) return s.error();
    host = layout_over(copy.get(), bytes, 0, blocks);
    if (!host) return host.error();
  }
  std::vector<std::byte> a(kChunkBytes), b(kChunkBytes);
  for (std::size_t c = 0; c < chunks; ++c) {
    if (Status s = client::gather(*host, src, c * kChunkTokens, kChunkTokens, a); !s)
      return s.error();
    if (Status s = client::gather(*host, dst, c * kChunkTokens, kChunkTokens, b); !s)
      return s.error();
    if (std::memcmp(a.data(), b.data(), kChunkBytes) != 0) {
      std::fprintf(stderr, "kvbench engine: chunk %zu loaded differs from the one stored\n", c);
      return false;
    }
  }
  return true;
}

// Median GB/s of `iters` synchronous cudaMemcpy of `bytes`.
Result<double> cuda_copy_gbps(void* dst, const void* src, std::size_t bytes, std::size_t iters) {
  std::vector<double> s;
  for (std::size_t i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    if (Status st = gpu::cuda_copy(dst, src, bytes); !st) return st.error();
    s.push_back(seconds_since(t0));
  }
  return static_cast<double>(bytes) / median(s) / 1e9;
}

struct Point {
  std::string op, baseline;
  double gbps = 0, p50_ms = 0, baseline_gbps = 0;
};

// The copy of the same bytes a pool's path is compared with, for store and for load.
struct Baselines {
  std::string store, load;
  double store_gbps = 0, load_gbps = 0;
};

struct KindRun {
  std::vector<Point> points;  // store, load
  std::size_t bytes = 0;
  double p50_us = 0, p99_us = 0;  // one-chunk stores
  bool verified = false;
};

Result<Baselines> gpu_baselines(MemoryKind kind, const EngineCache& cache, std::size_t bytes,
                                std::size_t iters) {
  std::byte* kv = cache.device->data();
  if (kind == MemoryKind::kDevice) {
    Result<gpu::DeviceBuffer> scratch = gpu::DeviceBuffer::allocate(bytes, 0);
    if (!scratch) return scratch.error();
    Result<double> d2d = cuda_copy_gbps(scratch->data(), kv, bytes, iters);
    if (!d2d) return d2d.error();
    return Baselines{"d2d", "d2d", *d2d, *d2d};
  }
  gpu::RegionOptions o;
  o.kind = MemoryKind::kPinnedHost;
  Result<gpu::MemoryRegion> pinned = gpu::MemoryRegion::allocate(bytes, o);
  if (!pinned) return pinned.error();
  Result<double> d2h = cuda_copy_gbps(pinned->data(), kv, bytes, iters);
  if (!d2h) return d2h.error();
  Result<double> h2d = cuda_copy_gbps(kv, pinned->data(), bytes, iters);  // the same bytes back
  if (!h2d) return h2d.error();
  return Baselines{"d2h", "h2d", *d2h, *h2d};
}

// Times one store or load (of every chunk in `t`); an error unless all `chunks` moved.
Status timed(LocalClient& c, const KvTransfer& t, bool store, std::size_t chunks,
             std::vector<double>& seconds) {
  // A full sync (the controller may ask one at any time) freezes the store for a moment: such
  // an answer is asked again and not timed.
  auto t0 = Clock::now();
  Result<client::KvTransferReply> r = store ? c.store(t) : c.load(t);
  for (const auto until = Clock::now() + kStartWait;
       !r && r.error().code == ErrorCode::kFrozen && Clock::now() < until;) {
    std::this_thread::sleep_for(kPoll);
    t0 = Clock::now();
    r = store ? c.store(t) : c.load(t);
  }
  seconds.push_back(seconds_since(t0));
  const std::string op = store ? "store: " : "load: ";
  if (!r) return wrap_error(op, r.error());
  if (r->chunks != chunks)
    return make_error(store ? ErrorCode::kNoRoom : ErrorCode::kNotFound,
                      op + std::to_string(r->chunks) + " of " + std::to_string(chunks) + " chunks");
  return {};
}

Result<KindRun> run_kind(const EngineBenchSpec& s, MemoryKind kind) {
  const std::size_t chunks = s.tokens / kChunkTokens;
  const auto seq_blocks = static_cast<std::uint32_t>(s.tokens / kBlockSize);
  const std::uint32_t blocks = 2 * seq_blocks;  // the stored sequence's, and the loaded one's
  const std::size_t cache_bytes = 2 * kLayers * std::size_t{blocks} * kBlockBytes;
  const bool on_gpu = kind != MemoryKind::kHost;
  KindRun out;
  out.bytes = chunks * kChunkBytes;
  // The host pool's ceiling first, before the cache and the pool take their memory.
  const double memcpy_ceiling = on_gpu ? 0 : memcpy_gbps(out.bytes, static_cast<int>(s.iterations));

  Result<EngineCache> cache = make_cache(on_gpu, cache_bytes);
  if (!cache) return wrap_error("the KV cache: ", cache.error());
  Result<client::KvLayout> layout =
      layout_over(cache->allocation.base, cache->allocation.bytes, cache->offset, blocks);
  if (!layout) return wrap_error("the KV layout: ", layout.error());
  // Random block tables (fixed seed): the stored sequence's blocks and, apart, the loaded one's.
  std::vector<std::uint32_t> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0u);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(kSeed));
  const std::vector<std::uint32_t> src(ids.begin(), ids.begin() + seq_blocks);
  const std::vector<std::uint32_t> dst(ids.begin() + seq_blocks, ids.end());

  NodeUnderTest node(dir_of(s.self), kind, chunks + kSparePages);
  Result<std::unique_ptr<LocalClient>> connected = node.connect();
  if (!connected) return wrap_error("kvnode: ", connected.error());
  LocalClient& c = **connected;
  Result<std::uint64_t> kv = c.register_kv(*layout, std::span(&cache->allocation, 1));
  if (!kv) return wrap_error("register_kv: ", kv.error());
  std::size_t seq = 0;  // sequences stored so far
  if (Status w = warm_up(c, *kv, src, seq++); !w) return wrap_error("warm-up store: ", w.error());

  std::vector<double> store_s, load_s;
  for (std::size_t i = 0; i < s.iterations; ++i) {
    Result<std::vector<std::int64_t>> hashes = c.hashes(sequence(seq++, s.tokens));
    if (!hashes) return wrap_error("hashes: ", hashes.error());
    KvTransfer t;
    t.kv = *kv;
    t.keys = ChunkKeys::of_hashes(std::move(hashes).value());
    t.block_ids = src;
    if (Status st = timed(c, t, true, chunks, store_s); !st) return st.error();
    t.block_ids = dst;
    if (Status st = timed(c, t, false, chunks, load_s); !st) return st.error();
    if (i > 0) continue;
    // Once: the loaded blocks held other bytes before, so every byte shows whether it landed.
    Result<bool> same = verify(*cache, *layout, cache_bytes, blocks, src, dst, chunks);
    if (!same) return wrap_error("verify: ", same.error());
    out.verified = *same;
  }

  // One-chunk stores of new tokens each, from the stored sequence's first blocks.
  KvTransfer one;
  one.kv = *kv;
  one.block_ids.assign(src.begin(), src.begin() + kChunkTokens / kBlockSize);
  std::vector<double> us;
  for (std::size_t i = 0; i < kLatencyStores; ++i) {
    Result<std::vector<std::int64_t>> h = c.hashes(sequence(seq++, kChunkTokens));
    if (!h) return wrap_error("hashes: ", h.error());
    one.keys = ChunkKeys::of_hashes(std::move(h).value());
    if (Status st = timed(c, one, true, 1, us); !st) return wrap_error("one-chunk ", st.error());
  }
  for (double& u : us) u *= 1e6;
  out.p50_us = percentile(us, 0.5);
  out.p99_us = percentile(us, 0.99);

  Baselines base{"memcpy", "memcpy", memcpy_ceiling, memcpy_ceiling};
  if (on_gpu) {
    Result<Baselines> b = gpu_baselines(kind, *cache, out.bytes, s.iterations);
    if (!b) return wrap_error("baseline: ", b.error());
    base = *b;
  }
  auto point = [&](const char* op, const std::string& name, double gbps, std::vector<double>& t) {
    return Point{op, name, static_cast<double>(out.bytes) / median(t) / 1e9, median(t) * 1e3, gbps};
  };
  out.points = {point("store", base.store, base.store_gbps, store_s),
                point("load", base.load, base.load_gbps, load_s)};
  return out;
}

void emit(const ordered_json& j) {
  std::printf("%s\n", j.dump().c_str());
}

void print(const EngineBenchSpec& s, MemoryKind kind, const KindRun& r) {
  const std::string memory(gpu::to_string(kind));
  for (const Point& p : r.points) {
    const double ratio = p.baseline_gbps > 0 ? p.gbps / p.baseline_gbps : 0;
    if (!s.json) {
      std::printf("%-7s %-6s %9.2f %9.1f  %-7s %9.2f %7.2f  %s\n", memory.c_str(), p.op.c_str(),
                  p.gbps, p.p50_ms, p.baseline.c_str(), p.baseline_gbps, ratio,
                  r.verified ? "yes" : "NO");
      continue;
    }
    ordered_json j{{"kind", "engine"}, {"memory", memory}, {"op", p.op}};
    j["bytes"] = r.bytes;
    j["tokens"] = s.tokens;
    j["iterations"] = s.iterations;
    j["gbps"] = p.gbps;
    j["p50_ms"] = p.p50_ms;
    j["baseline"] = p.baseline;
    j["baseline_gbps"] = p.baseline_gbps;
    j["ratio"] = ratio;
    j["verified"] = r.verified;
    emit(j);
  }
  if (s.json) {
    ordered_json j{{"kind", "engine"}, {"memory", memory}, {"op", "store_1chunk"}};
    j["bytes"] = kChunkBytes;
    j["stores"] = kLatencyStores;
    j["p50_us"] = r.p50_us;
    j["p99_us"] = r.p99_us;
    emit(j);
  } else {
    std::printf("%-7s 1-chunk store (%zu of %zu MiB): p50 %.0f us, p99 %.0f us\n", memory.c_str(),
                kLatencyStores, kChunkBytes >> 20, r.p50_us, r.p99_us);
  }
  std::fflush(stdout);
}

}  // namespace

int run_engine_bench(const EngineBenchSpec& s) {
  if (s.tokens == 0 || s.tokens % kChunkTokens != 0) {
    std::fprintf(stderr, "kvbench engine: --tokens must be a multiple of %zu\n", kChunkTokens);
    return 1;
  }
  const gpu::CudaProbe cuda = gpu::probe_cuda();
  const bool gpu_here = !cuda.devices.empty();
  std::vector<MemoryKind> kinds;
  if (s.memory == "all") {
    kinds.push_back(MemoryKind::kHost);
    if (gpu_here) {
      kinds.insert(kinds.end(), {MemoryKind::kPinnedHost, MemoryKind::kDevice});
    } else {
      // A note, not a failure; on stderr with --json so stdout stays JSON lines.
      std::fprintf(s.json ? stderr : stdout,
                   "kvbench engine: pinned and device skipped: no CUDA GPU (%s)\n",
                   cuda.note.c_str());
    }
  } else {
    Result<MemoryKind> k = gpu::parse_memory_kind(s.memory);
    if (!k) {
      std::fprintf(stderr, "kvbench engine: --memory: %s\n", k.error().message.c_str());
      return 1;
    }
    if (*k != MemoryKind::kHost && !gpu_here) {
      std::fprintf(stderr, "kvbench engine: --memory %s needs a CUDA GPU: %s\n", s.memory.c_str(),
                   cuda.note.c_str());
      return 1;
    }
    kinds.push_back(*k);
  }
  if (!s.json) {
    std::printf(
        "kvbench engine: Llama-3.1-8B KV (%u layers, %u KV heads x %u, bf16, blocks of %u), "
        "%zu tokens = %zu MiB per op, median of %zu\n",
        kLayers, kKvHeads, kHeadSize, kBlockSize, s.tokens,
        s.tokens / kChunkTokens * kChunkBytes >> 20, s.iterations);
    std::printf("%-7s %-6s %9s %9s  %-7s %9s %7s  %s\n", "memory", "op", "GB/s", "p50 ms", "vs",
                "GB/s", "ratio", "verified");
  }
  int failures = 0;
  for (const MemoryKind kind : kinds) {
    Result<KindRun> r = run_kind(s, kind);
    if (!r) {
      ++failures;
      std::fprintf(stderr, "kvbench engine: %s: %s\n", std::string(gpu::to_string(kind)).c_str(),
                   r.error().message.c_str());
      if (s.json)
        emit({{"kind", "engine"}, {"memory", gpu::to_string(kind)}, {"error", r.error().message}});
      continue;
    }
    if (!r->verified) ++failures;
    print(s, kind, *r);
  }
  return failures ? 1 : 0;
}

}  // namespace kvnode::bench
