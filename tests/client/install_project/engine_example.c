/* The README's C example ("From C"), verbatim down to the main below
 * (tests/client/readme_examples.cmake checks it): the C++ example's flow through kvnode_client.h.
 * Built against the installed tree by tests/client/install_test.cmake, with find_package(kvnode)
 * and with pkg-config alone, and run with no node there: it must fail cleanly. */
#include <kvnode/kvnode_client.h>
/* Every call answers a status and, in `err`, the node's message; field_mask 0: the defaults. */
kvnode_status_t run(const char* path, const int64_t* tokens, size_t n, kvnode_error_t* err) {
  const size_t per_layer = 2ull * 256 * 16 * 8 * 128 * 2, bytes = 32 * per_layer;  /* bf16 */
  kvnode_client_t* client = NULL; kvnode_host_memory_t* memory = NULL; kvnode_kv_cache_t* kv = NULL;
  kvnode_status_t s = kvnode_connect(&(kvnode_connect_params_t){.socket_path = path}, &client, err);
  if (s == KVNODE_OK) s = kvnode_host_memory_create(bytes, NULL, &memory, err);
  void* base = kvnode_host_memory_data(memory);
  kvnode_kv_buffer_t layers[32];  /* per layer one [2, blocks, 16, 8, 128] tensor */
  for (size_t l = 0; l < 32; ++l)
    layers[l] = (kvnode_kv_buffer_t){.base = base, .bytes = bytes, .offset = l * per_layer};
  kvnode_kv_allocation_t shared = {.kind = KVNODE_MEMORY_HOST_FD, .base = base, .bytes = bytes,
                                   .fd = kvnode_host_memory_fd(memory)};
  kvnode_kv_register_params_t p = {.preset = KVNODE_KV_VLLM, .num_blocks = 256, .block_size = 16,
      .kv_heads = 8, .head_size = 128, .elem_bytes = 2, .layers = layers, .num_layers = 32,
      .allocations = &shared, .num_allocations = 1};
  if (s == KVNODE_OK) s = kvnode_kv_register(client, &p, &kv, err);
  uint32_t blocks[] = {7, 3, 12 /* ... the sequence's blocks, 16 tokens each */};
  kvnode_kv_transfer_params_t t = {.tokens = tokens, .num_tokens = n, .block_ids = blocks,
                                   .num_block_ids = sizeof blocks / sizeof blocks[0]};
  kvnode_kv_result_t done = {.field_mask = KVNODE_KV_RESULT_FIELD_TOKENS};  /* what to fill */
  if (s == KVNODE_OK) s = kvnode_kv_store(kv, &t, &done, err);  /* done.tokens: stored */
  blocks[0] = 40, blocks[1] = 41, blocks[2] = 42;  /* ... where the engine wants them now */
  t.field_mask = KVNODE_KV_XFER_FIELD_RETRIEVE, t.retrieve = 1;  /* pull from a peer first */
  if (s == KVNODE_OK) s = kvnode_kv_load(kv, &t, &done, err);
  kvnode_kv_close(kv); kvnode_host_memory_free(memory); kvnode_client_close(client);
  return s;
}

#include <stdio.h>

int main(int argc, char** argv) {
  int64_t tokens[3 * 16];
  for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; ++i) tokens[i] = 1000 + (int64_t)i;
  kvnode_error_t err;
  if (run(argc > 1 ? argv[1] : "/tmp/kvnode-example.sock", tokens, 3 * 16, &err) != KVNODE_OK) {
    fprintf(stderr, "%s: %s\n", kvnode_status_string(err.status), err.message);
    return 1;
  }
  puts("stored and loaded");
  return 0;
}
