// The README's C++ example ("An engine's paged KV cache"), verbatim down to the main below
// (tests/client/readme_examples.cmake checks it), built against the installed tree by
// tests/client/install_test.cmake and run with no node there: it must fail cleanly.
#include "kvnode/client/kv_layout.hpp"
#include "kvnode/client/kv_memory.hpp"
#include "kvnode/client/local_client.hpp"
namespace kc = kvnode::client;

// A CPU engine (or a test): the cache lives in memory the node can map. A GPU engine passes
// kc::KvAllocation{kc::KvMemoryKind::kCudaIpc, base, bytes, -1, ipc_handle} instead.
kvnode::Status run(const std::string& socket, const std::vector<std::int64_t>& tokens) {
  auto client = kc::LocalClient::connect(socket);
  if (!client) return client.error();
  const kc::KvCacheShape shape{/*num_blocks*/ 256, /*block_size*/ 16, /*kv_heads*/ 8,
                               /*head_size*/ 128, /*elem_bytes*/ 2};  // Llama-3.1-8B, bf16
  const std::size_t per_layer = 2ull * 256 * 16 * 8 * 128 * 2;        // [2, blocks, 16, 8, 128]
  auto memory = kc::HostKvMemory::create(32 * per_layer);
  if (!memory) return memory.error();
  std::vector<kc::KvBuffer> layers;
  for (std::size_t l = 0; l < 32; ++l)
    layers.push_back({memory->data(), memory->size(), l * per_layer});
  auto layout = kc::vllm_flash_attn_layout(shape, layers);
  if (!layout) return layout.error();
  const kc::KvAllocation shared = memory->allocation();
  auto kv = (*client)->register_kv(*layout, std::span(&shared, 1));
  if (!kv) return kv.error();  // e.g. "a chunk of 256 tokens of this layout is ... bytes"

  kc::KvTransfer t;
  t.kv = *kv;
  t.keys = kc::ChunkKeys::of_tokens(tokens);
  t.block_ids = {7, 3, 12 /* ... the sequence's blocks, 16 tokens each */};
  auto stored = (*client)->store(t);  // committed once copied; the longest prefix that fits
  if (!stored) return stored.error();
  t.block_ids = {40, 41, 42 /* ... where the engine wants them now */};
  t.retrieve = true;                 // pull what this node lacks from a peer first
  auto loaded = (*client)->load(t);  // loaded->tokens: the leading tokens now in the blocks
  if (!loaded) return loaded.error();
  return {};
}

#include <cstdio>
#include <numeric>

int main(int argc, char** argv) {
  std::vector<std::int64_t> tokens(3 * 16);
  std::iota(tokens.begin(), tokens.end(), 1000);
  const kvnode::Status status = run(argc > 1 ? argv[1] : "/tmp/kvnode-example.sock", tokens);
  if (!status) {
    std::fprintf(stderr, "%s: %s\n", kvnode::to_string(status.error().code),
                 status.error().message.c_str());
    return 1;
  }
  std::puts("stored and loaded");
  return 0;
}
