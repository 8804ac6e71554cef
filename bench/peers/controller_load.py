#!/usr/bin/env python3
"""kvcontroller and LMCache 0.5.6's controller under LMCache's own load generator, side by side.

Starts build/bin/kvcontroller and LMCache's controller (`python -m lmcache.v1.api_server`, the
in-process `lmcache_controller`) on free loopback ports, then drives each with LMCache's load
generator (`lmcache.tools.controller_benchmark`: its ZMQControllerBenchmark class, run in this
process, unchanged) in the same phases with the same parameters, one after the other, a different
one first in each repetition:

  admit         BatchedKVOperationMsg on PULL, 50 admits per message (the tool's default batch)
  p2p_lookup    BatchedP2PLookupMsg round trips on the reply ROUTER, 100 hashes each, all held
  heartbeat     HeartbeatMsg round trips on the heartbeat ROUTER, each from the worker's
                registered address (as a real worker sends them: the tool's handler with its
                random address replaced by the registered one)
  heartbeat_moved  the tool's own heartbeats, unchanged: a new random address every time, which
                kvcontroller treats as the worker having moved (it drops the worker's keys,
                re-registers it and asks for a full sync); LMCache ignores the address

The tool's single Python client sets the pace, so the fair figure is each controller's CPU per
message: utime + stime of the controller process (/proc/PID/stat) from before a phase until the
controller is idle again after it (whatever was still queued is applied and counted), divided by
the messages the tool sent (an admit or a lookup hash is one message, as the tool counts them).
The same load also goes to bare ZMQ servers, bench_controller's own baselines (a PULL that only
receives, a ROUTER that answers 64 bytes): ZMQ's own cost per message, the floor for any
controller built on libzmq. Last, kvcontroller's own load generator (build/bin/bench_controller
--quick --only ingest) shows the rate kvcontroller sustains when the client is not the bottleneck.

Run with a Python that has lmcache==0.5.6 (docs/benchmarks.md, "Controller under LMCache's own load generator"):

    LMCACHE_TRACK_USAGE=false LMCACHE_DISABLE_BANNER=1 \
        /tmp/bench-venv/bin/python bench/peers/controller_load.py [--quick] [--build DIR]

Every process it starts is killed and reaped on every path; ports are picked free, never fixed.
Exit status: 0 after a complete run, 1 when a controller failed to start or died, or a phase
failed, 2 on bad usage.
"""

import argparse
import asyncio
import json
import logging
import os
import random
import re
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLK_TCK = os.sysconf("SC_CLK_TCK")

# LMCache reads these at import time: no usage reporting, no banner, no INFO line per call.
os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
os.environ.setdefault("LMCACHE_DISABLE_BANNER", "1")
os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")

# The tool's parameters, the same for both controllers.
NUM_INSTANCES = 10
NUM_KEYS = 1000  # few enough that every instance holds every key after the first admit phase
BATCH_SIZE = 50  # the tool's default: KV operations per BatchedKVOperationMsg
NUM_HASHES = 100  # hashes per BatchedP2PLookupMsg
# (phase, the tool's operation). heartbeat_moved last: in kvcontroller it drops the keys, which
# the next repetition's admits put back before its lookups.
PHASES = [("admit", "admit"), ("p2p_lookup", "p2p_lookup"),
          ("heartbeat", "heartbeat_registered"), ("heartbeat_moved", "heartbeat")]

BARE = "bare ZMQ"
BARE_PHASES = ("admit", "p2p_lookup", "heartbeat")  # heartbeat_moved: the same echo as heartbeat
IDLE_WINDOW_S = 0.3  # idle = no CPU tick for this long
DRAIN_LIMIT_S = 60.0
START_LIMIT_S = 90.0
STOP_LIMIT_S = 5.0


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Processes

