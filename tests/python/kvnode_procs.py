"""Real kvcontroller and kvnode processes for the Python package's tests, without pytest (so the
GPU test also runs as a plain script where pytest is missing).

`Cluster` is a kvcontroller and two kvnode processes on loopback (UCX over tcp on lo), each node
with a 256 KiB page of 16 tokens, the shape every test cache is cut to (kv_shapes.py), both past
their full syncs. `NodeProcess` starts one node. Binaries come from $KVNODE_PATH and
$KVCONTROLLER_PATH, else the build tree; `Missing` says which is not there.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[2]
try:
    import kvnode  # noqa: F401  (PYTHONPATH, or installed)
except ImportError:
    sys.path.insert(0, str(ROOT / "python"))
    import kvnode  # noqa: F401


class Missing(Exception):
    """A binary is not there: `named` when the environment named it (a failure), else a skip."""

    def __init__(self, message: str, named: bool) -> None:
        super().__init__(message)
        self.named = named


PAGE_BYTES = 262144  # --chunk-bytes
CHUNK_TOKENS = 16  # --chunk-size, the controller's too
HEARTBEAT = 0.5  # seconds between a node's heartbeats


def binary(env: str, default: Path) -> str:
    """The binary $env names, or the build tree's; Missing when neither is there."""
    path = os.environ.get(env)
    if path:
        if not os.access(path, os.X_OK):
            raise Missing(f"${env}={path} is not an executable", True)
        return path
    if not os.access(default, os.X_OK):
        raise Missing(f"{default} is not built (or set ${env})", False)
    return str(default)


def free_ports(n: int) -> List[int]:
    """`n` distinct ports the kernel just had free on 127.0.0.1."""
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def wait_for(predicate, timeout: float, period: float = 0.05) -> bool:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if predicate():
            return True
        time.sleep(period)
    return predicate()


