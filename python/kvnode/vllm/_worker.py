"""The connector's worker side: this rank's KV cache registered with its node, loads before the
forward, stores after it.

- Registration: vLLM (>= 0.32) hands each layer as a ``[num_blocks, kv_heads, block_size,
  2 * head_size]`` view of one allocation (MLA: ``[num_blocks, 1, block_size, head_size]``),
  registered once by its strides (kvnode's "packed" layouts). Layers sharing a cache are
  registered once. A node whose chunk does not match refuses, naming the --chunk-bytes to pass.
- Loads: a local hit is copied in by ``start_load_kv`` before the forward; a peer's prefix is
  pulled to this node and copied in on a background thread, reported through ``get_finished``.
- Stores: ``wait_for_save`` queues the step's stores on a background thread (the forward is not
  held); the blocks stay vLLM's until ``get_finished`` reports the request stored. A preemption
  (blocks about to be reused) and ``shutdown`` wait for the queued stores.
- Nothing raises into vLLM: a node that is down, a timeout or a short load is a miss; blocks not
  loaded are reported by ``get_block_ids_with_load_errors`` and vLLM recomputes them.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import weakref
from typing import Any, Dict, List, Optional, Set, Tuple

import kvnode

from ._config import ConnectorConfig
from ._link import NodeLink
from ._meta import Load, Save, StepMeta

__all__ = ["WorkerSide"]

log = logging.getLogger("kvnode.vllm")
_STOP = object()


def _cpu_backend() -> bool:
    """vLLM's CPU attention backend reads a page as K rows then V rows (cpu_attn.py); the GPU
    backends split the last axis (K is [..., :head_size])."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # noqa: BLE001 - no platform: the GPU layout
        return False


