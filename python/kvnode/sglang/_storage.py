"""KvnodeHiCacheStorage: SGLang's HiCache storage backend ("L3") over the kvnode on this host.

Each page is one kvnode chunk (``page_size`` tokens of every layer), named by SGLang's page key
folded with this deployment's namespace (_keys.py), so the rest of kvnode sees ordinary chunks:
the controller's P2P lookup finds them and P2P retrieval moves them to another node (kvctl's
lookup and move take tokens, not page keys).

Data path (SGLang's ``interface_v1``: ``batch_exists``, ``batch_get_v1``, ``batch_set_v1``, and
the generic ``get``/``set``/``batch_*`` on flat pages): SGLang's host pool is anonymous memory
(or with ``"allocator": "shm"`` a memfd the node cannot seal against shrinking), which the node
does not map. So the pool is registered as this process's own memory and the node copies
straight from and into it with process_vm_readv/writev; where it may not, and for the flat
pages, a bounce buffer the node maps (_Path). Measured in docs/benchmarks.md.

SGLang calls exists, get and set from three threads at once; each has a connection of its own,
so a slow store never delays a lookup. Nothing raises into SGLang on the data path: a node that
is down, a timeout or a refusal is a miss (False, 0), logged once per outage; only a
misconfiguration raises, when the backend is created or the host pool registered.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, List, Optional

import numpy as np
import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

import kvnode

from .._link import NodeLink
from ._config import BackendConfig, config_of
from ._keys import chunk_hashes, namespace_hash
from ._pool import Bounce, Geometry, geometry_of, register_pages

__all__ = ["KvnodeHiCacheStorage"]

log = logging.getLogger("kvnode.sglang")
BATCH_PAGES = 128  # SGLang's STORAGE_BATCH_SIZE: a bounce buffer holds one batch
PART_BYTES = 16 << 20  # a batch moves in parts of about this size (two in flight)


class _Path:
    """A connection and what it registered: the get or the set path.

    Zero-copy first: the host pool itself, registered as this process's own memory
    (``process_memory``), which the node reads and writes with process_vm_readv/writev, so a
    batch is one node call and one copy. Where the node may not (another user, Yama's
    ptrace_scope), or for SGLang's generic path (flat pages), a bounce buffer the node maps: a
    batch moves in parts of `part` pages through its two halves, so the torch copy between the
    host pool and one half overlaps the node's copy of the other.
    """

    def __init__(self, link: NodeLink, geo: Geometry, pool_chunks: Any, pool_memory: Any,
                 zero_copy: bool) -> None:
        self.link = link
        self.geo = geo
        self.pool_chunks = pool_chunks
        self.pool_memory = pool_memory  # (base, nbytes) of the host pool's buffer
        self.zero_copy = zero_copy  # try the direct registration (off once refused)
        self.direct: Optional[kvnode.KVCache] = None  # the host pool, registered
        self.bounce: Optional[Bounce] = None  # made when first needed
        self.cache: Optional[kvnode.KVCache] = None  # the bounce buffer, registered
        self.client: Optional[kvnode.Client] = None
        self.lock = threading.Lock()  # one batch at a time per path
        self.part = max(1, min(BATCH_PAGES // 2, PART_BYTES // geo.page_bytes))
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="kvnode-sglang")
        link.on_connect = self._registered

    def _registered(self, client: kvnode.Client) -> None:
        self.direct = self.cache = None
        _check_geometry(client, self.geo)
        self.client = client
        if self.zero_copy:
            try:
                self.direct = register_pages(client, self.geo, self.pool_chunks, self.pool_memory)
            except kvnode.Error as e:
                if e.status not in ("refused", "invalid"):
                    raise
                self.zero_copy = False
                log.warning("kvnode.sglang: the node cannot copy straight from this process's "
                            "host pool (%s); pages go through a buffer it maps (one more copy)",
                            e)
        if self.direct is None:
            self.bounce_cache()

    def bounce_cache(self) -> Optional[kvnode.KVCache]:
        """The bounce buffer's registration, made on first use (under self.lock or at
        connect); None while the node is down."""
        if self.cache is None or self.cache.closed:
            if self.client is None or self.client.closed:
                return None
            if self.bounce is None:
                self.bounce = Bounce(self.geo, BATCH_PAGES)
            self.cache = self.bounce.register(self.client)
        return self.cache

    def pipeline(self, n: int, local: Any, node: Any, store: bool) -> int:
        """Moves n pages part by part: local(bounce, start, m, at) is the host pool's side (a
        gather before a store, a scatter after a load), node(start, m, at) the node's (answers
        the leading pages done). Stops at the first short part; answers the pages done."""
        parts = [(start, min(self.part, n - start)) for start in range(0, n, self.part)]
        at = [(k % 2) * self.part for k in range(len(parts))]
        if len(parts) == 1:  # nothing to overlap
            start, m = parts[0]
            if store:
                local(self.bounce, start, m, 0)
                return node(start, m, 0)
            got = node(start, m, 0)
            if got:
                local(self.bounce, start, got, 0)
            return got
        done = 0
        if store:
            local(self.bounce, *parts[0], at[0])
            for k, (start, m) in enumerate(parts):
                running = self.worker.submit(node, start, m, at[k])
                try:
                    if k + 1 < len(parts):  # the next part's gather meanwhile
                        local(self.bounce, *parts[k + 1], at[k + 1])
                finally:
                    got = running.result()
                done += got
                if got < m:
                    break
            return done
        running = self.worker.submit(node, *parts[0], at[0])
        for k, (start, m) in enumerate(parts):
            got = running.result()
            if got == m and k + 1 < len(parts):  # the next part's load meanwhile
                running = self.worker.submit(node, *parts[k + 1], at[k + 1])
            try:
                if got:
                    local(self.bounce, start, got, at[k])
            except BaseException:
                if got == m and k + 1 < len(parts):
                    running.result()  # never leave a load writing the bounce buffer
                raise
            done += got
            if got < m:
                break
        return done

    def close(self) -> None:
        self.link.close()
        self.direct = self.cache = self.client = None
        self.worker.shutdown(wait=True)


def _block_ids(page_ids: Any) -> np.ndarray:
    """The host pool's page numbers as the registration's block ids."""
    return page_ids.numpy().astype(np.uint32)


def _check_geometry(client: kvnode.Client, geo: Geometry) -> None:
    info = client.info
    if info["chunk_size"] != geo.page_size or info["chunk_bytes"] != geo.page_bytes:
        raise ValueError(
            f"kvnode.sglang: the node at {client.socket_path} holds chunks of "
            f"{info['chunk_size']} tokens and {info['chunk_bytes']} bytes, but this host pool's "
            f"page is {geo.page_size} tokens and {geo.page_bytes} bytes ({geo.layers} layers, "
            f"{'MLA' if geo.mla else f'{geo.heads} KV heads'}, head size {geo.head_dim}, "
            f"{geo.itemsize}-byte elements): start the node with --chunk-size {geo.page_size} "
            f"--chunk-bytes {geo.page_bytes}")


class KvnodeHiCacheStorage(HiCacheStorage):
    """SGLang's HiCache storage interface over kvnode (see the module docstring)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Any = None) -> None:
        self.storage_config = storage_config
        self.config: BackendConfig = config_of(storage_config.extra_config)
        c = storage_config
        self.node_path = self.config.node_path(c.tp_rank, c.pp_rank, getattr(c, "dp_rank", 0))
        self.what = f"tp rank {c.tp_rank}" + (f" pp rank {c.pp_rank}" if c.pp_size > 1 else "")
        # The MLA ranks hold the same pages: one writer (SGLang's is_storage_writer).
        self.writer = bool(getattr(c, "is_storage_writer", not c.is_mla_model or c.tp_rank == 0))
        self.geo: Optional[Geometry] = None
        self.namespace = 0
        self.exists_link = self._link("exists")
        self.get_path: Optional[_Path] = None
        self.set_path: Optional[_Path] = None
        self.pool_chunks: Any = None

    def _link(self, role: str) -> NodeLink:
        return NodeLink(self.node_path, self.config.timeout_s, self.config.retry_s,
                        f"{self.what} ({role})", log)

    # ---- set-up ------------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Reads the host pool's geometry and checks the node's chunk against the page (the
        pool, or the bounce buffers, are registered with the node when each path first
        connects). Raises ValueError for a pool kvnode cannot hold or a node whose chunks do
        not match the page; a node that is down is only logged (every call a miss until it is
        up)."""
        super().register_mem_pool_host(mem_pool_host)
        geo = geometry_of(mem_pool_host)
        c = self.storage_config
        shard = "mla" if geo.mla else f"tp{c.tp_rank}/{c.tp_size}"
        self.namespace = namespace_hash(
            f"{c.model_name or ''}|{'mla' if geo.mla else 'mha'}|{geo.dtype}|page {geo.page_size}"
            f"|layers {geo.layers}x{geo.heads}x{geo.head_dim}|pp{c.pp_rank}/{c.pp_size}|{shard}")
        self.geo = geo
        self.pool_chunks = geo.chunk_view(mem_pool_host.kv_buffer)
        kv = mem_pool_host.kv_buffer
        memory = (kv.data_ptr(), kv.numel() * kv.element_size())
        # page_head's runs are one head's row (head_dim elements): through process_vm_readv
        # that ran at a quarter of the bounce path's rate (docs/benchmarks.md), so it bounces.
        zero_copy = self.config.zero_copy and not (not geo.mla and geo.layout == "page_head")
        self.get_path = _Path(self._link("get"), geo, self.pool_chunks, memory, zero_copy)
        self.set_path = _Path(self._link("set"), geo, self.pool_chunks, memory, zero_copy)
        try:  # a mismatch is a configuration error: say so now, not at the first store
            client = kvnode.connect(self.node_path, timeout=self.config.timeout_s)
        except kvnode.Error as e:
            log.warning("kvnode.sglang %s: the node at %s is not reachable (%s); every lookup "
                        "misses until it is", self.what, self.node_path, e)
            return
        with client:
            _check_geometry(client, geo)
        log.info("kvnode.sglang %s: node %s, %s host pool %s, %d pages of %d tokens (%d bytes), "
                 "%s", self.what, self.node_path, "MLA" if geo.mla else "MHA", geo.layout,
                 geo.pages, geo.page_size, geo.page_bytes,
                 "zero-copy" if zero_copy else "through a bounce buffer")

    def close(self) -> None:
        """Ends the connections; the node drops the registrations."""
        for path in (self.get_path, self.set_path):
            if path is not None:
                path.close()
        self.exists_link.close()

    # ---- helpers ------------------------------------------------------------------------------

    def _hashes(self, keys: List[str]) -> np.ndarray:
        return chunk_hashes(keys, self.namespace)

    def _page_ids(self, host_indices: Any, n: int) -> Any:
        """The pool pages of n pages whose slots start host_indices (a page's first slot every
        page_size slots)."""
        page = self.geo.page_size
        starts = torch.as_tensor(host_indices[: n * page : page], dtype=torch.int64)
        return starts // page

    def _store(self, hashes: np.ndarray, fill: Any, page_ids: Any = None) -> int:
        """Stores len(hashes) pages: straight from the host pool's pages page_ids when the node
        copies from this process, else through the bounce buffer, fill(bounce, start, n, at)
        putting pages [start, start + n) into bounce pages [at, at + n). Answers the leading
        pages stored."""
        path = self.set_path
        if path is None or len(hashes) == 0:
            return 0

        def run(client: kvnode.Client) -> int:
            with path.lock:
                if page_ids is not None and path.direct is not None and not path.direct.closed:
                    done = path.direct.store_chunks(hashes, _block_ids(page_ids))
                else:
                    cache = path.bounce_cache()
                    if cache is None:
                        return 0
                    done = path.pipeline(len(hashes), fill, lambda start, n, at: cache.store_chunks(
                        hashes[start:start + n], np.arange(at, at + n, dtype=np.uint32)),
                        store=True)
            if done < len(hashes):
                path.link.fail(f"the node stored {done} of {len(hashes)} pages (full?)")
            return done

        return path.link.call(run, 0)

    def _load(self, hashes: np.ndarray, drain: Any, page_ids: Any = None) -> int:
        """Loads the leading held pages of hashes (pulling from a peer with peers on): straight
        into the host pool's pages page_ids, or through the bounce buffer, drain(bounce, start,
        n, at) taking bounce pages [at, at + n) as pages [start, start + n)."""
        path = self.get_path
        if path is None or len(hashes) == 0:
            return 0
        retrieve = self.config.peers

        def run(client: kvnode.Client) -> int:
            with path.lock:
                if page_ids is not None and path.direct is not None and not path.direct.closed:
                    return path.direct.load_chunks(hashes, _block_ids(page_ids), retrieve=retrieve)
                cache = path.bounce_cache()
                if cache is None:
                    return 0
                return path.pipeline(len(hashes), drain, lambda start, n, at: cache.load_chunks(
                    hashes[start:start + n], np.arange(at, at + n, dtype=np.uint32),
                    retrieve=retrieve), store=False)

        return path.link.call(run, 0)

    # ---- the zero-copy interface (interface_v1) -------------------------------------------------

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """Leading keys held by this node or, with peers, by the peer holding the most."""
        if self.geo is None or not keys:
            return 0
        hashes = self._hashes(keys)

        def ask(client: kvnode.Client) -> int:
            held = client.lookup_chunks(hashes)
            if held < len(hashes) and self.config.peers:
                held = max(held, client.lookup_peers_chunks(hashes)["peer_chunks"])
            return held

        return self.exists_link.call(ask, 0)

    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        if self.geo is None:
            return [False] * len(keys)
        if not self.writer:  # another rank writes these pages (MLA)
            return [True] * len(keys)
        hashes = self._hashes(keys)
        skip = self.exists_link.call(lambda c: c.lookup_chunks(hashes), 0)  # stored already
        ids = self._page_ids(host_indices, len(keys))

        def fill(bounce: Bounce, start: int, n: int, at: int) -> None:
            bounce.gather(self.pool_chunks, ids[skip + start : skip + start + n], at)

        done = skip + self._store(hashes[skip:], fill, ids[skip:])
        return [True] * done + [False] * (len(keys) - done)

    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        if self.geo is None:
            return [False] * len(keys)
        ids = self._page_ids(host_indices, len(keys))

        def drain(bounce: Bounce, start: int, n: int, at: int) -> None:
            bounce.scatter(self.pool_chunks, ids[start : start + n], at)

        done = self._load(self._hashes(keys), drain, ids)
        return [True] * done + [False] * (len(keys) - done)

    # ---- the generic interface (flat pages, as get_data_page gives them) ------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None
                  ) -> bool:
        if self.geo is None or values is None or len(values) != len(keys):
            return False
        if not self.writer:
            return True

        geo = self.geo

        def fill(bounce: Bounce, start: int, n: int, at: int) -> None:
            rest = ((2,) if not geo.mla else ()) + geo.rest
            for i in range(n):
                page = geo.chunk_order(values[start + i].reshape(rest))
                bounce.pages[at + i].copy_(page)

        try:
            return self._store(self._hashes(keys), fill) == len(keys)
        except Exception as e:  # noqa: BLE001 - a malformed page is a failed set
            log.warning("kvnode.sglang %s: batch_set failed: %s", self.what, e)
            return False

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Optional[Any]]:
        if self.geo is None or not keys:
            return [None] * len(keys)
        out: List[Optional[Any]] = [None] * len(keys)
        geo = self.geo
        page_elems = geo.page_bytes // geo.itemsize
        rest = ((2,) if not geo.mla else ()) + geo.rest

        def drain(bounce: Bounce, start: int, n: int, at: int) -> None:
            for i in range(n):
                dst = target_locations[start + i] if target_locations is not None else None
                if dst is None or dst.numel() != page_elems:
                    dst = torch.empty(page_elems, dtype=self.geo.dtype)
                geo.chunk_order(dst.view(rest)).copy_(bounce.pages[at + i])
                out[start + i] = dst

        self._load(self._hashes(keys), drain)
        return out

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Optional[Any]:
        return self.batch_get([key], [target_location])[0]

    def clear(self) -> None:
        """Not this backend's to do: the node's chunks are the cluster's (kvctl clear)."""
        log.info("kvnode.sglang %s: clear() leaves the node's chunks (use kvctl clear)",
                 self.what)