class Process:
    """A child process whose output goes to a log file; stopped (TERM, then KILL) by stop()."""

    def __init__(self, args: List[str], log: Path) -> None:
        self.args = args
        self.log_path = log
        self._log = open(log, "wb")
        # LD_PRELOAD is this python's (the ASan runtime under a Sanitize build), not the node's.
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)

    def running(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        if self.running():
            self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.running():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class Controller(Process):
    def __init__(self, log_dir: Path, chunk_tokens: int = CHUNK_TOKENS) -> None:
        self.http, self.pull, self.reply, heartbeat = free_ports(4)
        ports = {"pull": self.pull, "reply": self.reply, "heartbeat": heartbeat}
        super().__init__(
            [binary("KVCONTROLLER_PATH", ROOT / "build/bin/kvcontroller"), "--host", "127.0.0.1",
             "--port", str(self.http), "--monitor-ports", json.dumps(ports), "--chunk-size",
             str(chunk_tokens), "--log-level", "warn"],
            log_dir / "kvcontroller.log",
        )

        def listening() -> bool:
            if not self.running():
                return True
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.pull)) == 0

        if not wait_for(listening, 15) or not self.running():
            raise RuntimeError(f"kvcontroller did not start: {self.log()}")

    def full_syncs(self) -> Tuple[int, int]:
        """(workers syncing now, workers whose full sync completed), from /metrics. A fresh
        controller asks the workers that heartbeat before the first sync completes for a full
        sync; a node refuses stores as "frozen" while it syncs."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return (0, 0)

        def gauge(name: str) -> int:
            m = re.search(rf"^lmcache:cache_controller_full_sync_{name}\S* (\S+)$", text,
                          re.MULTILINE)
            return int(float(m.group(1))) if m else 0

        return gauge("workers_syncing"), gauge("workers_completed")

    def settled(self, heartbeat: float) -> bool:
        """True once a full sync completed and none ran for two heartbeats."""
        syncing, completed = self.full_syncs()
        if syncing or not completed:
            return False
        time.sleep(2 * heartbeat)
        return self.full_syncs()[0] == 0


class NodeProcess(Process):
    """A kvnode process registered with `controller`; its local socket is `socket`."""

    def __init__(self, name: str, controller: Controller, log_dir: Path,
                 extra: Optional[List[str]] = None, gigabytes: str = "0.05",
                 chunk_bytes: int = PAGE_BYTES, chunk_tokens: int = CHUNK_TOKENS) -> None:
        self.instance = f"{name}-{os.getpid()}"
        self.socket = f"/tmp/kvnode-py-{self.instance}.sock"
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        worker, p2p = free_ports(2)
        super().__init__(
            [binary("KVNODE_PATH", ROOT / "build/bin/kvnode"),
             "--instance-id", self.instance,
             "--controller-pull-url", f"127.0.0.1:{controller.pull}",
             "--controller-reply-url", f"127.0.0.1:{controller.reply}",
             "--worker-ports", str(worker), "--p2p-host", "127.0.0.1",
             "--p2p-init-ports", str(p2p),
             "--chunk-bytes", str(chunk_bytes), "--chunk-size", str(chunk_tokens),
             "--max-local-cpu-size", gigabytes,
             "--heartbeat-time", str(HEARTBEAT), "--full-sync-startup-delay", "0",
             "--http-port", "-1", "--local-socket", self.socket, "--local-staging-mb", "1",
             "--ucx-tls", "tcp", "--ucx-net-devices", "lo"] + (extra or []),
            log_dir / f"{name}.log",
        )
        if not wait_for(lambda: os.path.exists(self.socket) or not self.running(), 30) \
                or not self.running():
            raise RuntimeError(f"kvnode {name} did not start: {self.log()}")

    def stop(self) -> None:
        super().stop()
        if os.path.exists(self.socket):
            os.unlink(self.socket)


def wait_unfrozen(node: NodeProcess) -> None:
    """Waits out the node's freeze: a store of one chunk, asked again while the node answers
    "frozen" (under tokens of its own, far from every test's)."""
    from kv_shapes import Shape, make_layers

    with kvnode.connect(node.socket) as client:
        layers, _ = make_layers(Shape("vllm", num_blocks=1))
        with client.register_kv_cache(layers, 16) as kv:
            tokens = list(range(900_000_000, 900_000_000 + CHUNK_TOKENS))
            until = time.monotonic() + 30
            while True:
                try:
                    assert kv.store(tokens, [0]) == CHUNK_TOKENS
                    return
                except kvnode.Error as e:
                    if e.status != "frozen" or time.monotonic() > until:
                        raise
                    time.sleep(0.05)


class Cluster:
    """A controller and nodes A and B; `extra` flags for both nodes (e.g. --memory device), pages
    of `chunk_bytes` and `chunk_tokens`; `ready(node)` waits out each node's full sync (the
    engine suites store a chunk of their own shape)."""

    def __init__(self, log_dir: Path, extra: Optional[List[str]] = None,
                 prefix: str = "py", chunk_bytes: int = PAGE_BYTES,
                 chunk_tokens: int = CHUNK_TOKENS,
                 ready: Callable[[NodeProcess], None] = wait_unfrozen) -> None:
        self.log_dir, self.extra, self.prefix = log_dir, extra, prefix
        self.chunk_bytes, self.chunk_tokens = chunk_bytes, chunk_tokens
        self.controller = Controller(log_dir, chunk_tokens=chunk_tokens)
        self.nodes: Dict[str, NodeProcess] = {}
        try:
            for name in ("A", "B"):
                self.start(name)
            if not wait_for(lambda: self.controller.settled(HEARTBEAT), 30, 0.1):
                raise RuntimeError(f"the nodes' full syncs did not complete: {self.a.log()}")
            for node in self.nodes.values():
                ready(node)
        except BaseException:
            self.stop()
            raise

    def start(self, name: str, chunk_bytes: Optional[int] = None) -> NodeProcess:
        """One more node of this cluster (another page size: `chunk_bytes`)."""
        node = NodeProcess(f"{self.prefix}-{name}", self.controller, self.log_dir, self.extra,
                           chunk_bytes=chunk_bytes or self.chunk_bytes,
                           chunk_tokens=self.chunk_tokens)
        self.nodes[name] = node
        return node

    @property
    def a(self) -> NodeProcess:
        return self.nodes["A"]

    @property
    def b(self) -> NodeProcess:
        return self.nodes["B"]

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()
        self.controller.stop()