class Proc:
    """A child in its own session, output to a file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, name, argv, logdir, env=None, pass_fds=()):
        self.name = name
        self.log_path = Path(logdir) / f"{name}.log"
        self._log = open(self.log_path, "wb")
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                  stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                  pass_fds=pass_fds)
        self.pid = self.p.pid

    def alive(self):
        return self.p.poll() is None

    def tail(self, n=15):
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self):
        if self.p.poll() is None:
            for sig, wait_s in ((signal.SIGTERM, STOP_LIMIT_S), (signal.SIGKILL, STOP_LIMIT_S)):
                try:
                    os.killpg(self.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.p.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        try:
            self.p.wait(timeout=STOP_LIMIT_S)
        except subprocess.TimeoutExpired:
            log(f"warning: {self.name} (pid {self.pid}) did not exit")
        self._log.close()


def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1 (all held open at once while picking)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_listening(proc, port, limit_s):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited ({proc.p.returncode}):\n{proc.tail()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{proc.name} did not listen on {port} within {limit_s:.0f} s:\n"
                       f"{proc.tail()}")


def cpu_seconds(pid):
    """utime + stime of the whole process (every thread), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def zmq_io_seconds(pid):
    """utime + stime of the process's libzmq I/O threads (named ZMQbg/IO/N by libzmq), from
    /proc/PID/task/TID/stat; a thread that exited meanwhile is missed (these live as long as the
    process)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            if comm.startswith("ZMQbg/IO"):
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
        except OSError:
            continue
    return total / CLK_TCK


def wait_idle(proc, since):
    """Waits until proc's CPU time has not moved for IDLE_WINDOW_S; returns (cpu, time of the
    last CPU tick seen, in time.monotonic())."""
    last_cpu = cpu_seconds(proc.pid)
    last_move = since
    deadline = time.monotonic() + DRAIN_LIMIT_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if not proc.alive():
            raise RuntimeError(f"{proc.name} died:\n{proc.tail()}")
        now_cpu = cpu_seconds(proc.pid)
        now = time.monotonic()
        if now_cpu != last_cpu:
            last_cpu, last_move = now_cpu, now
        elif now - last_move >= IDLE_WINDOW_S:
            return last_cpu, last_move
    raise RuntimeError(f"{proc.name} still busy {DRAIN_LIMIT_S:.0f} s after the load ended")


# ---------------------------------------------------------------------------------------------
# Controllers

class Controller:
    """A process under load: label, Proc, (http, pull, reply, heartbeat) ports."""

    def __init__(self, label, proc, ports):
        self.label = label
        self.proc = proc
        self.http, self.pull, self.reply, self.heartbeat = ports
        self.seq = {}  # the tool's sequence numbers, carried across phases (no false gaps)


def monitor_ports(ports):
    return json.dumps({"pull": ports[1], "reply": ports[2], "heartbeat": ports[3]})


def start_kvcontroller(binary, logdir):
    ports = free_ports(4)
    argv = [str(binary), "--host", "127.0.0.1", "--port", str(ports[0]),
            "--monitor-ports", monitor_ports(ports), "--log-level", "warn"]
    return Controller("kvcontroller", Proc("kvcontroller", argv, logdir), ports)


def start_bare(bench_bin, role, logdir):
    """bench_controller's own baseline children (docs/benchmarks.md): `sink`, a bare ZMQ PULL
    that receives frames; `echo`, a bare ZMQ ROUTER that answers [id, "", 64 bytes]. Each binds an
    ephemeral port and writes it (a 4-byte int) to the pipe named last on its command line."""
    r, w = os.pipe()
    try:
        args = ["sink", str(10**15)] if role == "sink" else ["echo", "64"]
        proc = Proc(f"bare-{role}", [str(bench_bin), "--child"] + args + [str(w)], logdir,
                    pass_fds=(w,))
        os.close(w)
        w = -1
        ready, _, _ = select.select([r], [], [], START_LIMIT_S)
        data = os.read(r, 4) if ready else b""
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    if len(data) != 4:
        proc.stop()
        raise RuntimeError(f"bench_controller --child {role} reported no port:\n{proc.tail()}")
    port = struct.unpack("i", data)[0]
    return proc, port


def start_lmcache(python, logdir):
    ports = free_ports(4)
    argv = [python, "-m", "lmcache.v1.api_server", "--host", "127.0.0.1", "--port", str(ports[0]),
            "--monitor-ports", monitor_ports(ports)]
    env = dict(os.environ, PYTHONHASHSEED="0")
    return Controller("LMCache", Proc("lmcache_controller", argv, logdir, env=env), ports)


# ---------------------------------------------------------------------------------------------
# The load: LMCache's controller_benchmark, in this process

def tool_config(ctrl, operation, duration, register_first=False):
    from lmcache.tools.controller_benchmark.config import ZMQBenchmarkConfig
    return ZMQBenchmarkConfig(
        controller_pull_url=f"127.0.0.1:{ctrl.pull}",
        controller_reply_url=f"127.0.0.1:{ctrl.reply}",
        controller_heartbeat_url=f"127.0.0.1:{ctrl.heartbeat}",
        duration=duration, batch_size=BATCH_SIZE, num_instances=NUM_INSTANCES, num_workers=1,
        num_locations=1, num_keys=NUM_KEYS, num_hashes=NUM_HASHES,
        operations={operation: 100.0}, register_first=register_first)


def register(ctrl):
    """The tool's own pre-registration (RegisterMsg per worker), once; the phases then run
    without registering or deregistering, so admitted keys stay for the lookups."""
    from lmcache.tools.controller_benchmark.benchmark import ZMQControllerBenchmark

    async def go():
        b = ZMQControllerBenchmark(tool_config(ctrl, "admit", 0, register_first=True))
        await b.setup()
        try:
            await b.register_workers(b.generate_test_data())
            return len(b.registered_workers)
        finally:
            b.cleanup()

    n = asyncio.run(go())
    if n != NUM_INSTANCES:
        raise RuntimeError(f"{ctrl.label}: registered {n} of {NUM_INSTANCES} workers")


def probe_lookup(ctrl):
    """One BatchedP2PLookupMsg of keys 0..NUM_HASHES-1 from instance_p0_0: chunks hit, peer."""
    import msgspec
    from lmcache.tools.controller_benchmark.benchmark import ZMQControllerBenchmark
    from lmcache.v1.cache_controller.message import BatchedP2PLookupMsg, BatchedP2PLookupRetMsg

    async def go():
        b = ZMQControllerBenchmark(tool_config(ctrl, "p2p_lookup", 0))
        await b.setup()
        try:
            _, resp = await b.send_request(BatchedP2PLookupMsg(
                hashes=list(range(NUM_HASHES)), instance_id="instance_p0_0", worker_id=0))
            return msgspec.msgpack.decode(resp, type=BatchedP2PLookupRetMsg).layout_info
        finally:
            b.cleanup()

    return asyncio.run(go())


def add_registered_heartbeat():
    """The tool's heartbeat handler, sending the address register_workers() registered."""
    from lmcache.tools.controller_benchmark.handlers import OPERATION_HANDLERS
    from lmcache.tools.controller_benchmark.handlers.heartbeat import HeartbeatHandler
    from lmcache.v1.cache_controller.message import HeartbeatMsg

    class RegisteredHeartbeat(HeartbeatHandler):
        @property
        def operation_name(self):
            return "heartbeat_registered"

        def create_message(self, benchmark, test_data):
            worker = random.choice(test_data.workers)
            ip = "192.168.1.%d" % (worker + 1)  # as ZMQControllerBenchmark.register_workers
            return HeartbeatMsg(instance_id=random.choice(test_data.instances),
                                worker_id=worker, ip=ip, port=10000 + worker,
                                peer_init_url="tcp://%s:%d" % (ip, 20000 + worker))

    OPERATION_HANDLERS["heartbeat_registered"] = RegisteredHeartbeat()


