"""The backend in a cluster and when things fail: a prefix stored by an SGLang on node A is
found (batch_exists through the controller's P2P lookup) and fetched (batch_get_v1 pulls it)
by an SGLang on node B; SGLang's own fault injector on; a node killed mid-batch, a node that is
down at start with its socket file left behind: misses at once, never an exception; a node
whose chunk is not the page is refused at register_mem_pool_host; close() ends the
registrations."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from sglang_rig import (PAGE_BYTES, StorageBackendFactory, backend, host_pool, keys_for, ready,
                        same_pages, storage_config)

import kvnode


def test_a_prefix_stored_at_a_is_fetched_at_b(cluster):
    src, dst = host_pool(False, "page_first"), host_pool(False, "layer_first")
    at_a, at_b = backend(cluster.a, src), backend(cluster.b, dst)
    keys = keys_for(6, seed=200)
    put = src.alloc(6 * 16)
    assert at_a.batch_set_v1(keys, put) == [True] * 6
    until = time.monotonic() + 30  # the controller hears of A's admits in batches
    while at_b.batch_exists(keys) < 6:
        assert time.monotonic() < until, "B never saw A's pages"
        time.sleep(0.1)
    with kvnode.connect(cluster.b.socket) as client:
        assert client.lookup_chunks(at_b._hashes(keys)) == 0, "batch_exists moved nothing"
    got = dst.alloc(6 * 16)
    assert at_b.batch_get_v1(keys, got) == [True] * 6
    assert same_pages(src, put, dst, got) == 0
    local = backend(cluster.b, dst, peers=False)  # B holds them now: no peer needed
    assert local.batch_exists(keys) == 6
    for b in (at_a, at_b, local):
        b.close()


def test_sglang_fault_injector(cluster, monkeypatch):
    """SGLang's HiCacheStorageFailureInjector around the backend: failures and delays are
    misses and partial hits, never exceptions, and what does succeed is right."""
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE", "0.5")
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_DELAY", "0.01")
    src, dst = host_pool(False, "page_first_direct"), host_pool(False, "page_first_direct")
    injected = []
    for pool in (src, dst):
        cfg = storage_config(False, node=cluster.a.socket)
        b = StorageBackendFactory.create_backend("dynamic", cfg, pool)
        assert type(b).__name__ != "KvnodeHiCacheStorage", "the injector is not on"
        b.register_mem_pool_host(pool)
        injected.append(b)
    put, got = src.alloc(4 * 16), dst.alloc(4 * 16)
    hits = 0
    for round_ in range(12):
        keys = keys_for(4, seed=300 + round_)
        ok = injected[0].batch_set_v1(keys, put)
        assert isinstance(ok, list) and len(ok) == 4
        found = injected[1].batch_exists(keys)
        assert 0 <= found <= 4
        res = injected[1].batch_get_v1(keys, got)
        lead = res.index(False) if False in res else len(res)
        if all(ok) and lead == 4:
            assert same_pages(src, put, dst, got) == 0
            hits += 1
    assert hits < 12, "the injector injected nothing"
    for b in injected:
        b.close()


def test_a_node_killed_mid_batch_is_a_miss(tmp_path, cluster):
    node = cluster.start("K")
    ready(node)
    pool = host_pool(False, "page_first", pages=256)
    b = backend(node, pool, timeout_s=2.0, retry_s=30.0)
    keys = keys_for(128, seed=400)
    idx = pool.alloc(128 * 16)
    assert b.batch_set_v1(keys, idx) == [True] * 128
    answers = []

    def gets():
        for _ in range(40):
            answers.append(b.batch_get_v1(keys, idx))

    t = threading.Thread(target=gets)
    t.start()
    time.sleep(0.05)
    os.kill(node.proc.pid, signal.SIGKILL)  # its socket file stays behind
    t.join(30)
    assert not t.is_alive()
    assert answers and all(len(a) == 128 for a in answers)
    began = time.monotonic()
    assert b.batch_exists(keys) == 0
    assert b.batch_get_v1(keys, idx) == [False] * 128
    assert b.batch_set_v1(keys, idx) == [False] * 128
    assert b.get(keys[0], pool.get_dummy_flat_data_page()) is None
    assert time.monotonic() - began < 1.0, "a dead node must be a miss at once"
    b.close()
    node.stop()


def test_a_node_down_at_start_then_up(cluster, tmp_path):
    path = str(tmp_path / "kvnode-late.sock")
    open(path, "w").close()  # a file left behind by a crashed node: no one listens
    pool = host_pool(True, "layer_first")
    b = backend(path, pool, retry_s=0.2)
    keys = keys_for(2, seed=500)
    assert b.batch_exists(keys) == 0
    assert b.batch_set_v1(keys, pool.alloc(32)) == [False, False]
    b.close()


def test_a_node_whose_chunk_is_not_the_page_is_refused_at_registration(cluster):
    node = cluster.start("W", chunk_bytes=PAGE_BYTES * 2)
    try:
        pool = host_pool(False, "page_head")
        with pytest.raises(ValueError, match=rf"--chunk-size 16 --chunk-bytes {PAGE_BYTES}"):
            backend(node, pool)
    finally:
        node.stop()


def test_close_ends_the_registrations(cluster):
    pool = host_pool(False, "page_first")
    b = backend(cluster.a, pool)
    keys = keys_for(1, seed=600)
    assert b.batch_set_v1(keys, pool.alloc(16)) == [True]
    caches = [b.get_path.direct, b.set_path.direct, b.get_path.cache, b.set_path.cache]
    assert caches[1] is not None and not caches[1].closed
    b.close()
    assert all(c is None or c.closed for c in caches)
    assert b.batch_exists(keys) in (0, 1)  # answers, reconnecting; never raises
