"""The SGLang backend's test rig (its tests and bench/sglang): SGLang 0.5.23's real host KV pools
on the CPU, its storage factory, and real kvcontroller and kvnode processes
(tests/python/kvnode_procs.py) whose chunk is one SGLang page.

The geometry: pages of 16 tokens, bf16. MHA: 4 layers x 2 KV heads x 64, a page is
2 x 4 x 16 x 2 x 64 x 2 = 32 KiB; MLA: 4 layers x 256 (kv_lora_rank 192 + rope 64), also 32 KiB,
so one cluster serves both. SGLang's pools import ``sglang.srt.configs``, which imports
torchvision; the venv has none (PyPI's is a CUDA build), so a stub stands in during the imports.
"""

from __future__ import annotations

import contextlib
import enum
import importlib.machinery
import importlib.util
import os
import sys
import time
import types
from pathlib import Path
from typing import Any, Iterator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0] / "python"))  # kvnode_procs

os.environ.setdefault("SGLANG_LOG_LEVEL", "warning")


@contextlib.contextmanager
def torchvision_stub() -> Iterator[None]:
    """torchvision.transforms for SGLang's module-level imports only; transformers' "is it
    installed" answer is cached as no first, and the stub is gone afterwards."""
    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        yield
        return
    from transformers.utils import import_utils

    assert not import_utils.is_torchvision_available()  # cached: False from now on
    names = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")
    mods = {n: types.ModuleType(n) for n in names}
    modes = enum.Enum("InterpolationMode",
                      "NEAREST NEAREST_EXACT BILINEAR BICUBIC BOX HAMMING LANCZOS")
    for name, mod in mods.items():
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        mod.__path__ = []
        mod.InterpolationMode = modes
    mods["torchvision"].transforms = mods["torchvision.transforms"]
    mods["torchvision.transforms"].functional = mods["torchvision.transforms.functional"]
    sys.modules.update(mods)
    try:
        yield
    finally:
        for name in names:
            sys.modules.pop(name, None)


with torchvision_stub():
    import torch
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

import kvnode  # noqa: E402
import numpy as np  # noqa: E402
import kvnode_procs as procs  # noqa: E402
from kvnode_procs import Missing, NodeProcess  # noqa: E402

PAGE, LAYERS, HEADS, HEAD_DIM = 16, 4, 2, 64
KV_LORA, ROPE = 192, 64
DTYPE = torch.bfloat16
PAGE_BYTES = 2 * LAYERS * PAGE * HEADS * HEAD_DIM * 2
assert PAGE_BYTES == LAYERS * PAGE * (KV_LORA + ROPE) * 2
MHA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct")


def host_pool(mla: bool, layout: str, pages: int = 32) -> Any:
    """A real SGLang host pool on the CPU holding `pages` pages (and SGLang's padding page),
    filled with random bits."""
    device_tokens = pages * PAGE // 2  # host_to_device_ratio 2
    common = dict(device="cpu", enable_memory_saver=False, start_layer=0, end_layer=LAYERS)
    with host_memory_budget_scope(1 << 30):
        if mla:
            dev = MLATokenToKVPool(device_tokens, PAGE, DTYPE, kv_lora_rank=KV_LORA,
                                   qk_rope_head_dim=ROPE, layer_num=LAYERS, **common)
            pool = MLATokenToKVPoolHost(
                dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE, layout,
                pin_memory=False, device="cpu", device_capacity_tokens=dev.size,
                start_layer=0, end_layer=LAYERS, target_layer_num=dev.layer_num,
                override_kv_cache_dim=dev.kv_cache_dim)
        else:
            dev = MHATokenToKVPool(device_tokens, PAGE, DTYPE, head_num=HEADS,
                                   head_dim=HEAD_DIM, layer_num=LAYERS, **common)
            pool = MHATokenToKVPoolHost(
                dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE, layout,
                pin_memory=False, device="cpu", device_capacity_tokens=dev.size,
                start_layer=0, end_layer=LAYERS)
    bits = pool.kv_buffer.view(torch.int16)
    bits.copy_(torch.randint(-32768, 32767, bits.shape, dtype=torch.int16))
    return pool


