"""The package with CUDA tensors (the GPU machine): a vLLM-layout KV cache in torch CUDA tensors
registered with nodes whose pools are device memory (--memory device): store, overwrite, load
into other blocks, every byte compared; load(retrieve=True) on the other node; bf16, one shared
allocation, cupy arrays, a DLPack-only exporter, host KV into a device pool, vLLM 0.33's
strided views in its six physical orders; and the refusals
(non-contiguous, mixed host and CUDA layers, PyTorch's expandable segments).

Skips cleanly without torch or a CUDA device. Runs under pytest, or as a plain script where
pytest is missing (`python3 tests/python/test_gpu.py`: one PASS/FAIL/SKIP line per test, exit 1
on a failure), with KVNODE_PATH, KVCONTROLLER_PATH, KVNODE_CLIENT_LIB and PYTHONPATH=python set
as for the host tests.
"""

from __future__ import annotations

import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, List

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import pytest
except ImportError:  # the plain-script runner below
    pytest = None
UNDER_PYTEST = pytest is not None and __name__ != "__main__"

from kvnode_procs import Cluster, Missing  # noqa: E402

import kvnode  # noqa: E402

BLOCK, HEADS, HEAD_SIZE, LAYERS, BLOCKS = 16, 8, 64, 8, 32  # a 16-token chunk: 256 KiB in fp16


class Skip(Exception):
    pass


def skip(reason: str) -> None:
    if UNDER_PYTEST:
        pytest.skip(reason)
    raise Skip(reason)


def need_torch() -> Any:
    try:
        import torch
    except ImportError:
        skip("torch is not installed")
    if not torch.cuda.is_available():
        skip("no CUDA device (torch.cuda.is_available() is False)")
    return torch


if UNDER_PYTEST:
    need_torch_at_import = pytest.importorskip("torch")
    if not need_torch_at_import.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

    @pytest.fixture(scope="module")
    def gpu_cluster(tmp_path_factory):
        try:
            c = Cluster(tmp_path_factory.mktemp("kvnode-gpu-logs"), ["--memory", "device"],
                        prefix="pygpu")
        except Missing as e:
            pytest.fail(str(e)) if e.named else pytest.skip(str(e))
        yield c
        c.stop()


_next = [50_000_000]


def tokens(n: int) -> List[int]:
    first = _next[0]
    _next[0] += n + 1000
    return list(range(first, first + n))


def random_layers(torch: Any, dtype: Any, n: int = LAYERS, seed: int = 1) -> List[Any]:
    """vLLM layers [2, BLOCKS, BLOCK, HEADS, HEAD_SIZE] of random bytes, one tensor each."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for _ in range(n):
        raw = torch.randint(0, 256, (2, BLOCKS, BLOCK, HEADS, HEAD_SIZE * 2), dtype=torch.uint8,
                            device="cuda", generator=g)
        out.append(raw.view(dtype))
    return out


def blocks(torch: Any, layers: List[Any], ids: List[int]) -> Any:
    """Every layer's K and V of these blocks, as bytes, on the host."""
    index = torch.tensor(ids, device="cuda")
    return torch.stack([layer.view(torch.uint8).index_select(1, index) for layer in layers]).cpu()


def scribble(torch: Any, layers: List[Any], ids: List[int]) -> None:
    for layer in layers:
        raw = layer.view(torch.uint8)
        raw[:, ids] = torch.randint(0, 256, raw[:, ids].shape, dtype=torch.uint8, device="cuda")


def round_trip(torch: Any, kv: Any, layers: List[Any], src: List[int], dst: List[int]) -> None:
    seq = tokens(len(src) * BLOCK)
    torch.cuda.synchronize()  # the node's copies do not wait for this process's streams
    assert kv.store(seq, src) == len(seq)
    want = blocks(torch, layers, src)
    scribble(torch, layers, src + dst)
    torch.cuda.synchronize()
    assert kv.load(seq, dst) == len(seq)
    assert torch.equal(blocks(torch, layers, dst), want)


# ---- tests --------------------------------------------------------------------------------------

def test_device_pool_round_trip_of_torch_layers(gpu_cluster):
    torch = need_torch()
    with kvnode.connect(gpu_cluster.a.socket) as client:
        assert client.info["memory"] == "device"
        layers = random_layers(torch, torch.float16)
        with client.register_kv_cache(layers, BLOCK) as kv:
            assert kv.device == "cuda"
            round_trip(torch, kv, layers, [5, 17, 2, 30], [9, 0, 21, 14])
            round_trip(torch, kv, layers, [1], [3])