def run_phase(ctrl, operation, duration):
    from lmcache.tools.controller_benchmark.benchmark import ZMQControllerBenchmark
    b = ZMQControllerBenchmark(tool_config(ctrl, operation, duration))
    b.sequence_numbers = ctrl.seq
    t0 = time.monotonic()
    io0 = zmq_io_seconds(ctrl.proc.pid)
    cpu0 = cpu_seconds(ctrl.proc.pid)
    asyncio.run(b.run_benchmark())
    t1 = time.monotonic()
    cpu1, last_tick = wait_idle(ctrl.proc, t1)
    io1 = zmq_io_seconds(ctrl.proc.pid)
    res = b.get_results()
    op = res.operations.get(operation)
    errors = op.errors if op else 0
    if res.total_messages == 0 or errors:
        raise RuntimeError(f"{ctrl.label} {operation}: {res.total_messages} messages, "
                           f"{errors} errors")
    drain = max(0.0, last_tick - t1)
    return {
        "messages": res.total_messages,
        "requests": res.total_requests,
        "rate": res.total_messages / res.total_time,  # the tool's QPS (messages sent per second)
        "applied_rate": res.total_messages / (res.total_time + drain),
        "drain_s": drain,
        "cpu_s": cpu1 - cpu0,
        "cpu_per_k": (cpu1 - cpu0) / res.total_messages * 1000,
        "cpu_per_req_us": (cpu1 - cpu0) / res.total_requests * 1e6,
        "io_per_req_us": (io1 - io0) / res.total_requests * 1e6,
        "core_share": (cpu1 - cpu0) / max(1e-9, last_tick - t0),
        "p95_ms": op.p95_latency * 1000 if op else 0.0,
    }


