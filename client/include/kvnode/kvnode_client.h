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
 * - Output structs (kvnode_node_info_t, kvnode_kv_result_t) start with `field_mask` too, set by
 *   the caller to the fields it wants filled (as UCX's attribute structs): the library writes
 *   those and no other byte, so it never writes past the end of an older, smaller struct. A bit
 *   it does not know is refused (KVNODE_ERR_INVALID) with nothing written. *_FIELDS_ALL: every
 *   field of this header.
 * - Array elements (kvnode_kv_buffer_t, kvnode_kv_allocation_t) cannot grow: the library finds
 *   element i at i * sizeof(element), so a larger element would misplace every one after the
 *   first of a caller built against an older header. They end in `reserved` words instead,
 *   which must be zero (checked: KVNODE_ERR_INVALID) so a later version can give them a meaning
 *   (under a new bit of the parameter struct's field_mask). Zero-initialise elements (C: `= {0}`
 *   or designated initialisers; C++: `{}`, then set the fields) and they stay valid.
 * - Threads: each function says. "Thread-safe": from any threads at once. "One call at a time
 *   per client": not at the same time as another call on the same kvnode_client_t or on a KV
 *   cache registered through it (from whichever thread); use a client per thread, or serialise
 *   its calls. A call that overlaps another on the same client fails at once with
 *   KVNODE_ERR_INVALID ("busy: one call at a time per client"), never with a wrong answer.
 *   Distinct clients are independent and may be used in parallel.
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

/* A static description of a status ("invalid", "not_found", ...). Thread-safe. */
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

/* Connects to the node at params->socket_path and asks its shape (kvnode_client_info); a new
 * client in *client, or NULL on failure. Thread-safe: each call makes a client of its own. */
kvnode_status_t kvnode_connect(const kvnode_connect_params_t* params, kvnode_client_t** client,
                               kvnode_error_t* err);
/* Closes the connection: the node ends its KV registrations (their handles stay valid to close).
 * Accepts NULL. Not at the same time as any other call on this client or its caches; the handle
 * is gone afterwards. */
void kvnode_client_close(kvnode_client_t* client);

#define KVNODE_NAME_BYTES 256
enum {
  KVNODE_NODE_INFO_FIELD_CHUNK_BYTES = 1u << 0,
  KVNODE_NODE_INFO_FIELD_CHUNK_SIZE = 1u << 1,
  KVNODE_NODE_INFO_FIELD_PAGES = 1u << 2,
  KVNODE_NODE_INFO_FIELD_WORKER_ID = 1u << 3,
  KVNODE_NODE_INFO_FIELD_MEMORY = 1u << 4,
  KVNODE_NODE_INFO_FIELD_INSTANCE = 1u << 5,
  KVNODE_NODE_INFO_FIELD_LOCATION = 1u << 6,
  KVNODE_NODE_INFO_FIELD_SAVE_UNFULL_CHUNK = 1u << 7,
  KVNODE_NODE_INFO_FIELD_HASHING = 1u << 8,
};
#define KVNODE_NODE_INFO_FIELDS_ALL                                                          \
  ((uint64_t)(KVNODE_NODE_INFO_FIELD_CHUNK_BYTES | KVNODE_NODE_INFO_FIELD_CHUNK_SIZE |     \
              KVNODE_NODE_INFO_FIELD_PAGES | KVNODE_NODE_INFO_FIELD_WORKER_ID |            \
              KVNODE_NODE_INFO_FIELD_MEMORY | KVNODE_NODE_INFO_FIELD_INSTANCE |            \
              KVNODE_NODE_INFO_FIELD_LOCATION | KVNODE_NODE_INFO_FIELD_SAVE_UNFULL_CHUNK | \
              KVNODE_NODE_INFO_FIELD_HASHING))
typedef struct kvnode_node_info {
  uint64_t field_mask;  /* set by the caller: KVNODE_NODE_INFO_FIELD_* of the fields to fill */
  uint64_t chunk_bytes; /* bytes per chunk (one pool page) */
  uint64_t chunk_size;  /* tokens per chunk */
  uint64_t pages;       /* chunks the pool holds */
  int64_t worker_id;
  char memory[16];                  /* "host", "pinned" or "device" */
  char instance[KVNODE_NAME_BYTES]; /* the node's instance id */
  char location[KVNODE_NAME_BYTES];
  /* 1: a sequence's last partial chunk (fewer than chunk_size tokens) is a chunk of its own,
   * stored, loaded and looked up like the others (LMCache's save_unfull_chunk, its default), so
   * 40 tokens in 16-token chunks are 3 chunks and 40 tokens; 0: whole chunks only (32 tokens). */
  int save_unfull_chunk;
  /* KVNODE_NODE_INFO_FIELD_HASHING: the chain the node keys chunks by, LMCache's:
   *   h[-1] = hash_init;  h[i] = hash((h[i-1], tuple(chunk i's tokens), third))
   * with CPython's hash(), third = () for "lmcache-0.5.6" or None for "legacy", whose hash is
   * none_hash (CPython's hash(None) depends on the interpreter). hash_init is decimal: it may
   * pass 2^63. A client that hashes tokens itself to ask by hash (kvnode_lookup_chunks) needs
   * all three; an older node leaves hash_generation empty. */
  char hash_generation[16];
  char hash_init[24];
  uint64_t none_hash;
} kvnode_node_info_t;

/* The node's shape, as it said when the client connected (no request is sent): the fields
 * info->field_mask asks for, no other byte written. One call at a time per client (a call that
 * reconnects to a restarted node renews it). */
kvnode_status_t kvnode_client_info(kvnode_client_t* client, kvnode_node_info_t* info,
                                   kvnode_error_t* err);

/* ---- chunks by tokens ------------------------------------------------------------------------ */

/* Leading tokens of `tokens` whose chunks this node holds (a last partial chunk counts when the
 * node's save_unfull_chunk is set). One call at a time per client. */
kvnode_status_t kvnode_lookup(kvnode_client_t* client, const int64_t* tokens, size_t num_tokens,
                              size_t* held_tokens, kvnode_error_t* err);

/* ---- chunks by hash ------------------------------------------------------------------------- */

/* An engine that names its chunks itself (SGLang's page hashes) passes 64-bit chunk hashes where
 * others pass tokens: each hash is one chunk of the node's chunk_size tokens. The hashes are the
 * chunks' names in the whole cluster (the controller's P2P lookup, kvctl lookup and move), so an
 * engine folds everything that tells two deployments apart (model, rank) into them. */

/* Leading chunks of `hashes` this node holds. One call at a time per client. */
kvnode_status_t kvnode_lookup_chunks(kvnode_client_t* client, const int64_t* hashes,
                                     size_t num_hashes, size_t* held_chunks, kvnode_error_t* err);

/* ---- a prefix at this node's peers (P2P, through the controller) ------------------------------ */

enum {
  KVNODE_PREFIX_FIELD_TOKENS = 1u << 0,
  KVNODE_PREFIX_FIELD_CHUNKS = 1u << 1,
  KVNODE_PREFIX_FIELD_PULLED = 1u << 2,
  KVNODE_PREFIX_FIELD_PEER_TOKENS = 1u << 3,
  KVNODE_PREFIX_FIELD_PEER = 1u << 4,
  KVNODE_PREFIX_FIELD_PEER_CHUNKS = 1u << 5,
};
#define KVNODE_PREFIX_FIELDS_ALL                                                          \
  ((uint64_t)(KVNODE_PREFIX_FIELD_TOKENS | KVNODE_PREFIX_FIELD_CHUNKS |                   \
              KVNODE_PREFIX_FIELD_PULLED | KVNODE_PREFIX_FIELD_PEER_TOKENS |              \
              KVNODE_PREFIX_FIELD_PEER | KVNODE_PREFIX_FIELD_PEER_CHUNKS))
/* What this node and its peers hold of a prefix: the fields prefix->field_mask asks for are
 * written (0 or "" when the call fails), no other byte. */
typedef struct kvnode_prefix_info {
  uint64_t field_mask;  /* set by the caller: KVNODE_PREFIX_FIELD_* of the fields to fill */
  uint64_t tokens;      /* leading tokens held by this node (kvnode_retrieve: now, pulled too) */
  uint64_t chunks;      /* their chunks */
  uint64_t pulled;      /* kvnode_retrieve: of them, pulled from `peer` */
  uint64_t peer_tokens; /* kvnode_lookup_peers: leading tokens `peer` holds (0: none holds more) */
  char peer[KVNODE_NAME_BYTES]; /* the peer's transfer URL; "" when none */
  uint64_t peer_chunks; /* kvnode_lookup_peers: leading chunks `peer` holds (0: none holds more) */
} kvnode_prefix_info_t;

/* How much of `tokens` this node holds and, when not all, the peer the controller names for the
 * most (its leading tokens): a scheduler's question, nothing is moved. A node without a
 * controller, or a lookup that fails, answers its own tokens only. One call at a time per
 * client. */
kvnode_status_t kvnode_lookup_peers(kvnode_client_t* client, const int64_t* tokens,
                                    size_t num_tokens, kvnode_prefix_info_t* prefix,
                                    kvnode_error_t* err);
/* Pulls the leading chunks this node lacks from the peer that holds them (P2P), then answers
 * what this node holds; no engine memory is touched (kvnode_kv_load with retrieve does both).
 * KVNODE_ERR_REFUSED on a node without a transfer plane or controller. One call at a time per
 * client. */
kvnode_status_t kvnode_retrieve(kvnode_client_t* client, const int64_t* tokens, size_t num_tokens,
                                kvnode_prefix_info_t* prefix, kvnode_error_t* err);
/* The same two questions by chunk hash: `tokens` and `peer_tokens` answer 0, `chunks` and
 * `peer_chunks` count. One call at a time per client. */
kvnode_status_t kvnode_lookup_peers_chunks(kvnode_client_t* client, const int64_t* hashes,
                                           size_t num_hashes, kvnode_prefix_info_t* prefix,
                                           kvnode_error_t* err);
kvnode_status_t kvnode_retrieve_chunks(kvnode_client_t* client, const int64_t* hashes,
                                       size_t num_hashes, kvnode_prefix_info_t* prefix,
                                       kvnode_error_t* err);

/* ---- host memory the node can map (CPU engines, tests) ---------------------------------------- */

typedef struct kvnode_host_memory kvnode_host_memory_t;
/* `bytes` of zeroed memory (a sealed memfd); `name` may be NULL. Thread-safe. */
kvnode_status_t kvnode_host_memory_create(size_t bytes, const char* name,
                                          kvnode_host_memory_t** memory, kvnode_error_t* err);
/* Its mapping, size and memfd (owned by the handle); NULL gives NULL, 0 and -1. Thread-safe. */
void* kvnode_host_memory_data(const kvnode_host_memory_t* memory);
size_t kvnode_host_memory_size(const kvnode_host_memory_t* memory);
int kvnode_host_memory_fd(const kvnode_host_memory_t* memory);
/* Unmaps and closes it; accepts NULL. Thread-safe, but not at the same time as another call on
 * the same handle, and not while a registration still uses it. */
void kvnode_host_memory_free(kvnode_host_memory_t* memory);

/* ---- an engine's paged KV cache --------------------------------------------------------------- */

typedef enum kvnode_memory_kind {
  KVNODE_MEMORY_HOST_FD = 0,  /* host memory behind `fd` (kvnode_host_memory_fd) */
  KVNODE_MEMORY_CUDA_IPC = 1, /* device memory: `ipc_handle` = cudaIpcGetMemHandle(base) */
  KVNODE_MEMORY_CUDA_VMM = 2,  /* device memory: `fd` from cuMemExportToShareableHandle */
  /* Host memory of this process the node cannot map (anonymous memory): the node copies with
   * process_vm_readv/writev (cross-memory attach), so it must be allowed to ptrace this process
   * (the same user, Yama's ptrace_scope 0 or PR_SET_PTRACER); `fd` unused. */
  KVNODE_MEMORY_HOST_PROCESS = 3
} kvnode_memory_kind_t;

/* An array element: ends in reserved words that must be zero (see the conventions above). */
typedef struct kvnode_kv_allocation {
  kvnode_memory_kind_t kind;
  void* base;    /* the allocation's base in this process */
  size_t bytes;  /* its size */
  int fd;        /* HOST_FD, CUDA_VMM: the node gets a copy; the caller keeps this one */
  uint8_t ipc_handle[64]; /* CUDA_IPC */
  uint64_t reserved[4];   /* zero */
} kvnode_kv_allocation_t;

typedef enum kvnode_kv_preset {
  KVNODE_KV_VLLM = 0,       /* per layer [2, num_blocks, block_size, kv_heads, head_size] */
  KVNODE_KV_FLASHINFER = 1, /* per layer [num_blocks, 2, block_size, kv_heads, head_size] */
  KVNODE_KV_MLA = 2,        /* per layer [num_blocks, block_size, head_size] */
  KVNODE_KV_SGLANG = 3,     /* per layer K and V buffers, [num_blocks * block_size, kv_heads, head_size] */
  /* Any byte strides (params->strides, required): per layer K at the buffer's offset and V
   * strides.v_offset bytes further, rows of head_size elements contiguous. vLLM >= 0.33: each
   * layer a view [num_blocks, kv_heads, block_size, 2 * head_size] of one allocation in any
   * KVCacheLayout (v_offset = head_size * elem_bytes). */
  KVNODE_KV_STRIDED = 4,
  /* MLA by byte strides (params->strides; v_offset unused): vLLM >= 0.33's
   * [num_blocks, 1, block_size, head_size] views. */
  KVNODE_KV_MLA_STRIDED = 5
} kvnode_kv_preset_t;

/* Byte strides shared by every layer of a STRIDED preset. */
typedef struct kvnode_kv_strides {
  size_t block_stride; /* between blocks */
  size_t token_stride; /* between tokens of one block */
  size_t head_stride;  /* between KV heads of one token (unused with one head) */
  size_t v_offset;     /* from a layer's K to its V (KVNODE_KV_STRIDED) */
} kvnode_kv_strides_t;

/* Where one layer's tensor lies (SGLANG: one K and one V per layer, K first). An array element:
 * ends in reserved words that must be zero (see the conventions above). */
typedef struct kvnode_kv_buffer {
  void* base;   /* the allocation's base (one of the registered allocations) */
  size_t bytes; /* the allocation's size */
  size_t offset; /* the tensor's first byte from base */
  uint64_t reserved[4]; /* zero */
} kvnode_kv_buffer_t;

enum {
  KVNODE_KV_REGISTER_FIELD_STRIDES = 1u << 0, /* strides: set with a STRIDED preset, only then */
};
typedef struct kvnode_kv_register_params {
  uint64_t field_mask;             /* KVNODE_KV_REGISTER_FIELD_* */
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
  kvnode_kv_strides_t strides;     /* KVNODE_KV_REGISTER_FIELD_STRIDES */
} kvnode_kv_register_params_t;

typedef struct kvnode_kv_cache kvnode_kv_cache_t;

/* Registers the cache with the node (the node maps it once; the allocations must outlive the
 * registration). Fails naming the field when the layout leaves an allocation or a chunk of it
 * does not match the node's page size. Closing the client ends its registrations: its caches then
 * answer KVNODE_ERR_NOT_FOUND, and must still be closed. One call at a time per client. */
kvnode_status_t kvnode_kv_register(kvnode_client_t* client,
                                   const kvnode_kv_register_params_t* params,
                                   kvnode_kv_cache_t** cache, kvnode_error_t* err);
/* Unregisters (the node unmaps it) through the cache's client; accepts NULL. One call at a time
 * per client, as the cache's other calls; once its client is closed it sends nothing and is
 * thread-safe. */
void kvnode_kv_close(kvnode_kv_cache_t* cache);

enum {
  KVNODE_KV_XFER_FIELD_RETRIEVE = 1u << 0,   /* retrieve (load only: a store refuses it) */
  KVNODE_KV_XFER_FIELD_WAIT_EVENT = 1u << 1, /* wait_event */
  KVNODE_KV_XFER_FIELD_DONE_EVENT = 1u << 2, /* done_event */
  KVNODE_KV_XFER_FIELD_HASHES = 1u << 3,     /* hashes: the chunks by hash, not by tokens */
};
typedef struct kvnode_kv_transfer_params {
  uint64_t field_mask;
  /* Required without KVNODE_KV_XFER_FIELD_HASHES: the sequence's token ids (hashed by the node).
   * With it, tokens is NULL and num_tokens the tokens `hashes` cover (0: every chunk whole). */
  const int64_t* tokens;
  size_t num_tokens;
  const uint32_t* block_ids; /* required: one per block_size tokens, in order */
  size_t num_block_ids;
  int retrieve;              /* load: pull what this node lacks from a peer first */
  uint8_t wait_event[64];    /* cudaIpcEventHandle_t the node's copies wait for */
  uint8_t done_event[64];    /* cudaIpcEventHandle_t the node records once they landed */
  const int64_t* hashes;     /* KVNODE_KV_XFER_FIELD_HASHES: one per chunk, in order */
  size_t num_hashes;
} kvnode_kv_transfer_params_t;

enum {
  KVNODE_KV_RESULT_FIELD_CHUNKS = 1u << 0,
  KVNODE_KV_RESULT_FIELD_TOKENS = 1u << 1,
  KVNODE_KV_RESULT_FIELD_PULLED = 1u << 2,
};
#define KVNODE_KV_RESULT_FIELDS_ALL                                            \
  ((uint64_t)(KVNODE_KV_RESULT_FIELD_CHUNKS | KVNODE_KV_RESULT_FIELD_TOKENS | \
              KVNODE_KV_RESULT_FIELD_PULLED))
/* A store's or load's answer: the fields result->field_mask asks for are written (0 when the
 * call fails), no other byte. */
typedef struct kvnode_kv_result {
  uint64_t field_mask; /* set by the caller: KVNODE_KV_RESULT_FIELD_* of the fields to fill */
  uint64_t chunks;     /* leading chunks stored or loaded */
  uint64_t tokens;     /* the tokens they cover (a last partial chunk's too: save_unfull_chunk) */
  uint64_t pulled;     /* load with retrieve: of them, pulled from a peer */
} kvnode_kv_result_t;

/* Gathers each chunk's blocks into the node's pool (committed once copied); the longest prefix
 * that fits. `result` may be NULL. One call at a time per client (the cache's). */
kvnode_status_t kvnode_kv_store(kvnode_kv_cache_t* cache,
                                const kvnode_kv_transfer_params_t* params,
                                kvnode_kv_result_t* result, kvnode_error_t* err);
/* Copies the leading stored chunks into the blocks; `result` may be NULL. One call at a time per
 * client (the cache's). */
kvnode_status_t kvnode_kv_load(kvnode_kv_cache_t* cache, const kvnode_kv_transfer_params_t* params,
                               kvnode_kv_result_t* result, kvnode_error_t* err);

#ifdef __cplusplus
}
#endif

#endif /* KVNODE_CLIENT_H */