def test_bf16_layers_in_one_allocation(gpu_cluster):
    torch = need_torch()
    whole = torch.empty((LAYERS, 2, BLOCKS, BLOCK, HEADS, HEAD_SIZE), dtype=torch.bfloat16,
                        device="cuda")
    whole.view(torch.uint8).random_(0, 256)
    layers = list(whole.unbind(0))
    with kvnode.connect(gpu_cluster.a.socket) as client, \
            client.register_kv_cache(layers, BLOCK, layout="vllm") as kv:
        assert kv.dtype == "bfloat16"
        round_trip(torch, kv, layers, [4, 8, 15], [16, 23, 31])


def test_load_with_retrieve_from_the_other_device_node(gpu_cluster):
    torch = need_torch()
    at_a = kvnode.connect(gpu_cluster.a.socket)
    at_b = kvnode.connect(gpu_cluster.b.socket)
    try:
        layers_a = random_layers(torch, torch.float16, seed=2)
        layers_b = random_layers(torch, torch.float16, seed=3)
        kv_a = at_a.register_kv_cache(layers_a, BLOCK)
        kv_b = at_b.register_kv_cache(layers_b, BLOCK)
        seq = tokens(64)
        torch.cuda.synchronize()
        assert kv_a.store(seq, [1, 2, 3, 4]) == 64
        loaded, until = 0, time.monotonic() + 30
        while loaded < 64 and time.monotonic() < until:
            loaded = kv_b.load(seq, [10, 11, 12, 13], retrieve=True)
            if loaded < 64:
                time.sleep(0.1)
        assert loaded == 64
        assert torch.equal(blocks(torch, layers_b, [10, 11, 12, 13]),
                           blocks(torch, layers_a, [1, 2, 3, 4]))
    finally:
        at_a.close()
        at_b.close()


def test_cupy_arrays(gpu_cluster):
    need_torch()
    try:
        import cupy as cp
    except ImportError:
        skip("cupy is not installed")
    layers = [cp.random.randint(0, 256, (2, BLOCKS, BLOCK, HEADS, HEAD_SIZE * 2),
                                dtype=cp.uint8).view(cp.float16) for _ in range(LAYERS)]
    seq = tokens(32)
    with kvnode.connect(gpu_cluster.a.socket) as client, \
            client.register_kv_cache(layers, BLOCK) as kv:
        cp.cuda.Device().synchronize()
        assert kv.store(seq, [6, 7]) == 32
        want = [cp.asnumpy(layer[:, [6, 7]]).view("u1") for layer in layers]
        for layer in layers:
            layer[:, [6, 7, 20, 21]] = 0
        cp.cuda.Device().synchronize()
        assert kv.load(seq, [20, 21]) == 32
        for layer, w in zip(layers, want):
            assert (cp.asnumpy(layer[:, [20, 21]]).view("u1") == w).all()


