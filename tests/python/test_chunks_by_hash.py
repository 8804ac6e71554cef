"""Chunks named by the engine (SGLang's page keys): a KV cache registered with layout="strided"
((k, v) view pairs in any order, V a fixed distance after K) stores and loads by chunk hash, and
the client asks this node and its peers how many leading hashes they hold, and pulls them.
What a "strided" cache stored by hash loads, row for row, into the fixed "vllm" preset."""

from __future__ import annotations

import time

import numpy as np
import pytest

import kvnode
from kv_shapes import BLOCK, HEAD_SIZE, HEADS, LAYERS, Shape, make_layers

PAGES = 8


def page_first(pages: int = PAGES):
    """SGLang's page_first host pool, [2, pages * BLOCK, L, H, D]: per layer (K, V) views
    [pages, H, BLOCK, D] and the array behind them."""
    whole = kvnode.host_array((2, pages * BLOCK, LAYERS, HEADS, HEAD_SIZE), np.float16)
    pages_view = whole.reshape(2, pages, BLOCK, LAYERS, HEADS, HEAD_SIZE)
    layers = [(pages_view[0, :, :, l].transpose(0, 2, 1, 3),
               pages_view[1, :, :, l].transpose(0, 2, 1, 3)) for l in range(LAYERS)]
    return layers, whole


def hashes_of(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)


def test_strided_pages_by_hash_load_into_the_preset(cluster):
    rng = np.random.default_rng(11)
    layers, whole = page_first()
    whole.view(np.uint16)[:] = rng.integers(1, 65535, whole.shape, dtype=np.uint16)
    preset, _ = make_layers(Shape("vllm", num_blocks=PAGES))  # [2, B, N, H, D] per layer
    keys = hashes_of(rng, 3)
    with kvnode.connect(cluster.a.socket) as client:
        with client.register_kv_cache(layers, BLOCK, layout="strided") as pool, \
                client.register_kv_cache(preset, BLOCK) as flat:
            assert client.lookup_chunks(keys) == 0
            assert pool.store_chunks(keys, [5, 0, 6]) == 3
            assert client.lookup_chunks(keys) == 3
            assert client.lookup_chunks([keys[0], 12345, keys[2]]) == 1
            assert flat.load_chunks(keys, [1, 7, 2]) == 3
            assert flat.load_chunks([keys[0], 12345], [0, 1]) == 1  # stops at the gap
    src = whole.reshape(2, PAGES, BLOCK, LAYERS, HEADS, HEAD_SIZE)
    for layer in range(LAYERS):
        for kv in range(2):
            want = src[kv][[5, 0, 6], :, layer]  # [3, N, H, D]
            got = preset[layer][kv][[1, 7, 2]]  # [3, N, H, D]
            assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), (layer, kv)


def test_strided_refuses_pairs_that_do_not_fit(cluster):
    layers, _ = page_first()
    with kvnode.connect(cluster.a.socket) as client:
        swapped = [(v, k) for k, v in layers]
        with pytest.raises(ValueError, match=r"layers\[0\]\[1\]: V must lie after K"):
            client.register_kv_cache(swapped, BLOCK, layout="strided")
        mixed = [layers[0], (layers[1][0], layers[2][1])]
        with pytest.raises(ValueError, match=r"layers\[1\]\[1\]: V lies .* bytes after K"):
            client.register_kv_cache(mixed, BLOCK, layout="strided")
        with pytest.raises(TypeError, match=r"layers\[0\]: a strided layer is a \(k, v\) pair"):
            client.register_kv_cache([layers[0][0]], BLOCK, layout="strided")


