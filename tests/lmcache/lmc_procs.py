"""Real peers for the LMCache suite: kvcontroller, LMCache 0.5.6's own controller
(`python -m lmcache.v1.api_server`, what the `lmcache_controller` entry point runs), kvnode
processes, kvctl, and LMCache's `LMCacheWorker` over a stub engine in this process.

Binaries come from $KVNODE_PATH, $KVCONTROLLER_PATH and $KVCTL_PATH (the CMake registration sets
them), else the build tree (build-sanitize/bin, then build/bin). Every process started here is
stopped and reaped by its owner's stop() (TERM, then KILL after a bounded wait), and killed by
the kernel should this process die first; every wait is bounded; every port comes from the
kernel (bind port 0); sockets and logs live in the test's temporary folder.

Chunks are LMCache's: 256 tokens (the size LMCache's controller hashes /lookup tokens with), but
small pages (64 KiB) so a test's chunks cost little memory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[2]
CHUNK_TOKENS = 256  # LMCache's chunk_size; its controller's /lookup hashes with 256
PAGE_BYTES = 65536  # kvnode --chunk-bytes
NODE_HEARTBEAT = 0.5  # kvnode --heartbeat-time (seconds)
WORKER_HEARTBEAT = 1  # LMCache's lmcache_worker_heartbeat_time (an int, seconds)
LOCATION = "LocalCPUBackend"
# Tokens whose 3 chunks each cluster's LMCache worker holds before it registers (its full sync
# reports them); tests take other token ids (conftest's fresh_tokens).
PRELOADED = list(range(50_000_000, 50_000_000 + 3 * CHUNK_TOKENS))
START_TIMEOUT = 90.0  # an LMCache process imports torch (~7 s alone, more on a busy machine)


class Missing(Exception):
    """A binary is not there."""


def binary(env: str, name: str) -> str:
    path = os.environ.get(env)
    if path:
        if not os.access(path, os.X_OK):
            raise Missing(f"${env}={path} is not an executable")
        return path
    for build in ("build-sanitize", "build"):
        candidate = ROOT / build / "bin" / name
        if os.access(candidate, os.X_OK):
            return str(candidate)
    raise Missing(f"{name} is not built (set ${env})")


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


def wait_for(predicate: Callable[[], Any], timeout: float, period: float = 0.1) -> Any:
    """predicate()'s first truthy value within `timeout` seconds, else its last (falsy) one."""
    until = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= until:
            return value
        time.sleep(period)


def lmcache_env() -> Dict[str, str]:
    """This environment for a child: LMCache quiet and offline, no inherited preload."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(LMCACHE_TRACK_USAGE="false", LMCACHE_DISABLE_BANNER="1",
               PYTHONDONTWRITEBYTECODE="1")
    return env


# A child gets SIGKILL when this process dies (pytest killed by ctest's timeout, say), so none
# is left behind holding its ports. setpriv (util-linux) sets that and execs the child.
_PDEATHSIG = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []


class Process:
    """A child whose output goes to a log file; stop() ends and reaps it (TERM, then KILL).
    Start it from the main thread: the kernel kills it when the thread that started it ends."""

    def __init__(self, args: List[str], log: Path) -> None:
        self.args = args
        self.log_path = log
        self._log = open(log, "wb")
        try:
            self.proc = subprocess.Popen(_PDEATHSIG + args, stdout=self._log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=lmcache_env())
        except BaseException:
            self._log.close()
            raise

    def running(self) -> bool:
        return self.proc.poll() is None

    def log(self, tail: int = 4000) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-tail:]

    def stop(self, grace: float = 15.0) -> Optional[int]:
        """Ends the process; returns its exit code (negative: the signal that ended it)."""
        if self.running():
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        else:
            self.proc.wait(10)
        if not self._log.closed:
            self._log.close()
        return self.proc.returncode


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


# ---- HTTP ----------------------------------------------------------------------------------------

def http(method: str, url: str, body: Optional[dict] = None,
         timeout: float = 30.0) -> Tuple[int, Any]:
    """(status, parsed JSON body, or the raw text when it is not JSON)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


# ---- controllers ---------------------------------------------------------------------------------

