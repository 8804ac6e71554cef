"""Scenario 1: two kvnodes under LMCache 0.5.6's own controller (`lmcache_controller`, the
`lmc` cluster): registration, admits, /lookup by tokens, /move A -> B verified byte for byte at
B, /pin, /clear, /health, /controller/workers and /query_worker_info."""

from __future__ import annotations

import json

from lmc_procs import (CHUNK_TOKENS, LOCATION, kvctl, node_hashes, put, token_range,
                       wait_for, wait_held, wait_unheld)


def held(node, tokens) -> int:
    """How many leading chunks of `tokens` the node holds (kvctl get)."""
    r = kvctl("get", "--node", node.socket, "--token-range", token_range(tokens[0], len(tokens)),
              "--json", check=False)
    assert r.returncode in (0, 1), f"kvctl get: {r.returncode} {r.stderr}"
    return json.loads(r.stdout)["chunks"]


def test_nodes_register_and_heartbeat(lmc):
    c = lmc.controller
    workers = {w["instance_id"]: w for w in c.workers()}
    for role, node in lmc.nodes.items():
        w = workers.get(node.instance)
        assert w is not None, f"kvnode {role} is not in {sorted(workers)}"
        assert w["worker_id"] == 0
        assert w["ip"] == "127.0.0.1"
        assert w["peer_init_url"] == node.peer_url
        assert w["registration_time"] <= w["last_heartbeat_time"]
    # Heartbeats reach LMCache's heartbeat socket: the timestamp moves on.
    before = workers[lmc.a.instance]["last_heartbeat_time"]
    assert wait_for(lambda: c.worker(lmc.a.instance)["last_heartbeat_time"] > before, 10, 0.2), \
        f"no heartbeat of A registered in 10 s:\n{lmc.logs()}"
    status, one = c.get(f"/controller/workers?instance_id={lmc.a.instance}&worker_id=0")
    assert status == 200 and one["instance_id"] == lmc.a.instance and one["port"] > 0
    status, info = c.post("/query_worker_info", {"instance_id": lmc.b.instance})
    assert status == 200, info
    assert [(i["instance_id"], i["peer_init_url"]) for i in info["worker_infos"]] == \
        [(lmc.b.instance, lmc.b.peer_url)]


def test_admits_reach_lmcache_registry(lmc, fresh_tokens):
    """A's admits (BatchedKVOperationMsg) land in LMCache's registry: a P2P lookup by hash names
    A for all of them, and A's key_count counts them."""
    c, a = lmc.controller, lmc.a
    tokens = fresh_tokens(6 * CHUNK_TOKENS)
    assert put(a, tokens[0], len(tokens), seed=11)["chunks"] == 6
    answer = wait_held(c, a.instance, node_hashes(tokens))
    assert answer == [(a.instance, LOCATION, 6, a.peer_url)]
    assert c.worker(a.instance)["key_count"] >= 6


def test_lookup_by_tokens_names_node(lmc, fresh_tokens):
    """LMCache's controller hashes the tokens itself (its ChunkedTokenDatabase, 0.5.6's chunk
    hash); kvnode's chunks must carry the same hashes, a partial last chunk included."""
    c, a = lmc.controller, lmc.a
    tokens = fresh_tokens(5 * CHUNK_TOKENS + 77)
    assert put(a, tokens[0], len(tokens), seed=12)["chunks"] == 6
    wait_held(c, a.instance, node_hashes(tokens))  # A's admits are in
    status, body = c.post("/lookup", {"tokens": tokens})
    assert status == 200, body
    assert body["event_id"].startswith("Lookup")
    assert body["layout_info"] == {a.instance: [LOCATION, len(tokens)]}, (
        f"LMCache's controller answers {body['layout_info']} for the tokens of A's chunks: its "
        "hashes (ChunkedTokenDatabase, 0.5.6) differ from kvnode's (hash generation)")


