// The C API (kvnode_client.h, libkvnode_client.so) against a real kvnode process: node info,
// host memory the node maps, a vLLM-preset cache registered in it, stored and loaded by block
// table (the loaded blocks' bytes checked against the stored ones), lookup, the node's errors
// with their status and message, and a cache whose client was closed first. The output structs
// get only the fields their mask asks for; array elements' reserved words must be zero. Chunks
// by hash (an engine naming its own chunks) are stored, looked up and loaded like tokens' chunks;
// memory the node cannot map is copied with process_vm_readv/writev.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "client/node_args.hpp"
#include "kvnode/kvnode_client.h"
#include "support/child_process.hpp"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The node's page: 64 KiB, 16 tokens. The vLLM cache's 16-token chunk is exactly that:
// 2 (K, V) x 4 layers x 16 tokens x 2 heads x 128 x 2 bytes.
constexpr std::size_t kChunkBytes = 64 << 10, kChunkTokens = 16;
constexpr std::uint32_t kLayers = 4, kHeads = 2, kHeadSize = 128, kElem = 2, kBlocks = 32;
constexpr std::size_t kBlockBytes = kChunkTokens * kHeads * kHeadSize * kElem;  // one K block
constexpr std::size_t kLayerBytes = 2 * kBlocks * kBlockBytes;  // [2, blocks, 16, heads, 128]

// A kvnode process with a local socket and no controller (local clients need none).
class Node {
 public:
  explicit Node(const std::string& name, const std::vector<std::string>& extra = {})
      : instance_("capi-" + name + "-" + std::to_string(::getpid())),
        socket_("/tmp/kvnode-" + instance_ + ".sock"),
        process_(args(instance_, socket_, extra)) {}
  // A client once the node serves (retried while it starts); NULL after 30 s.
  kvnode_client_t* connect() {
    kvnode_connect_params_t p{};
    p.socket_path = socket_.c_str();
    kvnode_error_t err{};
    for (const auto until = Clock::now() + 30s; Clock::now() < until && process_.running();) {
      kvnode_client_t* c = nullptr;
      if (kvnode_connect(&p, &c, &err) == KVNODE_OK) return c;
      std::this_thread::sleep_for(20ms);
    }
    ADD_FAILURE() << err.message << "\n" << process_.output();
    return nullptr;
  }
  const std::string& instance() const { return instance_; }

