"""vLLM >= 0.33's KV cache as vLLM lays it out: one allocation, each layer a strided
[num_blocks, kv_heads, block_size, 2 * head_size] view (K then V in the last axis) in one of its
physical orders, registered with layout="packed" by its strides; MLA's [num_blocks, 1,
block_size, head_size] views with "packed_mla". A chunk is the same bytes whichever layout
stored it: stored from the fixed "vllm" preset, loaded into every packed order, row for row.
Also the prefix questions beyond this node: lookup_peers and retrieve."""

from __future__ import annotations

import time

import numpy as np
import pytest

import kvnode
from kv_shapes import BLOCK, HEAD_SIZE, HEADS, LAYERS, MLA_HEAD, MLA_LAYERS, Shape, make_layers

BLOCKS = 16
# Physical orders of [L, B, H, N, C] (vllm/v1/kv_cache_layout.py's KVCacheLayout).
ORDERS = ["LBNHC", "LBHNC", "BLNHC", "LHBNC", "BLHNC", "BHLNC"]


def packed(order: str, heads: int = HEADS, channels: int = 2 * HEAD_SIZE, layers: int = LAYERS):
    """(per-layer [B, H, N, C] views in `order`, the array behind them)."""
    size = {"L": layers, "B": BLOCKS, "H": heads, "N": BLOCK, "C": channels}
    whole = kvnode.host_array(tuple(size[d] for d in order), np.float16)
    logical = whole.transpose([order.index(d) for d in "LBHNC"])  # [L, B, H, N, C], strided
    return [logical[i] for i in range(layers)], whole


@pytest.mark.parametrize("order", ORDERS)
def test_every_physical_order_loads_what_the_vllm_preset_stored(cluster, fresh_tokens, order):
    shape = Shape("vllm", num_blocks=BLOCKS)
    src_layers, _ = make_layers(shape, seed=5)  # [2, B, N, H, D] per layer
    dst_layers, _ = packed(order)
    tokens = fresh_tokens(3 * BLOCK)
    with kvnode.connect(cluster.a.socket) as client:
        with client.register_kv_cache(src_layers, BLOCK) as src, \
                client.register_kv_cache(dst_layers, BLOCK, layout="packed") as dst:
            assert src.store(tokens, [3, 9, 1]) == 3 * BLOCK
            assert dst.load(tokens, [14, 0, 7]) == 3 * BLOCK
    for layer in range(LAYERS):
        for kv in range(2):
            want = src_layers[layer][kv][[3, 9, 1]]  # [3, N, H, D]
            got = dst_layers[layer][[14, 0, 7]][..., kv * HEAD_SIZE:(kv + 1) * HEAD_SIZE]
            # As bits: random bytes hold NaNs, which compare unequal as floats.
            assert np.array_equal(got.transpose(0, 2, 1, 3).view(np.uint16),
                                  want.view(np.uint16)), (order, layer, kv)


def test_packed_cpu_pages_hold_k_rows_then_v_rows(cluster, fresh_tokens):
    """vLLM's CPU backend views a layer as [B, H, 2 * N, D]: K rows, then V rows, per page."""
    views, whole = packed("LBHNC")
    whole.view(np.uint16)[:] = np.random.default_rng(8).integers(1, 65535, whole.shape,
                                                                   dtype=np.uint16)
    preset, _ = make_layers(Shape("vllm", num_blocks=BLOCKS))  # [2, B, N, H, D] per layer
    tokens = fresh_tokens(2 * BLOCK)
    with kvnode.connect(cluster.a.socket) as client:
        with client.register_kv_cache(views, BLOCK, layout="packed_cpu") as cpu, \
                client.register_kv_cache(preset, BLOCK) as flat:
            assert cpu.store(tokens, [6, 2]) == 2 * BLOCK
            assert flat.load(tokens, [0, 1]) == 2 * BLOCK
    for layer in range(LAYERS):
        pages = views[layer].reshape(BLOCKS, HEADS, 2 * BLOCK, HEAD_SIZE)[[6, 2]]  # [2, H, 2N, D]
        k, v = pages[:, :, :BLOCK], pages[:, :, BLOCK:]
        got_k = preset[layer][0][[0, 1]].transpose(0, 2, 1, 3)  # [2, H, N, D]
        got_v = preset[layer][1][[0, 1]].transpose(0, 2, 1, 3)
        assert np.array_equal(got_k.view(np.uint16), k.view(np.uint16)), layer
        assert np.array_equal(got_v.view(np.uint16), v.view(np.uint16)), layer


