"""SGLang's page keys as kvnode chunk hashes.

SGLang names each page by a string: a SHA-256 hex digest chained page by page (64 hex
characters), or a longer key of its unified scheme (``{page_hash}_{digest}_L{a}-{b}``). kvnode
names a chunk by a signed 64-bit hash, cluster-wide. A key becomes
``H64(key) XOR H64(namespace)``: H64 of a 64-hex digest is the XOR of its four 64-bit words
(uniform, and cheap in bulk: one ``bytes.fromhex`` per batch), of any other key the first 8
bytes of its BLAKE2b. The namespace (model, page geometry, the rank's shard) keeps deployments
apart: the same page key of another model or another TP shard is another chunk.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

__all__ = ["namespace_hash", "chunk_hashes"]

_DIGEST_HEX = 64  # a SHA-256 hex digest


def _h64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def namespace_hash(namespace: str) -> int:
    """H64 of the namespace string (an unsigned 64-bit int)."""
    return _h64(b"kvnode.sglang/v1\0" + namespace.encode("utf-8"))


def _digest_words(keys: Sequence[str]) -> "np.ndarray | None":
    """The XOR of each key's four 64-bit words when every key is a 64-hex digest; else None."""
    if not all(isinstance(k, str) and len(k) == _DIGEST_HEX for k in keys):
        return None
    try:
        raw = bytes.fromhex("".join(keys))
    except ValueError:
        return None
    if len(raw) != 32 * len(keys):  # fromhex skips whitespace: such a key is not a digest
        return None
    words = np.frombuffer(raw, dtype="<u8").reshape(len(keys), 4)
    return np.bitwise_xor.reduce(words, axis=1)


def _one(key: str) -> int:
    """H64 of one key, as the bulk path computes it for a digest."""
    words = _digest_words([key])
    if words is not None:
        return int(words[0])
    return _h64(str(key).encode("utf-8", "surrogatepass"))


def chunk_hashes(keys: Sequence[str], namespace: int) -> np.ndarray:
    """The chunk hash (int64) of each key under `namespace` (from namespace_hash); a key's hash
    does not depend on the other keys of the batch."""
    words = _digest_words(keys)
    if words is None:  # not all digests: key by key
        words = np.fromiter((_one(k) for k in keys), dtype=np.uint64, count=len(keys))
    return (words ^ np.uint64(namespace)).view(np.int64)
