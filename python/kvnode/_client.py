"""Client (a connection to the node on this host) and KVCache (an engine's registered KV cache).

Each wraps a C handle. The C API serves one call at a time per client, so a Client holds a lock
around every call of its own and of its caches: threads may share them (ctypes releases the GIL
during the call, so other Python threads run meanwhile). A question (lookup, lookup_chunks,
lookup_peers, ...) asked while another thread's store or load holds that lock goes over a second
connection, opened the first time it is needed, so it never waits behind the copy. Closing a Client closes its caches
first; handles left open are closed when their object is collected (weakref.finalize), caches
before their client since a cache keeps its client alive. The lock is re-entrant: the cyclic GC
may collect a KVCache, and run its finalizer, in the middle of one of its client's calls on the
same thread (between two C calls, never during one), and that finalizer takes the lock again.
The per-call structs (parameters, result, error) are built once per object and reused under the
lock: a store or load costs one ctypes call plus the argument conversion.
"""

from __future__ import annotations

import contextlib
import ctypes
import numbers
import os
import threading
import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _lib
from ._args import as_block_ids, as_tokens, positive_int
from ._errors import Error
from ._hashes import node_chunk_hashes
from ._layers import LAYOUTS, plan

__all__ = ["Client", "KVCache", "connect"]

_MAX_TIMEOUT_S = 24.0 * 60 * 60  # kvnode_connect's bound: past a day a timeout is a mistake


class _ClientState:
    """The C client handle and what its finalizer needs (never the Client itself)."""

    def __init__(self, handle: int, path: bytes = b"", timeout_s: float = 15.0) -> None:
        self.handle: Optional[int] = handle
        self.path, self.timeout_s = path, timeout_s  # to open the questions' connection
        self.side: Optional["_ClientState"] = None  # that connection, once opened
        self.side_lock = threading.Lock()
        # Re-entrant: a finalizer may close a cache while this thread holds it (module docstring).
        self.lock = threading.RLock()
        self.caches: "weakref.WeakSet[_CacheState]" = weakref.WeakSet()
        self.err = _lib.ErrorStruct()

    def close(self) -> None:
        with self.side_lock:
            side, self.side = self.side, None
        if side is not None:
            side.close()
        with self.lock:
            for cache in list(self.caches):
                cache.close_locked()
            handle, self.handle = self.handle, None  # cleared first: a re-entrant close skips it
            if handle is not None:
                _lib.library().kvnode_client_close(handle)

    def side_state(self) -> "_ClientState":
        """The questions' connection, opened on first use (kvnode.Error if the node is gone)."""
        with self.side_lock:
            if self.side is None:
                if self.handle is None:
                    raise Error("the client is closed", "invalid", _lib.ERR_INVALID)
                params = _lib.ConnectParams(field_mask=_lib.CONNECT_FIELD_TIMEOUT,
                                            socket_path=self.path, timeout_s=self.timeout_s)
                handle = ctypes.c_void_p()
                err = _lib.ErrorStruct()
                _lib.check(_lib.library().kvnode_connect(ctypes.byref(params),
                                                         ctypes.byref(handle),
                                                         ctypes.byref(err)), err, "kvnode_connect")
                self.side = _ClientState(handle.value)
            return self.side


class _CacheState:
    """The C cache handle, the memory it needs kept alive, and the reused call structs."""

    def __init__(self, client: _ClientState, handle: int, keep: List[Any]) -> None:
        self.client = client
        self.handle: Optional[int] = handle
        self.keep = keep
        self.params = _lib.KvTransferParams()
        self.result = _lib.KvResult(  # all we read
            field_mask=_lib.KV_RESULT_FIELD_TOKENS | _lib.KV_RESULT_FIELD_CHUNKS)
        self.err = _lib.ErrorStruct()
        self.p_params = ctypes.pointer(self.params)
        self.p_result = ctypes.pointer(self.result)
        self.p_err = ctypes.pointer(self.err)

    def close_locked(self) -> None:  # the client's lock is held
        handle, self.handle = self.handle, None  # cleared first: a re-entrant close skips it
        if handle is not None:
            _lib.library().kvnode_kv_close(handle)
            self.keep = []
        self.client.caches.discard(self)

    def close(self) -> None:
        with self.client.lock:
            self.close_locked()


