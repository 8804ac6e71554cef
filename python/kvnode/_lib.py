"""ctypes bindings of libkvnode_client.so (client/include/kvnode/kvnode_client.h).

The structs mirror the header field for field (the header is the ABI: change both together);
every function gets argtypes and restype. The library is found lazily, at the first call that
needs it, so ``import kvnode`` works without it:

1. ``$KVNODE_CLIENT_LIB`` (a path to the library, or to the folder holding it; when set, the
   only place tried: an explicit override, e.g. the tests' sanitizer build);
2. the library the package ships, ``kvnode/_native/libkvnode_client.so`` (``pip install ./python``
   compiles it into the wheel; an editable install's is in site-packages, on the package's path);
3. ``ctypes.util.find_library("kvnode_client")`` (an installed library: ldconfig, LD_LIBRARY_PATH);
4. the build tree next to this source tree (``build/client/``, ``build/lib/``, ``build/``), for
   ``PYTHONPATH=python``.

When none loads, :func:`library` raises :class:`kvnode.Error` listing every place it looked.
Buffers (tokens, block ids, data pointers) are passed as ``c_void_p`` so a numpy array's or an
``array.array``'s address goes through without a conversion.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from ctypes import (
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_double,
    c_int,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import List, Optional

from ._errors import Error

__all__ = [
    "API_VERSION",
    "ConnectParams",
    "ErrorStruct",
    "KvAllocation",
    "KvBuffer",
    "KvRegisterParams",
    "KvStrides",
    "PrefixInfo",
    "KvResult",
    "KvTransferParams",
    "NodeInfo",
    "check",
    "library",
    "status_name",
]

API_VERSION = 1  # KVNODE_CLIENT_API_VERSION this binding was written against

# kvnode_status_t
OK = 0
STATUS_NAMES = {
    0: "ok",
    -1: "invalid",
    -2: "not_found",
    -3: "no_room",
    -4: "frozen",
    -5: "deadline",
    -6: "peer_lost",
    -7: "refused",
    -8: "io",
    -9: "internal",
}
ERR_INVALID = -1
ERR_NOT_FOUND = -2

ERROR_MESSAGE_BYTES = 1024  # KVNODE_ERROR_MESSAGE_BYTES
NAME_BYTES = 256  # KVNODE_NAME_BYTES
CUDA_IPC_HANDLE_BYTES = 64

# field_mask bits
CONNECT_FIELD_TIMEOUT = 1 << 0
CONNECT_FIELD_SHARED_MEMORY = 1 << 1
KV_XFER_FIELD_RETRIEVE = 1 << 0
KV_XFER_FIELD_WAIT_EVENT = 1 << 1
KV_XFER_FIELD_DONE_EVENT = 1 << 2
KV_XFER_FIELD_HASHES = 1 << 3
NODE_INFO_FIELD_CHUNK_BYTES = 1 << 0
NODE_INFO_FIELD_CHUNK_SIZE = 1 << 1
NODE_INFO_FIELD_PAGES = 1 << 2
NODE_INFO_FIELD_WORKER_ID = 1 << 3
NODE_INFO_FIELD_MEMORY = 1 << 4
NODE_INFO_FIELD_INSTANCE = 1 << 5
NODE_INFO_FIELD_LOCATION = 1 << 6
NODE_INFO_FIELD_SAVE_UNFULL_CHUNK = 1 << 7
NODE_INFO_FIELDS_ALL = (1 << 9) - 1  # KVNODE_NODE_INFO_FIELDS_ALL
KV_RESULT_FIELD_CHUNKS = 1 << 0
KV_RESULT_FIELD_TOKENS = 1 << 1
KV_RESULT_FIELD_PULLED = 1 << 2
KV_RESULT_FIELDS_ALL = (1 << 3) - 1  # KVNODE_KV_RESULT_FIELDS_ALL
RESERVED_WORDS = 4  # the reserved words ending kvnode_kv_buffer_t and kvnode_kv_allocation_t

# kvnode_memory_kind_t
MEMORY_HOST_FD = 0
MEMORY_CUDA_IPC = 1
MEMORY_CUDA_VMM = 2
MEMORY_HOST_PROCESS = 3  # this process's own memory: the node uses process_vm_readv/writev

# kvnode_kv_preset_t
KV_VLLM = 0
KV_FLASHINFER = 1
KV_MLA = 2
KV_SGLANG = 3
KV_STRIDED = 4
KV_MLA_STRIDED = 5
KV_REGISTER_FIELD_STRIDES = 1 << 0
PREFIX_FIELDS_ALL = (1 << 6) - 1  # KVNODE_PREFIX_FIELDS_ALL


class ErrorStruct(Structure):
    """kvnode_error_t"""

    _fields_ = [("status", c_int), ("message", c_char * ERROR_MESSAGE_BYTES)]


class ConnectParams(Structure):
    """kvnode_connect_params_t"""

    _fields_ = [
        ("field_mask", c_uint64),
        ("socket_path", c_char_p),
        ("timeout_s", c_double),
        ("use_shared_memory", c_int),
    ]


class NodeInfo(Structure):
    """kvnode_node_info_t"""

    _fields_ = [
        ("field_mask", c_uint64),  # the fields to fill (NODE_INFO_FIELD_*)
        ("chunk_bytes", c_uint64),
        ("chunk_size", c_uint64),
        ("pages", c_uint64),
        ("worker_id", c_int64),
        ("memory", c_char * 16),
        ("instance", c_char * NAME_BYTES),
        ("location", c_char * NAME_BYTES),
        ("save_unfull_chunk", c_int),
        ("hash_generation", c_char * 16),
        ("hash_init", c_char * 24),
        ("none_hash", c_uint64),
    ]


class KvAllocation(Structure):
    """kvnode_kv_allocation_t"""

    _fields_ = [
        ("kind", c_int),
        ("base", c_void_p),
        ("bytes", c_size_t),
        ("fd", c_int),
        ("ipc_handle", c_uint8 * CUDA_IPC_HANDLE_BYTES),
        ("reserved", c_uint64 * RESERVED_WORDS),  # zero
    ]


class KvBuffer(Structure):
    """kvnode_kv_buffer_t"""

    _fields_ = [
        ("base", c_void_p),
        ("bytes", c_size_t),
        ("offset", c_size_t),
        ("reserved", c_uint64 * RESERVED_WORDS),  # zero
    ]


class KvStrides(Structure):
    """kvnode_kv_strides_t"""

    _fields_ = [
        ("block_stride", c_size_t),
        ("token_stride", c_size_t),
        ("head_stride", c_size_t),
        ("v_offset", c_size_t),
    ]


class KvRegisterParams(Structure):
    """kvnode_kv_register_params_t"""

    _fields_ = [
        ("field_mask", c_uint64),
        ("preset", c_int),
        ("num_blocks", c_uint32),
        ("block_size", c_uint32),
        ("kv_heads", c_uint32),
        ("head_size", c_uint32),
        ("elem_bytes", c_uint32),
        ("layers", POINTER(KvBuffer)),
        ("num_layers", c_size_t),
        ("allocations", POINTER(KvAllocation)),
        ("num_allocations", c_size_t),
        ("strides", KvStrides),  # KV_REGISTER_FIELD_STRIDES
    ]


class PrefixInfo(Structure):
    """kvnode_prefix_info_t"""

    _fields_ = [
        ("field_mask", c_uint64),  # the fields to fill (PREFIX_FIELDS_ALL)
        ("tokens", c_uint64),
        ("chunks", c_uint64),
        ("pulled", c_uint64),
        ("peer_tokens", c_uint64),
        ("peer", c_char * NAME_BYTES),
        ("peer_chunks", c_uint64),
    ]


class KvTransferParams(Structure):
    """kvnode_kv_transfer_params_t"""

    _fields_ = [
        ("field_mask", c_uint64),
        ("tokens", c_void_p),  # const int64_t*
        ("num_tokens", c_size_t),
        ("block_ids", c_void_p),  # const uint32_t*
        ("num_block_ids", c_size_t),
        ("retrieve", c_int),
        ("wait_event", c_uint8 * CUDA_IPC_HANDLE_BYTES),
        ("done_event", c_uint8 * CUDA_IPC_HANDLE_BYTES),
        ("hashes", c_void_p),  # const int64_t*, KV_XFER_FIELD_HASHES
        ("num_hashes", c_size_t),
    ]


class KvResult(Structure):
    """kvnode_kv_result_t"""

    _fields_ = [
        ("field_mask", c_uint64),  # the fields to fill (KV_RESULT_FIELD_*)
        ("chunks", c_uint64),
        ("tokens", c_uint64),
        ("pulled", c_uint64),
    ]


_PROTOTYPES = {
    # name: (restype, argtypes)
    "kvnode_status_string": (c_char_p, [c_int]),
    "kvnode_connect": (
        c_int,
        [POINTER(ConnectParams), POINTER(c_void_p), POINTER(ErrorStruct)],
    ),
    "kvnode_client_close": (None, [c_void_p]),
    "kvnode_client_info": (c_int, [c_void_p, POINTER(NodeInfo), POINTER(ErrorStruct)]),
    "kvnode_lookup": (
        c_int,
        [c_void_p, c_void_p, c_size_t, POINTER(c_size_t), POINTER(ErrorStruct)],
    ),
    "kvnode_lookup_peers": (
        c_int,
        [c_void_p, c_void_p, c_size_t, POINTER(PrefixInfo), POINTER(ErrorStruct)],
    ),
    "kvnode_retrieve": (
        c_int,
        [c_void_p, c_void_p, c_size_t, POINTER(PrefixInfo), POINTER(ErrorStruct)],
    ),
    "kvnode_lookup_chunks": (
        c_int,
        [c_void_p, c_void_p, c_size_t, POINTER(c_size_t), POINTER(ErrorStruct)],
    ),
    "kvnode_lookup_peers_chunks": (
        c_int,
        [c_void_p, c_void_p, c_size_t, POINTER(PrefixInfo), POINTER(ErrorStruct)],
    ),
    "kvnode_retrieve_chunks": (
        c_int,
        [c_void_p, c_void_p, c_size_t, POINTER(PrefixInfo), POINTER(ErrorStruct)],
    ),
    "kvnode_host_memory_create": (
        c_int,
        [c_size_t, c_char_p, POINTER(c_void_p), POINTER(ErrorStruct)],
    ),
    "kvnode_host_memory_data": (c_void_p, [c_void_p]),
    "kvnode_host_memory_size": (c_size_t, [c_void_p]),
    "kvnode_host_memory_fd": (c_int, [c_void_p]),
    "kvnode_host_memory_free": (None, [c_void_p]),
    "kvnode_kv_register": (
        c_int,
        [c_void_p, POINTER(KvRegisterParams), POINTER(c_void_p), POINTER(ErrorStruct)],
    ),
    "kvnode_kv_close": (None, [c_void_p]),
    "kvnode_kv_store": (
        c_int,
        [c_void_p, POINTER(KvTransferParams), POINTER(KvResult), POINTER(ErrorStruct)],
    ),
    "kvnode_kv_load": (
        c_int,
        [c_void_p, POINTER(KvTransferParams), POINTER(KvResult), POINTER(ErrorStruct)],
    ),
}

_LIB_NAME = "libkvnode_client.so"
_FIND_LIBRARY = 'ctypes.util.find_library("kvnode_client")'  # looked up only when reached
_lock = threading.Lock()
_loaded: Optional[ctypes.CDLL] = None


def _candidates(env: Optional[str]) -> List[str]:
    """Where to look, in order (see the module's docstring)."""
    if env:
        return [os.path.join(env, _LIB_NAME) if os.path.isdir(env) else env]
    here = os.path.dirname(os.path.abspath(__file__))
    # The package's folders: an editable install's span the source and site-packages, where
    # the library is.
    folders = list(getattr(sys.modules.get(__package__ or ""), "__path__", None) or [here])
    root = os.path.dirname(os.path.dirname(here))
    bundled = [os.path.join(folder, "_native", _LIB_NAME) for folder in folders]
    builds = [os.path.join(root, sub, _LIB_NAME) for sub in ("build/client", "build/lib", "build")]
    return bundled + [_FIND_LIBRARY] + builds


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)  # AttributeError: an older or foreign library
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def library() -> ctypes.CDLL:
    """libkvnode_client, loaded and bound once; kvnode.Error saying where it looked if not.

    A ``$KVNODE_CLIENT_LIB`` that does not load is an error of its own: the other places are
    not tried, so a wrong setting never goes unnoticed behind another library.
    """
    global _loaded
    if _loaded is not None:
        return _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        tried: List[str] = []
        env = os.environ.get("KVNODE_CLIENT_LIB")
        if not env:
            tried.append("$KVNODE_CLIENT_LIB (not set)")
        for place in _candidates(env):
            if place is _FIND_LIBRARY:  # runs ldconfig (or a compiler): not when one loaded
                found = ctypes.util.find_library("kvnode_client")
                if not found:
                    tried.append(f"{place} (not found)")
                    continue
                place = found
            if os.sep in place and not os.path.exists(place):
                tried.append(f"{place} (no such file)")
            else:
                try:
                    _loaded = _bind(ctypes.CDLL(place))
                    return _loaded
                except (OSError, AttributeError) as e:
                    tried.append(f"{place} ({e})")
            if env:
                break
        raise Error(
            f"{_LIB_NAME} could not be loaded; looked at: " + "; ".join(tried)
            + ". Install the package with `pip install ./python` (it compiles and ships the "
            "library), or set KVNODE_CLIENT_LIB to its path (build it with "
            "`cmake --build build --target kvnode_client_c`).",
            status="not_found",
            code=ERR_NOT_FOUND,
        )


def status_name(code: int) -> str:
    """The C API's name for a status ("invalid", "frozen", ...)."""
    name = STATUS_NAMES.get(code)
    if name is not None:
        return name
    text = library().kvnode_status_string(code)
    return text.decode("utf-8", "replace") if text else f"status {code}"


def check(code: int, err: ErrorStruct, what: str) -> None:
    """Raises kvnode.Error with the node's message when `code` is not KVNODE_OK."""
    if code == OK:
        return
    message = err.message.decode("utf-8", "replace") or f"{what} failed"
    raise Error(message, status=status_name(code), code=code)
