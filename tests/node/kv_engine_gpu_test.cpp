// The engine's KV path with GPUs (issue 21), against real kvnode processes whose pools are pinned
// host or device memory, this test process being the engine: KV caches in device memory shared
// by CUDA IPC handle (cudaMalloc) or VMM fd (cuMemCreate, as PyTorch's expandable segments), and
// host KV (memfds) copied by the node's GPU kernel into a device pool. Each round trip stores by
// tokens (5 whole chunks and an unfull tail), writes garbage over the cache, loads into other
// blocks and checks every byte of the cache against the host reference (kv_engine_rig.hpp). Then
// store and load ordered by the engine's CUDA events, and kvctl against a device pool.
//
// Every test skips where there is no CUDA device: the GPU half runs on the GPU machine.
#include "kv_engine_rig.hpp"
#include "kvnode/gpu/cuda_ipc.hpp"

namespace kvnode::node {
namespace {

using namespace kv_rig;

constexpr std::size_t kTotal = 5 * kChunkTokens + 7;
constexpr std::size_t kChunks = 6;

// Why the GPU half cannot run here; nullopt where a device is there.
std::optional<std::string> no_gpu() {
  Result<gpu::DeviceBuffer> probe = gpu::DeviceBuffer::allocate(1 << 20, 0);
  if (probe) return std::nullopt;
  return "no CUDA device (" + probe.error().message + "): the GPU half runs on the GPU machine";
}

enum class KvMemory : std::uint8_t { kIpc, kVmm, kHostFd };
const char* to_string(KvMemory m) {
  return m == KvMemory::kIpc ? "Ipc" : m == KvMemory::kVmm ? "Vmm" : "HostFd";
}

// A KV cache in this process's GPU memory: one cudaMalloc or VMM allocation per allocation of the
// spec's layout (allocation_sizes()), written from and read back into host copies of the regions.
class DeviceCache {
 public:
  static Result<DeviceCache> make(const CacheSpec& spec, KvMemory kind) {
    DeviceCache d;
    std::vector<std::byte*> bases;
    for (std::size_t bytes : allocation_sizes(spec)) {
      KvAllocation a;
      if (kind == KvMemory::kIpc) {
        Result<gpu::DeviceBuffer> b = gpu::DeviceBuffer::allocate(bytes, 0);
        if (!b) return b.error();
        Result<gpu::DeviceExport> e = gpu::export_device_memory(b->data());
        if (!e) return e.error();
        if (e->base != b->data() || e->offset != 0 || e->bytes < bytes)
          return make_error("cudaMalloc of " + std::to_string(bytes) +
                            " bytes is not an allocation of its own: the layout needs its base");
        a.kind = client::KvMemoryKind::kCudaIpc;
        a.base = e->base;
        a.bytes = e->bytes;
        a.ipc_handle = e->handle;
        d.buffers_.push_back(std::move(b).value());
      } else {
        Result<gpu::VmmAllocation> v = gpu::VmmAllocation::create(bytes, 0);
        if (!v) return v.error();
        Result<UniqueFd> fd = v->export_fd();
        if (!fd) return fd.error();
        a.kind = client::KvMemoryKind::kCudaVmmFd;
        a.base = v->data();
        a.bytes = v->size();
        a.fd = fd->get();
        d.fds_.push_back(std::move(fd).value());
        d.vmm_.push_back(std::move(v).value());
      }
      d.allocations.push_back(a);
      d.regions_.emplace_back(a.base, bytes);
      bases.push_back(a.base);
    }
    Result<KvLayout> l = layout_over(spec, bases);
    if (!l) return l.error();
    d.layout = std::move(l).value();
    return d;
  }

  Status upload(const KvCache& host) {
    for (std::size_t i = 0; i < regions_.size(); ++i)
      if (Status s = gpu::cuda_copy(regions_[i].data(), host.regions[i].data(), regions_[i].size());
          !s)
        return s;
    return {};
  }
  Result<std::vector<std::vector<std::byte>>> download() const {
    std::vector<std::vector<std::byte>> out;
    for (std::span<std::byte> r : regions_) {
      out.emplace_back(r.size());
      if (Status s = gpu::cuda_copy(out.back().data(), r.data(), r.size()); !s) return s.error();
    }
    return out;
  }

  KvLayout layout{};
  std::vector<KvAllocation> allocations{};

