"""Test KV caches cut to the test nodes' page: a 16-token chunk of every layer is 256 KiB.

vLLM and FlashInfer: 8 layers x 8 KV heads x head_size 64 x fp16; MLA: 16 layers x 512 x fp16;
SGLang: 8 layers of K and V, 8 heads x 64. `blocks_of` reads a block of every layer's tensors as
bytes, so tests compare what a load wrote with what a store read, byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Tuple

import numpy as np

import kvnode

LAYERS, HEADS, HEAD_SIZE, BLOCK = 8, 8, 64, 16
MLA_LAYERS, MLA_HEAD = 16, 512


@dataclass
class Shape:
    layout: str = "vllm"
    num_blocks: int = 32
    dtype: Any = np.float16

    def layer_shape(self) -> Tuple[int, ...]:
        if self.layout == "vllm":
            return (2, self.num_blocks, BLOCK, HEADS, HEAD_SIZE)
        if self.layout == "flashinfer":
            return (self.num_blocks, 2, BLOCK, HEADS, HEAD_SIZE)
        if self.layout == "mla":
            return (self.num_blocks, BLOCK, MLA_HEAD)
        return (self.num_blocks * BLOCK, HEADS, HEAD_SIZE)  # sglang, K or V

    def layers(self) -> int:
        return MLA_LAYERS if self.layout == "mla" else LAYERS


def make_layers(shape: Shape, seed: int = 0) -> Tuple[List[Any], np.ndarray]:
    """(layers, the one host array they are views of), filled with random bytes (seed > 0) or
    zeroes. SGLang's layers are (k, v) pairs."""
    tensors = shape.layers() * (2 if shape.layout == "sglang" else 1)
    whole = kvnode.host_array((tensors,) + shape.layer_shape(), shape.dtype)
    if seed:
        fill(whole, seed)
    views = [whole[i] for i in range(tensors)]
    if shape.layout == "sglang":
        return [(views[2 * i], views[2 * i + 1]) for i in range(shape.layers())], whole
    return views, whole


def fill(array: np.ndarray, seed: int) -> None:
    raw = array.reshape(-1).view(np.uint8)
    raw[:] = np.random.default_rng(seed).integers(0, 256, raw.size, dtype=np.uint8)


def blocks_of(shape: Shape, whole: np.ndarray, block_ids: List[int]) -> np.ndarray:
    """The bytes of these blocks in every layer (K and V), as uint8, in block_ids' order."""
    ids = np.asarray(block_ids)
    raw = whole.view(np.uint8)
    if shape.layout == "vllm":
        return raw[:, :, ids].copy()
    if shape.layout in ("flashinfer", "mla"):
        return raw[:, ids].copy()
    slots = (ids[:, None] * BLOCK + np.arange(BLOCK)[None, :]).reshape(-1)
    return raw[:, slots].copy()


def scribble(shape: Shape, whole: np.ndarray, block_ids: List[int], seed: int) -> None:
    """Overwrites these blocks with other random bytes."""
    ids = np.asarray(block_ids)
    raw = whole.view(np.uint8)
    rng = np.random.default_rng(seed)
    if shape.layout == "vllm":
        raw[:, :, ids] = rng.integers(0, 256, raw[:, :, ids].shape, dtype=np.uint8)
    elif shape.layout in ("flashinfer", "mla"):
        raw[:, ids] = rng.integers(0, 256, raw[:, ids].shape, dtype=np.uint8)
    else:
        slots = (ids[:, None] * BLOCK + np.arange(BLOCK)[None, :]).reshape(-1)
        raw[:, slots] = rng.integers(0, 256, raw[:, slots].shape, dtype=np.uint8)
