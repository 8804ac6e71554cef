"""What the Python package adds to a store: kvnode.KVCache.store against the same store through
the C API called from C, on one client and one cache in one process.

Starts a kvcontroller and a kvnode (host pool; chunks of --chunk-size tokens, LMCache's 256 by
default, of a small vLLM-layout cache: 2 layers, 1 KV head of 16 fp16, so a chunk is 32 KiB and
the copies stay small next to the call), registers a host KV cache through kvnode, builds
bench_overhead.c into a shared library that times `kvnode_kv_store` in a C loop, and times, for
a one-chunk and a 64-chunk store of the same tokens again and again (interleaved in rounds so
drift hits every path alike):

  C              kvnode_kv_store called from C (the C API over the C++ client)
  ctypes         the same function called through ctypes with prebuilt structs
  kvnode, numpy  KVCache.store(tokens, block_ids) with int64 / uint32 numpy arrays
  kvnode, list   KVCache.store with Python lists (converted on each call)

and prints the median microseconds per call of each, and kvnode's over C: the median over
rounds of (kvnode's median in the round - C's median in the same round). On a loaded machine
those differences are within the node's noise, so it then times the same four paths with
kvnode_kv_store replaced by a stub that returns at once: the Python side's own cost.

    PYTHONPATH=python python3 tests/python/bench_overhead.py [--rounds 40] [--per-round 25]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kvnode_procs import HEARTBEAT, ROOT, Controller, NodeProcess, wait_for  # noqa: E402

import kvnode  # noqa: E402
from kvnode import _lib  # noqa: E402

LAYERS, HEADS, HEAD_SIZE, BLOCK = 2, 1, 16, 16


def build_c_loop(out_dir: Path) -> ctypes.CDLL:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        sys.exit("bench_overhead: needs a C compiler")
    lib = Path(_lib.library()._name).resolve()
    so = out_dir / "bench_overhead.so"
    subprocess.run([cc, "-std=c99", "-O2", "-shared", "-fPIC", "-I", str(ROOT / "client/include"),
                    str(Path(__file__).with_suffix(".c")), "-o", str(so), str(lib),
                    f"-Wl,-rpath,{lib.parent}"], check=True)
    c = ctypes.CDLL(str(so))
    c.bench_store.restype = ctypes.c_int
    c.bench_store.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                              ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    c.bench_stub.restype = ctypes.c_double
    c.bench_stub.argtypes = c.bench_store.argtypes[:-1]
    c.stub_store.restype = ctypes.c_int
    c.stub_store.argtypes = _lib.library().kvnode_kv_store.argtypes
    return c


def store_when_ready(kv: kvnode.KVCache, tokens: List[int], blocks: List[int]) -> None:
    until = time.monotonic() + 30
    while True:
        try:
            kv.store(tokens, blocks)
            return
        except kvnode.Error as e:
            if e.status != "frozen" or time.monotonic() > until:
                raise
            time.sleep(0.05)


def measure(kv: kvnode.KVCache, c_loop: ctypes.CDLL, chunks: int, chunk_tokens: int,
            rounds: int, per_round: int) -> Dict[str, float]:
    n = chunks * chunk_tokens
    tokens_list = list(range(10_000_000 * chunks, 10_000_000 * chunks + n))
    blocks_list = list(range(n // BLOCK))
    tokens_np = np.array(tokens_list, dtype=np.int64)
    blocks_np = np.array(blocks_list, dtype=np.uint32)
    store_when_ready(kv, tokens_list, blocks_list)

    state = kv._state
    params = _lib.KvTransferParams(tokens=tokens_np.ctypes.data, num_tokens=n,
                                   block_ids=blocks_np.ctypes.data, num_block_ids=len(blocks_np))
    result, err = _lib.KvResult(field_mask=_lib.KV_RESULT_FIELD_TOKENS), _lib.ErrorStruct()
    p_params, p_result, p_err = (ctypes.pointer(x) for x in (params, result, err))
    store_fn = _lib.library().kvnode_kv_store
    c_times = np.zeros(per_round, dtype=np.float64)
    clock = time.perf_counter_ns

    def c_path() -> List[float]:
        got = c_loop.bench_store(state.handle, tokens_np.ctypes.data, n, blocks_np.ctypes.data,
                                 len(blocks_np), per_round, c_times.ctypes.data)
        if got != 0:
            sys.exit(f"bench_overhead: the C loop's store failed ({got})")
        return c_times.tolist()

    def ctypes_path() -> List[float]:
        out = []
        for _ in range(per_round):
            t0 = clock()
            code = store_fn(state.handle, p_params, p_result, p_err)
            out.append((clock() - t0) / 1e3)
            assert code == 0 and result.tokens == n, err.message
        return out

    def kvnode_path(tokens: object, blocks: object) -> List[float]:
        out = []
        for _ in range(per_round):
            t0 = clock()
            kv.store(tokens, blocks)
            out.append((clock() - t0) / 1e3)
        return out

    paths = {
        "C": c_path,
        "ctypes": ctypes_path,
        "kvnode, numpy": lambda: kvnode_path(tokens_np, blocks_np),
        "kvnode, list": lambda: kvnode_path(tokens_list, blocks_list),
    }
    times: Dict[str, List[float]] = {k: [] for k in paths}
    over: Dict[str, List[float]] = {k: [] for k in paths}  # per round: its median minus C's
    rng = random.Random(chunks)
    for r in range(rounds + 1):  # round 0 warms up
        order = list(paths)
        rng.shuffle(order)  # drift and order effects hit every path alike
        got = {name: paths[name]() for name in order}
        if r:
            for name, t in got.items():
                times[name] += t
                over[name].append(statistics.median(t) - statistics.median(got["C"]))
    out = {k: statistics.median(v) for k, v in times.items()}
    out.update({f"{k} - C": statistics.median(v) for k, v in over.items()})
    return out


def wrapper_cost(kv: kvnode.KVCache, c_loop: ctypes.CDLL, chunks: int, chunk_tokens: int,
                 iters: int) -> Dict[str, float]:
    """Microseconds per call with kvnode_kv_store replaced by a stub that returns at once: what
    the Python side itself costs, without the node's copies and their noise."""
    n = chunks * chunk_tokens
    tokens_list = list(range(n))
    blocks_list = list(range(n // BLOCK))
    tokens_np = np.array(tokens_list, dtype=np.int64)
    blocks_np = np.array(blocks_list, dtype=np.uint32)
    lib = _lib.library()
    real = lib.kvnode_kv_store
    state = kv._state
    params = _lib.KvTransferParams(tokens=tokens_np.ctypes.data, num_tokens=n,
                                   block_ids=blocks_np.ctypes.data, num_block_ids=len(blocks_np))
    result, err = _lib.KvResult(field_mask=_lib.KV_RESULT_FIELD_TOKENS), _lib.ErrorStruct()
    p_params, p_result, p_err = (ctypes.pointer(x) for x in (params, result, err))
    stub = c_loop.stub_store

    def per_call(fn) -> float:
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for _ in range(iters):
                fn()
            best = min(best, (time.perf_counter_ns() - t0) / 1e3 / iters)
        return best

    lib.kvnode_kv_store = stub  # KVCache.store looks it up on each call
    try:
        return {
            "C": c_loop.bench_stub(state.handle, tokens_np.ctypes.data, n, blocks_np.ctypes.data,
                                   len(blocks_np), iters * 10),
            "ctypes": per_call(lambda: stub(state.handle, p_params, p_result, p_err)),
            "kvnode, numpy": per_call(lambda: kv.store(tokens_np, blocks_np)),
            "kvnode, list": per_call(lambda: kv.store(tokens_list, blocks_list)),
        }
    finally:
        lib.kvnode_kv_store = real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunk-size", type=int, default=256, help="tokens per chunk")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--per-round", type=int, default=25)
    args = ap.parse_args()
    chunk_tokens = args.chunk_size
    if chunk_tokens % BLOCK:
        sys.exit(f"--chunk-size must be a multiple of {BLOCK}")
    chunk_bytes = 2 * LAYERS * chunk_tokens * HEADS * HEAD_SIZE * 2
    num_blocks = 64 * chunk_tokens // BLOCK
    work = Path(tempfile.mkdtemp(prefix="kvnode-bench-"))
    ctl = Controller(work, chunk_tokens)
    node = NodeProcess("bench", ctl, work, gigabytes="0.05", chunk_bytes=chunk_bytes,
                       chunk_tokens=chunk_tokens)
    try:
        wait_for(lambda: ctl.settled(HEARTBEAT), 30, 0.1)
        c_loop = build_c_loop(work)
        whole = kvnode.host_array((LAYERS, 2, num_blocks, BLOCK, HEADS, HEAD_SIZE), np.float16)
        whole.view(np.uint8)[...] = 7
        with kvnode.connect(node.socket) as client, \
                client.register_kv_cache(list(whole), BLOCK) as kv:
            print(f"kvnode {kvnode.__version__}, python {sys.version.split()[0]}, numpy "
                  f"{np.__version__}; chunk {chunk_tokens} tokens = {chunk_bytes} bytes; medians "
                  f"of {args.rounds * args.per_round} stores each, us per call")
            print(f"{'store':>10} | {'C':>8} | {'ctypes':>8} | {'kvnode, numpy':>13} | "
                  f"{'kvnode, list':>12} | {'numpy - C':>9} | {'list - C':>8}")
            for chunks in (1, 64):
                m = measure(kv, c_loop, chunks, chunk_tokens, args.rounds, args.per_round)
                print(f"{chunks:>3} chunks | {m['C']:8.1f} | {m['ctypes']:8.1f} | "
                      f"{m['kvnode, numpy']:13.1f} | {m['kvnode, list']:12.1f} | "
                      f"{m['kvnode, numpy - C']:9.1f} | {m['kvnode, list - C']:8.1f}")
            print("the Python side alone (kvnode_kv_store replaced by a stub that returns at "
                  "once; best of 5 runs), us per call")
            for chunks in (1, 64):
                w = wrapper_cost(kv, c_loop, chunks, chunk_tokens, 2000 if chunks == 1 else 200)
                print(f"{chunks:>3} chunks | {w['C']:8.2f} | {w['ctypes']:8.2f} | "
                      f"{w['kvnode, numpy']:13.2f} | {w['kvnode, list']:12.2f} | "
                      f"{w['kvnode, numpy'] - w['C']:9.2f} | {w['kvnode, list'] - w['C']:8.2f}")
    finally:
        node.stop()
        ctl.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
