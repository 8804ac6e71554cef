/* kvnode's client C API: what an inference engine (or its Python binding) links to reach the
 * kvnode daemon on its host: libkvnode_client.so, `pkg-config --cflags --libs kvnode-client`.
 * A thin layer over the C++ kvnode::client library; it links no UCX, ZeroMQ, CUDA or httplib.
 *
 * Conventions (as UCX's):
 * - Every call returns a kvnode_status_t (KVNODE_OK is 0, errors are negative) and, when `err` is
 *   not NULL, fills it with the code and the node's message (NUL-terminated, cut to fit; empty on
 *   success). No C++ exception crosses this boundary.
 * - Handles are opaque and owned by the caller: every *_open / *_create / kvnode_connect has its
 *   *_close / *_free, which accepts NULL.
 * - Parameter structs start with `field_mask`: a field whose bit is not set takes its default, so
 *   structs can grow without breaking callers built against an older header. Set `field_mask` to
 *   the bits of the fields you filled (required fields are listed per struct and need no bit).
 *   A bit this library does not know is refused (KVNODE_ERR_INVALID), never silently ignored.
 * - Threads: a kvnode_client_t (and the KV caches registered through it) serves one call at a
 *   time: use one client per thread, or serialise calls. Distinct clients are independent.
 *   kvnode_status_string and kvnode_host_memory_* functions are thread-safe.
 */
#ifndef KVNODE_CLIENT_H
#define KVNODE_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVNODE_CLIENT_API_VERSION 1

typedef enum kvnode_status {
  KVNODE_OK = 0,
  KVNODE_ERR_INVALID = -1,   /* a bad argument or request; the message names the field */
  KVNODE_ERR_NOT_FOUND = -2, /* no such chunk, registration or socket */
  KVNODE_ERR_NO_ROOM = -3,   /* the pool, staging or a queue is full: fewer, or later */
  KVNODE_ERR_FROZEN = -4,    /* a full sync runs: ask again shortly */
  KVNODE_ERR_DEADLINE = -5,  /* no answer within the timeout */
  KVNODE_ERR_PEER_LOST = -6, /* the node went away; the next call connects again */
  KVNODE_ERR_REFUSED = -7,   /* not allowed (permissions, a cap, no GPU) */
  KVNODE_ERR_IO = -8,        /* an operating-system call failed */
  KVNODE_ERR_INTERNAL = -9   /* a bug or an unexpected answer */
} kvnode_status_t;

/* A static description of a status ("invalid", "not_found", ...). */
const char* kvnode_status_string(kvnode_status_t status);

#define KVNODE_ERROR_MESSAGE_BYTES 1024
typedef struct kvnode_error {
  kvnode_status_t status;
  char message[KVNODE_ERROR_MESSAGE_BYTES]; /* NUL-terminated, cut to fit */
} kvnode_error_t;

/* ---- connecting ---------------------------------------------------------------------------- */

typedef struct kvnode_client kvnode_client_t;

enum {
  KVNODE_CONNECT_FIELD_TIMEOUT = 1u << 0,       /* timeout_s */
  KVNODE_CONNECT_FIELD_SHARED_MEMORY = 1u << 1, /* use_shared_memory */
};
typedef struct kvnode_connect_params {
  uint64_t field_mask;
  const char* socket_path;  /* required: the node's local socket */
  double timeout_s;         /* per request; default 15 */
  int use_shared_memory;    /* default 1; 0: put/get bytes travel inline */
} kvnode_connect_params_t;

kvnode_status_t kvnode_connect(const kvnode_connect_params_t* params, kvnode_client_t** client,
                               kvnode_error_t* err);
void kvnode_client_close(kvnode_client_t* client);

#define KVNODE_NAME_BYTES 256
typedef struct kvnode_node_info {
  uint64_t chunk_bytes; /* bytes per chunk (one pool page) */
  uint64_t chunk_size;  /* tokens per chunk */
  uint64_t pages;       /* chunks the pool holds */
  int64_t worker_id;
  char memory[16];                  /* "host", "pinned" or "device" */
  char instance[KVNODE_NAME_BYTES]; /* the node's instance id */
  char location[KVNODE_NAME_BYTES];
} kvnode_node_info_t;

kvnode_status_t kvnode_client_info(kvnode_client_t* client, kvnode_node_info_t* info,
                                   kvnode_error_t* err);

/* ---- chunks by tokens ------------------------------------------------------------------------ */

/* Leading tokens of `tokens` whose chunks this node holds. */
kvnode_status_t kvnode_lookup(kvnode_client_t* client, const int64_t* tokens, size_t num_tokens,
                              size_t* held_tokens, kvnode_error_t* err);

/* ---- host memory the node can map (CPU engines, tests) ---------------------------------------- */

typedef struct kvnode_host_memory kvnode_host_memory_t;
/* `bytes` of zeroed memory (a sealed memfd); `name` may be NULL. */
kvnode_status_t kvnode_host_memory_create(size_t bytes, const char* name,
                                          kvnode_host_memory_t** memory, kvnode_error_t* err);
/* Its mapping, size and memfd (owned by the handle); NULL gives NULL, 0 and -1. */
void* kvnode_host_memory_data(const kvnode_host_memory_t* memory);
size_t kvnode_host_memory_size(const kvnode_host_memory_t* memory);
int kvnode_host_memory_fd(const kvnode_host_memory_t* memory);
void kvnode_host_memory_free(kvnode_host_memory_t* memory);