class ControllerBase(Process):
    """A controller on 127.0.0.1: HTTP `http`, ZMQ `pull`, `reply`, `heartbeat`."""

    kind = "controller"

    def __init__(self, args: List[str], log: Path, ports: Tuple[int, int, int, int],
                 timeout: float, wait: bool) -> None:
        self.http_port, self.pull, self.reply, self.heartbeat = ports
        self.start_timeout = timeout
        super().__init__(args, log)
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Returns once the HTTP and ZMQ ports listen; else stops the process and raises."""
        up = wait_for(lambda: not self.running() or (
            port_open(self.http_port) and port_open(self.pull) and port_open(self.reply)),
            self.start_timeout, 0.2)
        if not up or not self.running():
            log_text = self.log()
            self.stop()
            raise RuntimeError(f"{self.kind} did not start within {self.start_timeout} s: "
                               f"{log_text}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def get(self, path: str, timeout: float = 30.0) -> Tuple[int, Any]:
        return http("GET", self.url + path, timeout=timeout)

    def post(self, path: str, body: dict, timeout: float = 60.0) -> Tuple[int, Any]:
        return http("POST", self.url + path, body, timeout)

    def workers(self) -> List[dict]:
        status, body = self.get("/controller/workers")
        assert status == 200, f"{self.kind} /controller/workers: {status} {body}"
        return body["workers"]

    def worker(self, instance_id: str, worker_id: int = 0) -> Optional[dict]:
        """One worker's listing, None when it is not registered. (Asked by instance and worker:
        LMCache's answer to the plain /controller/workers comes from a list cached for 30 s.)"""
        status, body = self.get(f"/controller/workers?instance_id={instance_id}"
                                f"&worker_id={worker_id}")
        if status == 404:
            return None
        assert status == 200, f"{self.kind} /controller/workers: {status} {body}"
        return body

    def key_count(self, instance_id: str) -> Optional[int]:
        """The instance's keys in the registry (/controller/key-stats; both controllers)."""
        status, body = self.get("/controller/key-stats")
        assert status == 200, f"{self.kind} /controller/key-stats: {status} {body}"
        for i in body["instances"]:
            if i["instance_id"] == instance_id:
                return i["key_count"]
        return None


def monitor_ports(pull: int, reply: int, heartbeat: int) -> str:
    return json.dumps({"pull": pull, "reply": reply, "heartbeat": heartbeat})


class KvController(ControllerBase):
    kind = "kvcontroller"

    def __init__(self, log_dir: Path, extra: Optional[List[str]] = None, wait: bool = True,
                 ports: Optional[List[int]] = None) -> None:
        ports = ports or free_ports(4)
        self.extra = extra or []
        super().__init__(
            [binary("KVCONTROLLER_PATH", "kvcontroller"), "--host", "127.0.0.1",
             "--port", str(ports[0]), "--monitor-ports", monitor_ports(*ports[1:]),
             "--chunk-size", str(CHUNK_TOKENS), "--log-level", "info"] + self.extra,
            log_dir / f"kvcontroller-{ports[0]}.log", tuple(ports), 30.0, wait)


class LmcController(ControllerBase):
    """LMCache 0.5.6's controller, as `lmcache_controller` starts it (its module's main())."""

    kind = "lmcache_controller"

    def __init__(self, log_dir: Path, extra: Optional[List[str]] = None,
                 wait: bool = True) -> None:
        ports = free_ports(4)
        super().__init__(
            [sys.executable, "-m", "lmcache.v1.api_server", "--host", "127.0.0.1",
             "--port", str(ports[0]), "--monitor-ports", monitor_ports(*ports[1:])]
            + (extra or []),
            log_dir / "lmcache_controller.log", tuple(ports), START_TIMEOUT, wait)


# ---- kvnode and kvctl ----------------------------------------------------------------------------

