/* The C side of bench_overhead.py: `iters` stores through the C API in a tight loop, each one
 * timed (CLOCK_MONOTONIC), on a cache the Python side registered. Built by bench_overhead.py as
 * a shared library loaded into the same process, so both paths use one client and one cache. */
#define _POSIX_C_SOURCE 199309L /* clock_gettime under -std=c99 */
#include <kvnode/kvnode_client.h>
#include <time.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

int bench_store(kvnode_kv_cache_t* cache, const int64_t* tokens, size_t num_tokens,
                const uint32_t* block_ids, size_t num_block_ids, int iters, double* out_us) {
  kvnode_kv_transfer_params_t p = {0};
  p.tokens = tokens;
  p.num_tokens = num_tokens;
  p.block_ids = block_ids;
  p.num_block_ids = num_block_ids;
  kvnode_kv_result_t result = {0};
  result.field_mask = KVNODE_KV_RESULT_FIELD_TOKENS;
  kvnode_error_t err;
  for (int i = 0; i < iters; ++i) {
    const double t0 = now_us();
    const kvnode_status_t s = kvnode_kv_store(cache, &p, &result, &err);
    out_us[i] = now_us() - t0;
    if (s != KVNODE_OK) return (int)s;
    if (result.tokens != num_tokens) return 1;
  }
  return 0;
}

/* A stand-in for kvnode_kv_store that does nothing but answer "all stored": timing
 * KVCache.store over it measures the Python side alone, free of the node's noise. */
kvnode_status_t stub_store(kvnode_kv_cache_t* cache, const kvnode_kv_transfer_params_t* params,
                           kvnode_kv_result_t* result, kvnode_error_t* err) {
  (void)cache;
  (void)err;
  result->chunks = 1;
  result->tokens = params->num_tokens;
  result->pulled = 0;
  return KVNODE_OK;
}

/* `iters` calls of the stub from C, timed as one: the C side's floor. */
double bench_stub(kvnode_kv_cache_t* cache, const int64_t* tokens, size_t num_tokens,
                  const uint32_t* block_ids, size_t num_block_ids, int iters) {
  kvnode_kv_transfer_params_t p = {0};
  p.tokens = tokens;
  p.num_tokens = num_tokens;
  p.block_ids = block_ids;
  p.num_block_ids = num_block_ids;
  kvnode_kv_result_t result = {0};
  result.field_mask = KVNODE_KV_RESULT_FIELD_TOKENS;
  kvnode_error_t err;
  kvnode_status_t (*volatile fn)(kvnode_kv_cache_t*, const kvnode_kv_transfer_params_t*,
                                 kvnode_kv_result_t*, kvnode_error_t*) = stub_store;
  const double t0 = now_us();
  for (int i = 0; i < iters; ++i) (void)fn(cache, &p, &result, &err);
  return (now_us() - t0) / iters;
}
