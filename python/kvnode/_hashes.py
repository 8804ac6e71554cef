"""LMCache's chunk-hash chain, computed here so a client can ask its node by hash.

    h[-1] = hash_init
    h[i]  = hash((h[i-1], tuple(tokens[i*c:(i+1)*c]), third))    third: () or None

This is what the node computes from tokens (`control/include/kvnode/keys/chunk_hash.hpp`) and
what LMCache's token database computes. CPython's own ``hash()`` gives it bit for bit: ints and
tuples hash alike in every process (only str and bytes are salted). A 32k-token prompt hashes
here in ~0.4 ms, half of what turning it into an int64 array for the node costs, so the vLLM
scheduler's question goes by hash. The legacy chain's third element is None, whose hash varies
between interpreters before 3.12: the node's ``none_hash`` stands in for it, and the tuple hash
is computed from the element hashes as CPython does (xxHash-based, 3.8+).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

LMCACHE_056 = "lmcache-0.5.6"
LEGACY = "legacy"

_M64 = (1 << 64) - 1
_P1 = 11400714785074694791
_P2 = 14029467366897019727
_P5 = 2870177450012600261


def _tuple_hash(element_hashes: Sequence[int]) -> int:
    """CPython's hash(tuple) from its elements' hashes (Objects/tupleobject.c)."""
    acc = _P5
    for lane in element_hashes:
        acc = (acc + (lane & _M64) * _P2) & _M64
        acc = ((acc << 31) | (acc >> 33)) & _M64
        acc = (acc * _P1) & _M64
    acc = (acc + (len(element_hashes) ^ (_P5 ^ 3527539))) & _M64
    if acc == _M64:
        return 1546275796
    return acc - (1 << 64) if acc >> 63 else acc


def chunk_hashes(tokens: Sequence[int], chunk_size: int, *, generation: str = LMCACHE_056,
                 hash_init: int = 0, none_hash: int = 0,
                 save_unfull_chunk: bool = True) -> List[int]:
    """The chain's hashes for `tokens`, one per chunk of `chunk_size` tokens (the last partial
    chunk too when `save_unfull_chunk`). ValueError for an unknown generation or chunk size."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size: must be positive, got {chunk_size}")
    if hasattr(tokens, "tolist"):  # numpy: plain ints hash the same, and far faster
        tokens = tokens.tolist()
    n = len(tokens)
    end = n if save_unfull_chunk else n - n % chunk_size
    prefix = hash_init
    out: List[int] = []
    if generation == LMCACHE_056:
        for at in range(0, end, chunk_size):
            prefix = hash((prefix, tuple(tokens[at:at + chunk_size]), ()))
            out.append(prefix)
    elif generation == LEGACY:
        for at in range(0, end, chunk_size):
            prefix = _tuple_hash((hash(prefix), hash(tuple(tokens[at:at + chunk_size])),
                                  none_hash))
            out.append(prefix)
    else:
        raise ValueError(f"generation: {generation!r} is neither {LMCACHE_056!r} nor {LEGACY!r}")
    return out


def node_chunk_hashes(tokens: Sequence[int], info: Dict[str, Any]) -> List[int]:
    """:func:`chunk_hashes` with a node's settings (``Client.info``). ValueError for a node too
    old to say which chain it uses."""
    if not info.get("hash_generation"):
        raise ValueError("the node does not say how it hashes tokens (a kvnode before 0.2)")
    return chunk_hashes(tokens, info["chunk_size"], generation=info["hash_generation"],
                        hash_init=info["hash_init"], none_hash=info["none_hash"],
                        save_unfull_chunk=info["save_unfull_chunk"])