class Node(Process):
    """A kvnode registered with `controller`; its local socket is `socket`, its transfer plane
    `peer_url` (the peer_init_url it registers)."""

    def __init__(self, instance: str, controller: ControllerBase, log_dir: Path,
                 extra: Optional[List[str]] = None, megabytes: int = 48) -> None:
        self.instance = instance
        # In the test's folder: kvnode leaves <socket>.lock behind (and, killed, the socket).
        self.socket = str(log_dir / f"{instance}.sock")
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        worker, p2p = free_ports(2)
        self.peer_url = f"127.0.0.1:{p2p}"
        super().__init__(
            [binary("KVNODE_PATH", "kvnode"),
             "--instance-id", instance,
             "--controller-pull-url", f"127.0.0.1:{controller.pull}",
             "--controller-reply-url", f"127.0.0.1:{controller.reply}",
             "--worker-ports", str(worker), "--advertise-ip", "127.0.0.1",
             "--p2p-host", "127.0.0.1", "--p2p-init-ports", str(p2p),
             "--chunk-bytes", str(PAGE_BYTES), "--chunk-size", str(CHUNK_TOKENS),
             "--max-local-cpu-size", str(megabytes / 1000),
             "--heartbeat-time", str(NODE_HEARTBEAT), "--full-sync-startup-delay", "0",
             "--http-port", "-1", "--local-socket", self.socket, "--local-staging-mb", "2",
             "--ucx-tls", "tcp", "--ucx-net-devices", "lo", "--log-level", "info"]
            + (extra or []),
            log_dir / f"kvnode-{instance}.log",
        )
        if not wait_for(lambda: os.path.exists(self.socket) or not self.running(), 60) \
                or not self.running():
            log_text = self.log()
            self.stop()
            raise RuntimeError(f"kvnode {instance} did not start: {log_text}")

    def stop(self, grace: float = 15.0) -> Optional[int]:
        code = super().stop(grace)
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        return code


def kvctl(*args: str, stdin: Optional[str] = None, timeout: float = 120.0,
          check: bool = True) -> subprocess.CompletedProcess:
    """Runs kvctl to its end (bounded); `check`: a non-zero exit fails with its output."""
    cmd = [binary("KVCTL_PATH", "kvctl")] + list(args)
    r = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout,
                       env=lmcache_env())
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}:\n"
                             f"stdout: {r.stdout[-3000:]}\nstderr: {r.stderr[-3000:]}")
    return r


def token_range(first: int, count: int) -> str:
    return f"{first}:{first + count}"


def put(node: Node, first: int, count: int, seed: int) -> dict:
    """kvctl put of tokens first..first+count-1 into `node` (waits out its full sync)."""
    r = kvctl("put", "--node", node.socket, "--token-range", token_range(first, count),
              "--seed", str(seed), "--wait", "60", "--json")
    return json.loads(r.stdout)


def node_hashes(tokens: List[int], generation: Optional[str] = None) -> List[int]:
    """The chunk hashes kvnode computes for `tokens` (kvctl keys hash, 256-token chunks)."""
    line: Dict[str, Any] = {"tokens": tokens, "chunk_size": CHUNK_TOKENS}
    if generation:
        line["hash_generation"] = generation
    r = kvctl("keys", "hash", "--json-lines", "-", stdin=json.dumps(line) + "\n")
    return json.loads(r.stdout.splitlines()[0])


# ---- LMCache's worker over a stub engine (in this process) --------------------------------------

class _Key:
    """What LMCache's full sync reads of a hot-cache key: its chunk hash."""

    def __init__(self, chunk_hash: int) -> None:
        self.chunk_hash = chunk_hash


class _LocalCpuBackend:
    """The part of LocalCPUBackend that LMCache's FullSyncSender uses: its name and its keys
    (LRU to MRU)."""

    def __init__(self, engine: "StubEngine") -> None:
        self._engine = engine

    def __str__(self) -> str:
        return LOCATION

    def get_keys(self) -> List[_Key]:
        with self._engine.lock:
            return [_Key(h) for h in self._engine.chunks]


class _StorageManager:
    def __init__(self, engine: "StubEngine") -> None:
        self.local_cpu_backend = _LocalCpuBackend(engine)


