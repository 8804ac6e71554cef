"""The connector's settings, from vLLM's ``kv_transfer_config``.

``kv_connector_extra_config`` keys (every one optional but ``node``)::

    node       the node's local socket; "{rank}" becomes the worker's tensor-parallel rank
               (one node per GPU and rank, as LMCache runs one worker per rank)
    timeout_s  per node request (default 5): a slower node is a miss, never a stall
    peers      look up and pull prefixes held by other nodes through the controller (default
               true; false: this node only)
    retry_s    after a node was unreachable, how long to treat it as down before connecting
               again (default 5): a dead node costs one failed connect per period, not per step

``kv_role``: kv_producer stores only, kv_consumer loads only, kv_both does both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["ConnectorConfig", "config_of"]

_KEYS = ("node", "timeout_s", "peers", "retry_s")
_ROLES = {"kv_producer": (True, False), "kv_consumer": (False, True), "kv_both": (True, True)}


@dataclass(frozen=True)
class ConnectorConfig:
    node: str  # the socket path template ("{rank}" in it)
    timeout_s: float = 5.0
    peers: bool = True
    retry_s: float = 5.0
    save: bool = True
    load: bool = True

    def node_path(self, rank: int) -> str:
        return self.node.replace("{rank}", str(rank))


def _seconds(extra: Mapping[str, Any], key: str, default: float) -> float:
    value = extra.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"kv_connector_extra_config.{key}: expected seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"kv_connector_extra_config.{key}: must be > 0, got {value!r}")
    return float(value)


def config_of(kv_transfer_config: Any) -> ConnectorConfig:
    """The settings, or ValueError naming the key (at engine start, never on the data path)."""
    extra = dict(getattr(kv_transfer_config, "kv_connector_extra_config", None) or {})
    unknown = sorted(set(extra) - set(_KEYS))
    if unknown:
        raise ValueError(f"kv_connector_extra_config: unknown keys {unknown} (known: "
                         f"{', '.join(_KEYS)})")
    node = extra.get("node")
    if not isinstance(node, str) or not node:
        raise ValueError('kv_connector_extra_config.node: required, the node\'s local socket '
                         '(e.g. "/tmp/kvnode-<instance>-{rank}.sock")')
    peers = extra.get("peers", True)
    if not isinstance(peers, bool):
        raise ValueError(f"kv_connector_extra_config.peers: expected true or false, got {peers!r}")
    role = getattr(kv_transfer_config, "kv_role", None) or "kv_both"
    if role not in _ROLES:
        raise ValueError(f"kv_role: {role!r} is not one of {', '.join(_ROLES)}")
    save, load = _ROLES[role]
    return ConnectorConfig(node=node, timeout_s=_seconds(extra, "timeout_s", 5.0), peers=peers,
                           retry_s=_seconds(extra, "retry_s", 5.0), save=save, load=load)