 private:
  std::vector<gpu::DeviceBuffer> buffers_;
  std::vector<gpu::VmmAllocation> vmm_;
  std::vector<UniqueFd> fds_;
  std::vector<std::span<std::byte>> regions_;
};

// The cache the node maps: in GPU memory (IPC, VMM) or host memfds, with its host reference.
struct EngineCache {
  EngineCache(const CacheSpec& spec, KvMemory kind) : host(KvCache::plain(spec)) {
    if (kind == KvMemory::kHostFd) {
      Result<KvCache> s = KvCache::shared(spec);
      if (!s) {
        error = s.error().message;
        return;
      }
      shared.emplace(std::move(s).value());
      return;
    }
    Result<DeviceCache> d = DeviceCache::make(spec, kind);
    if (!d) {
      error = d.error().message;
      return;
    }
    device.emplace(std::move(d).value());
  }
  const KvLayout& layout() const { return device ? device->layout : shared->layout; }
  const std::vector<KvAllocation>& allocations() const {
    return device ? device->allocations : shared->allocations;
  }
  // Fills the host reference with `seed`'s bytes and the engine's cache with the same.
  Status fill(std::uint64_t seed) {
    host.fill(seed);
    if (device) return device->upload(host);
    shared->fill(seed);
    return {};
  }
  Result<std::vector<std::vector<std::byte>>> read() const {
    if (device) return device->download();
    return shared->snapshot();
  }