class DLPackOnly:
    """An exporter with nothing but the DLPack protocol."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.tensor.__dlpack__()

    def __dlpack_device__(self) -> Any:
        return self.tensor.__dlpack_device__()


def test_a_dlpack_exporter(gpu_cluster):
    torch = need_torch()
    layers = random_layers(torch, torch.float16, seed=4)
    with kvnode.connect(gpu_cluster.a.socket) as client, \
            client.register_kv_cache([DLPackOnly(t) for t in layers], BLOCK) as kv:
        assert kv.device == "cuda" and kv.dtype == "float16"
        round_trip(torch, kv, layers, [3, 5], [7, 9])


def test_host_layers_into_a_device_pool(gpu_cluster):
    need_torch()
    import numpy as np

    whole = kvnode.host_array((LAYERS, 2, BLOCKS, BLOCK, HEADS, HEAD_SIZE), np.float16)
    raw = whole.view(np.uint8)
    raw[...] = np.random.default_rng(5).integers(0, 256, raw.shape, dtype=np.uint8)
    seq = tokens(32)
    with kvnode.connect(gpu_cluster.a.socket) as client, \
            client.register_kv_cache(list(whole), BLOCK) as kv:
        assert kv.store(seq, [2, 3]) == 32
        want = raw[:, :, [2, 3]].copy()
        raw[:, :, [2, 3, 12, 13]] = 0
        assert kv.load(seq, [12, 13]) == 32
        assert np.array_equal(raw[:, :, [12, 13]], want)


def test_vllm_packed_views_in_every_physical_order(gpu_cluster):
    """vLLM 0.33's CUDA KV: one int8 allocation, each layer a [B, H, N, 2D] view (K then V in
    the last axis) in one of its six physical orders, registered over IPC by its strides and
    gathered/scattered by the node's kernel; stored from the plain vLLM layout, loaded into the
    packed one, K and V compared with what was stored."""
    torch = need_torch()
    src = random_layers(torch, torch.float16, seed=7)  # [2, B, N, H, D] per layer
    size = {"L": LAYERS, "B": BLOCKS, "H": HEADS, "N": BLOCK, "C": 2 * HEAD_SIZE}
    with kvnode.connect(gpu_cluster.a.socket) as client, \
            client.register_kv_cache(src, BLOCK) as flat:
        seq = tokens(2 * BLOCK)
        torch.cuda.synchronize()
        assert flat.store(seq, [4, 11]) == len(seq)
        for order in ("LBNHC", "LBHNC", "BLNHC", "LHBNC", "BLHNC", "BHLNC"):
            raw = torch.zeros([size[d] for d in order], dtype=torch.float16, device="cuda")
            logical = raw.permute([order.index(d) for d in "LBHNC"])  # [L, B, H, N, C]
            views = [logical[i] for i in range(LAYERS)]
            with client.register_kv_cache(views, BLOCK, layout="packed") as kv:
                assert kv.load(seq, [20, 3]) == len(seq), order
            for layer in range(LAYERS):
                got = views[layer][[20, 3]].permute(0, 2, 1, 3)  # [2, N, H, 2D]
                want = src[layer][:, [4, 11]]  # [2(kv), 2, N, H, D]
                assert torch.equal(got[..., :HEAD_SIZE].view(torch.int16),
                                   want[0].view(torch.int16)), (order, layer, "K")
                assert torch.equal(got[..., HEAD_SIZE:].view(torch.int16),
                                   want[1].view(torch.int16)), (order, layer, "V")


def test_refusals(gpu_cluster):
    torch = need_torch()
    layers = random_layers(torch, torch.float16, n=2)
    with kvnode.connect(gpu_cluster.a.socket) as client:
        wide = torch.empty((2, BLOCKS, BLOCK, HEADS, HEAD_SIZE * 2), dtype=torch.float16,
                           device="cuda")
        expect_error(lambda: client.register_kv_cache([layers[0], wide[..., :HEAD_SIZE]], BLOCK),
                     ValueError, "layers[1]: not contiguous")
        host = kvnode.host_array((2, BLOCKS, BLOCK, HEADS, HEAD_SIZE), "float16")
        expect_error(lambda: client.register_kv_cache([layers[0], host], BLOCK), ValueError,
                     "layers[1]: on the host, but layers[0] is on cuda")
        settings = getattr(torch.cuda.memory, "_set_allocator_settings", None)
        if settings is None:
            return
        settings("expandable_segments:True")
        try:
            vmm = torch.zeros((2, BLOCKS, BLOCK, HEADS, HEAD_SIZE), dtype=torch.float16,
                              device="cuda")
            expect_error(lambda: client.register_kv_cache([vmm], BLOCK), ValueError,
                         "expandable_segments")
        finally:
            settings("expandable_segments:False")


def expect_error(call: Callable[[], Any], exc: type, words: str) -> None:
    try:
        call()
    except exc as e:
        assert words in str(e), f"{e!r} does not say {words!r}"
        return
    raise AssertionError(f"no {exc.__name__} saying {words!r}")


# ---- without pytest -----------------------------------------------------------------------------

def main() -> int:
    try:
        need_torch()
    except Skip as e:
        print(f"test_gpu: SKIPPED ({e})")
        return 0
    try:
        cluster = Cluster(Path(tempfile.mkdtemp(prefix="kvnode-gpu-logs-")),
                          ["--memory", "device"], prefix="pygpu")
    except Missing as e:
        print(f"test_gpu: {'FAIL' if e.named else 'SKIPPED'} ({e})")
        return 1 if e.named else 0
    failed = 0
    try:
        for name, test in sorted(globals().items()):
            if not name.startswith("test_") or not callable(test):
                continue
            try:
                test(cluster)
                print(f"{name}: PASS")
            except Skip as e:
                print(f"{name}: SKIPPED ({e})")
            except Exception:
                failed += 1
                print(f"{name}: FAIL\n{traceback.format_exc()}")
    finally:
        cluster.stop()
    print(f"test_gpu: {'FAIL' if failed else 'PASS'} ({failed} failed)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