class WorkerSide:
    def __init__(self, config: ConnectorConfig, rank: int, block_size: int, mla: bool) -> None:
        self.config = config
        self.rank = rank
        self.block_size = block_size  # vLLM's (the scheduler's block ids)
        self.mla = mla
        path = config.node_path(rank)
        self.link = NodeLink(path, config.timeout_s, config.retry_s, f"worker rank {rank}")
        self.link.on_connect = self._register
        # Pulls from peers go through a connection of their own, so a slow peer never holds
        # the step's loads and stores (one call at a time per client).
        self.pull_link = NodeLink(path, config.timeout_s, config.retry_s, f"worker rank {rank}")
        self.layers: List[Any] = []
        self.kernel_block_size = 0  # tokens per block of the registered views
        self.cache: Optional[kvnode.KVCache] = None
        self.lock = threading.Lock()  # what the threads and the step share, below
        self.load_errors: Set[int] = set()
        self.recved: Set[str] = set()       # asynchronous loads done, to report
        self.saving: Dict[str, int] = {}    # queued stores per request
        self.finishing: Set[str] = set()    # vLLM said finished; report once stored
        self.sent: Set[str] = set()         # stored and finished, to report
        self.seen_saves: Set[str] = set()   # requests with planned stores (vLLM holds blocks)
        self.saves: "queue.Queue[Any]" = queue.Queue()
        self.saver = threading.Thread(target=self._save_loop, name="kvnode-save", daemon=True)
        self.saver.start()
        self.pullers: List[threading.Thread] = []
        # The last step's stores land even when the process ends without vLLM's shutdown().
        me = weakref.ref(self)
        atexit.register(lambda: (w := me()) is not None and w.shutdown(timeout=10.0))

    # -- registration -------------------------------------------------------------------------

    def register(self, kv_caches: Dict[str, Any]) -> None:
        seen: Set[int] = set()
        layers = []
        for tensor in kv_caches.values():
            if tensor.data_ptr() in seen:
                continue  # a layer sharing another's cache (cross-layer KV sharing)
            seen.add(tensor.data_ptr())
            layers.append(tensor)
        self.layers = layers
        if not layers:
            log.warning("kvnode worker rank %d: vLLM gave no KV cache to register", self.rank)
            return
        self.kernel_block_size = int(layers[0].shape[2])
        if self.block_size % self.kernel_block_size:
            log.warning("kvnode worker rank %d: block size %d is not whole kernel blocks of %d; "
                        "the connector stays off", self.rank, self.block_size,
                        self.kernel_block_size)
            self.layers = []
            return
        self.link.client()  # connects and registers now, so a wrong geometry shows at start

    def _register(self, client: kvnode.Client) -> None:
        if not self.layers:
            return
        layout = "packed_mla" if self.mla else "packed_cpu" if _cpu_backend() else "packed"
        try:
            self.cache = client.register_kv_cache(self.layers, block_size=self.kernel_block_size,
                                                  layout=layout)
        except (TypeError, ValueError) as e:  # the cache itself: no retry helps
            log.error("kvnode worker rank %d: vLLM's KV cache cannot be registered, the "
                      "connector stays off: %s", self.rank, e)
            self.layers = []
            return
        log.info("kvnode worker rank %d: %d layers registered with %s (%s, %d blocks)",
                 self.rank, len(self.layers), self.link.path, layout, self.cache.num_blocks)

    def _kernel_blocks(self, block_ids: List[int]) -> List[int]:
        ratio = self.block_size // self.kernel_block_size
        if ratio == 1:
            return block_ids
        return [b * ratio + i for b in block_ids for i in range(ratio)]

    # -- loads --------------------------------------------------------------------------------

    def start_load(self, meta: StepMeta) -> None:
        if meta.preempted:
            self.drain_saves()  # the stores still read blocks the scheduler is about to reuse
        for load in meta.loads:
            if load.remote:
                t = threading.Thread(target=self._load_remote, args=(load,),
                                     name="kvnode-pull", daemon=True)
                self.pullers.append(t)
                t.start()
            else:
                self._load(load)
        self.pullers = [t for t in self.pullers if t.is_alive()]

    def _load(self, load: Load) -> int:
        """Copies the node's chunks in; blocks past what landed are load errors. Tokens loaded."""
        if not self.layers:
            loaded = 0
        else:
            blocks = self._kernel_blocks(load.block_ids)
            loaded = self.link.call(lambda c: self._cache_of(c).load(load.tokens, blocks), 0)
        if loaded < load.hit_tokens:
            first_bad = loaded // self.block_size
            bad = load.block_ids[first_bad: -(-load.hit_tokens // self.block_size)]
            with self.lock:
                self.load_errors.update(bad)
            self.link.fail(f"request {load.req_id}: {loaded} of {load.hit_tokens} tokens loaded; "
                           f"{len(bad)} blocks recomputed")
        return loaded

    def _cache_of(self, client: kvnode.Client) -> kvnode.KVCache:
        if self.cache is None or self.cache.closed:
            raise kvnode.Error("the KV cache is not registered", "not_found", -2)
        return self.cache

    def _load_remote(self, load: Load) -> None:
        try:
            if self.config.peers:
                self.pull_link.call(lambda c: c.retrieve(load.tokens), None)
            self._load(load)
        except Exception as e:  # noqa: BLE001 - a thread's failure is a miss, never a crash
            with self.lock:
                self.load_errors.update(load.block_ids)
            self.link.fail(f"request {load.req_id}: pulling from a peer failed: {e}")
        finally:
            with self.lock:
                self.recved.add(load.req_id)

    # -- stores -------------------------------------------------------------------------------

    def queue_saves(self, meta: StepMeta) -> None:
        for save in meta.saves:
            with self.lock:
                self.saving[save.req_id] = self.saving.get(save.req_id, 0) + 1
                self.seen_saves.add(save.req_id)
            self.saves.put(save)

    def _save_loop(self) -> None:
        while True:
            item = self.saves.get()
            try:
                if item is _STOP:
                    return
                if isinstance(item, threading.Event):
                    item.set()  # a drain marker: everything before it is stored
                    continue
                self._save(item)
            finally:
                self.saves.task_done()

    def _save(self, save: Save) -> None:
        try:
            if self.layers:
                blocks = self._kernel_blocks(save.block_ids)
                self.link.call(lambda c: self._cache_of(c).store(save.tokens, blocks), 0)
        except Exception as e:  # noqa: BLE001 - a failed store is a future miss
            self.link.fail(f"request {save.req_id}: a store failed: {e}")
        finally:
            with self.lock:
                left = self.saving.get(save.req_id, 1) - 1
                if left > 0:
                    self.saving[save.req_id] = left
                else:
                    self.saving.pop(save.req_id, None)
                    if save.req_id in self.finishing:
                        self.finishing.discard(save.req_id)
                        self.sent.add(save.req_id)

    def drain_saves(self, timeout: Optional[float] = None) -> bool:
        """Waits until every store queued so far ran; False on timeout."""
        if not self.saver.is_alive():
            return True
        marker = threading.Event()
        self.saves.put(marker)
        return marker.wait(timeout)

    # -- the step's end -----------------------------------------------------------------------

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]],
                                                                 Optional[Set[str]]]:
        with self.lock:
            for req_id in finished_req_ids:
                if req_id not in self.seen_saves:
                    continue  # the scheduler freed its blocks: no store was planned
                self.seen_saves.discard(req_id)
                if self.saving.get(req_id):
                    self.finishing.add(req_id)
                else:
                    self.sent.add(req_id)
            sent, self.sent = self.sent, set()
            recved, self.recved = self.recved, set()
        return (sent or None), (recved or None)

    def take_load_errors(self) -> Set[int]:
        with self.lock:
            errors, self.load_errors = self.load_errors, set()
        return errors

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stores queued before it land (a prompt saved in the last step), then disconnects."""
        if self.saver.is_alive():
            if not self.drain_saves(timeout):
                log.warning("kvnode worker rank %d: stores still queued after %.0f s at shutdown",
                            self.rank, timeout)
            self.saves.put(_STOP)
            self.saver.join(timeout)
        for t in self.pullers:
            t.join(timeout)
        self.link.close()
        self.pull_link.close()