def connect(socket_path: Union[str, "os.PathLike[str]"], timeout: float = 15.0) -> "Client":
    """Connects to the kvnode serving this host at `socket_path` (its ``--local-socket``).

    Args:
        socket_path: the node's local socket (default ``/tmp/kvnode-<instance>-<rank>.sock``):
            a str or an ``os.PathLike`` giving one (encoded with ``os.fsencode``, so a path
            that is not UTF-8 passes as the file system spells it).
        timeout: seconds each request may take, > 0 and at most a day (a load with retrieve
            crosses the network); any real number (``numpy.float32`` too).

    Raises:
        kvnode.Error: no node listens there (status ``not_found``), or the library is missing.
        TypeError, ValueError: a bad argument, named.
    """
    path = _socket_path(socket_path)
    seconds = _timeout(timeout)
    lib = _lib.library()
    params = _lib.ConnectParams(
        field_mask=_lib.CONNECT_FIELD_TIMEOUT,
        socket_path=os.fsencode(path),
        timeout_s=seconds,
    )
    handle = ctypes.c_void_p()
    err = _lib.ErrorStruct()
    _lib.check(lib.kvnode_connect(ctypes.byref(params), ctypes.byref(handle), ctypes.byref(err)),
               err, "kvnode_connect")
    return Client(_ClientState(handle.value, os.fsencode(path), seconds), path)


def _socket_path(socket_path: Any) -> str:
    """connect's socket_path as a str; TypeError or ValueError naming it."""
    if not isinstance(socket_path, (str, os.PathLike)):
        raise TypeError(f"socket_path: expected a str path, got {type(socket_path).__name__}")
    path = os.fspath(socket_path)
    if not isinstance(path, str):  # a PathLike of bytes
        raise TypeError(f"socket_path: expected a str path, {type(socket_path).__name__} gives "
                        f"{type(path).__name__}")
    if not path:
        raise ValueError("socket_path: expected a non-empty path")
    if "\0" in path:
        raise ValueError(f"socket_path: {path!r} holds a NUL character")
    return path


def _timeout(timeout: Any) -> float:
    """connect's timeout in seconds, as the C library bounds it; TypeError or ValueError."""
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout: expected seconds as a real number, got {type(timeout).__name__}")
    try:
        seconds = float(timeout)
    except OverflowError:  # an int past float's range
        seconds = float("inf")
    if not (0 < seconds <= _MAX_TIMEOUT_S):  # also refuses NaN
        raise ValueError(f"timeout: expected seconds > 0 and at most a day ({_MAX_TIMEOUT_S:g}), "
                         f"got {timeout}")
    return seconds