def test_move_a_to_b_verified_at_b(lmc, fresh_tokens):
    c, a, b = lmc.controller, lmc.a, lmc.b
    tokens = fresh_tokens(8 * CHUNK_TOKENS)
    hashes = node_hashes(tokens)
    assert put(a, tokens[0], len(tokens), seed=7)["chunks"] == 8
    wait_held(c, a.instance, hashes)
    status, body = c.post("/move", {"old_position": [a.instance, LOCATION],
                                    "new_position": [b.instance, LOCATION],
                                    "tokens": tokens}, timeout=120)
    assert status == 200, f"/move answered {status}: {body}\n{lmc.logs()}"
    assert set(body) == {"event_id", "num_tokens"} and body["event_id"].startswith("Move")
    assert body["num_tokens"] == len(tokens)
    r = kvctl("verify", "--node", b.socket, "--token-range", token_range(tokens[0], len(tokens)),
              "--seed", "7", "--json")
    v = json.loads(r.stdout)
    assert v["present"] == 8 and v["mismatched"] == []
    assert held(a, tokens) == 0, "a move (should_copy false) left the chunks at A"
    # The registry follows the nodes' events: B admitted them, A evicted them.
    wait_held(c, b.instance, hashes)


def test_copy_keeps_source(lmc, fresh_tokens):
    c, a, b = lmc.controller, lmc.a, lmc.b
    tokens = fresh_tokens(3 * CHUNK_TOKENS)
    assert put(a, tokens[0], len(tokens), seed=8)["chunks"] == 3
    status, body = c.post("/move", {"old_position": [a.instance, LOCATION],
                                    "new_position": [b.instance, LOCATION],
                                    "tokens": tokens, "should_copy": True}, timeout=120)
    assert status == 200 and body["num_tokens"] == len(tokens), body
    for node in (a, b):
        kvctl("verify", "--node", node.socket, "--token-range",
              token_range(tokens[0], len(tokens)), "--seed", "8")


def test_pin(lmc, fresh_tokens):
    c, a = lmc.controller, lmc.a
    tokens = fresh_tokens(4 * CHUNK_TOKENS)
    assert put(a, tokens[0], len(tokens), seed=9)["chunks"] == 4
    status, body = c.post("/pin", {"instance_id": a.instance, "location": LOCATION,
                                   "tokens": tokens})
    assert status == 200, body
    assert body["num_tokens"] == len(tokens) and body["event_id"].startswith("Pin")
    # Only the leading held chunks count.
    status, body = c.post("/pin", {"instance_id": a.instance, "location": LOCATION,
                                   "tokens": tokens[:2 * CHUNK_TOKENS] + fresh_tokens(512)})
    assert status == 200 and body["num_tokens"] == 2 * CHUNK_TOKENS, body
    status, body = c.post("/pin", {"instance_id": a.instance, "location": LOCATION,
                                   "tokens": fresh_tokens(CHUNK_TOKENS)})
    assert status == 200 and body["num_tokens"] == 0, body


def test_clear(lmc, fresh_tokens):
    c, b = lmc.controller, lmc.b
    tokens = fresh_tokens(5 * CHUNK_TOKENS)
    hashes = node_hashes(tokens)
    assert put(b, tokens[0], len(tokens), seed=10)["chunks"] == 5
    wait_held(c, b.instance, hashes)
    status, body = c.post("/clear", {"instance_id": b.instance, "location": LOCATION})
    assert status == 200, body
    assert body["event_id"].startswith("Clear")
    assert body["num_tokens"] >= len(tokens)
    assert held(b, tokens) == 0
    wait_unheld(c, hashes)  # B's evicts reached the registry
    # Another location clears nothing.
    status, body = c.post("/clear", {"instance_id": b.instance, "location": "LocalDiskBackend"})
    assert status == 200 and body["num_tokens"] == 0, body


def test_health(lmc):
    c = lmc.controller
    for node in lmc.nodes.values():
        status, body = c.post("/health", {"instance_id": node.instance})
        assert status == 200, body
        assert body["error_codes"] == {"0": 0} and body["event_id"].startswith("health")
    status, body = c.post("/health", {"instance_id": "no-such-instance"})
    assert status == 200 and body["error_codes"] == {}, body
