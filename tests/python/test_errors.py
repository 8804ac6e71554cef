"""Every error path: bad arguments raise TypeError or ValueError naming the argument; what the
node or the library refuses raises kvnode.Error with the node's message and a status."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from kvnode_procs import NodeProcess
from kv_shapes import BLOCK, HEAD_SIZE, HEADS, Shape, make_layers

import kvnode


@pytest.fixture
def kv(cluster):
    layers, _ = make_layers(Shape("vllm"))
    with kvnode.connect(cluster.a.socket) as client, \
            client.register_kv_cache(layers, BLOCK) as cache:
        yield cache


# ---- connect ------------------------------------------------------------------------------------

def test_connect_to_no_node_names_the_socket():
    with pytest.raises(kvnode.Error) as e:
        kvnode.connect("/tmp/kvnode-py-no-such.sock")
    assert e.value.status == "not_found"
    assert "/tmp/kvnode-py-no-such.sock" in str(e.value)
    assert isinstance(e.value, RuntimeError)


@pytest.mark.parametrize("path, timeout, exc, word", [
    (42, 15.0, TypeError, "socket_path"),
    ("", 15.0, ValueError, "socket_path"),
    ("/tmp/x.sock", "15", TypeError, "timeout"),
    ("/tmp/x.sock", 0, ValueError, "timeout"),
    ("/tmp/x.sock", float("inf"), ValueError, "timeout"),
])
def test_connect_arguments(path, timeout, exc, word):
    with pytest.raises(exc, match=word):
        kvnode.connect(path, timeout)


class BytesPath:
    def __fspath__(self):
        return b"/tmp/x.sock"


@pytest.mark.parametrize("path, timeout, exc, word", [
    ("/tmp/x\0.sock", 15.0, ValueError, "socket_path: .* NUL"),  # C would cut it at the NUL
    (b"/tmp/x.sock", 15.0, TypeError, "socket_path"),
    (BytesPath(), 15.0, TypeError, "socket_path: .*BytesPath gives bytes"),
    ("/tmp/x.sock", -1, ValueError, "timeout"),
    ("/tmp/x.sock", float("nan"), ValueError, "timeout"),
    ("/tmp/x.sock", 86400.5, ValueError, "timeout: .*at most a day"),
    ("/tmp/x.sock", 2**70, ValueError, "timeout"),
    ("/tmp/x.sock", 10**400, ValueError, "timeout"),  # past float's range
    ("/tmp/x.sock", True, TypeError, "timeout"),
    ("/tmp/x.sock", 1 + 2j, TypeError, "timeout"),
])
def test_connect_arguments_checked_in_python(path, timeout, exc, word):
    with pytest.raises(exc, match=word):
        kvnode.connect(path, timeout)


@pytest.mark.parametrize("timeout", [np.float32(0.5), np.float64(2), np.int64(3), 86400,
                                     __import__("fractions").Fraction(1, 4)])
def test_any_real_timeout_is_seconds(timeout):
    with pytest.raises(kvnode.Error) as e:  # the arguments pass: no node listens there
        kvnode.connect("/tmp/kvnode-py-no-such.sock", timeout)
    assert e.value.status == "not_found"


def test_a_path_that_is_not_utf8_reaches_the_file_system(tmp_path):
    import os

    name = os.fsdecode(b"kvnode-\xff\xfe.sock")  # surrogate escapes: not UTF-8
    with pytest.raises(kvnode.Error) as e:
        kvnode.connect(tmp_path / name)
    assert e.value.status == "not_found"
    assert "kvnode-" in str(e.value)


def test_errors_keep_status_and_code_through_pickle():
    e = kvnode.Error("block_ids[9]: out of range", "invalid", -1)
    back = pickle.loads(pickle.dumps(e))
    assert (str(back), back.status, back.code) == (str(e), "invalid", -1)


# ---- tokens and block ids -----------------------------------------------------------------------

@pytest.mark.parametrize("tokens, exc", [
    ("abcd", TypeError),
    (b"abcd", TypeError),
    ({1: 2}, TypeError),
    (None, TypeError),
    ([1.5, 2.5], TypeError),
    (["a"], TypeError),
    ([2 ** 70], ValueError),
    (np.zeros((2, 16), dtype=np.int64), ValueError),
    (np.zeros(16, dtype=np.float32), TypeError),
    ([2 ** 63], ValueError),
    (np.array([1, 2 ** 63], dtype=np.uint64), ValueError),  # would wrap to a negative id
    (np.array([2 ** 64 - 1, 0], dtype=np.uint64)[::2], ValueError),
])
def test_bad_tokens_name_tokens(kv, tokens, exc):
    for call in (lambda: kv.store(tokens, [0]), lambda: kv.load(tokens, [0]),
                 lambda: kv.lookup(tokens)):
        with pytest.raises(exc, match="tokens"):
            call()


@pytest.mark.parametrize("block_ids, exc", [
    ("ab", TypeError),
    ([0.5, 1.5], TypeError),
    ([-1, 0], ValueError),
    ([2 ** 32, 0], ValueError),
    (np.array([-1, 0]), ValueError),
    (np.zeros((2, 1), dtype=np.int64), ValueError),
    (np.zeros(2, dtype=np.float64), TypeError),
])
def test_bad_block_ids_name_block_ids(kv, fresh_tokens, block_ids, exc):
    with pytest.raises(exc, match="block_ids"):
        kv.store(fresh_tokens(32), block_ids)


def test_too_few_block_ids(kv, fresh_tokens):
    with pytest.raises(ValueError, match=r"block_ids: 2 block ids for 33 tokens.*needs 3"):
        kv.store(fresh_tokens(33), [0, 1])
    with pytest.raises(ValueError, match="block_ids"):
        kv.load(fresh_tokens(16), [])


def test_a_block_id_out_of_range_is_the_nodes_error(kv, fresh_tokens):
    with pytest.raises(kvnode.Error) as e:
        kv.store(fresh_tokens(32), [0, 32])
    assert e.value.status == "invalid"
    assert "block_ids[1]" in str(e.value) and "32" in str(e.value)


# ---- register_kv_cache --------------------------------------------------------------------------

def layers_of(shape=(2, 8, BLOCK, HEADS, HEAD_SIZE), n=8, dtype=np.float16):
    whole = kvnode.host_array((n,) + shape, dtype)
    return [whole[i] for i in range(n)]


def test_register_argument_errors(cluster):
    good = layers_of()
    with kvnode.connect(cluster.a.socket) as client:
        reg = client.register_kv_cache
        cases = [
            (lambda: reg(good, BLOCK, layout="paged"), ValueError, "layout"),
            (lambda: reg(good, BLOCK, layout=1), TypeError, "layout"),
            (lambda: reg(good, 0), ValueError, "block_size"),
            (lambda: reg(good, "16"), TypeError, "block_size"),
            (lambda: reg(good, 16.0), TypeError, "block_size"),
            (lambda: reg(good, 32), ValueError, r"layers\[0\]: block_size is 32"),
            (lambda: reg([], BLOCK), ValueError, "layers: empty"),
            (lambda: reg(good[0], BLOCK), TypeError, "layers: expected a list"),  # one array
            (lambda: reg("layers", BLOCK), TypeError, "layers"),
            (lambda: reg([[1, 2]], BLOCK), TypeError, r"layers\[0\]"),
            (lambda: reg(good[:3] + [np.zeros_like(good[0])], BLOCK), ValueError,
             r"layers\[3\]: not in memory the node can map"),
            (lambda: reg(good[:2] + layers_of(n=1, dtype=np.float32), BLOCK), ValueError,
             r"layers\[2\]: dtype float32 differs from layers\[0\]'s float16"),
            (lambda: reg(good[:2] + layers_of((2, 9, BLOCK, HEADS, HEAD_SIZE), 1), BLOCK),
             ValueError, r"layers\[2\]: shape \(2, 9, 16, 8, 64\) differs"),
            (lambda: reg([g[:, :, :, :4] for g in good], BLOCK), ValueError,
             r"layers\[0\]: not contiguous"),
            (lambda: reg(layers_of((3, 8, BLOCK, HEADS, HEAD_SIZE)), BLOCK), ValueError,
             r"layers\[0\]: a vllm layer is \[2, num_blocks"),
            (lambda: reg(layers_of((8, BLOCK, HEADS, HEAD_SIZE)), BLOCK), ValueError,
             r"layers\[0\]: a vllm layer"),
            (lambda: reg(good, BLOCK, layout="mla"), ValueError, r"layers\[0\]: a mla layer"),
            (lambda: reg(good, BLOCK, layout="sglang"), TypeError,
             r"layers\[0\]: an sglang layer is a \(k, v\) pair"),
            (lambda: reg(layers_of(n=2, dtype=np.complex64), BLOCK), TypeError,
             r"layers\[0\]: dtype complex64"),
        ]
        for i, (call, exc, pattern) in enumerate(cases):
            with pytest.raises(exc, match=pattern):
                call()
        assert not client.closed


def test_a_layout_that_does_not_fill_the_page_is_the_nodes_error(cluster):
    with kvnode.connect(cluster.a.socket) as client:
        with pytest.raises(kvnode.Error) as e:
            client.register_kv_cache(layers_of(n=4), BLOCK)  # half a page per chunk
        assert e.value.status == "invalid"
        assert "131072" in str(e.value) or "262144" in str(e.value), str(e.value)


# ---- closed handles and a dead node -------------------------------------------------------------

def test_a_closed_cache_and_a_closed_client(cluster, fresh_tokens):
    layers, _ = make_layers(Shape("vllm"))
    client = kvnode.connect(cluster.a.socket)
    kv = client.register_kv_cache(layers, BLOCK)
    kv.close()
    for call in (lambda: kv.store(fresh_tokens(16), [0]), lambda: kv.load(fresh_tokens(16), [0]),
                 lambda: kv.lookup([1, 2])):
        with pytest.raises(kvnode.Error, match="closed") as e:
            call()
        assert e.value.status == "invalid"
    kv2 = client.register_kv_cache(layers, BLOCK)
    client.close()
    with pytest.raises(kvnode.Error, match="closed"):
        kv2.store(fresh_tokens(16), [0])
    for call in (lambda: client.info, lambda: client.lookup([1]),
                 lambda: client.register_kv_cache(layers, BLOCK)):
        with pytest.raises(kvnode.Error, match="client is closed"):
            call()


def test_a_dead_node_is_an_error_with_its_message(cluster, log_dir, fresh_tokens):
    node = NodeProcess("py-dying", cluster.controller, log_dir)
    try:
        layers, _ = make_layers(Shape("vllm"))
        client = kvnode.connect(node.socket, timeout=5)
        kv = client.register_kv_cache(layers, BLOCK)
        node.kill()
        with pytest.raises(kvnode.Error) as e:
            kv.store(fresh_tokens(16), [0])
        assert e.value.status in ("peer_lost", "not_found", "io"), (e.value.status, str(e.value))
        print(e.value.status, e.value)
        assert str(e.value)
        client.close()
    finally:
        node.stop()