class Client:
    """A connection to the node on this host; made by :func:`kvnode.connect`.

    A context manager (``with kvnode.connect(path) as client:``) that closes on exit. Safe to
    share between threads (calls are serialised); a process after ``fork()`` should connect anew.
    """

    def __init__(self, state: _ClientState, socket_path: str) -> None:
        self._state = state
        self.socket_path: str = socket_path
        self._finalizer = weakref.finalize(self, state.close)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<kvnode.Client {self.socket_path!r} {state}>"

    @property
    def closed(self) -> bool:
        """True once close() ran."""
        return self._state.handle is None

    def close(self) -> None:
        """Closes the connection and every KV cache registered through it (the node unmaps
        them). Idempotent."""
        self._finalizer()

    def _handle(self, what: str) -> int:
        handle = self._state.handle
        if handle is None:
            raise Error(f"{what}: the client is closed", "invalid", _lib.ERR_INVALID)
        return handle

    @contextlib.contextmanager
    def _asking(self, what: str) -> Iterator[Tuple[_ClientState, int]]:
        """(state, handle) for a question: this client's connection when no other thread
        holds it, else the second connection (a store or load in flight never delays it)."""
        state = self._state
        if state.lock.acquire(blocking=False):
            try:
                yield state, self._handle(what)
            finally:
                state.lock.release()
            return
        self._handle(what)  # closed: say so, rather than open a second connection
        side = state.side_state()
        with side.lock:
            if side.handle is None:
                raise Error(f"{what}: the client is closed", "invalid", _lib.ERR_INVALID)
            yield side, side.handle

    @property
    def info(self) -> Dict[str, Any]:
        """The node's shape: ``chunk_bytes`` (bytes per chunk, one pool page), ``chunk_size``
        (tokens per chunk), ``save_unfull_chunk`` (True: a sequence's last partial chunk is a
        chunk of its own, stored, loaded and looked up as LMCache does by default; False: only
        whole chunks), ``pages`` (chunks the pool holds), ``memory`` ("host", "pinned" or
        "device"), ``instance``, ``worker_id``, ``location``, and the chain it hashes tokens
        with: ``hash_generation`` ("lmcache-0.5.6" or "legacy"; "" from an older node),
        ``hash_init`` and ``none_hash`` (:meth:`chunk_hashes` computes it)."""
        info = _lib.NodeInfo(field_mask=_lib.NODE_INFO_FIELDS_ALL)
        state = self._state
        with state.lock:
            handle = self._handle("Client.info")
            code = _lib.library().kvnode_client_info(handle, ctypes.byref(info),
                                                     ctypes.byref(state.err))
            _lib.check(code, state.err, "kvnode_client_info")
        return {
            "chunk_bytes": info.chunk_bytes,
            "chunk_size": info.chunk_size,
            "save_unfull_chunk": bool(info.save_unfull_chunk),
            "pages": info.pages,
            "memory": info.memory.decode("utf-8", "replace"),
            "instance": info.instance.decode("utf-8", "replace"),
            "worker_id": info.worker_id,
            "location": info.location.decode("utf-8", "replace"),
            "hash_generation": info.hash_generation.decode("utf-8", "replace"),
            "hash_init": int(info.hash_init) if info.hash_init else 0,
            "none_hash": info.none_hash,
        }

    def chunk_hashes(self, tokens: Sequence[int]) -> List[int]:
        """The hashes this node keys `tokens`' chunks by, computed here (LMCache's chain with the
        node's settings, see :mod:`kvnode._hashes`): ask :meth:`lookup_chunks` or
        :meth:`lookup_peers_chunks` with them instead of sending every token. ValueError from a
        node too old to say how it hashes."""
        return node_chunk_hashes(tokens, self.info)

    def lookup(self, tokens: Sequence[int]) -> int:
        """Leading tokens of `tokens` whose chunks this node holds.

        Chunks are ``info["chunk_size"]`` tokens; when ``info["save_unfull_chunk"]`` (the node
        hashes as LMCache does by default) a last partial chunk is a chunk too, so 40 tokens
        stored in 16-token chunks are 40 held (and their first 36 only 32: another partial
        chunk, another hash); without it only whole chunks count (32).
        """
        return self._leading("kvnode_lookup", tokens, "tokens")

    def lookup_chunks(self, hashes: Sequence[int]) -> int:
        """Leading chunks of `hashes` (64-bit chunk hashes, one per chunk) this node holds."""
        return self._leading("kvnode_lookup_chunks", hashes, "hashes")

    def _leading(self, fn: str, keys: Sequence[int], arg: str) -> int:
        """kvnode_lookup or kvnode_lookup_chunks: how many of `keys` (tokens or hashes, named
        `arg` in errors) lead what this node holds."""
        keep, ptr, n = as_tokens(keys, arg)
        held = ctypes.c_size_t()
        with self._asking(fn[len("kvnode_"):]) as (state, handle):
            code = getattr(_lib.library(), fn)(handle, ptr, n, ctypes.byref(held),
                                               ctypes.byref(state.err))
            _lib.check(code, state.err, fn)
        del keep
        return held.value

    def _prefix(self, keys: Sequence[int], pull: bool, by_hash: bool = False) -> Dict[str, Any]:
        keep, ptr, n = as_tokens(keys, "hashes" if by_hash else "tokens")
        out = _lib.PrefixInfo(field_mask=_lib.PREFIX_FIELDS_ALL)
        name = "kvnode_retrieve" if pull else "kvnode_lookup_peers"
        if by_hash:
            name += "_chunks"
        with self._asking(name[len("kvnode_"):]) as (state, handle):
            code = getattr(_lib.library(), name)(handle, ptr, n, ctypes.byref(out),
                                                 ctypes.byref(state.err))
            _lib.check(code, state.err, name)
        del keep
        return {
            "tokens": out.tokens,
            "chunks": out.chunks,
            "pulled": out.pulled,
            "peer_tokens": out.peer_tokens,
            "peer_chunks": out.peer_chunks,
            "peer": out.peer.decode("utf-8", "replace"),
        }

    def lookup_peers(self, tokens: Sequence[int]) -> Dict[str, Any]:
        """How much of `tokens` this node and its peers hold; nothing moves.

        Returns ``{"tokens": leading tokens held here, "chunks": their chunks, "peer": the
        transfer URL of the peer the controller names for the most ("" when none holds more),
        "peer_tokens": its leading tokens, "peer_chunks": their chunks, "pulled": 0}``. A node
        without a controller, or whose lookup fails, answers its own tokens only. A scheduler's
        question: a prefix at a peer comes here with :meth:`retrieve` (or a load with
        ``retrieve=True``).
        """
        return self._prefix(tokens, pull=False)

    def retrieve(self, tokens: Sequence[int]) -> Dict[str, Any]:
        """Pulls the leading chunks of `tokens` this node lacks from the peer holding them.

        Returns :meth:`lookup_peers`'s keys with ``tokens``/``chunks`` held here now and
        ``pulled`` the chunks pulled from ``peer``. The engine's memory is not touched.
        kvnode.Error ``refused`` on a node without a transfer plane or controller.
        """
        return self._prefix(tokens, pull=True)

    def lookup_peers_chunks(self, hashes: Sequence[int]) -> Dict[str, Any]:
        """:meth:`lookup_peers` by chunk hash: ``chunks`` held here and ``peer_chunks`` at
        ``peer`` count; ``tokens`` and ``peer_tokens`` are 0."""
        return self._prefix(hashes, pull=False, by_hash=True)

    def retrieve_chunks(self, hashes: Sequence[int]) -> Dict[str, Any]:
        """:meth:`retrieve` by chunk hash (``chunks`` and ``pulled`` count)."""
        return self._prefix(hashes, pull=True, by_hash=True)

    def register_kv_cache(self, layers: Sequence[Any], block_size: int,
                          layout: str = "vllm",
                          process_memory: Optional[Tuple[int, int]] = None) -> "KVCache":
        """Registers an engine's paged KV cache with the node, which maps it once.

        Args:
            layers: one contiguous array per model layer, all of one shape and dtype: numpy
                arrays from :func:`kvnode.host_array` (or views of one), or CUDA tensors (torch,
                cupy, anything with ``__cuda_array_interface__`` or DLPack) in cudaMalloc memory.
                For ``layout="sglang"``, one ``(k, v)`` pair per layer.
            block_size: tokens per block (the engine's page size).
            layout: ``"vllm"`` (``[2, num_blocks, block_size, num_kv_heads, head_size]``),
                ``"flashinfer"`` (``[num_blocks, 2, block_size, num_kv_heads, head_size]``),
                ``"mla"`` (``[num_blocks, block_size, head_size]``), ``"sglang"``, or
                ``"packed"`` / ``"packed_mla"`` (vLLM >= 0.33: ``[num_blocks, num_kv_heads,
                block_size, 2 * head_size]`` / ``[num_blocks, 1, block_size, head_size]`` views
                with any strides, registered by their strides; K then V in the last axis), or
                ``"packed_cpu"`` (the same views as vLLM's CPU backend reads them: each
                (block, head) page holds block_size K rows, then block_size V rows).

            process_memory: ``(base, nbytes)``, host memory of this process the layers lie in that
                the node cannot map (not from kvnode.host_array: SGLang's host pools): the node
                then copies with process_vm_readv/writev, and must be allowed to (the same
                user, Yama's ptrace_scope 0); it refuses the registration otherwise
                (``kvnode.Error`` ``refused``).

        The node's chunk (``info["chunk_size"]`` tokens of every layer, K and V) must be exactly
        its page (``info["chunk_bytes"]``); the node says so by name otherwise. The arrays must
        outlive the registration (the KVCache keeps references to them).

        Raises:
            TypeError, ValueError: naming ``layers[i]``, ``block_size`` or ``layout``.
            kvnode.Error: the node refused the registration (its message names the field).
        """
        if not isinstance(layout, str):
            raise TypeError(f"layout: expected a str, got {type(layout).__name__}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout: {layout!r} is not one of {', '.join(map(repr, LAYOUTS))}")
        block_size = positive_int(block_size, "block_size")
        if block_size > 0xFFFFFFFF:
            raise ValueError(f"block_size: {block_size} is too large")
        self._handle("register_kv_cache")
        reg = plan(layers, block_size, layout, process_memory)
        buffers = (_lib.KvBuffer * len(reg.buffers))(
            *(_lib.KvBuffer(base, size, offset) for base, size, offset in reg.buffers)
        )
        allocations = (_lib.KvAllocation * len(reg.allocations))(*reg.allocations)
        params = _lib.KvRegisterParams(
            field_mask=_lib.KV_REGISTER_FIELD_STRIDES if reg.strides else 0,
            preset=reg.preset,
            num_blocks=reg.num_blocks,
            block_size=reg.block_size,
            kv_heads=reg.kv_heads,
            head_size=reg.head_size,
            elem_bytes=reg.elem_bytes,
            layers=buffers,
            num_layers=len(layers),
            allocations=allocations,
            num_allocations=len(reg.allocations),
        )
        if reg.strides:
            params.strides = _lib.KvStrides(*reg.strides)
        handle = ctypes.c_void_p()
        state = self._state
        with state.lock:
            client_handle = self._handle("register_kv_cache")
            code = _lib.library().kvnode_kv_register(client_handle, ctypes.byref(params),
                                                     ctypes.byref(handle), ctypes.byref(state.err))
            _lib.check(code, state.err, "kvnode_kv_register")
            cache_state = _CacheState(state, handle.value, [list(layers), reg.keep])
            state.caches.add(cache_state)
        return KVCache(self, cache_state, reg.num_blocks, block_size, layout, len(layers),
                       reg.dtype, reg.device)


