"""Scenario 4: LMCache 0.5.6's own token database (lmcache/v1/token_database.py,
ChunkedTokenDatabase: _chunk_tokens, _prefix_hash, _hash_tokens) and kvnode's chunk hashes
(`kvctl keys hash --json-lines -`) are equal on random token lists: with a partial last chunk and
without, save_unfull_chunk on and off, init hash (LMCache's NONE_HASH) 0 and other values.

LMCache 0.5.6 hashes `(prefix_hash, tuple(tokens), tuple(extra_keys) if extra_keys is not None
else ())`, kvnode's generation `lmcache-0.5.6` (the default). Releases before 0.5.6 put `None`
in the third slot: kvnode's generation `legacy`. `_hash_tokens` cannot produce that slot (its
extra_keys=None becomes `()`), so the legacy reference is LMCache's own ChunkedTokenDatabase
with only `_canonicalize_hash_inputs` overridden to put None there (the pre-0.5.6 form), hashed by
this interpreter: compared with kvnode given `none_hash` = this interpreter's hash(None) (3.11:
address-derived), and, through a stand-in element whose hash is CPython 3.12's hash(None), with
kvnode's default none_hash.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any, Dict, List, Tuple

from lmc_procs import ROOT, kvctl

sys.path.insert(0, str(ROOT / "python"))
import kvnode  # noqa: E402  (the pure-Python chain needs no native library)

PY312_NONE_HASH = 0xFCA86420  # hash(None) on CPython >= 3.12


class _Py312None:
    """Hashes as CPython 3.12's None does (a tuple hashes its elements' hashes only)."""

    def __hash__(self) -> int:
        return PY312_NONE_HASH


def _lmcache_db(chunk_size: int, save_unfull_chunk: bool, legacy_slot: Any = ()):
    """LMCache's ChunkedTokenDatabase for this chunking; `legacy_slot` other than () replaces the
    third hashed element (the pre-0.5.6 None)."""
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.token_database import ChunkedTokenDatabase

    config = LMCacheEngineConfig.from_defaults(chunk_size=chunk_size,
                                               save_unfull_chunk=save_unfull_chunk)
    if legacy_slot == ():
        return ChunkedTokenDatabase(config)

    class LegacyDb(ChunkedTokenDatabase):
        def _canonicalize_hash_inputs(self, prefix_hash, tokens_tuple, extra_keys):
            prefix, tokens, _ = super()._canonicalize_hash_inputs(prefix_hash, tokens_tuple,
                                                                  extra_keys)
            return prefix, tokens, legacy_slot

    return LegacyDb(config)


def lmcache_hashes(tokens: List[int], chunk_size: int, save_unfull_chunk: bool, init_hash: int,
                   legacy_slot: Any = ()) -> List[int]:
    """The chunk hashes LMCache's token database gives `tokens`, with NONE_HASH = init_hash (the
    module global its _get_init_hash reads, as vLLM's init_none_hash sets it)."""
    import lmcache.v1.token_database as token_database

    db = _lmcache_db(chunk_size, save_unfull_chunk, legacy_slot)  # sets NONE_HASH = 0
    saved = token_database.NONE_HASH
    token_database.NONE_HASH = init_hash
    try:
        return [h for _, _, h in db.process_tokens(tokens, make_key=False)]
    finally:
        token_database.NONE_HASH = saved


def kvnode_hashes(lines: List[Dict[str, Any]], *flags: str) -> List[List[int]]:
    """kvctl keys hash --json-lines -: one list of hashes per request line."""
    r = kvctl("keys", "hash", "--json-lines", "-", *flags,
              stdin="".join(json.dumps(line) + "\n" for line in lines))
    out = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    assert len(out) == len(lines), f"kvctl answered {len(out)} lines for {len(lines)}: {r.stdout}"
    return out


def _cases() -> List[Tuple[List[int], int, bool, int]]:
    """(tokens, chunk_size, save_unfull_chunk, init_hash), seeded: lengths with and without a
    partial last chunk, both save_unfull_chunk values, init hashes 0 and others (negative, the
    -1 that CPython turns into -2, and one above 2^63 as vLLM's sha256 NONE_HASH can be)."""
    rng = random.Random(20260506)
    inits = [0, 0, 1, -1, -(2 ** 63), 2 ** 64 - 1, rng.getrandbits(64), rng.getrandbits(63)]
    cases = []
    for i in range(40):
        chunk_size = 256 if i % 4 else 16
        full = rng.randint(0, 6)
        partial = 0 if i % 2 else rng.randint(1, chunk_size - 1)
        n = max(1, full * chunk_size + partial)
        vocab = rng.choice([32_000, 128_256, 151_936])
        tokens = [rng.randrange(vocab) for _ in range(n)]
        if i % 10 == 3:  # ids far from any vocabulary: int hashing's edges
            tokens[:4] = [2 ** 61 - 1, 2 ** 63 - 1, -(2 ** 63), -1]
        cases.append((tokens, chunk_size, bool(i % 3), inits[i % len(inits)]))
    return cases


