"""Fixtures of the vLLM connector's tests: real kvcontroller and kvnode processes (from
tests/python/kvnode_procs.py) cut to one small KV shape, and a host cache to fill a node with.

The shape (SHAPE): 2 layers, 2 KV heads of 64 bf16 elements, blocks and chunks of 16 tokens;
a chunk is 2 x 2 x 16 x 2 x 64 x 2 = 16 KiB, the nodes' page. A node's first stores wait out its
full sync ("frozen"): `ready()` stores one chunk of its own until the node takes it.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0] / "python"))  # kvnode_procs
sys.path.insert(0, str(HERE))

import kvnode  # noqa: E402
import numpy as np  # noqa: E402
import kvnode_procs as procs  # noqa: E402
from kvnode_procs import Missing, NodeProcess  # noqa: E402


@dataclass(frozen=True)
class Shape:
    layers: int = 2
    heads: int = 2
    head_size: int = 64
    block: int = 16  # tokens per block and per chunk
    elem: int = 2  # bf16

    @property
    def chunk_bytes(self) -> int:
        return 2 * self.layers * self.block * self.heads * self.head_size * self.elem


SHAPE = Shape()


def host_cache(num_blocks: int, shape: Shape = SHAPE) -> np.ndarray:
    """[layers, num_blocks, heads, block, 2 * head_size] in memory the node maps (vLLM's LBHNC,
    the CPU backend's order), as 2-byte elements."""
    return kvnode.host_array(
        (shape.layers, num_blocks, shape.heads, shape.block, 2 * shape.head_size), np.uint16)


def register(client: kvnode.Client, cache: np.ndarray) -> kvnode.KVCache:
    return client.register_kv_cache([cache[i] for i in range(cache.shape[0])],
                                    block_size=cache.shape[3], layout="packed")


def ready(node: NodeProcess, shape: Shape = SHAPE) -> None:
    """Waits out the node's full sync: one chunk of its own stored (tokens far from the tests')."""
    with kvnode.connect(node.socket) as client:
        cache = host_cache(1, shape)
        with register(client, cache) as kv:
            tokens = list(range(900_000_000, 900_000_000 + shape.block))
            until = time.monotonic() + 30
            while True:
                try:
                    assert kv.store(tokens, [0]) == shape.block
                    return
                except kvnode.Error as e:
                    if e.status != "frozen" or time.monotonic() > until:
                        raise
                    time.sleep(0.05)


def fill(node: NodeProcess, tokens: List[int], seed: int = 1, shape: Shape = SHAPE) -> np.ndarray:
    """Stores `tokens`' chunks (random KV) in the node; returns the cache they came from (its
    blocks 0, 1, ... in order)."""
    blocks = -(-len(tokens) // shape.block)
    cache = host_cache(blocks, shape)
    cache[...] = np.random.default_rng(seed).integers(1, 65535, cache.shape, dtype=np.uint16)
    with kvnode.connect(node.socket) as client, register(client, cache) as kv:
        stored = kv.store(tokens, list(range(blocks)))
        assert stored == len(tokens), f"stored {stored} of {len(tokens)} tokens"
    return cache


class Cluster(procs.Cluster):
    """kvcontroller and nodes A and B in SHAPE, past their full syncs."""

    def __init__(self, log_dir: Path) -> None:
        super().__init__(log_dir, prefix="vllm", chunk_bytes=SHAPE.chunk_bytes,
                         chunk_tokens=SHAPE.block, ready=ready)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    try:
        c = Cluster(tmp_path_factory.mktemp("cluster"))
    except Missing as e:
        if e.named:
            raise
        pytest.skip(str(e))
    yield c
    c.stop()


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
