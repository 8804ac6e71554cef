// The token -> chunk-hash chain the controller runs for every /lookup (Google Benchmark).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kvnode/keys/chunk_hash.hpp"

namespace {

void BM_ChunkHashes(benchmark::State& state) {
  std::mt19937_64 rng(42);
  std::vector<std::int64_t> tokens(static_cast<std::size_t>(state.range(0)));
  for (auto& t : tokens) t = static_cast<std::int64_t>(rng() % 151936);  // a real vocabulary size
  kvnode::keys::ChunkHashConfig cfg;
  cfg.chunk_size = static_cast<std::size_t>(state.range(1));
  for (auto _ : state) {
    auto hashes = kvnode::keys::chunk_hashes(tokens, cfg);
    benchmark::DoNotOptimize(hashes);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));  // tokens
}
BENCHMARK(BM_ChunkHashes)->Args({4096, 256})->Args({1 << 20, 256})->Args({1 << 20, 16});

}  // namespace
