"""KvnodeConnector: vLLM's KV connector (``KVConnectorBase_V1``) over the kvnode on each host.

One class for both roles, as vLLM builds it: the scheduler's instance answers
``get_num_new_matched_tokens`` and plans each step (``_scheduler.py``); each worker's instance
registers its rank's KV cache and runs the loads and stores (``_worker.py``). Enable it with::

    --kv-transfer-config '{"kv_connector": "KvnodeConnector",
                           "kv_connector_module_path": "kvnode.vllm", "kv_role": "kv_both",
                           "kv_connector_extra_config": {"node": "/tmp/kvnode-a-{rank}.sock"}}'

Chunks it stores are ordinary kvnode chunks (LMCache's hashes of the prompt's tokens):
``kvctl lookup`` finds them, ``kvctl move`` moves them, and another engine's node pulls them.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Set, Tuple

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from ._config import config_of
from ._memory import host_kv_allocation
from ._meta import StepMeta
from ._scheduler import SchedulerSide
from ._worker import WorkerSide

__all__ = ["KvnodeConnector"]

log = logging.getLogger("kvnode.vllm")


def _tp(vllm_config: Any) -> Tuple[int, int]:
    """(this worker's tensor-parallel rank, the tensor-parallel size)."""
    size = int(getattr(vllm_config.parallel_config, "tensor_parallel_size", 1) or 1)
    if size == 1:
        return 0, 1
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    return int(get_tensor_model_parallel_rank()), size


class KvnodeConnector(KVConnectorBase_V1):
    """kvnode as vLLM's KV cache tier and P2P transport (roles scheduler and worker)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.config = config_of(vllm_config.kv_transfer_config)
        block_size = int(vllm_config.cache_config.block_size)
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
        if len(groups) > 1:
            raise ValueError(f"KvnodeConnector: {len(groups)} KV cache groups (a hybrid model); "
                             "it serves models with one attention KV cache")
        self._scheduler: Optional[SchedulerSide] = None
        self._worker: Optional[WorkerSide] = None
        rank, size = _tp(vllm_config)
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerSide(self.config, block_size, size)
        else:
            mla = bool(getattr(vllm_config.model_config, "use_mla", False))
            self._worker = WorkerSide(self.config, rank, block_size, mla)

    # -- worker side --------------------------------------------------------------------------

    def get_mem_pool_context(self) -> Any:
        return host_kv_allocation() if self._worker is not None else None

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        if self._worker is not None:
            self._worker.register(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._meta()
        if self._worker is not None and meta is not None:
            self._worker.start_load(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # start_load_kv copied the local hits in before the forward

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        return  # stored whole after the forward (wait_for_save), one request per chunk run

    def wait_for_save(self) -> None:
        meta = self._meta()
        if self._worker is not None and meta is not None:
            self._worker.queue_saves(meta)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if self._worker is not None and isinstance(kv_connector_metadata, StepMeta):
            if kv_connector_metadata.preempted:
                self._worker.drain_saves()

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]],
                                                                 Optional[Set[str]]]:
        if self._worker is None:
            return None, None
        return self._worker.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        return self._worker.take_load_errors() if self._worker is not None else set()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
        if self._scheduler is not None:
            self._scheduler.close()

    def _meta(self) -> Optional[StepMeta]:
        if not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        return meta if isinstance(meta, StepMeta) else None

    # -- scheduler side -----------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[int, bool]:
        if self._scheduler is None:
            return 0, False
        try:
            return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)
        except Exception as e:  # noqa: BLE001 - never into vLLM: a failure is a miss
            log.warning("kvnode scheduler: lookup of request %s failed: %s",
                        getattr(request, "request_id", "?"), e)
            return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        if self._scheduler is not None:
            self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        if self._scheduler is None:
            return StepMeta()
        return self._scheduler.build_connector_meta(scheduler_output)

    def request_finished(self, request: Any, block_ids: Any) -> Tuple[bool, Optional[dict]]:
        if self._scheduler is None:
            return False, None
        return self._scheduler.request_finished(request, block_ids)