class StubEngine:
    """What LMCacheWorker calls on an LMCacheEngine (lookup/pin, clear, health, move, compress,
    decompress, freeze and storage_manager.local_cpu_backend for full sync), over a map of chunk
    hashes, with LMCache's own ChunkedTokenDatabase hashing tokens and LMCache's own
    BatchedMessageSender reporting admits and evicts. Records every call in `calls`."""

    def __init__(self, config: Any, metadata: Any) -> None:
        from lmcache.v1.token_database import ChunkedTokenDatabase

        self.token_db = ChunkedTokenDatabase(config, metadata)
        self.lock = threading.RLock()
        self.chunks: Dict[int, int] = {}  # chunk hash -> its tokens, insertion (LRU) order
        self.pinned: Dict[str, List[int]] = {}  # lookup_id -> pinned chunk hashes
        self.frozen = False
        self.freezes: List[bool] = []
        self.calls: List[Tuple[str, dict]] = []
        self.health_code = 0
        self.storage_manager = _StorageManager(self)
        self.sender: Any = None  # BatchedMessageSender, once the worker exists

    def hashes(self, tokens: List[int]) -> List[int]:
        return [h for _, _, h in self.token_db.process_tokens(tokens, make_key=False)]

    def _chunk_spans(self, tokens: List[int]) -> List[Tuple[int, int, int]]:
        return list(self.token_db.process_tokens(tokens, make_key=False))

    def store(self, tokens: List[int] = None, hashes: Iterable[int] = None) -> int:
        """Stores chunks (of `tokens`, or raw `hashes` of full chunks); each new one is ADMITted
        through LMCache's BatchedMessageSender. Stores nothing while frozen, like LMCache."""
        from lmcache.v1.cache_controller.message import OpType

        spans = self._chunk_spans(tokens) if tokens is not None else \
            [(0, CHUNK_TOKENS, h) for h in hashes]
        with self.lock:
            if self.frozen:
                return 0
            for start, end, h in spans:
                if h not in self.chunks:
                    self.chunks[h] = end - start
                    self.sender.add_kv_op(OpType.ADMIT, h)
            return len(spans)

    def _leading(self, tokens: List[int]) -> Tuple[int, List[int]]:
        end_token, hit = 0, []
        for _, end, h in self._chunk_spans(tokens):
            if h not in self.chunks:
                break
            end_token = end
            hit.append(h)
        return end_token, hit

    def lookup(self, tokens, search_range=None, lookup_id=None, pin=False, **kw) -> int:
        tokens = list(tokens or [])
        with self.lock:
            self.calls.append(("lookup", dict(tokens=len(tokens), search_range=search_range,
                                              lookup_id=lookup_id, pin=pin)))
            end_token, hit = self._leading(tokens)
            if pin and hit:
                self.pinned[lookup_id] = hit
            return end_token

    def clear(self, locations=None, **kw) -> int:
        from lmcache.v1.cache_controller.message import OpType

        with self.lock:
            self.calls.append(("clear", dict(locations=locations)))
            if locations is not None and LOCATION not in locations:
                return 0
            keep = {h for hs in self.pinned.values() for h in hs}
            removed = 0
            for h in [h for h in self.chunks if h not in keep]:
                removed += self.chunks.pop(h)
                self.sender.add_kv_op(OpType.EVICT, h)
            return removed

    def health(self) -> int:
        with self.lock:
            self.calls.append(("health", {}))
            return self.health_code

    def move(self, tokens=None, old_position=None, new_position=None, event_id=None,
             do_copy=True, **kw) -> int:
        with self.lock:
            self.calls.append(("move", dict(tokens=len(tokens or []), old_position=old_position,
                                            new_position=new_position, event_id=event_id,
                                            do_copy=do_copy)))
        return 0  # no transfer plane of LMCache's in this stub

    def compress(self, tokens=None, method=None, location=None, event_id=None, **kw) -> int:
        with self.lock:
            self.calls.append(("compress", dict(method=method, location=location)))
        return 0

    def decompress(self, tokens=None, method=None, location=None, event_id=None, **kw) -> int:
        with self.lock:
            self.calls.append(("decompress", dict(method=method, location=location)))
        return 0

    def freeze(self, enabled: bool) -> None:
        with self.lock:
            self.frozen = enabled
            self.freezes.append(enabled)

    def synced(self) -> bool:
        """True once a full sync ran to its end (freeze on, then off)."""
        with self.lock:
            return True in self.freezes and not self.frozen

    def called(self, op: str) -> List[dict]:
        with self.lock:
            return [args for name, args in self.calls if name == op]