/* ---- an engine's paged KV cache --------------------------------------------------------------- */

typedef enum kvnode_memory_kind {
  KVNODE_MEMORY_HOST_FD = 0,  /* host memory behind `fd` (kvnode_host_memory_fd) */
  KVNODE_MEMORY_CUDA_IPC = 1, /* device memory: `ipc_handle` = cudaIpcGetMemHandle(base) */
  KVNODE_MEMORY_CUDA_VMM = 2  /* device memory: `fd` from cuMemExportToShareableHandle */
} kvnode_memory_kind_t;

typedef struct kvnode_kv_allocation {
  kvnode_memory_kind_t kind;
  void* base;    /* the allocation's base in this process */
  size_t bytes;  /* its size */
  int fd;        /* HOST_FD, CUDA_VMM: the node gets a copy; the caller keeps this one */
  uint8_t ipc_handle[64]; /* CUDA_IPC */
} kvnode_kv_allocation_t;

typedef enum kvnode_kv_preset {
  KVNODE_KV_VLLM = 0,       /* per layer [2, num_blocks, block_size, kv_heads, head_size] */
  KVNODE_KV_FLASHINFER = 1, /* per layer [num_blocks, 2, block_size, kv_heads, head_size] */
  KVNODE_KV_MLA = 2,        /* per layer [num_blocks, block_size, head_size] */
  KVNODE_KV_SGLANG = 3      /* per layer K and V buffers, [num_blocks * block_size, kv_heads, head_size] */
} kvnode_kv_preset_t;

/* Where one layer's tensor lies (SGLANG: one K and one V per layer, K first). */
typedef struct kvnode_kv_buffer {
  void* base;   /* the allocation's base (one of the registered allocations) */
  size_t bytes; /* the allocation's size */
  size_t offset; /* the tensor's first byte from base */
} kvnode_kv_buffer_t;

enum {
  KVNODE_KV_FIELD_KV_HEADS = 1u << 0, /* accepted; kv_heads is read either way (MLA ignores it) */
};
typedef struct kvnode_kv_register_params {
  uint64_t field_mask;
  kvnode_kv_preset_t preset;       /* required */
  uint32_t num_blocks;             /* required */
  uint32_t block_size;             /* required: tokens per block */
  uint32_t kv_heads;               /* per rank; required but for MLA */
  uint32_t head_size;              /* required: elements per head */
  uint32_t elem_bytes;             /* required: 2 for bf16/fp16, 1 for fp8 */
  const kvnode_kv_buffer_t* layers; /* required: one per layer (SGLANG: 2 per layer, K then V) */
  size_t num_layers;               /* layers, not buffers */
  const kvnode_kv_allocation_t* allocations; /* required: every layer lies in one of them */
  size_t num_allocations;
} kvnode_kv_register_params_t;

typedef struct kvnode_kv_cache kvnode_kv_cache_t;

/* Registers the cache with the node (the node maps it once; the allocations must outlive the
 * registration). Fails naming the field when the layout leaves an allocation or a chunk of it
 * does not match the node's page size. Closing the client ends its registrations: its caches then
 * answer KVNODE_ERR_NOT_FOUND, and must still be closed. */
kvnode_status_t kvnode_kv_register(kvnode_client_t* client,
                                   const kvnode_kv_register_params_t* params,
                                   kvnode_kv_cache_t** cache, kvnode_error_t* err);
/* Unregisters (the node unmaps it); accepts NULL. */
void kvnode_kv_close(kvnode_kv_cache_t* cache);

enum {
  KVNODE_KV_XFER_FIELD_RETRIEVE = 1u << 0,   /* retrieve (load only: a store refuses it) */
  KVNODE_KV_XFER_FIELD_WAIT_EVENT = 1u << 1, /* wait_event */
  KVNODE_KV_XFER_FIELD_DONE_EVENT = 1u << 2, /* done_event */
};
typedef struct kvnode_kv_transfer_params {
  uint64_t field_mask;
  const int64_t* tokens;     /* required: the sequence's token ids (hashed by the node) */
  size_t num_tokens;
  const uint32_t* block_ids; /* required: one per block_size tokens, in order */
  size_t num_block_ids;
  int retrieve;              /* load: pull what this node lacks from a peer first */
  uint8_t wait_event[64];    /* cudaIpcEventHandle_t the node's copies wait for */
  uint8_t done_event[64];    /* cudaIpcEventHandle_t the node records once they landed */
} kvnode_kv_transfer_params_t;

typedef struct kvnode_kv_result {
  uint64_t chunks; /* leading chunks stored or loaded */
  uint64_t tokens; /* the tokens they cover */
  uint64_t pulled; /* load with retrieve: of them, pulled from a peer */
} kvnode_kv_result_t;

/* Gathers each chunk's blocks into the node's pool (committed once copied); the longest prefix
 * that fits. `result` may be NULL. */
kvnode_status_t kvnode_kv_store(kvnode_kv_cache_t* cache,
                                const kvnode_kv_transfer_params_t* params,
                                kvnode_kv_result_t* result, kvnode_error_t* err);
/* Copies the leading stored chunks into the blocks; `result` may be NULL. */
kvnode_status_t kvnode_kv_load(kvnode_kv_cache_t* cache, const kvnode_kv_transfer_params_t* params,
                               kvnode_kv_result_t* result, kvnode_error_t* err);

#ifdef __cplusplus
}
#endif

#endif /* KVNODE_CLIENT_H */
