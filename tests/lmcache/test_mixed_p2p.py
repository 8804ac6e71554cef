"""Scenario 3: a mixed cluster on kvcontroller (the `kvc` cluster): LMCache 0.5.6's worker W and
kvnode A find each other's chunks by P2P lookup (BatchedP2PLookupMsg, by chunk hash).

- W asks with LMCache's own BatchedP2PLookupMsg over its own DEALER (what its P2P backend sends)
  and must be pointed at A's transfer plane;
- A asks when told to retrieve what it lacks (`kvctl get --retrieve`): its lookup must name W's
  peer_init_url. Nothing listens there (this stub runs no LMCache transfer plane, and kvnode's
  plane could not speak to it anyway), so the pull itself fails and nothing arrives.

By hash: each side admits the hashes the other side computes for the tokens, so these two tests
do not depend on the hash generations agreeing; the last test asks by tokens with each side's own
hashing (LMCache's token database, kvnode's default generation), which does.
"""

from __future__ import annotations

import json

from lmc_procs import CHUNK_TOKENS, LOCATION, kvctl, node_hashes, put, token_range, wait_held


def retrieve(node, tokens) -> dict:
    """kvctl get --retrieve at `node`: what its P2P lookup found and pulled (exit 1: not all
    chunks are there afterwards, expected here)."""
    r = kvctl("get", "--node", node.socket, "--token-range", token_range(tokens[0], len(tokens)),
              "--retrieve", "--json", check=False, timeout=120)
    assert r.returncode in (0, 1) and r.stdout.strip(), \
        f"kvctl get --retrieve exited {r.returncode}: {r.stdout} {r.stderr}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_worker_finds_node_chunks_by_hash(kvc, fresh_tokens):
    c, a, w = kvc.controller, kvc.a, kvc.w
    tokens = fresh_tokens(4 * CHUNK_TOKENS)
    hashes = node_hashes(tokens)
    assert put(a, tokens[0], len(tokens), seed=21)["chunks"] == 4
    wait_held(c, a.instance, hashes)
    assert w.p2p_lookup(hashes) == [(a.instance, LOCATION, 4, a.peer_url)]
    # Hits count from the first hash and stop at the first miss.
    other = node_hashes(fresh_tokens(CHUNK_TOKENS))
    assert w.p2p_lookup(hashes[:2] + other + hashes[2:]) == [(a.instance, LOCATION, 2, a.peer_url)]
    # Nobody holds the first: the sentinel.
    assert w.p2p_lookup(other + hashes) == [("", "", 0, "")]


def test_node_finds_worker_chunks_by_hash(kvc, fresh_tokens):
    c, a, w = kvc.controller, kvc.a, kvc.w
    tokens = fresh_tokens(3 * CHUNK_TOKENS)
    hashes = node_hashes(tokens)  # what A computes for these tokens
    assert w.engine.store(hashes=hashes) == 3
    wait_held(c, w.instance, hashes)
    got = retrieve(a, tokens)
    assert got["retrieve"] is not None
    assert got["retrieve"]["peer"] == w.peer_url, (
        f"A's P2P lookup of W's chunks named {got['retrieve']['peer']!r}, want W's "
        f"{w.peer_url}: {got}")
    assert got["retrieve"]["pulled"] == 0 and got["chunks"] == 0


def test_each_finds_the_other_by_tokens(kvc, fresh_tokens):
    """Each side hashes the tokens its own way: LMCache's token database at W, kvnode's default
    generation at A. They meet only when the two chunk hashes agree."""
    c, a, w = kvc.controller, kvc.a, kvc.w
    at_a = fresh_tokens(2 * CHUNK_TOKENS)
    assert put(a, at_a[0], len(at_a), seed=22)["chunks"] == 2
    wait_held(c, a.instance, node_hashes(at_a))
    at_w = fresh_tokens(2 * CHUNK_TOKENS)
    assert w.engine.store(at_w) == 2
    wait_held(c, w.instance, w.engine.hashes(at_w))

    found_by_w = w.p2p_lookup(w.engine.hashes(at_a))
    found_by_a = retrieve(a, at_w)["retrieve"]["peer"]
    assert (found_by_w, found_by_a) == ([(a.instance, LOCATION, 2, a.peer_url)], w.peer_url), (
        "LMCache's token database and kvnode hash the same tokens differently")
