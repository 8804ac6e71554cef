"""vLLM's CPU KV cache in memory the node can map, through the connector's
``get_mem_pool_context`` hook.

vLLM allocates a rank's whole KV cache as one ``torch.zeros(n, dtype=torch.int8,
device=device)`` inside the context the connector returns (``vllm/v1/worker/utils.py``,
``allocate_kv_cache``) and views each layer out of it. On the CPU, inside this context, that one
call gets zeroed kvnode host memory instead (a sealed memfd, :func:`kvnode.host_array`), which
the node maps once: stores and loads copy straight between the engine's blocks and the node's
pool, zero-copy. Any other ``torch.zeros`` call, and every call on a GPU, goes to torch
unchanged (CUDA KV is shared with the node through CUDA IPC instead).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Iterator

import kvnode

__all__ = ["host_kv_allocation"]

log = logging.getLogger("kvnode.vllm")
_patch_lock = threading.Lock()  # one patched torch.zeros at a time


def _is_cpu(device: Any) -> bool:
    return device is None or str(device) == "cpu"


@contextlib.contextmanager
def host_kv_allocation() -> Iterator[None]:
    import numpy as np
    import torch

    real_zeros = torch.zeros

    def zeros(*size: Any, dtype: Any = None, device: Any = None, **kwargs: Any) -> Any:
        if (dtype is torch.int8 and _is_cpu(device) and not kwargs and len(size) == 1
                and isinstance(size[0], int) and size[0] > 0):
            try:
                return torch.from_numpy(kvnode.host_array(size[0], np.int8))
            except Exception as e:  # noqa: BLE001 - fall back to torch's memory, said once
                log.warning("kvnode: the KV cache stays in torch's memory (%s): the node "
                            "cannot map it, so the connector stays off", e)
        return real_zeros(*size, dtype=dtype, device=device, **kwargs)

    with _patch_lock:
        torch.zeros = zeros
        try:
            yield
        finally:
            torch.zeros = real_zeros
