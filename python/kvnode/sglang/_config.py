"""The backend's settings, from SGLang's ``--hicache-storage-backend-extra-config``.

SGLang passes one extra config to every rank; kvnode's keys (all optional but ``node``)::

    node       the node's local socket; "{tp_rank}", "{pp_rank}" and "{dp_rank}" become the
               rank's (one node per GPU, as for vLLM). An MLA model's ranks hold the same pages
               and only one writes them: give them one node (no "{tp_rank}"), or a controller
               through which the others find the writer's pages
    timeout_s  per node request (default 5): a slower node is a miss, never a stall
    peers      batch_exists also asks the controller which peer holds more, and batch_get_v1
               pulls from it (default true; false: this node only)
    retry_s    after the node was unreachable, how long to treat it as down before connecting
               again (default 5)
    zero_copy  the node copies straight between its pool and SGLang's host pool (default true;
               it falls back to a buffer it maps, one more copy, where it may not: see the
               README); false: always the buffer

SGLang's own keys (backend_name, module_path, class_name, interface_v1, allocator, ...) pass
through; any other key is logged once, never fatal (the extra config is shared with SGLang).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

__all__ = ["BackendConfig", "config_of"]

log = logging.getLogger("kvnode.sglang")
_KEYS = ("node", "timeout_s", "peers", "retry_s", "zero_copy")
_SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1", "allocator")


@dataclass(frozen=True)
class BackendConfig:
    node: str  # the socket path template
    timeout_s: float = 5.0
    peers: bool = True
    retry_s: float = 5.0
    zero_copy: bool = True

    def node_path(self, tp_rank: int, pp_rank: int, dp_rank: int) -> str:
        return (self.node.replace("{tp_rank}", str(tp_rank))
                .replace("{pp_rank}", str(pp_rank)).replace("{dp_rank}", str(dp_rank)))


def _seconds(extra: Mapping[str, Any], key: str, default: float) -> float:
    value = extra.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"hicache extra config {key}: expected seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"hicache extra config {key}: must be > 0, got {value!r}")
    return float(value)


def config_of(extra: Optional[Mapping[str, Any]]) -> BackendConfig:
    """The settings, or ValueError naming the key (when the backend is created)."""
    extra = dict(extra or {})
    unknown = sorted(set(extra) - set(_KEYS) - set(_SGLANG_KEYS))
    if unknown:
        log.info("kvnode.sglang: extra config keys %s are not kvnode's (kvnode reads %s)",
                 unknown, ", ".join(_KEYS))
    node = extra.get("node")
    if not isinstance(node, str) or not node:
        raise ValueError('hicache extra config "node": required, the kvnode local socket of '
                         'this rank (e.g. "/tmp/kvnode-<instance>-{tp_rank}.sock")')
    flags = {}
    for key in ("peers", "zero_copy"):
        flags[key] = extra.get(key, True)
        if not isinstance(flags[key], bool):
            raise ValueError(f'hicache extra config "{key}": expected true or false, got '
                             f'{flags[key]!r}')
    return BackendConfig(node=node, timeout_s=_seconds(extra, "timeout_s", 5.0),
                         retry_s=_seconds(extra, "retry_s", 5.0), **flags)