def import_lmcache() -> None:
    """Imports what LmcWorker needs (torch and LMCache: seconds, once per process)."""
    import lmcache.v1.cache_controller.worker  # noqa: F401
    import lmcache.v1.storage_backend.batched_message_sender  # noqa: F401
    import lmcache.v1.token_database  # noqa: F401


class LmcWorker:
    """LMCache 0.5.6's LMCacheWorker (rank 0 of instance `instance`) and its BatchedMessageSender,
    in this process, over a StubEngine, registered with `controller`. `peer_url` is the
    peer_init_url it registers (nothing listens there: LMCache's transfer plane is not started).
    `preload`: tokens whose chunks the engine holds before it registers."""

    def __init__(self, instance: str, controller: ControllerBase,
                 preload: Optional[List[int]] = None) -> None:
        import torch
        from lmcache.v1.cache_controller import worker as worker_module
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.metadata import LMCacheMetadata
        from lmcache.v1.storage_backend.batched_message_sender import BatchedMessageSender

        # The worker registers the address of the interface that routes to 8.8.8.8; here every
        # peer is on loopback, and no test sends to any other address.
        worker_module.get_ip = lambda: "127.0.0.1"
        self.instance = instance
        rep, p2p, p2p_lookup = free_ports(3)
        self.port = rep
        self.peer_url = f"127.0.0.1:{p2p}"
        self.config = LMCacheEngineConfig.from_defaults(
            chunk_size=CHUNK_TOKENS,
            save_unfull_chunk=True,
            enable_controller=True,
            lmcache_instance_id=instance,
            controller_pull_url=f"127.0.0.1:{controller.pull}",
            controller_reply_url=f"127.0.0.1:{controller.reply}",
            lmcache_worker_ports=[rep],
            lmcache_worker_heartbeat_delay_time=0,
            lmcache_worker_heartbeat_time=WORKER_HEARTBEAT,
            enable_p2p=True,
            p2p_host="127.0.0.1",
            p2p_init_ports=[p2p],
            p2p_lookup_ports=[p2p_lookup],
            extra_config={
                "full_sync_startup_delay_s": 0.0,
                "full_sync_status_poll_interval_s": 0.3,
                "full_sync_retry_delay_s": 0.3,
                "worker_socket_recv_timeout_ms": 20000,
            },
        )
        self.metadata = LMCacheMetadata(
            model_name="kvnode-test", world_size=1, local_world_size=1, worker_id=0,
            local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=(1, 2, CHUNK_TOKENS, 1, 64),
            chunk_size=CHUNK_TOKENS)
        self.engine = StubEngine(self.config, self.metadata)
        if preload:
            # Chunks held before registering (as after a controller restart): only the full
            # sync tells the controller about them.
            for start, end, h in self.engine._chunk_spans(preload):
                self.engine.chunks[h] = end - start
        self.worker = worker_module.LMCacheWorker(self.config, self.metadata, self.engine)
        self.engine.sender = BatchedMessageSender(self.metadata, self.config, LOCATION,
                                                  self.worker)
        self._closed = False

    def p2p_lookup(self, hashes: List[int], timeout: float = 30.0) -> List[Tuple]:
        """LMCache's own BatchedP2PLookupMsg from this worker (its DEALER, as its P2P backend
        sends it); the reply's layout_info."""
        import asyncio

        from lmcache.v1.cache_controller.message import (BatchedP2PLookupMsg,
                                                         BatchedP2PLookupRetMsg)

        msg = BatchedP2PLookupMsg(hashes=list(hashes), instance_id=self.instance,
                                  worker_id=self.metadata.worker_id)
        future = asyncio.run_coroutine_threadsafe(self.worker.async_put_and_wait_msg(msg),
                                                  self.worker.loop)
        ret = future.result(timeout)
        assert isinstance(ret, BatchedP2PLookupRetMsg), f"P2P lookup answered {ret!r}"
        return [tuple(x) for x in ret.layout_info]

    def close(self) -> None:
        """De-registers, ends the worker's tasks, stops its loop and sockets (LMCache's close())
        and the sender's thread.

        LMCache's close() stops the loop with the worker's tasks pending; when the garbage
        collector later closes its push() coroutine, push() spins for ever (it catches every
        Exception and loops without awaiting). So the tasks end first: push() ignores a
        cancellation (batched_get_msg turns it into an empty batch), so its next
        batched_get_msg() raises CancelledError itself."""
        import asyncio

        if self._closed:
            return
        self._closed = True
        worker = self.worker
        try:
            self.engine.sender.close()
            worker.deregister()
            wait_for(worker.msg_queue.empty, 5, 0.05)  # the push task took it

            def cancelled(*args: Any, **kwargs: Any) -> Any:
                raise asyncio.CancelledError()

            class NoPush:  # push()'s last, empty batch goes nowhere
                def send_multipart(self, *args: Any, **kwargs: Any) -> None:
                    pass

            async def end_tasks() -> bool:
                worker.batched_get_msg = cancelled
                push_socket, worker.push_socket = worker.push_socket, NoPush()
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for t in tasks:
                    t.cancel()
                _, pending = await asyncio.wait(tasks, timeout=10)
                worker.push_socket = push_socket  # close() closes it
                return not pending

            ended = asyncio.run_coroutine_threadsafe(end_tasks(), worker.loop).result(20)
        finally:
            # Stops the loop, joins its thread, closes the sockets (and queues a second
            # DeRegisterMsg that nobody sends).
            closer = threading.Thread(target=worker.close, daemon=True)
            closer.start()
            closer.join(20)
            if closer.is_alive():
                raise RuntimeError(f"LMCacheWorker {self.instance} did not close in 20 s")
        if not ended:
            raise RuntimeError(f"LMCacheWorker {self.instance}: tasks did not end in 10 s")