# ---------------------------------------------------------------------------------------------
# kvcontroller's own load generator

def run_own_bench(bench_bin, logdir, timeout_s):
    proc = Proc("bench_controller", [str(bench_bin), "--quick", "--only", "ingest"], logdir)
    try:
        proc.p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.stop()
        return None, f"bench_controller did not finish within {timeout_s} s"
    proc.stop()
    text = proc.log_path.read_text(errors="replace")
    if proc.p.returncode != 0:
        return None, f"bench_controller exited {proc.p.returncode}:\n{proc.tail()}"
    rows = []  # (what, rate, bare rate, cpu ns, bare cpu ns)
    pending = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3:
            continue
        if cells[0].startswith("ingest,") and "ops/s" in cells[1]:
            pending = [cells[0], cells[1], cells[2]]
        elif pending and "CPU of the receiving process" in cells[0]:
            rows.append(tuple(pending + [cells[1], cells[2]]))
            pending = None
    return rows, text


# ---------------------------------------------------------------------------------------------
# Report

def fmt_int(x):
    return f"{x:,.0f}"


def print_table(results, phases, reps, duration):
    print(f"\nLMCache controller_benchmark (one Python client), {reps} repetitions x "
          f"{duration:g} s per phase, {NUM_INSTANCES} instances, {NUM_KEYS} keys, "
          f"batch {BATCH_SIZE}, "
          f"{NUM_HASHES} hashes per lookup; medians. {BARE}: a PULL that only receives (admit), a "
          f"ROUTER that answers 64 bytes (lookups, heartbeats):\n")
    print("| phase | process | messages | msgs/s sent | msgs/s applied | its CPU (% of a core) | "
          "CPU per request (ZMQ I/O thread + the rest) | CPU-s per 1,000 msgs | "
          "CPU per msg vs kvcontroller |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    ratios = {}
    for phase, _ in phases:
        labels = [lbl for lbl in ("kvcontroller", "LMCache", BARE) if (lbl, phase) in results]
        med = {lbl: {k: statistics.median(r[k] for r in results[(lbl, phase)])
                     for k in results[(lbl, phase)][0]} for lbl in labels}
        kv_cpu = med["kvcontroller"]["cpu_per_k"]
        per_rep = [lm["cpu_per_k"] / kv["cpu_per_k"] for kv, lm in
                   zip(results[("kvcontroller", phase)], results[("LMCache", phase)])]
        ratios[phase] = (med["LMCache"]["cpu_per_k"] / kv_cpu, per_rep,
                         med[BARE]["cpu_per_k"] / kv_cpu if BARE in med else None)
        for lbl in labels:
            m = med[lbl]
            x = m["cpu_per_k"] / kv_cpu
            shown = "" if lbl == "kvcontroller" else (f"**{x:.1f}x**" if lbl == "LMCache"
                                                      else f"{x:.2f}x")
            print(f"| {phase} | {lbl} | {fmt_int(m['messages'])} | {fmt_int(m['rate'])} | "
                  f"{fmt_int(m['applied_rate'])} | {m['core_share'] * 100:.0f} % | "
                  f"{m['cpu_per_req_us']:.0f} us ({m['io_per_req_us']:.0f} + "
                  f"{m['cpu_per_req_us'] - m['io_per_req_us']:.0f}) | {m['cpu_per_k']:.3g} | "
                  f"{shown} |")
    print("\nLMCache / kvcontroller CPU per message, each repetition: " + "; ".join(
        f"{phase} " + ", ".join(f"{r:.1f}x" for r in per_rep)
        for phase, (_, per_rep, _) in ratios.items()))
    return ratios


def print_own(rows):
    print("\nkvcontroller's own load generator (build/bin/bench_controller --quick --only ingest, "
          "pre-encoded batches from C++, 300 k ops per case, one repetition):\n")
    print("| case | kvcontroller | bare ZMQ PULL | kvcontroller CPU per op | "
          "= CPU-s per 1,000 msgs |")
    print("|---|---:|---:|---:|---:|")
    for what, rate, bare, cpu, bare_cpu in rows:
        ns = re.match(r"([\d.]+)\s*ns", cpu)
        per_k = f"{float(ns.group(1)) * 1e-6:.5f}" if ns else ""
        print(f"| {what} | {rate} | {bare.replace('bare PULL ', '')} | {cpu} | {per_k} |")


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 s phases (about 1 minute in all)")
    ap.add_argument("--build", default=str(REPO / "build"), help="build tree with bin/kvcontroller "
                    "and bin/bench_controller (default: %(default)s)")
    ap.add_argument("--reps", type=int, help="repetitions (default 3)")
    ap.add_argument("--duration", type=float, help="seconds per phase (default 3, --quick 1)")
    ap.add_argument("--no-own-bench", action="store_true", help="skip bench_controller")
    ap.add_argument("--keep-logs", action="store_true", help="keep the controllers' logs")
    args = ap.parse_args()
    reps = args.reps or 3
    duration = args.duration or (1.0 if args.quick else 3.0)
    build = Path(args.build)
    kv_bin, bench_bin = build / "bin" / "kvcontroller", build / "bin" / "bench_controller"
    for b in (kv_bin, bench_bin):
        if not os.access(b, os.X_OK):
            ap.error(f"{b} not found: build it first (docs/benchmarks.md, controller section)")
    if reps < 1 or duration <= 0:
        ap.error("--reps and --duration must be positive")

    logdir = tempfile.mkdtemp(prefix="controller-load-")  # kept when the run fails
    procs = []

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    rc = 0
    t_start = time.monotonic()
    try:
        lm = start_lmcache(sys.executable, logdir)
        procs.append(lm.proc)
        kv = start_kvcontroller(kv_bin, logdir)
        procs.append(kv.proc)
        log(f"importing LMCache's controller_benchmark; controllers starting (logs in {logdir})")
        import lmcache.tools.controller_benchmark.benchmark  # noqa: F401  (~5 s)
        add_registered_heartbeat()
        # The tool logs progress at INFO through LMCache's loggers: keep the output readable.
        for name in list(logging.root.manager.loggerDict):
            if name.startswith("lmcache"):
                logging.getLogger(name).setLevel(logging.WARNING)
        wait_listening(kv.proc, kv.http, START_LIMIT_S)
        wait_listening(lm.proc, lm.http, START_LIMIT_S)
        log(f"kvcontroller pid {kv.proc.pid}, LMCache controller pid {lm.proc.pid}: up after "
            f"{time.monotonic() - t_start:.1f} s")
        for c in (kv, lm):
            register(c)
        # The floor: bare ZMQ servers (no decoding, no state) under the same load.
        sink, sink_port = start_bare(bench_bin, "sink", logdir)
        procs.append(sink)
        echo, echo_port = start_bare(bench_bin, "echo", logdir)
        procs.append(echo)
        bare_pull = Controller(BARE, sink, (0, sink_port, 0, 0))
        bare_router = Controller(BARE, echo, (0, 0, echo_port, echo_port))

        results = {}
        for rep in range(reps):
            for phase, operation in PHASES:
                bare = bare_pull if phase == "admit" else bare_router
                order = [kv, lm] + ([bare] if phase in BARE_PHASES else [])
                k = rep % len(order)  # a different one goes first each repetition
                for c in order[k:] + order[:k]:
                    r = run_phase(c, operation, duration)
                    results.setdefault((c.label, phase), []).append(r)
                    log(f"rep {rep + 1} {phase:10s} {c.label:12s} {r['messages']:9,d} msgs "
                        f"{r['rate']:10,.0f}/s sent, drain {r['drain_s']:.2f} s, "
                        f"CPU {r['cpu_s']:.2f} s ({r['core_share'] * 100:.0f} % of a core), "
                        f"{r['cpu_per_req_us']:.0f} us/request ({r['io_per_req_us']:.0f} in "
                        f"ZMQ I/O), "
                        f"{r['cpu_per_k']:.3g} CPU-s/1k msgs")
                if phase == "admit":  # every key held: a lookup hits all its hashes
                    for c in (kv, lm):
                        layout = probe_lookup(c)
                        if rep == 0 or layout[0][2] != NUM_HASHES:
                            log(f"probe: {c.label} answers a lookup of keys 0..{NUM_HASHES - 1} "
                                f"with {layout}")
        for c in (kv, lm, bare_pull, bare_router):
            if not c.proc.alive():
                raise RuntimeError(f"{c.label} ({c.proc.name}) died:\n{c.proc.tail()}")
        for p in procs:
            p.stop()
        procs.clear()

        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
        print(f"controller_load: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
              f"{os.cpu_count()} CPUs, load average {load}")
        ratios = print_table(results, PHASES, reps, duration)

        if not args.no_own_bench:
            log("running build/bin/bench_controller --quick --only ingest")
            rows, text = run_own_bench(bench_bin, logdir, timeout_s=180)
            if not rows:
                log(f"bench_controller: no ingest rows parsed\n{text}")
                rc = 1
            else:
                print_own(rows)
        print("\ngoal, LMCache >= 10x kvcontroller's CPU per message: " + ", ".join(
            f"{phase} {r:.1f}x {'met' if r >= 10 else 'not met'}"
            for phase, (r, _, _) in ratios.items()))
        print("kvcontroller's CPU per message / the bare ZMQ server's: " + ", ".join(
            f"{phase} {1 / b:.2f}x" for phase, (_, _, b) in ratios.items() if b))
        print(f"whole run {time.monotonic() - t_start:.0f} s")
    except KeyboardInterrupt as e:
        log(f"interrupted ({e})")
        rc = 1
    except Exception as e:  # noqa: BLE001  (report, clean up, exit 1)
        log(f"controller_load: {e}")
        rc = 1
    finally:
        for p in procs:
            p.stop()
        if rc == 0 and not args.keep_logs:
            for f in Path(logdir).glob("*.log"):
                f.unlink()
            os.rmdir(logdir)
    return rc


if __name__ == "__main__":
    sys.exit(main())