class KVCache:
    """An engine's KV cache registered with the node: store and load by block table.

    Made by :meth:`Client.register_kv_cache`. A context manager that unregisters on exit.
    ``tokens`` are the sequence's token ids (a list of ints or a 1-D integer array; an int64
    numpy array passes without a copy); ``block_ids`` are its block table, one block id per
    ``block_size`` tokens in order (more are ignored). Chunks are ``info["chunk_size"]`` tokens,
    and a last partial chunk is one too when ``info["save_unfull_chunk"]`` (LMCache's default).

    With CUDA tensors, the node's copies do not wait for work queued on the engine's streams:
    synchronise (``torch.cuda.current_stream().synchronize()``) before a store, and before
    reusing blocks a load writes; a store or load returns once its copies landed.
    """

    def __init__(self, client: Client, state: _CacheState, num_blocks: int, block_size: int,
                 layout: str, num_layers: int, dtype: str, device: str) -> None:
        self.client: Client = client  # kept alive by the cache
        self.num_blocks: int = num_blocks
        self.block_size: int = block_size
        self.layout: str = layout
        self.num_layers: int = num_layers
        self.dtype: str = dtype
        self.device: str = device  # "host" or "cuda"
        self._state = state
        self._finalizer = weakref.finalize(self, state.close)

    def __enter__(self) -> "KVCache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return (f"<kvnode.KVCache {self.layout} {self.num_layers} layers x {self.num_blocks} "
                f"blocks of {self.block_size} ({self.dtype}, {self.device}) {state}>")

    @property
    def closed(self) -> bool:
        """True once close() ran (or the client was closed)."""
        return self._state.handle is None

    def close(self) -> None:
        """Unregisters the cache (the node unmaps it). Idempotent."""
        self._finalizer()

    def _transfer(self, store: bool, tokens: Any, block_ids: Any, retrieve: bool,
                  hashes: bool = False) -> int:
        """A store or load by tokens, or (hashes) by chunk hashes in `tokens`, answering chunks."""
        what = "KVCache.store" if store else "KVCache.load"
        if hashes:
            what += "_chunks"
        tok_keep, tok_ptr, ntok = as_tokens(tokens, "hashes" if hashes else "tokens")
        blk_keep, blk_ptr, nblk = as_block_ids(block_ids)
        need = -(-ntok // self.block_size) if not hashes else min(ntok, 1)
        if nblk < need:
            raise ValueError(
                f"block_ids: {nblk} block ids for {ntok} tokens; block_size {self.block_size} "
                f"needs {need}"
            )
        s = self._state
        with s.client.lock:
            handle = s.handle
            if handle is None or s.client.handle is None:
                raise Error(f"{what}: the KV cache is closed", "invalid", _lib.ERR_INVALID)
            if ntok == 0:
                return 0
            p = s.params
            p.field_mask = _lib.KV_XFER_FIELD_RETRIEVE if retrieve else 0
            if hashes:
                p.field_mask |= _lib.KV_XFER_FIELD_HASHES
                p.tokens, p.num_tokens = None, 0
                p.hashes, p.num_hashes = tok_ptr, ntok
            else:
                p.tokens, p.num_tokens = tok_ptr, ntok
                p.hashes, p.num_hashes = None, 0
            p.block_ids = blk_ptr
            p.num_block_ids = nblk
            p.retrieve = 1 if retrieve else 0
            lib = _lib.library()
            fn = lib.kvnode_kv_store if store else lib.kvnode_kv_load
            code = fn(handle, s.p_params, s.p_result, s.p_err)
            if code != _lib.OK:
                _lib.check(code, s.err, what)
            done = s.result.chunks if hashes else s.result.tokens
        del tok_keep, blk_keep
        return done

    def store(self, tokens: Sequence[int], block_ids: Sequence[int]) -> int:
        """Copies the sequence's KV from its blocks into the node's pool, chunk by chunk.

        Returns the tokens stored: those of the leading chunks that fit (a stored chunk is
        committed once copied; chunks the node already holds count as stored). With
        ``client.info["save_unfull_chunk"]`` (LMCache's default) a last partial chunk is stored
        too: 40 tokens in 16-token chunks answer 40 when all fit; without it, 32.

        Raises:
            TypeError, ValueError: bad ``tokens`` or ``block_ids`` (too few for the tokens).
            kvnode.Error: the node's refusal (``frozen`` during a full sync: ask again).
        """
        return self._transfer(True, tokens, block_ids, False)

    def load(self, tokens: Sequence[int], block_ids: Sequence[int], retrieve: bool = False) -> int:
        """Copies the sequence's stored leading chunks from the node into these blocks.

        Args:
            retrieve: first pull the chunks this node lacks from a peer node (P2P).

        Returns the tokens loaded: the leading tokens now in the blocks (those of the leading
        chunks the node holds, a last partial one included as for :meth:`store`).
        """
        return self._transfer(False, tokens, block_ids, bool(retrieve))

    def store_chunks(self, hashes: Sequence[int], block_ids: Sequence[int]) -> int:
        """:meth:`store` by chunk hash: chunk i is ``hashes[i]``, its KV in the blocks
        ``block_ids[i * per : (i + 1) * per]`` (``per`` = the node's chunk_size / block_size).
        Returns the leading chunks stored."""
        return self._transfer(True, hashes, block_ids, False, hashes=True)

    def load_chunks(self, hashes: Sequence[int], block_ids: Sequence[int],
                    retrieve: bool = False) -> int:
        """:meth:`load` by chunk hash; returns the leading chunks loaded."""
        return self._transfer(False, hashes, block_ids, bool(retrieve), hashes=True)

    def lookup(self, tokens: Sequence[int]) -> int:
        """Leading tokens of `tokens` whose chunks this node holds (as Client.lookup)."""
        if self.closed:
            raise Error("KVCache.lookup: the KV cache is closed", "invalid", _lib.ERR_INVALID)
        return self.client.lookup(tokens)