 private:
  static std::vector<std::string> args(const std::string& instance, const std::string& socket,
                                       const std::vector<std::string>& extra) {
    std::vector<std::string> a =
        kvnode::test::client_test_node_args(instance, socket, kChunkBytes, kChunkTokens);
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::string instance_, socket_;
  kvnode::test::ChildProcess process_;
};

struct ClientCloser {
  void operator()(kvnode_client_t* c) const { kvnode_client_close(c); }
};
using Client = std::unique_ptr<kvnode_client_t, ClientCloser>;

// A layer's buffer, its reserved words zero.
kvnode_kv_buffer_t buffer(void* base, std::size_t bytes, std::size_t offset) {
  kvnode_kv_buffer_t b{};
  b.base = base;
  b.bytes = bytes;
  b.offset = offset;
  return b;
}

// The cache's K (kv 0) or V (kv 1) block `block` of `layer`, in vLLM's layout.
std::byte* block_at(void* base, std::uint32_t layer, int kv, std::uint32_t block) {
  return static_cast<std::byte*>(base) + layer * kLayerBytes + (kv * kBlocks + block) * kBlockBytes;
}

TEST(CApiAgainstKvnode, InfoRegisterStoreLoadAndLookupByBlockTable) {
  Node node("kv");
  Client client(node.connect());
  ASSERT_TRUE(client);
  kvnode_error_t err{};
  kvnode_node_info_t info;
  std::memset(&info, 'Z', sizeof info);
  info.field_mask = KVNODE_NODE_INFO_FIELDS_ALL;
  ASSERT_EQ(kvnode_client_info(client.get(), &info, &err), KVNODE_OK) << err.message;
  EXPECT_EQ(info.chunk_bytes, kChunkBytes);
  EXPECT_EQ(info.chunk_size, kChunkTokens);
  EXPECT_GT(info.pages, 0u);
  EXPECT_STREQ(info.memory, "host");
  EXPECT_EQ(info.instance, node.instance());
  EXPECT_EQ(info.save_unfull_chunk, 1) << "the node hashes as LMCache does by default";
  // Its chain, for a client that hashes tokens itself: LMCache 0.5.6's, from 0, and the legacy
  // chain's hash(None) (CPython 3.12's).
  EXPECT_STREQ(info.hash_generation, "lmcache-0.5.6");
  EXPECT_STREQ(info.hash_init, "0");
  EXPECT_EQ(info.none_hash, 0xFCA86420u);
  EXPECT_EQ(kvnode_client_info(client.get(), nullptr, &err), KVNODE_ERR_INVALID);

  // The cache: 4 layers of [2, 32 blocks, 16, 2, 128] bf16 in one memfd, bytes a pattern.
  kvnode_host_memory_t* memory = nullptr;
  ASSERT_EQ(kvnode_host_memory_create(kLayers * kLayerBytes, "c-api-test", &memory, &err),
            KVNODE_OK)
      << err.message;
  std::unique_ptr<kvnode_host_memory_t, void (*)(kvnode_host_memory_t*)> owned(
      memory, kvnode_host_memory_free);
  void* base = kvnode_host_memory_data(memory);
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(kvnode_host_memory_size(memory), kLayers * kLayerBytes);
  EXPECT_GE(kvnode_host_memory_fd(memory), 0);
  EXPECT_EQ(static_cast<unsigned char*>(base)[kLayerBytes], 0) << "zeroed";
  for (std::size_t i = 0; i < kLayers * kLayerBytes; ++i)
    static_cast<unsigned char*>(base)[i] = static_cast<unsigned char>(i * 31 / 7 + i / 4096);

  std::vector<kvnode_kv_buffer_t> layers(kLayers);
  for (std::uint32_t l = 0; l < kLayers; ++l)
    layers[l] = buffer(base, kLayers * kLayerBytes, l * kLayerBytes);
  kvnode_kv_allocation_t shared{};
  shared.kind = KVNODE_MEMORY_HOST_FD;
  shared.base = base;
  shared.bytes = kLayers * kLayerBytes;
  shared.fd = kvnode_host_memory_fd(memory);
  kvnode_kv_register_params_t reg{};
  reg.preset = KVNODE_KV_VLLM;
  reg.num_blocks = kBlocks;
  reg.block_size = kChunkTokens;
  reg.kv_heads = kHeads;
  reg.head_size = kHeadSize / 2;  // a chunk half the page: the node says both sizes
  reg.elem_bytes = kElem;
  reg.layers = layers.data();
  reg.num_layers = kLayers;
  reg.allocations = &shared;
  reg.num_allocations = 1;
  kvnode_kv_cache_t* cache = nullptr;
  EXPECT_EQ(kvnode_kv_register(client.get(), &reg, &cache, &err), KVNODE_ERR_INVALID);
  EXPECT_NE(std::string(err.message).find("65536"), std::string::npos) << err.message;
  reg.head_size = kHeadSize;
  ASSERT_EQ(kvnode_kv_register(client.get(), &reg, &cache, &err), KVNODE_OK) << err.message;
  ASSERT_NE(cache, nullptr);

  std::vector<std::int64_t> tokens(4 * kChunkTokens);
  std::iota(tokens.begin(), tokens.end(), 1000);
  const std::vector<std::uint32_t> stored_in = {5, 9, 2, 30}, loaded_to = {11, 12, 13, 14};
  kvnode_kv_transfer_params_t t{};
  t.tokens = tokens.data();
  t.num_tokens = tokens.size();
  t.block_ids = stored_in.data();
  t.num_block_ids = stored_in.size();
  kvnode_kv_result_t r{};
  r.field_mask = KVNODE_KV_RESULT_FIELDS_ALL;
  ASSERT_EQ(kvnode_kv_store(cache, &t, &r, &err), KVNODE_OK) << err.message;
  EXPECT_EQ(r.chunks, 4u);
  EXPECT_EQ(r.tokens, tokens.size());
  std::size_t held = 0;
  ASSERT_EQ(kvnode_lookup(client.get(), tokens.data(), tokens.size(), &held, &err), KVNODE_OK);
  EXPECT_EQ(held, tokens.size());
  const std::int64_t other[] = {1, 2, 3};
  ASSERT_EQ(kvnode_lookup(client.get(), other, 3, &held, &err), KVNODE_OK);
  EXPECT_EQ(held, 0u);

  t.block_ids = loaded_to.data();
  t.field_mask = KVNODE_KV_XFER_FIELD_RETRIEVE;  // a load's field
  EXPECT_EQ(kvnode_kv_store(cache, &t, &r, &err), KVNODE_ERR_INVALID);
  t.field_mask = 0;
  ASSERT_NE(std::memcmp(block_at(base, 0, 0, 11), block_at(base, 0, 0, 5), kBlockBytes), 0);
  ASSERT_EQ(kvnode_kv_load(cache, &t, &r, &err), KVNODE_OK) << err.message;
  EXPECT_EQ(r.chunks, 4u);
  EXPECT_EQ(r.tokens, tokens.size());
  EXPECT_EQ(r.pulled, 0u);
  for (std::uint32_t l = 0; l < kLayers; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (std::size_t i = 0; i < loaded_to.size(); ++i) {
        EXPECT_EQ(std::memcmp(block_at(base, l, kv, loaded_to[i]),
                              block_at(base, l, kv, stored_in[i]), kBlockBytes),
                  0)
            << "layer " << l << (kv ? " V" : " K") << " block " << loaded_to[i];
      }

  const std::uint32_t out_of_range[] = {5, 9, 2, kBlocks};
  t.block_ids = out_of_range;
  EXPECT_EQ(kvnode_kv_store(cache, &t, &r, &err), KVNODE_ERR_INVALID);
  EXPECT_NE(std::string(err.message).find("block_ids[3]"), std::string::npos) << err.message;
  t.block_ids = nullptr;
  EXPECT_EQ(kvnode_kv_load(cache, &t, &r, &err), KVNODE_ERR_INVALID);

  // A second registration of the same memory, closed while its client lives (the node unmaps it).
  kvnode_kv_cache_t* second = nullptr;
  ASSERT_EQ(kvnode_kv_register(client.get(), &reg, &second, &err), KVNODE_OK) << err.message;
  kvnode_kv_close(second);

  // Closing the client first ends the registration; the cache handle stays safe.
  client.reset();
  t.block_ids = stored_in.data();
  EXPECT_EQ(kvnode_kv_store(cache, &t, &r, &err), KVNODE_ERR_NOT_FOUND);
  EXPECT_NE(std::string(err.message).find("is closed"), std::string::npos) << err.message;
  kvnode_kv_close(cache);
}

// A vLLM-preset cache of kLayers layers in one memfd: what kvnode_kv_register needs.
struct HostCache {
  HostCache() {
    kvnode_host_memory_t* m = nullptr;
    kvnode_error_t err{};
    EXPECT_EQ(kvnode_host_memory_create(kLayers * kLayerBytes, "c-api-test", &m, &err), KVNODE_OK)
        << err.message;
    memory.reset(m);
    void* base = kvnode_host_memory_data(m);
    for (std::uint32_t l = 0; l < kLayers; ++l)
      layers.push_back(buffer(base, kLayers * kLayerBytes, l * kLayerBytes));
    allocation.kind = KVNODE_MEMORY_HOST_FD;
    allocation.base = base;
    allocation.bytes = kLayers * kLayerBytes;
    allocation.fd = kvnode_host_memory_fd(m);
    params.preset = KVNODE_KV_VLLM;
    params.num_blocks = kBlocks;
    params.block_size = kChunkTokens;
    params.kv_heads = kHeads;
    params.head_size = kHeadSize;
    params.elem_bytes = kElem;
    params.layers = layers.data();
    params.num_layers = kLayers;
    params.allocations = &allocation;
    params.num_allocations = 1;
  }
  std::unique_ptr<kvnode_host_memory_t, void (*)(kvnode_host_memory_t*)> memory{
      nullptr, kvnode_host_memory_free};
  std::vector<kvnode_kv_buffer_t> layers;
  kvnode_kv_allocation_t allocation{};
  kvnode_kv_register_params_t params{};
};

struct CacheCloser {
  void operator()(kvnode_kv_cache_t* c) const { kvnode_kv_close(c); }
};
using Cache = std::unique_ptr<kvnode_kv_cache_t, CacheCloser>;

template <class T>
bool same_bytes(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

TEST(CApiAgainstKvnode, OutputStructsGetTheFieldsTheirMaskAsksForAndNoOtherByte) {
  Node node("masks");
  Client client(node.connect());
  ASSERT_TRUE(client);
  kvnode_error_t err{};
  kvnode_node_info_t info, want;
  std::memset(&info, 'Z', sizeof info);  // padding included: no byte may change but those asked
  info.field_mask = KVNODE_NODE_INFO_FIELD_CHUNK_SIZE | KVNODE_NODE_INFO_FIELD_SAVE_UNFULL_CHUNK;
  std::memcpy(&want, &info, sizeof info);
  want.chunk_size = kChunkTokens;
  want.save_unfull_chunk = 1;
  ASSERT_EQ(kvnode_client_info(client.get(), &info, &err), KVNODE_OK) << err.message;
  EXPECT_TRUE(same_bytes(info, want));
  info.field_mask = 0;  // nothing asked, nothing written
  std::memcpy(&want, &info, sizeof info);
  EXPECT_EQ(kvnode_client_info(client.get(), &info, &err), KVNODE_OK);
  EXPECT_TRUE(same_bytes(info, want));
  info.field_mask = KVNODE_NODE_INFO_FIELDS_ALL | (1ull << 40);  // a field of a newer header
  std::memcpy(&want, &info, sizeof info);
  EXPECT_EQ(kvnode_client_info(client.get(), &info, &err), KVNODE_ERR_INVALID);
  EXPECT_NE(
      std::string(err.message).find("kvnode_client_info: info->field_mask: bits 0x10000000000"),
      std::string::npos)
      << err.message;
  EXPECT_TRUE(same_bytes(info, want)) << "a refused call writes nothing";

  HostCache host;
  kvnode_kv_cache_t* raw = nullptr;
  ASSERT_EQ(kvnode_kv_register(client.get(), &host.params, &raw, &err), KVNODE_OK) << err.message;
  Cache cache(raw);
  std::vector<std::int64_t> tokens(2 * kChunkTokens);
  std::iota(tokens.begin(), tokens.end(), 5000);
  const std::uint32_t blocks[] = {1, 2};
  kvnode_kv_transfer_params_t t{};
  t.tokens = tokens.data();
  t.num_tokens = tokens.size();
  t.block_ids = blocks;
  t.num_block_ids = 2;
  kvnode_kv_result_t r, r_want;
  std::memset(&r, 'Z', sizeof r);
  r.field_mask = KVNODE_KV_RESULT_FIELD_TOKENS;
  std::memcpy(&r_want, &r, sizeof r);
  r_want.tokens = tokens.size();
  ASSERT_EQ(kvnode_kv_store(cache.get(), &t, &r, &err), KVNODE_OK) << err.message;
  EXPECT_TRUE(same_bytes(r, r_want));
  EXPECT_EQ(r.tokens, tokens.size());
  // A failed call zeroes the fields asked for, and no other.
  const std::uint32_t out_of_range[] = {1, kBlocks};
  t.block_ids = out_of_range;
  r_want.tokens = 0;
  EXPECT_EQ(kvnode_kv_load(cache.get(), &t, &r, &err), KVNODE_ERR_INVALID);
  EXPECT_TRUE(same_bytes(r, r_want));
  // An unknown bit: refused before anything is sent, nothing written.
  t.block_ids = blocks;
  std::vector<std::int64_t> fresh(kChunkTokens);
  std::iota(fresh.begin(), fresh.end(), 9000);
  t.tokens = fresh.data();
  t.num_tokens = fresh.size();
  r.field_mask = KVNODE_KV_RESULT_FIELDS_ALL | (1ull << 3);
  std::memcpy(&r_want, &r, sizeof r);
  EXPECT_EQ(kvnode_kv_store(cache.get(), &t, &r, &err), KVNODE_ERR_INVALID);
  EXPECT_NE(std::string(err.message).find("kvnode_kv_store: result->field_mask: bits 0x8"),
            std::string::npos)
      << err.message;
  EXPECT_TRUE(same_bytes(r, r_want));
  std::size_t held = 1;
  ASSERT_EQ(kvnode_lookup(client.get(), fresh.data(), fresh.size(), &held, &err), KVNODE_OK);
  EXPECT_EQ(held, 0u) << "the refused store sent nothing";
  EXPECT_EQ(kvnode_kv_store(cache.get(), &t, nullptr, &err), KVNODE_OK) << "result may be NULL";
}

TEST(CApiAgainstKvnode, ArrayElementsReservedWordsMustBeZero) {
  Node node("reserved");
  Client client(node.connect());
  ASSERT_TRUE(client);
  kvnode_error_t err{};
  HostCache host;
  kvnode_kv_cache_t* cache = nullptr;
  host.layers[1].reserved[2] = 1;
  EXPECT_EQ(kvnode_kv_register(client.get(), &host.params, &cache, &err), KVNODE_ERR_INVALID);
  EXPECT_NE(std::string(err.message).find("params->layers[1].reserved: must be zero"),
            std::string::npos)
      << err.message;
  host.layers[1].reserved[2] = 0;
  host.allocation.reserved[3] = 7;
  EXPECT_EQ(kvnode_kv_register(client.get(), &host.params, &cache, &err), KVNODE_ERR_INVALID);
  EXPECT_NE(std::string(err.message).find("params->allocations[0].reserved: must be zero"),
            std::string::npos)
      << err.message;
  host.allocation.reserved[3] = 0;
  host.params.field_mask = 1u << 5;  // a bit this library does not know
  EXPECT_EQ(kvnode_kv_register(client.get(), &host.params, &cache, &err), KVNODE_ERR_INVALID);
  EXPECT_NE(std::string(err.message).find("params->field_mask: bits 0x20 "), std::string::npos)
      << err.message;
  host.params.field_mask = KVNODE_KV_REGISTER_FIELD_STRIDES;  // a fixed preset takes none
  EXPECT_EQ(kvnode_kv_register(client.get(), &host.params, &cache, &err), KVNODE_ERR_INVALID);
  EXPECT_NE(std::string(err.message).find("params->strides: only a STRIDED preset"),
            std::string::npos)
      << err.message;
  EXPECT_EQ(cache, nullptr);
  host.params.field_mask = 0;
  ASSERT_EQ(kvnode_kv_register(client.get(), &host.params, &cache, &err), KVNODE_OK) << err.message;
  kvnode_kv_close(cache);
}

TEST(CApiAgainstKvnode, ALastPartialChunkIsStoredAndCountedAsTheNodeSays) {
  Node node("unfull");
  Client client(node.connect());
  ASSERT_TRUE(client);
  kvnode_error_t err{};
  kvnode_node_info_t info{};
  info.field_mask = KVNODE_NODE_INFO_FIELD_SAVE_UNFULL_CHUNK;
  ASSERT_EQ(kvnode_client_info(client.get(), &info, &err), KVNODE_OK) << err.message;
  ASSERT_EQ(info.save_unfull_chunk, 1);
  HostCache host;
  kvnode_kv_cache_t* raw = nullptr;
  ASSERT_EQ(kvnode_kv_register(client.get(), &host.params, &raw, &err), KVNODE_OK) << err.message;
  Cache cache(raw);
  std::vector<std::int64_t> tokens(2 * kChunkTokens + 8);  // 40: 2 whole chunks and 8 tokens
  std::iota(tokens.begin(), tokens.end(), 7000);
  const std::uint32_t blocks[] = {4, 5, 6};
  kvnode_kv_transfer_params_t t{};
  t.tokens = tokens.data();
  t.num_tokens = tokens.size();
  t.block_ids = blocks;
  t.num_block_ids = 3;
  kvnode_kv_result_t r{};
  r.field_mask = KVNODE_KV_RESULT_FIELDS_ALL;
  ASSERT_EQ(kvnode_kv_store(cache.get(), &t, &r, &err), KVNODE_OK) << err.message;
  EXPECT_EQ(r.chunks, 3u);
  EXPECT_EQ(r.tokens, 40u);
  std::size_t held = 0;
  ASSERT_EQ(kvnode_lookup(client.get(), tokens.data(), tokens.size(), &held, &err), KVNODE_OK);
  EXPECT_EQ(held, 40u);
}

}  // namespace

// vLLM >= 0.33's cache (every layer a [blocks, heads, block_size, 2 * head_size] view of one
// allocation, here in the CPU backend's physical order LBHNC) registered by strides, fed from a
// cache in the older per-layer [2, blocks, block_size, heads, head_size] preset through the node:
// a chunk means the same tokens' K and V whichever layout stored it.
TEST(CApiAgainstKvnode, AStridedCacheLoadsWhatAPresetCacheStored) {
  Node node("strided");
  Client client(node.connect());
  ASSERT_TRUE(client);
  kvnode_error_t err{};
  HostCache source;
  auto* src = static_cast<std::byte*>(kvnode_host_memory_data(source.memory.get()));
  for (std::size_t i = 0; i < kLayers * kLayerBytes; ++i)
    src[i] = static_cast<std::byte>((i * 131 + i / 977) | 1);
  kvnode_kv_cache_t* raw = nullptr;
  ASSERT_EQ(kvnode_kv_register(client.get(), &source.params, &raw, &err), KVNODE_OK) << err.message;
  Cache preset(raw);

  HostCache packed;  // the same bytes in all, laid out [layer, block, head, token, K|V channel]
  auto* dst = static_cast<std::byte*>(kvnode_host_memory_data(packed.memory.get()));
  const std::size_t row = kHeadSize * kElem;  // one head's K (or V) of one token
  const std::size_t token_stride = 2 * row, head_stride = kChunkTokens * token_stride;
  const std::size_t block_stride = kHeads * head_stride;
  packed.params.preset = KVNODE_KV_STRIDED;
  packed.params.strides = {block_stride, token_stride, head_stride, row};
  EXPECT_EQ(kvnode_kv_register(client.get(), &packed.params, &raw, &err), KVNODE_ERR_INVALID);
  EXPECT_NE(std::string(err.message).find("params->strides: required"), std::string::npos)
      << err.message;
  packed.params.field_mask = KVNODE_KV_REGISTER_FIELD_STRIDES;
  ASSERT_EQ(kvnode_kv_register(client.get(), &packed.params, &raw, &err), KVNODE_OK) << err.message;
  Cache strided(raw);

  std::vector<std::int64_t> tokens(3 * kChunkTokens);
  std::iota(tokens.begin(), tokens.end(), 7000);
  const std::vector<std::uint32_t> from = {4, 17, 8}, to = {30, 1, 22};
  kvnode_kv_transfer_params_t t{};
  t.tokens = tokens.data();
  t.num_tokens = tokens.size();
  t.block_ids = from.data();
  t.num_block_ids = from.size();
  kvnode_kv_result_t r{};
  r.field_mask = KVNODE_KV_RESULT_FIELD_CHUNKS;
  ASSERT_EQ(kvnode_kv_store(preset.get(), &t, &r, &err), KVNODE_OK) << err.message;
  ASSERT_EQ(r.chunks, 3u);
  t.block_ids = to.data();
  ASSERT_EQ(kvnode_kv_load(strided.get(), &t, &r, &err), KVNODE_OK) << err.message;
  ASSERT_EQ(r.chunks, 3u);
  std::size_t bad = 0;
  for (std::uint32_t l = 0; l < kLayers; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (std::size_t b = 0; b < from.size(); ++b)
        for (std::size_t tok = 0; tok < kChunkTokens; ++tok)
          for (std::size_t h = 0; h < kHeads; ++h) {
            const std::byte* want = block_at(src, l, kv, from[b]) + (tok * kHeads + h) * row;
            const std::byte* got = dst + l * kLayerBytes + to[b] * block_stride + h * head_stride +
                                   tok * token_stride + kv * row;
            bad += std::memcmp(want, got, row) != 0;
          }
  EXPECT_EQ(bad, 0u) << "rows that differ";
}

// An engine that names its chunks (SGLang's page keys): store, check and load by chunk hash,
// one block per chunk here; a hash never stored stops the load, and tokens stay unhashed.
TEST(CApiAgainstKvnode, ChunksByHashStoreLookUpAndLoad) {
  Node node("hashes");
  Client client(node.connect());
  ASSERT_TRUE(client);
  kvnode_error_t err{};
  HostCache cache;
  auto* base = static_cast<std::byte*>(kvnode_host_memory_data(cache.memory.get()));
  for (std::size_t i = 0; i < kLayers * kLayerBytes; ++i)
    base[i] = static_cast<std::byte>((i * 37 + i / 1013) | 2);
  kvnode_kv_cache_t* raw = nullptr;
  ASSERT_EQ(kvnode_kv_register(client.get(), &cache.params, &raw, &err), KVNODE_OK) << err.message;
  Cache kv(raw);

  const std::vector<std::int64_t> hashes = {-5, 0x7fffffffffffffffLL, 42};
  const std::vector<std::uint32_t> from = {3, 9, 27}, to = {11, 0, 31};
  kvnode_kv_transfer_params_t t{};
  t.field_mask = KVNODE_KV_XFER_FIELD_HASHES;
  t.hashes = hashes.data();
  t.num_hashes = hashes.size();
  t.block_ids = from.data();
  t.num_block_ids = from.size();
  kvnode_kv_result_t r{};
  r.field_mask = KVNODE_KV_RESULT_FIELDS_ALL;
  ASSERT_EQ(kvnode_kv_store(kv.get(), &t, &r, &err), KVNODE_OK) << err.message;
  EXPECT_EQ(r.chunks, 3u);
  EXPECT_EQ(r.tokens, 3 * kChunkTokens);  // num_tokens 0: every chunk whole

  std::size_t held = 99;
  ASSERT_EQ(kvnode_lookup_chunks(client.get(), hashes.data(), hashes.size(), &held, &err),
            KVNODE_OK)
      << err.message;
  EXPECT_EQ(held, 3u);
  const std::vector<std::int64_t> gap = {-5, 7, 42};  // 7 was never stored
  ASSERT_EQ(kvnode_lookup_chunks(client.get(), gap.data(), gap.size(), &held, &err), KVNODE_OK);
  EXPECT_EQ(held, 1u);
  kvnode_prefix_info_t prefix{};
  prefix.field_mask = KVNODE_PREFIX_FIELDS_ALL;
  ASSERT_EQ(kvnode_lookup_peers_chunks(client.get(), gap.data(), gap.size(), &prefix, &err),
            KVNODE_OK)
      << err.message;
  EXPECT_EQ(prefix.chunks, 1u);
  EXPECT_EQ(prefix.tokens, 0u);
  EXPECT_EQ(prefix.peer_chunks, 0u);  // no controller: no peer
  size_t tokens_held = 99;            // the same numbers as tokens are another sequence: not held
  ASSERT_EQ(kvnode_lookup(client.get(), hashes.data(), hashes.size(), &tokens_held, &err),
            KVNODE_OK);
  EXPECT_EQ(tokens_held, 0u);

  t.block_ids = to.data();
  t.hashes = gap.data();
  ASSERT_EQ(kvnode_kv_load(kv.get(), &t, &r, &err), KVNODE_OK) << err.message;
  EXPECT_EQ(r.chunks, 1u);  // the leading chunk only
  t.hashes = hashes.data();
  ASSERT_EQ(kvnode_kv_load(kv.get(), &t, &r, &err), KVNODE_OK) << err.message;
  EXPECT_EQ(r.chunks, 3u);
  std::size_t bad = 0;
  for (std::uint32_t l = 0; l < kLayers; ++l)
    for (int part = 0; part < 2; ++part)
      for (std::size_t i = 0; i < from.size(); ++i)
        bad += std::memcmp(block_at(base, l, part, from[i]), block_at(base, l, part, to[i]),
                           kBlockBytes) != 0;
  EXPECT_EQ(bad, 0u) << "blocks that differ";

  // Hashes and tokens together, or neither, are refused naming the field.
  t.tokens = hashes.data();
  EXPECT_EQ(kvnode_kv_load(kv.get(), &t, &r, &err), KVNODE_ERR_INVALID);
  EXPECT_NE(std::string(err.message).find("params->tokens"), std::string::npos) << err.message;
  t.tokens = nullptr;
  t.hashes = nullptr;
  EXPECT_EQ(kvnode_kv_store(kv.get(), &t, &r, &err), KVNODE_ERR_INVALID);
  EXPECT_NE(std::string(err.message).find("params->hashes"), std::string::npos) << err.message;
}

// Memory the node cannot map (this process's heap, as SGLang's host pools): registered as the
// engine's own memory, the node copies with process_vm_readv/writev; every byte comes back, and
// an address range that is not mapped in this process is refused at registration.
TEST(CApiAgainstKvnode, AnEnginesOwnMemoryIsCopiedWithoutMapping) {
  Node node("process");
  Client client(node.connect());
  ASSERT_TRUE(client);
  kvnode_error_t err{};
  std::vector<std::byte> heap(kLayers * kLayerBytes);
  for (std::size_t i = 0; i < heap.size(); ++i)
    heap[i] = static_cast<std::byte>((i * 29 + i / 4099) | 4);
  HostCache cache;  // its params, pointed at the heap instead of its memfd
  for (std::uint32_t l = 0; l < kLayers; ++l)
    cache.layers[l] = buffer(heap.data(), heap.size(), l * kLayerBytes);
  cache.allocation.kind = KVNODE_MEMORY_HOST_PROCESS;
  cache.allocation.base = heap.data();
  cache.allocation.bytes = heap.size();
  cache.allocation.fd = -1;
  kvnode_kv_cache_t* raw = nullptr;
  ASSERT_EQ(kvnode_kv_register(client.get(), &cache.params, &raw, &err), KVNODE_OK) << err.message;
  Cache kv(raw);
  std::vector<std::int64_t> tokens(2 * kChunkTokens);
  std::iota(tokens.begin(), tokens.end(), 91000);
  const std::vector<std::uint32_t> from = {6, 19}, to = {2, 30};
  kvnode_kv_transfer_params_t t{};
  t.tokens = tokens.data();
  t.num_tokens = tokens.size();
  t.block_ids = from.data();
  t.num_block_ids = from.size();
  kvnode_kv_result_t r{};
  r.field_mask = KVNODE_KV_RESULT_FIELD_CHUNKS;
  ASSERT_EQ(kvnode_kv_store(kv.get(), &t, &r, &err), KVNODE_OK) << err.message;
  ASSERT_EQ(r.chunks, 2u);
  t.block_ids = to.data();
  ASSERT_EQ(kvnode_kv_load(kv.get(), &t, &r, &err), KVNODE_OK) << err.message;
  ASSERT_EQ(r.chunks, 2u);
  std::size_t bad = 0;
  for (std::uint32_t l = 0; l < kLayers; ++l)
    for (int part = 0; part < 2; ++part)
      for (std::size_t i = 0; i < from.size(); ++i)
        bad += std::memcmp(block_at(heap.data(), l, part, from[i]),
                           block_at(heap.data(), l, part, to[i]), kBlockBytes) != 0;
  EXPECT_EQ(bad, 0u) << "blocks that differ";

  // A range this process does not map: refused, naming the allocation.
  const std::size_t span = 1 << 20;
  void* gone = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(gone, MAP_FAILED);
  ASSERT_EQ(::munmap(gone, span), 0);
  cache.allocation.base = gone;
  for (std::uint32_t l = 0; l < kLayers; ++l)
    cache.layers[l] = buffer(gone, span, l * 2 * kBlockBytes);  // one block per layer
  cache.params.num_blocks = 1;
  EXPECT_EQ(kvnode_kv_register(client.get(), &cache.params, &raw, &err), KVNODE_ERR_INVALID);
  EXPECT_NE(std::string(err.message).find("allocations[0]"), std::string::npos) << err.message;
}

// The node maps at most --max-kv-registration-gb of engines' host KV, all clients together: one
// more is refused (no_room, naming the flag) before anything is mapped; a cache unregistered
// makes room again.
TEST(CApiAgainstKvnode, RegistrationsPastTheNodesCapAreRefused) {
  Node node("cap", {"--max-kv-registration-gb", "0.003"});  // 3 MB: one 2 MiB cache, not two
  Client first(node.connect()), second(node.connect());
  ASSERT_TRUE(first && second);
  kvnode_error_t err{};
  HostCache a, b;
  kvnode_kv_cache_t* raw = nullptr;
  ASSERT_EQ(kvnode_kv_register(first.get(), &a.params, &raw, &err), KVNODE_OK) << err.message;
  Cache held(raw);
  EXPECT_EQ(kvnode_kv_register(second.get(), &b.params, &raw, &err), KVNODE_ERR_NO_ROOM);
  EXPECT_NE(std::string(err.message).find("--max-kv-registration-gb"), std::string::npos)
      << err.message;
  held.reset();  // unregistered: its 2 MiB are free again
  ASSERT_EQ(kvnode_kv_register(second.get(), &b.params, &raw, &err), KVNODE_OK) << err.message;
  Cache now(raw);
}
