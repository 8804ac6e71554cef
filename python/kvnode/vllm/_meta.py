"""What the scheduler side tells the worker side each step (vLLM's KVConnectorMetadata)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

__all__ = ["Load", "Save", "StepMeta"]


@dataclass
class Load:
    """Copy the node's chunks of `tokens` into `block_ids`; vLLM counts `hit_tokens` loaded.

    `tokens` are what the node was asked about (their chunks, an unfull last one included, are
    what it holds); `hit_tokens` <= len(tokens) is what the scheduler told vLLM. `remote`: the
    chunks are at a peer: pull them first, off the step (an asynchronous load).
    """

    req_id: str
    tokens: List[int]
    block_ids: List[int]
    hit_tokens: int
    remote: bool = False


@dataclass
class Save:
    """Store the chunks of `tokens` (computed by the end of this step) from `block_ids`."""

    req_id: str
    tokens: List[int]
    block_ids: List[int]


@dataclass
class StepMeta(KVConnectorMetadata):
    loads: List[Load] = field(default_factory=list)
    saves: List[Save] = field(default_factory=list)
    preempted: bool = False  # some request lost its blocks: pending saves must land first