CASES = _cases()


def _line(tokens, chunk_size, unfull, init, **extra) -> Dict[str, Any]:
    return dict(tokens=tokens, chunk_size=chunk_size, save_unfull_chunk=unfull, init_hash=init,
                **extra)


def _mismatches(cases, got: List[List[int]], want: List[List[int]]) -> List[str]:
    bad = []
    for (tokens, chunk_size, unfull, init), g, w in zip(cases, got, want):
        if g != w:
            bad.append(f"{len(tokens)} tokens, chunk_size {chunk_size}, save_unfull_chunk "
                       f"{unfull}, init_hash {init}: kvnode {g[:3]}..., LMCache {w[:3]}...")
    return bad


def test_cases_cover_partial_and_full_last_chunks():
    partial = [c for c in CASES if len(c[0]) % c[1]]
    assert partial and len(partial) < len(CASES)
    assert {c[2] for c in CASES} == {True, False}
    assert len({c[3] for c in CASES}) > 2


def test_default_generation_equals_lmcache_056():
    """kvnode's default chunk hash (no hash_generation given) is LMCache 0.5.6's."""
    want = [lmcache_hashes(*c) for c in CASES]
    got = kvnode_hashes([_line(*c) for c in CASES])
    bad = _mismatches(CASES, got, want)
    assert not bad, f"{len(bad)} of {len(CASES)} token lists hash differently:\n" + \
        "\n".join(bad)


def test_named_generation_equals_lmcache_056():
    """The generation named on the command line and per JSON line."""
    want = [lmcache_hashes(*c) for c in CASES]
    by_flag = kvnode_hashes([_line(*c) for c in CASES], "--hash-generation", "lmcache-0.5.6")
    by_line = kvnode_hashes([_line(*c, hash_generation="lmcache-0.5.6") for c in CASES])
    bad = _mismatches(CASES, by_flag, want) + _mismatches(CASES, by_line, want)
    assert not bad, "\n".join(bad)


def test_legacy_generation_equals_lmcache_with_none_slot():
    """`legacy` is LMCache's chain with None in the third slot: with none_hash = this
    interpreter's hash(None), and with kvnode's default none_hash (CPython 3.12's)."""
    this_none = hash(None)
    want_here = [lmcache_hashes(*c, legacy_slot=None) for c in CASES]
    got_here = kvnode_hashes([_line(*c, hash_generation="legacy", none_hash=this_none)
                              for c in CASES])
    want_312 = [lmcache_hashes(*c, legacy_slot=_Py312None()) for c in CASES]
    got_312 = kvnode_hashes([_line(*c) for c in CASES], "--hash-generation", "legacy")
    bad = _mismatches(CASES, got_here, want_here) + _mismatches(CASES, got_312, want_312)
    assert not bad, "\n".join(bad)
    # The two generations differ on every chunk (the third slot enters every chunk's hash).
    want_056 = [lmcache_hashes(*c) for c in CASES]
    same = [i for i, (a, b) in enumerate(zip(want_312, want_056))
            if set(a) & set(b)]
    assert not same, f"legacy and 0.5.6 hashes agree on cases {same}"


def test_known_vectors():
    """The protocol reference's vectors: hash(()) and the legacy 3.12 column (tokens 0..599)."""
    assert hash(()) == 5740354900026072187
    legacy = kvnode_hashes([{"tokens": list(range(600)), "hash_generation": "legacy"}])[0]
    assert legacy == [-7693565463539782743, 2055708856580048389, -1455558097904284410]
    assert legacy == lmcache_hashes(list(range(600)), 256, True, 0, legacy_slot=_Py312None())


def test_the_python_clients_chain_equals_lmcache_in_both_generations():
    """kvnode.chunk_hashes, which the vLLM connector's scheduler asks its node by, is LMCache's
    chain: 0.5.6's, and the legacy one with this interpreter's hash(None) and with 3.12's."""
    def ours(c, **kw):
        tokens, chunk_size, unfull, init = c
        return kvnode.chunk_hashes(tokens, chunk_size, hash_init=init, save_unfull_chunk=unfull,
                                   **kw)
    bad = _mismatches(CASES, [ours(c) for c in CASES], [lmcache_hashes(*c) for c in CASES])
    bad += _mismatches(CASES, [ours(c, generation="legacy", none_hash=hash(None)) for c in CASES],
                       [lmcache_hashes(*c, legacy_slot=None) for c in CASES])
    bad += _mismatches(CASES, [ours(c, generation="legacy", none_hash=PY312_NONE_HASH)
                               for c in CASES],
                       [lmcache_hashes(*c, legacy_slot=_Py312None()) for c in CASES])
    assert not bad, f"{len(bad)} token lists hash differently:\n" + "\n".join(bad)
