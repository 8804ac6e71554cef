#!/usr/bin/env python3
"""The SGLang backend's costs, side by side with their ceiling in one run.

Run with the vllm venv (tools/ci/test-venv.sh vllm: it holds SGLang 0.5.23) after
`./dev.sh build`:

    python bench/sglang/hicache_bench.py [--reps 7] [--page 16] [--layout page_first] [--json]

Starts kvcontroller and a kvnode (build/bin) on loopback whose chunk is one page, builds SGLang's
real MHATokenToKVPoolHost on the CPU in Llama-3.1-8B's per-rank shape (32 layers, 8 KV heads of
128, bf16), the backend through SGLang's factory, and measures for 128-page batches (SGLang's
STORAGE_BATCH_SIZE):

  set      batch_set_v1 of 128 pages not yet stored, GB/s: the default path, zero-copy (the node
           reads the host pool with process_vm_readv; page_head bounces), and through the bounce
           buffer (set_bounce), whose two
           parts are also timed alone: the gather into it (torch) and the node's store from it
  get      batch_get_v1 of 128 stored pages into other pages, both ways (every byte compared)
  memcpy   one numpy.copyto of as many bytes between two buffers (the ceiling; goal >= 0.7x)
  exists   batch_exists of 128 keys the node holds, p50 and p99 (goal <= 200 us)

Medians over --reps; 2 noisy cores: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "tests/python"), str(ROOT / "tests/sglang")]

import sglang_rig as sgl  # noqa: E402  (SGLang's imports behind the torchvision stub)
import numpy as np  # noqa: E402
import torch  # noqa: E402
from kvnode_procs import HEARTBEAT, Controller, NodeProcess, wait_for  # noqa: E402

LAYERS, HEADS, HEAD_DIM = 32, 8, 128
BATCH = 128


def host_pool(page: int, layout: str, pages: int):
    """MHATokenToKVPoolHost in Llama-3.1-8B's per-rank shape, random bits."""
    with sgl.host_memory_budget_scope(64 << 30):
        dev = sgl.MHATokenToKVPool(pages * page // 2, page, torch.bfloat16, head_num=HEADS,
                                   head_dim=HEAD_DIM, layer_num=LAYERS, device="cpu",
                                   enable_memory_saver=False, start_layer=0, end_layer=LAYERS)
        pool = sgl.MHATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, page,
                                        layout, pin_memory=False, device="cpu",
                                        device_capacity_tokens=dev.size, start_layer=0,
                                        end_layer=LAYERS)
    del dev
    bits = pool.kv_buffer.view(torch.int16)
    bits.random_(-32768, 32767)
    return pool


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--page", type=int, default=16, help="tokens per page (default 16)")
    ap.add_argument("--layout", default="page_first", choices=sgl.MHA_LAYOUTS)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads (0: keep)")
    args = ap.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    page_bytes = 2 * LAYERS * args.page * HEADS * HEAD_DIM * 2
    batch_bytes = BATCH * page_bytes
    logs = Path(tempfile.mkdtemp(prefix="kvnode-sglang-bench-"))
    controller = Controller(logs, chunk_tokens=args.page)
    gib = 2 * (args.reps + 2) * batch_bytes / 2**30 + 0.5
    node = NodeProcess("sgl-bench", controller, logs, chunk_bytes=page_bytes,
                       chunk_tokens=args.page, gigabytes=f"{gib:.2f}")
    try:
        wait_for(lambda: controller.settled(HEARTBEAT), 60, 0.1)
        sgl.ready(node, args.page, page_bytes)
        pool = host_pool(args.page, args.layout, 2 * BATCH)
        backends = {"direct": sgl.backend(node, pool, timeout_s=60.0, peers=False),
                    "bounce": sgl.backend(node, pool, timeout_s=60.0, peers=False,
                                          zero_copy=False)}
        src_idx = pool.alloc(BATCH * args.page)
        dst_idx = pool.alloc(BATCH * args.page)
        a = np.empty(batch_bytes, np.uint8)
        a[:] = 7
        c = np.empty_like(a)
        rows = {k: [] for k in ("memcpy", "set", "get", "set_bounce", "get_bounce", "gather",
                                "node_store")}
        b = backends["bounce"]
        ids = b._page_ids(src_idx, BATCH)
        dst_pages = b._page_ids(dst_idx, BATCH)
        for rep in range(args.reps):
            for mode, be in backends.items():
                suffix = "" if mode == "direct" else "_bounce"
                keys = sgl.keys_for(BATCH, seed=1000 + rep + 100 * (mode == "bounce"))
                t, ok = timed(lambda: be.batch_set_v1(keys, src_idx))
                assert ok == [True] * BATCH, ok.count(True)
                # The default path is zero-copy but for page_head, which always bounces.
                direct = mode == "direct" and args.layout != "page_head"
                assert (be.set_path.direct is not None) == direct, mode
                rows["set" + suffix].append(t)
                b.pool_chunks.index_fill_(0, dst_pages, 0)  # nothing left from the last rep
                t, ok = timed(lambda: be.batch_get_v1(keys, dst_idx))
                assert ok == [True] * BATCH, ok.count(True)
                rows["get" + suffix].append(t)
                assert sgl.same_pages(pool, src_idx, pool, dst_idx) == 0, "a page came back wrong"
            rows["memcpy"].append(timed(lambda: np.copyto(c, a))[0])
            path = b.set_path  # the bounce set path's two parts, on fresh keys
            fresh = b._hashes(sgl.keys_for(BATCH, seed=5000 + rep))
            rows["gather"].append(timed(lambda: path.bounce.gather(b.pool_chunks, ids))[0])
            t, got = timed(lambda: path.cache.store_chunks(
                fresh, np.arange(BATCH, dtype=np.uint32)))
            assert got == BATCH
            rows["node_store"].append(t)
        keys = sgl.keys_for(BATCH, seed=1000 + args.reps - 1)  # the last direct set: held
        lat = []
        for _ in range(2000):
            t, n = timed(lambda: b.batch_exists(keys))
            assert n == BATCH
            lat.append(t)
        lat.sort()
        for be in backends.values():
            be.close()
    finally:
        node.stop()
        controller.stop()
    med = {k: statistics.median(v) for k, v in rows.items()}
    gbs = {k: batch_bytes / v / 1e9 for k, v in med.items()}
    result = {
        "page_bytes": page_bytes, "batch_bytes": batch_bytes, "layout": args.layout,
        "gbps": gbs,
        "ratio_to_memcpy": {k: gbs[k] / gbs["memcpy"] for k in gbs},
        "exists_p50_us": lat[len(lat) // 2] * 1e6, "exists_p99_us": lat[len(lat) * 99 // 100] * 1e6,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"128 pages of {page_bytes >> 10} KiB ({batch_bytes >> 20} MiB), {args.layout}, "
              f"medians of {args.reps}:")
        for k in ("memcpy", "set", "get", "set_bounce", "get_bounce", "gather", "node_store"):
            print(f"  {k:<11} {gbs[k]:6.2f} GB/s  {gbs[k] / gbs['memcpy']:.2f}x memcpy")
        print(f"  batch_exists(128): p50 {result['exists_p50_us']:.0f} us, "
              f"p99 {result['exists_p99_us']:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
