"""Fixtures of the LMCache suite: real LMCache 0.5.6 code against real kvnode binaries.

Two clusters, one per controller, built once per session and shared by the modules (each test
uses token ids of its own, `fresh_tokens`):

- `kvc`: kvcontroller + LMCache's LMCacheWorker W (a stub engine, in this process) + kvnodes A
  and B;
- `lmc`: LMCache's own controller (`lmcache_controller`) + W + kvnodes A and B, the same shape.

Binaries: $KVNODE_PATH, $KVCONTROLLER_PATH, $KVCTL_PATH (ctest sets them), else the build tree;
without them the tests fail (this suite runs only where the venv and the binaries were asked for).
Logs of every process land in pytest's temporary folder; a failed fixture shows their ends.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Type

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
os.environ.setdefault("LMCACHE_DISABLE_BANNER", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402

from lmc_procs import (PRELOADED, ControllerBase, KvController, LmcController,  # noqa: E402
                       LmcWorker, Node, import_lmcache, wait_for)


class Cluster:
    """A controller, kvnodes A and B, and LMCache's worker W, all registered; W's full sync ran
    to its end. `roles` maps each instance id to its role (A, B, W)."""

    def __init__(self, controller: ControllerBase, prefix: str, log_dir: Path,
                 preloaded_tokens: Optional[List[int]] = None) -> None:
        self.controller = controller
        self.nodes: Dict[str, Node] = {}
        self.worker: Optional[LmcWorker] = None
        try:
            # W first: its first heartbeat reaches the fresh controller before any full sync
            # completed, so the controller asks it for one (the preloaded chunks).
            self.worker = LmcWorker(f"{prefix}-W-{os.getpid()}", controller, preloaded_tokens)
            for role in ("A", "B"):
                self.nodes[role] = Node(f"{prefix}-{role}-{os.getpid()}", controller, log_dir)
            ids = {n.instance for n in self.nodes.values()} | {self.worker.instance}
            if not wait_for(lambda: all(controller.worker(i) for i in ids), 60, 0.2):
                raise RuntimeError(f"not all of {sorted(ids)} registered with {controller.kind}: "
                                   f"{controller.workers()}\n{self.logs()}")
            if not wait_for(self.worker.engine.synced, 90, 0.2):
                raise RuntimeError(f"W's full sync with {controller.kind} did not end: "
                                   f"freezes {self.worker.engine.freezes}\n{self.logs()}")
        except BaseException:
            self.stop()
            raise
        self.roles = {n.instance: role for role, n in self.nodes.items()}
        self.roles[self.worker.instance] = "W"

    @property
    def a(self) -> Node:
        return self.nodes["A"]

    @property
    def b(self) -> Node:
        return self.nodes["B"]

    @property
    def w(self) -> LmcWorker:
        assert self.worker is not None
        return self.worker

    def logs(self) -> str:
        parts = [f"--- {self.controller.kind}:\n{self.controller.log(2000)}"]
        for role, node in self.nodes.items():
            parts.append(f"--- kvnode {role}:\n{node.log(2000)}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Stops everything; raises when W failed to close or a kvnode or kvcontroller exited
        other than 0 on SIGTERM (an ASan or UBSan report ends it so)."""
        errors = []
        if self.worker is not None:
            try:
                self.worker.close()
            except Exception as e:  # keep stopping the processes
                errors.append(f"W: {e!r}")
        for role, node in self.nodes.items():
            code = node.stop()
            if code != 0:
                errors.append(f"kvnode {role} exited {code}:\n{node.log(3000)}")
        code = self.controller.stop()
        if code != 0 and isinstance(self.controller, KvController):
            errors.append(f"kvcontroller exited {code}:\n{self.controller.log(3000)}")
        if errors:
            raise RuntimeError("\n".join(errors))


def _cluster(kind: Type[ControllerBase], prefix: str, log_dir: Path,
             preloaded: Optional[List[int]] = None) -> Iterator[Cluster]:
    controller = kind(log_dir, wait=False)
    try:
        import_lmcache()  # while the controller starts: W registers at once then
        controller.wait_ready()
        cluster = Cluster(controller, prefix, log_dir, preloaded)
    except BaseException:
        controller.stop()
        raise
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kvc(tmp_path_factory) -> Iterator[Cluster]:
    # A reaper with a short timeout: W's and the nodes' heartbeats must keep them registered.
    log_dir = tmp_path_factory.mktemp("kvc-logs")
    yield from _cluster(lambda d, wait: KvController(d, ["--health-check-interval", "1",
                                                         "--lmcache-worker-timeout", "5"], wait),
                        "kvc", log_dir, PRELOADED)


@pytest.fixture(scope="session")
def lmc(tmp_path_factory) -> Iterator[Cluster]:
    log_dir = tmp_path_factory.mktemp("lmc-logs")
    yield from _cluster(LmcController, "lmc", log_dir, PRELOADED)


_next_token = [1_000_000]


@pytest.fixture
def fresh_tokens():
    """fresh_tokens(n): n token ids no other test used (chunks nobody holds yet)."""

    def make(n: int) -> List[int]:
        first = _next_token[0]
        _next_token[0] += n + 100_000
        return list(range(first, first + n))

    return make