def test_peers_by_hash(cluster):
    rng = np.random.default_rng(12)
    layers, whole = page_first()
    whole.view(np.uint16)[:] = rng.integers(1, 65535, whole.shape, dtype=np.uint16)
    keys = hashes_of(rng, 4)
    with kvnode.connect(cluster.a.socket) as at_a, kvnode.connect(cluster.b.socket) as at_b:
        with at_a.register_kv_cache(layers, BLOCK, layout="strided") as kv:
            assert kv.store_chunks(keys, [0, 1, 2, 3]) == 4
        until = time.monotonic() + 30
        while (seen := at_b.lookup_peers_chunks(keys))["peer_chunks"] < 4:
            assert time.monotonic() < until, seen
            time.sleep(0.1)
        assert (seen["chunks"], seen["tokens"], seen["peer_tokens"]) == (0, 0, 0)
        assert seen["peer"]
        assert at_b.lookup_chunks(keys) == 0, "lookup_peers_chunks moved nothing"
        got = at_b.retrieve_chunks(keys[:3])
        assert (got["chunks"], got["pulled"]) == (3, 3)
        assert at_b.lookup_chunks(keys) == 3
        target, whole_b = page_first()
        with at_b.register_kv_cache(target, BLOCK, layout="strided") as kv_b:
            assert kv_b.load_chunks(keys, [7, 6, 5, 4], retrieve=True) == 4
    a = whole.reshape(2, PAGES, -1)
    b = whole_b.reshape(2, PAGES, -1)
    assert np.array_equal(b[:, [7, 6, 5, 4]].view(np.uint16), a[:, [0, 1, 2, 3]].view(np.uint16))


def test_a_question_never_waits_behind_another_threads_copy(cluster):
    """A lookup while another thread holds the client (a long store or load) answers over the
    client's second connection, at once and right."""
    import threading

    rng = np.random.default_rng(13)
    layers, _ = page_first()
    keys = hashes_of(rng, 2)
    with kvnode.connect(cluster.a.socket) as client:
        with client.register_kv_cache(layers, BLOCK, layout="strided") as kv:
            assert kv.store_chunks(keys, [0, 1]) == 2
        held, release = threading.Event(), threading.Event()

        def copy_in_flight():  # what a store holds for its whole copy
            with client._state.lock:
                held.set()
                release.wait(30)

        t = threading.Thread(target=copy_in_flight)
        t.start()
        try:
            assert held.wait(30)
            began = time.monotonic()
            assert client.lookup_chunks(keys) == 2
            assert client.lookup_peers_chunks(keys)["chunks"] == 2
            assert time.monotonic() - began < 5, "the question waited for the copy"
            assert client._state.side is not None
        finally:
            release.set()
            t.join()
        assert client.lookup_chunks(keys) == 2  # the client's own connection again
    assert client._state.side is None  # closed with the client


@pytest.mark.parametrize("chain", [[], ["--hash-generation", "legacy",
                                        "--hash-init", "18446744073709551615"]])
def test_tokens_hashed_by_the_client_name_what_the_node_stored_by_tokens(cluster, log_dir,
                                                                          fresh_tokens, chain):
    """Client.chunk_hashes computes the node's chain, which its info names (the default, and
    the legacy one with an initial hash past 2^63): what the node stored by tokens is found by
    those hashes, here and through lookup_peers_chunks, a partial last chunk included."""
    from kvnode_procs import NodeProcess, wait_unfrozen

    node = NodeProcess(f"chain{len(chain)}", cluster.controller, log_dir, extra=chain)
    try:
        wait_unfrozen(node)
        layers, _ = make_layers(Shape("vllm"), seed=5)
        tokens = fresh_tokens(5 * BLOCK + 3)  # 6 chunks, the last partial
        with kvnode.connect(node.socket) as client:
            info = client.info
            assert info["hash_generation"] == ("legacy" if chain else "lmcache-0.5.6")
            assert info["hash_init"] == (2**64 - 1 if chain else 0)
            hashes = client.chunk_hashes(tokens)
            assert hashes == kvnode.chunk_hashes(
                tokens, info["chunk_size"], generation=info["hash_generation"],
                hash_init=info["hash_init"], none_hash=info["none_hash"])
            assert len(hashes) == 6
            assert client.lookup_chunks(hashes) == 0
            with client.register_kv_cache(layers, BLOCK) as kv:
                assert kv.store(tokens, list(range(6))) == len(tokens)
            assert client.lookup_chunks(hashes) == 6
            assert client.lookup_peers_chunks(hashes)["chunks"] == 6
            # The other chain's hashes name none of it.
            other = kvnode.chunk_hashes(tokens, info["chunk_size"],
                                        generation="lmcache-0.5.6" if chain else "legacy")
            assert client.lookup_chunks(other) == 0
            assert client.lookup_chunks(hashes[:4] + other[4:]) == 4
    finally:
        node.stop()