  KvCache host;
  std::optional<DeviceCache> device;
  std::optional<KvCache> shared;
  std::string error;
};

// The engine's cache after a load of `chunks` into `table`: the host reference `before` with
// those chunks written, compared with what the engine's memory holds.
std::string load_difference(const EngineCache& cache,
                            const std::vector<std::vector<std::byte>>& before,
                            const std::vector<std::uint32_t>& table,
                            const std::vector<std::vector<std::byte>>& chunks, std::size_t total) {
  KvCache want = KvCache::plain(cache.host.spec, before);
  reference_scatter(want.layout, table, chunks, total);
  Result<std::vector<std::vector<std::byte>>> got = cache.read();
  if (!got) return "reading the cache back: " + got.error().message;
  return first_difference(*got, want.regions);
}

struct GpuCase {
  const char* memory = "device";  // the node's pool
  KvMemory kv = KvMemory::kIpc;
  CacheSpec spec{};
};

void PrintTo(const GpuCase& g, std::ostream* os) {
  *os << g.memory << " pool, " << to_string(g.kv) << " KV, ";
  PrintTo(g.spec, os);
}

class KvEngineGpuRoundTrip : public ::testing::TestWithParam<GpuCase> {};

TEST_P(KvEngineGpuRoundTrip, ALoadIntoOtherBlocksWritesEveryStoredByteThereAndNoOther) {
  if (const auto why = no_gpu()) {
    GTEST_SKIP() << *why;
  }
  const GpuCase& g = GetParam();
  NodeProcessOptions o;
  o.extra = {"--memory", g.memory};
  OneNode n(std::string("kvgpu-") + g.memory + "-" + to_string(g.kv), o);
  ASSERT_TRUE(n.node.up()) << n.node.log();
  EngineCache cache(g.spec, g.kv);
  ASSERT_EQ(cache.error, "");
  ASSERT_TRUE(cache.fill(1).ok());
  auto c = connect_to(n.node.socket());
  ASSERT_TRUE(c);
  Result<std::uint64_t> kv = c->register_kv(cache.layout(), cache.allocations());
  ASSERT_TRUE(kv) << kv.error().message << "\n" << n.node.log();

  const auto tokens = token_range(kTotal, 1000);
  const std::size_t blocks = blocks_for(kTotal, g.spec.block_size);
  const auto stored_in = random_blocks(g.spec.num_blocks, blocks, 11);
  const auto ref = reference_chunks(cache.host.layout, stored_in, kTotal);
  expect_reply(store_when_ready(*c, transfer(*kv, ChunkKeys::of_tokens(tokens), stored_in)),
               kChunks, kTotal);
  std::vector<std::byte> first(kPageBytes);  // a stored chunk is what a put's would be
  Result<std::size_t> got = c->get(ChunkKeys::of_tokens(token_range(16, 1000)), first);
  ASSERT_TRUE(got && *got == 1u);
  EXPECT_EQ(bytes_difference(first, ref[0]), "");

  ASSERT_TRUE(cache.fill(2).ok());  // garbage over every block
  const auto before = cache.host.snapshot();
  const auto loaded_in = random_blocks(g.spec.num_blocks, blocks, 22);
  expect_reply(c->load(transfer(*kv, ChunkKeys::of_tokens(tokens), loaded_in)), kChunks, kTotal);
  EXPECT_EQ(load_difference(cache, before, loaded_in, ref, kTotal), "");
}

INSTANTIATE_TEST_SUITE_P(
    KvEngineGpu, KvEngineGpuRoundTrip,
    ::testing::Values(GpuCase{"device", KvMemory::kIpc, {Preset::kVllm, 64, 16}},
                      GpuCase{"pinned", KvMemory::kIpc, {Preset::kHnd, 64, 4}},
                      GpuCase{"device", KvMemory::kVmm, {Preset::kFlashInfer, 64, 4}},
                      GpuCase{"pinned", KvMemory::kVmm, {Preset::kSglang, 256, 1}},
                      GpuCase{"device", KvMemory::kHostFd, {Preset::kMla, 32, 8}},
                      GpuCase{"pinned", KvMemory::kHostFd, {Preset::kVllm, 64, 16}}),
    [](const ::testing::TestParamInfo<GpuCase>& p) {
      return std::string(p.param.memory) + "_pool_" + to_string(p.param.kv) + "_" +
             preset_name(p.param.spec.preset);
    });

TEST(KvEngineGpu, StoreAndLoadWaitForTheEnginesEventAndRecordTheirOwn) {
  if (const auto why = no_gpu()) {
    GTEST_SKIP() << *why;
  }
  NodeProcessOptions o;
  o.extra = {"--memory", "device"};
  OneNode n("kvevent", o);
  ASSERT_TRUE(n.node.up()) << n.node.log();
  const CacheSpec spec{Preset::kVllm, 64, 16};
  EngineCache cache(spec, KvMemory::kIpc);
  ASSERT_EQ(cache.error, "");
  Result<gpu::IpcEvent> written = gpu::IpcEvent::create(0), copied = gpu::IpcEvent::create(0);
  ASSERT_TRUE(written && copied);
  auto c = connect_to(n.node.socket());
  ASSERT_TRUE(c);
  Result<std::uint64_t> kv = c->register_kv(cache.layout(), cache.allocations());
  ASSERT_TRUE(kv) << kv.error().message;
  const auto tokens = token_range(kTotal, 1000);
  const auto table = random_blocks(spec.num_blocks, blocks_for(kTotal, 16), 11);
  auto with_events = [&](const std::vector<std::uint32_t>& blocks) {
    KvTransfer t = transfer(*kv, ChunkKeys::of_tokens(tokens), blocks);
    t.wait_event = written->handle();
    t.done_event = copied->handle();
    return t;
  };

  // The engine's writes, then its event; the node's copies wait for it and record `copied`.
  ASSERT_TRUE(cache.fill(1).ok());
  const auto ref = reference_chunks(cache.host.layout, table, kTotal);
  ASSERT_TRUE(written->record_on_default_stream().ok());
  auto stored = store_when_ready(*c, with_events(table));
  ASSERT_TRUE(stored) << stored.error().message << "\n" << n.node.log();
  EXPECT_EQ(stored->chunks, kChunks);
  ASSERT_TRUE(copied->synchronize().ok());
  // Committed once landed (the answer came when the copies were queued).
  EXPECT_TRUE(eventually([&] {
    auto present = c->contains(ChunkKeys::of_tokens(tokens));
    return present && std::size_t(std::count(present->begin(), present->end(), true)) == kChunks;
  }));
  std::vector<std::byte> first(kPageBytes);
  Result<std::size_t> got = c->get(ChunkKeys::of_tokens(token_range(16, 1000)), first);
  ASSERT_TRUE(got && *got == 1u);
  EXPECT_EQ(bytes_difference(first, ref[0]), "");

  ASSERT_TRUE(cache.fill(2).ok());
  const auto before = cache.host.snapshot();
  const auto into = random_blocks(spec.num_blocks, blocks_for(kTotal, 16), 22);
  ASSERT_TRUE(written->record_on_default_stream().ok());
  expect_reply(c->load(with_events(into)), kChunks, kTotal);
  ASSERT_TRUE(copied->synchronize().ok());  // the blocks are the engine's again
  EXPECT_EQ(load_difference(cache, before, into, ref, kTotal), "");
}

TEST(KvEngineGpu, KvctlPutGetAndVerifyAgainstADevicePool) {
  if (const auto why = no_gpu()) {
    GTEST_SKIP() << *why;
  }
  NodeProcessOptions o;
  o.extra = {"--memory", "device"};
  OneNode n("kvctlgpu", o);
  ASSERT_TRUE(n.node.up()) << n.node.log();
  auto put = kvctl({"put", "--node", n.node.socket(), "--token-range", "0:320", "--seed", "1"});
  EXPECT_EQ(put.exit_code, 0) << put.out << put.err << n.node.log();
  EXPECT_NE(put.out.find("stored 20 chunks"), std::string::npos) << put.out;
  auto verify =
      kvctl({"verify", "--node", n.node.socket(), "--token-range", "0:320", "--seed", "1"});
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  EXPECT_NE(verify.out.find("verified 20 of 20 chunks"), std::string::npos) << verify.out;
  auto get = kvctl({"get", "--node", n.node.socket(), "--token-range", "0:320"});
  EXPECT_EQ(get.exit_code, 0) << get.out << get.err;
  EXPECT_NE(get.out.find("read 20 of 20 chunks"), std::string::npos) << get.out;
  auto wrong =  // another seed's bytes: verify tells them apart
      kvctl({"verify", "--node", n.node.socket(), "--token-range", "0:320", "--seed", "2"});
  EXPECT_NE(wrong.exit_code, 0) << wrong.out << wrong.err;
}

}  // namespace
}  // namespace kvnode::node