def page_of(pool: Any, start: int) -> Any:
    """The page starting at slot `start` in one order for every layout: MHA [2, L, page, H, D],
    MLA [L, page, 1, C] (a copy)."""
    kv, n = pool.kv_buffer, PAGE
    if isinstance(pool, MLATokenToKVPoolHost):
        if pool.layout == "layer_first":
            return kv[:, start:start + n].clone()
        if pool.layout == "page_first":
            return kv[start:start + n].permute(1, 0, 2, 3).clone()
        return kv[start // n].clone()
    if pool.layout == "layer_first":
        return kv[:, :, start:start + n].clone()
    if pool.layout == "page_first":
        return kv[:, start:start + n].permute(0, 2, 1, 3, 4).clone()
    if pool.layout == "page_first_direct":
        return kv[:, start // n].clone()
    return kv[:, start // n].permute(0, 3, 2, 1, 4).clone()  # page_head [2, H, page, L, D]


def same_pages(a: Any, a_idx: Any, b: Any, b_idx: Any) -> int:
    """Pages that differ between pool a's pages at slots a_idx and b's at b_idx (bits)."""
    bad = 0
    for i in range(0, len(a_idx), PAGE):
        x = page_of(a, int(a_idx[i])).view(torch.int16)
        y = page_of(b, int(b_idx[i])).view(torch.int16)
        bad += not torch.equal(x, y)
    return bad


def storage_config(mla: bool, model: str = "model-a", tp_rank: int = 0, tp_size: int = 1,
                   **extra: Any) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=False, is_page_first_layout=False,
        model_name=model,
        extra_config={"backend_name": "kvnode", "module_path": "kvnode.sglang",
                      "class_name": "KvnodeHiCacheStorage", "interface_v1": 1, **extra})


def backend(node: Any, pool: Any, **kw: Any) -> Any:
    """The backend as SGLang's HiCacheController makes it: the real factory, then the pool."""
    mla = isinstance(pool, MLATokenToKVPoolHost)
    socket = node if isinstance(node, str) else node.socket
    kw.setdefault("retry_s", 0.2)
    extra = {k: kw.pop(k) for k in list(kw) if k in ("timeout_s", "peers", "retry_s", "zero_copy")}
    cfg = storage_config(mla, node=socket, **extra, **kw)
    b = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    b.register_mem_pool_host(pool)
    return b


def keys_for(n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [bytes(rng.integers(0, 256, 32, dtype=np.uint8)).hex() for _ in range(n)]


def ready(node: NodeProcess, page: int = PAGE, page_bytes: int = PAGE_BYTES) -> None:
    """Waits out the node's full sync: one chunk of its own stored while it answers "frozen"
    (from a one-layer, one-head cache whose chunk is the node's page)."""
    with kvnode.connect(node.socket) as client:
        layer = kvnode.host_array((2, 1, page, 1, page_bytes // (4 * page)), np.uint16)
        with client.register_kv_cache([layer], page) as kv:
            until = time.monotonic() + 30
            while True:
                try:
                    assert kv.store_chunks([-(2**62) + os.getpid()], [0]) == 1
                    return
                except kvnode.Error as e:
                    if e.status != "frozen" or time.monotonic() > until:
                        raise
                    time.sleep(0.05)


class Cluster(procs.Cluster):
    """kvcontroller and nodes A and B whose chunk is one page, past their full syncs;
    start(name) adds a node (another page size: chunk_bytes)."""

    def __init__(self, log_dir: Path) -> None:
        super().__init__(log_dir, prefix="sgl", chunk_bytes=PAGE_BYTES, chunk_tokens=PAGE,
                         ready=ready)