def test_packed_mla_round_trips(cluster, fresh_tokens):
    views, whole = packed("BLNHC", heads=1, channels=MLA_HEAD, layers=MLA_LAYERS)
    whole.reshape(-1).view(np.uint16)[:] = np.random.default_rng(3).integers(
        1, 65535, whole.size, dtype=np.uint16)
    tokens = fresh_tokens(2 * BLOCK)
    with kvnode.connect(cluster.a.socket) as client:
        with client.register_kv_cache(views, BLOCK, layout="packed_mla") as kv:
            assert kv.store(tokens, [2, 5]) == 2 * BLOCK
            assert kv.load(tokens, [11, 12]) == 2 * BLOCK
    for v in views:
        assert np.array_equal(v[[11, 12]].view(np.uint16), v[[2, 5]].view(np.uint16))


def test_packed_refusals_name_the_layer(cluster):
    views, _ = packed("LBNHC")
    with kvnode.connect(cluster.a.socket) as client:
        with pytest.raises(ValueError, match=r"layers\[0\]: a packed layer is"):
            client.register_kv_cache([v[:, :, :, 0] for v in views], BLOCK, layout="packed")
        odd = [v[..., 1:] for v in views]  # 127 channels: no K|V split
        with pytest.raises(ValueError, match=r"layers\[0\]: .*odd size"):
            client.register_kv_cache(odd, BLOCK, layout="packed")
        other, _ = packed("LHBNC")
        with pytest.raises(ValueError, match=r"layers\[1\]: strides .* differ"):
            client.register_kv_cache([views[0], other[1]] + views[2:], BLOCK, layout="packed")
        torn = [v[..., ::2] for v in views]  # every other element: rows not contiguous
        with pytest.raises(ValueError, match="last axis must be contiguous"):
            client.register_kv_cache(torn, BLOCK, layout="packed")
        foreign = [np.zeros((BLOCKS, HEADS, BLOCK, 2 * HEAD_SIZE), np.float16)] * LAYERS
        with pytest.raises(ValueError, match="not in memory the node can map"):
            client.register_kv_cache(foreign, BLOCK, layout="packed")


def test_lookup_peers_and_retrieve(cluster, fresh_tokens):
    views, _ = packed("LBHNC")
    tokens = fresh_tokens(3 * BLOCK + 5)  # an unfull last chunk
    with kvnode.connect(cluster.a.socket) as at_a, kvnode.connect(cluster.b.socket) as at_b:
        with at_a.register_kv_cache(views, BLOCK, layout="packed") as kv:
            assert kv.store(tokens, [0, 1, 2, 3]) == len(tokens)
        assert at_a.lookup_peers(tokens)["tokens"] == len(tokens)
        assert at_a.lookup_peers(tokens)["peer"] == ""  # all here: nobody asked
        # The controller hears of A's admits in batches: ask until B's lookup finds them.
        until = time.monotonic() + 30
        while (seen := at_b.lookup_peers(tokens))["peer_tokens"] < len(tokens):
            assert time.monotonic() < until, seen
            time.sleep(0.1)
        assert seen["tokens"] == 0 and seen["pulled"] == 0 and seen["peer"]
        assert at_b.lookup(tokens) == 0, "lookup_peers moved nothing"
        got = at_b.retrieve(tokens)
        assert (got["tokens"], got["chunks"], got["pulled"]) == (len(tokens), 4, 4)
        assert at_b.lookup(tokens) == len(tokens)
        assert at_b.retrieve(tokens)["pulled"] == 0  # held now: nothing to pull
