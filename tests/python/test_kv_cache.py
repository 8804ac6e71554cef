"""The package's whole API on host memory against real kvnode processes: connect, info, lookup,
register_kv_cache in every layout, store, load (into other blocks; with retrieve from the other
node), context managers, threads."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from kv_shapes import BLOCK, Shape, blocks_of, make_layers, scribble

import kvnode

LAYOUTS = ["vllm", "flashinfer", "mla", "sglang"]


def test_info_describes_the_node(cluster):
    with kvnode.connect(cluster.a.socket) as client:
        info = client.info
        assert info["chunk_bytes"] == 262144
        assert info["chunk_size"] == 16
        assert info["save_unfull_chunk"] is True  # LMCache's default: a last partial chunk counts
        assert info["memory"] == "host"
        assert info["instance"] == cluster.a.instance
        assert info["worker_id"] == 0
        assert info["pages"] > 0
        assert isinstance(info["location"], str)
        assert repr(client).startswith("<kvnode.Client")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_store_then_load_into_other_blocks_gives_every_byte_back(cluster, fresh_tokens, layout):
    shape = Shape(layout)
    layers, whole = make_layers(shape, seed=7)
    tokens = fresh_tokens(64)  # 4 chunks, 4 blocks
    src, dst = [5, 17, 2, 30], [9, 0, 21, 14]
    with kvnode.connect(cluster.a.socket) as client:
        with client.register_kv_cache(layers, block_size=BLOCK, layout=layout) as kv:
            assert kv.num_blocks == 32 and kv.block_size == BLOCK and kv.layout == layout
            assert kv.lookup(tokens) == 0
            assert kv.store(tokens, src) == 64
            assert kv.lookup(tokens) == 64
            assert client.lookup(tokens[:40]) == 32  # its last 8 tokens: a partial chunk, unheld
            want = blocks_of(shape, whole, src)
            scribble(shape, whole, src, seed=8)
            scribble(shape, whole, dst, seed=9)
            assert kv.load(tokens, dst) == 64
            assert np.array_equal(blocks_of(shape, whole, dst), want)


def test_arrays_of_tokens_and_block_ids(cluster, fresh_tokens):
    shape = Shape("vllm")
    layers, whole = make_layers(shape, seed=3)
    tokens = np.array(fresh_tokens(48), dtype=np.int64)
    with kvnode.connect(cluster.a.socket) as client, \
            client.register_kv_cache(layers, BLOCK) as kv:
        assert kv.store(tokens, np.array([3, 4, 5], dtype=np.uint32)) == 48
        want = blocks_of(shape, whole, [3, 4, 5])
        # Other integer dtypes, a strided array, a tuple and a range all convert.
        assert kv.load(tokens.astype(np.int32), np.array([7, 0, 8, 0, 9])[::2]) == 48
        assert np.array_equal(blocks_of(shape, whole, [7, 8, 9]), want)
        assert kv.lookup(tuple(int(t) for t in tokens)) == 48
        assert kv.lookup(tokens.astype(np.uint64)) == 48  # unsigned ids below 2**63 pass
        assert kv.lookup(range(int(tokens[0]), int(tokens[0]) + 32)) == 32
        assert kv.load(tokens[:32], (10, 11)) == 32  # fewer tokens: the leading chunks


def test_an_unfull_last_chunk_and_a_load_of_the_stored_prefix(cluster, fresh_tokens):
    shape = Shape("vllm")
    layers, whole = make_layers(shape, seed=4)
    tokens = fresh_tokens(40)  # 2 whole chunks and 8 tokens: LMCache's unfull last chunk
    with kvnode.connect(cluster.a.socket) as client, \
            client.register_kv_cache(layers, BLOCK) as kv:
        assert client.info["save_unfull_chunk"]  # the rule that makes 40 tokens 3 chunks
        assert kv.store(tokens, [1, 2, 3]) == 40
        assert kv.lookup(tokens) == 40
        assert kv.lookup(tokens[:32]) == 32
        assert kv.lookup(tokens[:36]) == 32  # another unfull chunk: another hash
        want = blocks_of(shape, whole, [1, 2])
        assert kv.load(tokens[:32] + [7] * 32, [4, 5, 6, 7]) == 32  # the prefix it holds
        assert np.array_equal(blocks_of(shape, whole, [4, 5]), want)
        assert kv.load(fresh_tokens(32), [4, 5]) == 0  # nothing held
        assert kv.store([], []) == 0 and kv.load([], []) == 0


def test_load_with_retrieve_pulls_from_the_other_node(cluster, fresh_tokens):
    shape = Shape("vllm")
    layers_a, whole_a = make_layers(shape, seed=21)
    layers_b, whole_b = make_layers(shape, seed=22)
    tokens = fresh_tokens(64)
    with kvnode.connect(cluster.a.socket) as at_a, kvnode.connect(cluster.b.socket) as at_b:
        kv_a = at_a.register_kv_cache(layers_a, BLOCK)
        kv_b = at_b.register_kv_cache(layers_b, BLOCK)
        assert kv_a.store(tokens, [1, 2, 3, 4]) == 64
        assert kv_b.lookup(tokens) == 0
        assert kv_b.load(tokens, [10, 11, 12, 13]) == 0  # without retrieve: B holds nothing
        # The controller hears of A's admits in batches: ask until B's load finds them there.
        loaded, until = 0, time.monotonic() + 30
        while loaded < 64 and time.monotonic() < until:
            loaded = kv_b.load(tokens, [10, 11, 12, 13], retrieve=True)
            if loaded < 64:
                time.sleep(0.1)
        assert loaded == 64
        assert np.array_equal(blocks_of(shape, whole_b, [10, 11, 12, 13]),
                              blocks_of(shape, whole_a, [1, 2, 3, 4]))
        assert kv_b.lookup(tokens) == 64  # B keeps what it pulled


def test_layers_in_separate_allocations(cluster, fresh_tokens):
    shape = Shape("flashinfer")
    layers = [kvnode.host_array(shape.layer_shape(), np.float16) for _ in range(8)]
    for i, layer in enumerate(layers):
        layer.view(np.uint16)[...] = i + 1
    tokens = fresh_tokens(16)
    with kvnode.connect(cluster.a.socket) as client, \
            client.register_kv_cache(layers, BLOCK, layout="flashinfer") as kv:
        assert kv.store(tokens, [6]) == 16
        for layer in layers:
            layer[...] = 0
        assert kv.load(tokens, [9]) == 16
        for i, layer in enumerate(layers):
            assert (layer[9].view(np.uint16) == i + 1).all()
            assert not layer[6].any()


def test_context_managers_and_close(cluster):
    layers, _ = make_layers(Shape("vllm"))
    with kvnode.connect(cluster.a.socket) as client:
        with client.register_kv_cache(layers, BLOCK) as kv:
            assert not kv.closed
        assert kv.closed
        kv.close()  # idempotent
        kept = client.register_kv_cache(layers, BLOCK)
    assert client.closed and kept.closed  # closing the client closed its caches
    client.close()
    assert "closed" in repr(client) and "closed" in repr(kept)


def test_many_registrations_come_and_go(cluster):
    layers, _ = make_layers(Shape("mla", num_blocks=4))
    with kvnode.connect(cluster.a.socket) as client:
        for _ in range(20):
            client.register_kv_cache(layers, BLOCK, layout="mla").close()
        for _ in range(5):
            client.register_kv_cache(layers, BLOCK, layout="mla")  # dropped: the GC closes
        assert client.info["chunk_size"] == 16


def test_threads_share_one_client(cluster, fresh_tokens):
    shape = Shape("vllm")
    layers, whole = make_layers(shape, seed=5)
    sequences = [fresh_tokens(16) for _ in range(8)]
    errors = []
    with kvnode.connect(cluster.a.socket) as client, \
            client.register_kv_cache(layers, BLOCK) as kv:

        def work(i: int) -> None:
            try:
                for _ in range(5):
                    assert kv.store(sequences[i], [i]) == 16
                    assert kv.load(sequences[i], [16 + i]) == 16
                    assert client.lookup(sequences[i]) == 16
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for i in range(8):
            assert np.array_equal(blocks_of(shape, whole, [16 + i]), blocks_of(shape, whole, [i]))