def p2p_probe(controller: ControllerBase, hashes: List[int], instance_id: str = "probe",
              worker_id: int = 0, timeout_ms: int = 20000) -> List[Tuple]:
    """Who holds `hashes`, as the controller answers an LMCache BatchedP2PLookupMsg from an
    instance of no worker's (LMCache's message classes, a DEALER to the reply socket)."""
    import msgspec
    import zmq
    from lmcache.v1.cache_controller.message import (BatchedP2PLookupMsg,
                                                     BatchedP2PLookupRetMsg, Msg)

    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, timeout_ms)
    s.setsockopt(zmq.SNDTIMEO, timeout_ms)
    try:
        s.connect(f"tcp://127.0.0.1:{controller.reply}")
        s.send_multipart([b"", msgspec.msgpack.encode(BatchedP2PLookupMsg(
            hashes=list(hashes), instance_id=instance_id, worker_id=worker_id))])
        ret = msgspec.msgpack.decode(s.recv_multipart()[-1], type=Msg)
    finally:
        s.close(0)
    assert isinstance(ret, BatchedP2PLookupRetMsg), f"P2P lookup answered {ret!r}"
    return [tuple(x) for x in ret.layout_info]


def wait_held(controller: ControllerBase, instance: str, hashes: List[int],
              timeout: float = 30.0) -> List[Tuple]:
    """Waits until the controller's registry has `instance` holding all of `hashes` (chunks no
    one else holds), as a P2P lookup by hash answers; the last answer."""
    last: List[Any] = [None]

    def check() -> bool:
        last[0] = p2p_probe(controller, hashes)
        return len(last[0]) == 1 and last[0][0][:3] == (instance, LOCATION, len(hashes))

    if not wait_for(check, timeout, 0.2):
        raise AssertionError(f"{controller.kind} does not list {instance} holding "
                             f"{len(hashes)} chunks within {timeout} s: {last[0]}")
    return last[0]


def wait_unheld(controller: ControllerBase, hashes: List[int], timeout: float = 30.0) -> None:
    """Waits until nobody holds hashes[0] in the controller's registry."""
    if not wait_for(lambda: p2p_probe(controller, hashes[:1]) == [("", "", 0, "")], timeout,
                    0.2):
        raise AssertionError(f"{controller.kind} still lists a holder of the chunks after "
                             f"{timeout} s: {p2p_probe(controller, hashes)}")
