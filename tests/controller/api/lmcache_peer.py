#!/usr/bin/python3
"""An unmodified LMCache worker and orchestrator client, emulated from the protocol reference.

Talks to a running kvcontroller exactly as LMCache's worker code does (protocol reference
docs/lmcache-protocol.md, section 0): a DEALER to the reply port sending ["", payload], a DEALER to
the heartbeat_url handed out at registration, a PUSH to the pull port (one encoded message per
frame, at most 50 frames per multipart) and a REP socket bound at the worker port that answers
the controller's ControlMsgs with canned replies. The orchestrator side uses the HTTP API.

Messages are encoded like msgspec does (section 1.2): a map, "type" first, then every field in
declaration order, defaults included. Every reply is checked both by value and by bytes (the
decoded reply re-encoded canonically must reproduce the bytes received).

Needs only Debian's python3 with python3-zmq and python3-msgpack.

    lmcache_peer.py --self-test [--shared-dir DIR]
    lmcache_peer.py --http-port P --pull-port P --reply-port P --heartbeat-port P [--shared-dir DIR]

Exit status: 0 when every check passed, 1 when a check failed (each failure names its step, what
was checked, the expected and the actual value), 2 on bad usage, 3 when the watchdog fired.
"""

import argparse
import copy
import json
import os
import queue
import random
import re
import signal
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request

import msgpack
import zmq

CPU = "LocalCPUBackend"
RECV_TIMEOUT_MS = 5000
SEND_TIMEOUT_MS = 5000
HTTP_TIMEOUT_S = 10
MAX_FRAMES_PER_MULTIPART = 50  # the upstream worker drains at most 50 queued messages per send
HEARTBEAT_PERIOD_S = 0.5
UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"


# ---------------------------------------------------------------------------------------------
# Failures

class CheckFailed(Exception):
    """A check of the current step failed; the message says what, expected and got."""


def fail(what, expected, got):
    raise CheckFailed(f"{what}: expected {expected!r}, got {got!r}")


def same(a, b):
    """Equality that also distinguishes bool/int/float (msgpack and JSON keep them apart)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def check(what, got, expected):
    if not same(got, expected):
        fail(what, expected, got)


def check_match(what, got, pattern):
    if not isinstance(got, str) or not re.fullmatch(pattern, got):
        fail(what, f"a string matching /{pattern}/", got)


def eventually(what, probe, expected, timeout_s=5.0, interval_s=0.05):
    """Polls probe() until it returns expected (PUSH is asynchronous); returns the last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = probe()
        if same(got, expected):
            return got
        if time.monotonic() > deadline:
            fail(f"{what} (within {timeout_s} s)", expected, got)
        time.sleep(interval_s)


# ---------------------------------------------------------------------------------------------
# msgspec-compatible encoding (protocol reference section 1)

REQUIRED = object()


def field(name, default=REQUIRED, kind=None):
    return (name, default, kind)


def common(*names):
    return [field(n) for n in names]


KV_OP_EVENT = common("op_type", "key", "seq_num")
WORKER_INFO = common("instance_id", "worker_id", "ip", "port", "peer_init_url") + [
    field("registration_time", kind=float), field("last_heartbeat_time", kind=float)]
COMMAND_FIELDS = [field("reason", None), field("args", None)]  # after "command_type"
WORKER_ADDRESS = common("instance_id", "worker_id", "ip", "port", "peer_init_url")
CODEC_WORKER = common("worker_event_id", "method", "location") + [field("tokens", None)]

# Field lists in wire order (after "type"), for every class this peer sends or receives.
MESSAGES = {
    # worker -> controller (PUSH)
    "DeRegisterMsg": common("instance_id", "worker_id", "ip", "port"),
    "BatchedKVOperationMsg": common("instance_id", "worker_id", "location") + [
        field("operations", kind=("structs", KV_OP_EVENT))],
    "FullSyncBatchMsg": common("instance_id", "worker_id", "location", "sync_id", "batch_id",
                               "keys"),
    "FullSyncEndMsg": common("instance_id", "worker_id", "location", "sync_id",
                             "actual_total_keys"),
    "KVAdmitMsg": common("instance_id", "worker_id", "key", "location") + [field("seq_num", 0)],
    "KVEvictMsg": common("instance_id", "worker_id", "key", "location") + [field("seq_num", 0)],
    # worker -> controller (DEALER) and the replies
    "RegisterMsg": WORKER_ADDRESS,
    "HeartbeatMsg": WORKER_ADDRESS,
    "BatchedP2PLookupMsg": common("hashes", "instance_id", "worker_id"),
    "FullSyncStartMsg": common("instance_id", "worker_id", "location", "sync_id", "total_keys",
                               "batch_count"),
    "FullSyncStatusMsg": common("instance_id", "worker_id", "sync_id"),
    "RegisterRetMsg": [field("extra_config", {})],
    "HeartbeatRetMsg": [field("commands", [], kind="commands")],
    "BatchedP2PLookupRetMsg": common("layout_info"),
    "FullSyncStartRetMsg": common("sync_id", "accepted") + [field("error_msg", None)],
    "FullSyncStatusRetMsg": common("sync_id", "is_complete") + [
        field("global_progress", kind=float), field("can_exit_freeze"),
        field("missing_batches", [])],
    "ErrorMsg": common("error"),
    # controller -> worker (REQ -> REP) and the replies
    "ClearWorkerMsg": common("worker_event_id", "location"),
    "PinWorkerMsg": common("worker_event_id", "location", "tokens"),
    "CompressWorkerMsg": CODEC_WORKER,
    "DecompressWorkerMsg": CODEC_WORKER,
    "MoveWorkerMsg": common("worker_event_id", "old_position", "new_position") + [
        field("tokens", None), field("copy", True)],
    "HealthWorkerMsg": common("worker_event_id"),
    "CheckFinishWorkerMsg": common("worker_event_id"),
    "ClearWorkerRetMsg": common("num_tokens"),
    "PinWorkerRetMsg": common("num_tokens"),
    "CompressWorkerRetMsg": common("num_tokens"),
    "DecompressWorkerRetMsg": common("num_tokens"),
    "MoveWorkerRetMsg": common("num_tokens"),
    "HealthWorkerRetMsg": common("error_code"),
}


def convert(kind, value):
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(kind, tuple) and kind[0] == "structs":
        return [struct_map(kind[1], v) for v in value]
    if kind == "commands":
        return [struct_map(COMMAND_FIELDS, c, tag=("command_type", c["command_type"]))
                for c in value]
    return value


def struct_map(fields, values, tag=None):
    """The map msgspec writes: tag first, then every field in order, defaults filled in."""
    known = {name for name, _, _ in fields} | ({tag[0]} if tag else set())
    unknown = [k for k in values if k not in known]
    if unknown:
        raise ValueError(f"unknown fields {unknown}")
    out = {tag[0]: tag[1]} if tag else {}
    for name, default, kind in fields:
        if name in values:
            value = values[name]
        elif default is REQUIRED:
            raise ValueError(f"missing required field {name!r}")
        else:
            value = copy.deepcopy(default)
        out[name] = convert(kind, value)
    return out


def message(type_name, **fields):
    """The message as an ordered dict (the msgspec layout), before packing."""
    return struct_map(MESSAGES[type_name], fields, tag=("type", type_name))


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def encode(type_name, **fields):
    return pack(message(type_name, **fields))


def decode(raw):
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


def canonical(raw):
    """Re-encodes a received message the way msgspec would; equal bytes = correct layout."""
    value = decode(raw)
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ValueError(f"not a tagged map: {value!r}")
    fields = {k: v for k, v in value.items() if k != "type"}
    return encode(value["type"], **fields)


def check_layout(what, raw):
    """The bytes received must be exactly what msgspec writes for the decoded value."""
    try:
        expected = canonical(raw)
    except (ValueError, KeyError, TypeError, msgpack.exceptions.ExtraData,
            msgpack.exceptions.UnpackException) as e:
        fail(f"{what}: decodable msgspec map", "a known message class", f"{e} in {raw.hex()}")
    if raw != expected:
        fail(f"{what}: msgspec byte layout", expected.hex(), raw.hex())


def decode_reply(what, raw, expected_type):
    check_layout(what, raw)
    value = decode(raw)
    if value["type"] != expected_type:
        fail(f"{what}: reply class", expected_type, value)
    return value


# ---------------------------------------------------------------------------------------------
# CPython builtin hash chain (protocol reference sections 5.4 and 5.5), independent of the local
# interpreter: Debian's python3.11 hashes None differently from the 3.12+ rule used here.

U64 = (1 << 64) - 1
HASH_MODULUS = (1 << 61) - 1
P1 = 11400714785074694791
P2 = 14029467366897019727
P5 = 2870177450012600261
H_NONE = 0xFCA86420  # hash(None), CPython >= 3.12: the third key element before LMCache 0.5.6
H_EMPTY_TUPLE = 5740354900026072187  # hash(()): the third key element from LMCache 0.5.6 on
CHUNK_SIZE = 256


def h_int(x):
    r = abs(x) % HASH_MODULUS
    if x < 0:
        r = -r
    return -2 if r == -1 else r


def h_tuple(element_hashes):
    acc = P5
    for e in element_hashes:
        acc = (acc + (e & U64) * P2) & U64
        acc = ((acc << 31) | (acc >> 33)) & U64
        acc = (acc * P1) & U64
    acc = (acc + (len(element_hashes) ^ (P5 ^ 3527539))) & U64
    if acc == U64:
        return 1546275796
    return acc - (1 << 64) if acc >= (1 << 63) else acc


def chunk_hashes(tokens, chunk_size=CHUNK_SIZE, init_hash=0, save_unfull_chunk=True,
                 extra=H_EMPTY_TUPLE):
    """LMCache 0.5.6's chain by default; extra=H_NONE gives the earlier releases' chain."""
    hashes, prev = [], init_hash
    for start in range(0, len(tokens), chunk_size):
        chunk = tokens[start:start + chunk_size]
        if len(chunk) < chunk_size and not save_unfull_chunk:
            break
        prev = h_tuple([h_int(prev), h_tuple([h_int(t) for t in chunk]), extra])
        hashes.append(prev)
    return hashes


# ---------------------------------------------------------------------------------------------
# Offline self-checks: the encoder against the conformance vectors, the hash against section 5.5

HASH_TABLE = [  # (tokens, init_hash, expected keys), section 5.5, Python >= 3.12 column
    (list(range(600)), 0, [-7693565463539782743, 2055708856580048389, -1455558097904284410]),
    ([1, 2, 3], 0, [8373755996035033071]),
    (list(range(1000, 2124)), 0, [-1385495305192787874, -3440327253504673428,
                                  8117490385210471792, -3398586315300791726,
                                  -1318209813381188320]),
    ([1, 2, 3], -1, [-3186794757698923497]),
]

HEARTBEAT_RESTART_HEX = (  # section 1.8
    "82a474797065af4865617274626561745265744d7367a8636f6d6d616e64739183ac636f6d6d616e645f74797065"
    "a966756c6c5f73796e63a6726561736f6eb2636f6e74726f6c6c65725f72657374617274a461726773c0")
P2P_SENTINEL_HEX = (
    "82a474797065b6426174636865645032504c6f6f6b75705265744d7367ab6c61796f75745f696e666f9194a0a000"
    "a0")
BATCH_HEX = (
    "85a474797065b5426174636865644b564f7065726174696f6e4d7367ab696e7374616e63655f6964a5696e737431"
    "a9776f726b65725f696400a86c6f636174696f6eaf4c6f63616c4350554261636b656e64aa6f7065726174696f6e"
    "739383a76f705f74797065a561646d6974a36b657964a77365715f6e756d0083a76f705f74797065a56576696374"
    "a36b6579cf7fffffffffffffffa77365715f6e756d0183a76f705f74797065a561646d6974a36b6579d380000000"
    "00000000a77365715f6e756d02")


def self_test_hash(shared_dir):
    check("hash(())", h_tuple([]), 5740354900026072187)
    check("hash((0,))", h_tuple([0]), -8753497827991233192)
    for x, want in [(-1, -2), ((1 << 61) - 1, 0), ((1 << 63) - 1, 3), (-(1 << 63), -4)]:
        check(f"H_int({x})", h_int(x), want)
    for tokens, init, want in HASH_TABLE:
        check(f"chunk hashes of {len(tokens)} tokens, init {init}",
              chunk_hashes(tokens, init_hash=init, extra=H_NONE), want)
    path = os.path.join(shared_dir or "", "conformance", "chunk_hash_vectors.json")
    if not shared_dir or not os.path.exists(path):
        return 0
    with open(path) as f:
        cases = json.load(f)["cases"]
    for i, c in enumerate(cases):
        check(f"chunk_hash_vectors.json case {i}",
              chunk_hashes(c["tokens"], c["chunk_size"], c["init_hash"], c["save_unfull_chunk"],
                           extra=H_NONE),
              c["hashes"])
    return len(cases)


def self_test_encoder(shared_dir):
    check("§1.8 HeartbeatRetMsg vector",
          encode("HeartbeatRetMsg", commands=[{"command_type": "full_sync",
                                               "reason": "controller_restart"}]).hex(),
          HEARTBEAT_RESTART_HEX)
    check("§1.8 sentinel vector",
          encode("BatchedP2PLookupRetMsg", layout_info=[("", "", 0, "")]).hex(), P2P_SENTINEL_HEX)
    ops = [{"op_type": "admit", "key": 100, "seq_num": 0},
           {"op_type": "evict", "key": (1 << 63) - 1, "seq_num": 1},
           {"op_type": "admit", "key": -(1 << 63), "seq_num": 2}]
    check("§1.8 BatchedKVOperationMsg vector",
          encode("BatchedKVOperationMsg", instance_id="inst1", worker_id=0, location=CPU,
                 operations=ops).hex(), BATCH_HEX)
    path = os.path.join(shared_dir or "", "conformance", "lmcache_vectors.json")
    if not shared_dir or not os.path.exists(path):
        return 0
    with open(path) as f:
        vectors = json.load(f)
    checked = 0
    for v in vectors:
        if v["decode_as"] != "Msg" or v["type"] not in MESSAGES:
            continue
        fields = {k: x for k, x in v["value"].items() if k != "type"}
        what = f"lmcache_vectors.json {v['type']}/{v['variant']}"
        check(what, encode(v["type"], **fields).hex(), v["msgpack_hex"])
        check(f"{what} (canonical re-encoding)", canonical(bytes.fromhex(v["msgpack_hex"])).hex(),
              v["msgpack_hex"])
        checked += 1
    return checked


# ---------------------------------------------------------------------------------------------
# Sockets

def tcp(host, port):
    return f"tcp://{host}:{port}"


def configure(sock):
    sock.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
    sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    sock.setsockopt(zmq.LINGER, 0)
    return sock


class Dealer:
    """W-REQ / W-HB: a DEALER that sends ["", payload] and decodes the last reply frame."""

    def __init__(self, ctx, url):
        self.ctx, self.url = ctx, url
        self.lock = threading.Lock()
        self.sock = self._connect()

    def _connect(self):
        sock = configure(self.ctx.socket(zmq.DEALER))
        sock.connect(self.url)
        return sock

    def request(self, payload):
        """Returns the raw reply; like the upstream worker, recreates the socket on a timeout."""
        with self.lock:
            try:
                self.sock.send_multipart([b"", payload])
                frames = self.sock.recv_multipart()
            except zmq.Again:
                self.sock.close(linger=0)
                self.sock = self._connect()
                raise CheckFailed(f"no reply from {self.url} within {RECV_TIMEOUT_MS} ms")
        if len(frames) != 2 or frames[0] != b"":
            fail(f"reply framing from {self.url}", "[b'', reply]", frames)
        return frames[-1]

    def close(self):
        with self.lock:
            self.sock.close(linger=0)


class Pusher:
    """W-PUSH: each frame is one encoded message, at most 50 frames per multipart."""

    def __init__(self, ctx, url):
        self.sock = configure(ctx.socket(zmq.PUSH))
        self.sock.connect(url)

    def send(self, payloads):
        for i in range(0, len(payloads), MAX_FRAMES_PER_MULTIPART):
            self.sock.send_multipart(payloads[i:i + MAX_FRAMES_PER_MULTIPART])

    def close(self):
        self.sock.close(linger=0)


class ControlServer:
    """W-REP: answers every ControlMsg with a canned reply and records what it received."""

    CANNED = {
        "ClearWorkerMsg": ("ClearWorkerRetMsg", {"num_tokens": 42}),
        "PinWorkerMsg": ("PinWorkerRetMsg", {"num_tokens": 512}),
        "CompressWorkerMsg": ("CompressWorkerRetMsg", {"num_tokens": 128}),
        "DecompressWorkerMsg": ("DecompressWorkerRetMsg", {"num_tokens": 64}),
        "MoveWorkerMsg": ("MoveWorkerRetMsg", {"num_tokens": 256}),
        "HealthWorkerMsg": ("HealthWorkerRetMsg", {"error_code": 0}),
    }

    def __init__(self, ctx, host):
        self.sock = configure(ctx.socket(zmq.REP))
        self.port = self.sock.bind_to_random_port(f"tcp://{host}")
        self.received = queue.Queue()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @classmethod
    def reply_to(cls, raw):
        try:
            msg = decode(raw)
            type_name = msg["type"]
        except Exception as e:  # the upstream worker answers any failure with an ErrorMsg
            return encode("ErrorMsg", error=f"Worker error: {e}")
        if type_name not in cls.CANNED:
            return encode("ErrorMsg", error=f"Unknown message: {msg!r}")
        reply_type, fields = cls.CANNED[type_name]
        return encode(reply_type, **fields)

    def _serve(self):
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self.stopping.is_set():
            if not poller.poll(50):
                continue
            raw = self.sock.recv()
            self.sock.send(self.reply_to(raw))
            self.received.put(raw)
        self.sock.close(linger=0)

    def next_request(self, what, timeout_s=5.0):
        try:
            raw = self.received.get(timeout=timeout_s)
        except queue.Empty:
            raise CheckFailed(f"{what}: no ControlMsg reached the worker's REP socket") from None
        check_layout(what, raw)
        return decode(raw)

    def check_idle(self, what):
        if not self.received.empty():
            fail(what, "no further ControlMsg", decode(self.received.get()))

    def stop(self):
        self.stopping.set()
        self.thread.join(timeout=2)


class Heartbeater:
    """W-HB plus the worker's heartbeat loop: beat() on demand, or periodically in a thread."""

    def __init__(self, ctx, url, heartbeat_msg):
        self.dealer = Dealer(ctx, "tcp://" + url)
        self.payload = heartbeat_msg
        self.last_sent = None
        self.errors = []
        self.stopping = threading.Event()
        self.thread = None

    def beat(self):
        self.last_sent = time.monotonic()
        return self.dealer.request(self.payload)

    def _loop(self):
        while not self.stopping.wait(HEARTBEAT_PERIOD_S):
            try:
                self.beat()
            except CheckFailed as e:
                self.errors.append(str(e))

    def start(self):
        if self.thread is None:
            self.stopping.clear()
            self.thread = threading.Thread(target=self._loop, daemon=True)
            self.thread.start()

    def stop(self):
        if self.thread is not None:
            self.stopping.set()
            self.thread.join(timeout=5)
            self.thread = None

    def close(self):
        self.stop()
        self.dealer.close()


class Worker:
    """One LMCache worker (one engine rank): REP server, DEALER, PUSH, and later a heartbeat."""

    def __init__(self, ctx, ports, instance_id, worker_id, peer_init_url):
        self.ctx, self.ports = ctx, ports
        self.instance_id, self.worker_id = instance_id, worker_id
        self.ip, self.peer_init_url = "127.0.0.1", peer_init_url
        self.control = ControlServer(ctx, self.ip)
        self.port = self.control.port
        self.dealer = Dealer(ctx, tcp(ports.host, ports.reply))
        self.pusher = Pusher(ctx, tcp(ports.host, ports.pull))
        self.heartbeat = None
        self.seq = 0  # the BatchedMessageSender's counter for LocalCPUBackend

    def address(self):
        return dict(instance_id=self.instance_id, worker_id=self.worker_id, ip=self.ip,
                    port=self.port, peer_init_url=self.peer_init_url)

    def connect_heartbeat(self, url):
        self.heartbeat = Heartbeater(self.ctx, url, encode("HeartbeatMsg", **self.address()))

    def request(self, type_name, **fields):
        return self.dealer.request(encode(type_name, **fields))

    def admit_messages(self, keys, ops_per_message):
        """BatchedKVOperationMsgs admitting keys, seq numbers continuing from the last ones."""
        payloads, i = [], 0
        sizes = iter(ops_per_message)
        while i < len(keys):
            n = next(sizes, 50)
            ops = [{"op_type": "admit", "key": k, "seq_num": self.seq + j}
                   for j, k in enumerate(keys[i:i + n])]
            self.seq += len(ops)
            i += len(ops)
            payloads.append(encode("BatchedKVOperationMsg", instance_id=self.instance_id,
                                   worker_id=self.worker_id, location=CPU, operations=ops))
        return payloads

    def p2p_lookup(self, hashes):
        raw = self.request("BatchedP2PLookupMsg", hashes=hashes, instance_id=self.instance_id,
                           worker_id=self.worker_id)
        return decode_reply("BatchedP2PLookupRetMsg", raw, "BatchedP2PLookupRetMsg")["layout_info"]

    def close(self):
        if self.heartbeat:
            self.heartbeat.close()
        self.control.stop()
        self.dealer.close()
        self.pusher.close()


# ---------------------------------------------------------------------------------------------
# Orchestrator client (HTTP, section 3.10)

class Orchestrator:
    def __init__(self, host, port):
        self.base = f"http://{host}:{port}"

    def _send(self, request):
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as r:
                status, body = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read()
        except (urllib.error.URLError, OSError) as e:
            raise CheckFailed(f"HTTP {request.get_method()} {request.full_url} failed: {e}")
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body.decode(errors="replace")

    def post(self, path, body):
        data = json.dumps(body).encode()
        return self._send(urllib.request.Request(
            self.base + path, data=data, method="POST",
            headers={"Content-Type": "application/json"}))

    def get(self, path):
        return self._send(urllib.request.Request(self.base + path, method="GET"))

    def post_ok(self, path, body):
        status, reply = self.post(path, body)
        if status != 200:
            fail(f"POST {path} status", 200, (status, reply))
        return reply

    def get_ok(self, path):
        status, reply = self.get(path)
        if status != 200:
            fail(f"GET {path} status", 200, (status, reply))
        return reply

    def worker_infos(self):
        reply = self.post_ok("/query_worker_info", {"instance_id": "all"})
        check("/query_worker_info keys", list(reply), ["event_id", "worker_infos"])
        check_match("/query_worker_info event_id", reply["event_id"], "QueryWorkerInfo" + UUID4)
        return reply["worker_infos"]

    def listed(self, instance_id):
        return [w for w in self.worker_infos() if w["instance_id"] == instance_id]


# ---------------------------------------------------------------------------------------------
# The scenario

def sentinel():
    return [["", "", 0, ""]]


def full_sync(reason):
    return [{"command_type": "full_sync", "reason": reason, "args": None}]


def heartbeat_commands(worker, what):
    return decode_reply(what, worker.heartbeat.beat(), "HeartbeatRetMsg")["commands"]


def distinct_keys(rng, n, taken):
    """Chunk hashes as workers report them: signed int64 (builtin) and uint64 (sha256 64-bit)."""
    keys = []
    while len(keys) < n:
        k = rng.getrandbits(64)
        if rng.random() < 0.6:  # builtin hash: signed
            k -= 1 << 63
        if k not in taken:
            taken.add(k)
            keys.append(k)
    return keys


class Scenario:
    SYNC_ID = "inst-A-t1_0_1a2b3c4d"

    def __init__(self, ports):
        self.ports = ports
        self.ctx = zmq.Context()
        self.orch = Orchestrator(ports.host, ports.http)
        self.workers = []
        rng, taken = random.Random(20240601), set()
        edges = [-(1 << 63), -1, 0, (1 << 63) - 1, (1 << 64) - 1, -12345]
        taken.update(edges)
        self.held = edges + distinct_keys(rng, 94, taken)  # 100 keys inst-A admits first
        self.unheld = distinct_keys(rng, 100, taken)  # never admitted by anyone
        self.extra = distinct_keys(rng, 20, taken)  # admitted after garbage frames
        self.token_ids = list(range(1000, 2124))
        self.token_keys = chunk_hashes(self.token_ids)
        self.hb_url = None

    def new_worker(self, instance_id, worker_id, peer_init_url):
        w = Worker(self.ctx, self.ports, instance_id, worker_id, peer_init_url)
        self.workers.append(w)
        return w

    def close(self):
        for w in self.workers:
            w.close()
        self.ctx.destroy(linger=0)

    # -- steps ----------------------------------------------------------------------------------

    def step_register_a(self):
        self.a = self.new_worker("inst-A-t1", 0, "127.0.0.1:18601")
        raw = self.a.request("RegisterMsg", **self.a.address())
        check("first byte of RegisterRetMsg (fixmap)", raw[:1].hex(), "82")
        check("RegisterRetMsg starts with the \"type\" key", raw[1:6], b"\xa4type")
        hb_url = f"{self.ports.host}:{self.ports.heartbeat}"
        check("RegisterRetMsg bytes", raw.hex(),
              encode("RegisterRetMsg", extra_config={"heartbeat_url": hb_url}).hex())
        reply = decode_reply("RegisterRetMsg", raw, "RegisterRetMsg")
        self.hb_url = reply["extra_config"]["heartbeat_url"]
        self.a.connect_heartbeat(self.hb_url)

    def step_first_heartbeat(self):
        raw = self.a.heartbeat.beat()
        check("first HeartbeatRetMsg bytes (§1.8 vector)", raw.hex(), HEARTBEAT_RESTART_HEX)
        check("commands", decode(raw)["commands"], full_sync("controller_restart"))
        self.a.heartbeat.start()  # like the worker's heartbeat loop; keeps inst-A from the reaper

    def step_unregistered_heartbeat(self):
        self.c = self.new_worker("inst-C-t1", 3, None)
        self.c.connect_heartbeat(self.hb_url)
        before = time.time()
        commands = heartbeat_commands(self.c, "HeartbeatRetMsg")
        after = time.time()
        check("commands for an unregistered worker", commands, full_sync("worker_re_registered"))
        listed = self.orch.listed("inst-C-t1")
        check("inst-C-t1 entries in /query_worker_info", len(listed), 1)
        info = listed[0]
        check("WorkerInfo keys", list(info), [f[0] for f in WORKER_INFO])
        check("WorkerInfo identity", [info[k] for k in ("instance_id", "worker_id", "ip", "port",
                                                        "peer_init_url")],
              ["inst-C-t1", 3, "127.0.0.1", self.c.port, None])
        check("registration_time is a float", type(info["registration_time"]), float)
        check("registration_time == last_heartbeat_time", info["last_heartbeat_time"],
              info["registration_time"])
        if not before - 1 <= info["registration_time"] <= after + 1:
            fail("registration_time (epoch s)", f"in [{before}, {after}]",
                 info["registration_time"])
        self.c.heartbeat.start()

    def step_register_b_and_p2p_lookup(self):
        self.b = self.new_worker("inst-B-t1", 0, "127.0.0.1:18602")
        raw = self.b.request("RegisterMsg", **self.b.address())
        check("RegisterRetMsg for inst-B-t1",
              decode_reply("RegisterRetMsg", raw, "RegisterRetMsg")["extra_config"],
              {"heartbeat_url": self.hb_url})
        self.b.connect_heartbeat(self.hb_url)
        check("inst-B-t1 first heartbeat", heartbeat_commands(self.b, "HeartbeatRetMsg"),
              full_sync("controller_restart"))
        self.b.heartbeat.start()

        # 60 one-op messages then 8-op ones: 65 frames, sent as multiparts of 50 and 15 frames.
        self.a.pusher.send(self.a.admit_messages(self.held, [1] * 60 + [8] * 5))
        hit_all = ["inst-A-t1", CPU, 100, "127.0.0.1:18601"]
        eventually("P2P lookup of the 100 admitted hashes from inst-B-t1",
                   lambda: self.b.p2p_lookup(self.held), [hit_all])
        # the 11th hash is held key -12345 read as uint64: a different, unheld key
        aliased = self.held[5] + (1 << 64)
        assert self.held[5] == -12345 and aliased not in self.held
        query = self.held[:10] + [aliased] + self.unheld[:10]
        check("P2P lookup of 21 hashes, first 10 held", self.b.p2p_lookup(query),
              [["inst-A-t1", CPU, 10, "127.0.0.1:18601"]])
        check("P2P lookup from the holder itself", self.a.p2p_lookup(self.held), sentinel())
        raw = self.b.request("BatchedP2PLookupMsg", hashes=[], instance_id="inst-B-t1",
                             worker_id=0)
        check("P2P lookup of an empty list (bytes, §1.8 sentinel)", raw.hex(), P2P_SENTINEL_HEX)
        check("P2P lookup of an unheld first hash", self.b.p2p_lookup(self.unheld[:5]),
              sentinel())
        check("P2P lookup from rank 1 (no rank-1 holder)", self.p2p_lookup_as_rank(1), sentinel())
        request = json.dumps({"type": "BatchedP2PLookupMsg", "hashes": self.held,
                              "instance_id": "inst-B-t1", "worker_id": 0,
                              "unknown_extra_key": [1, 2]}).encode()
        raw = self.b.dealer.request(request)
        check("JSON P2P lookup answered in msgpack",
              decode_reply("JSON BatchedP2PLookupMsg", raw, "BatchedP2PLookupRetMsg")[
                  "layout_info"], [hit_all])

    def p2p_lookup_as_rank(self, rank):
        raw = self.b.request("BatchedP2PLookupMsg", hashes=self.held, instance_id="inst-B-t1",
                             worker_id=rank)
        return decode_reply("BatchedP2PLookupRetMsg", raw, "BatchedP2PLookupRetMsg")["layout_info"]

    def step_garbage_then_admits(self):
        first, second = self.extra[:10], self.extra[10:]
        valid_first = self.a.admit_messages(first, [10])
        valid_second = self.a.admit_messages(second, [3, 3, 4])
        truncated = encode("KVAdmitMsg", instance_id="inst-A-t1", worker_id=0, key=5,
                           location=CPU)[:-3]
        self.a.pusher.send([b"\xc1 not msgpack"] + valid_first)
        self.a.pusher.send([b'{"type":"NoSuchMsg"}', truncated] + valid_second)
        expected = [["inst-A-t1", CPU, 120, "127.0.0.1:18601"]]
        eventually("P2P lookup of 120 hashes after garbage frames",
                   lambda: self.b.p2p_lookup(self.held + self.extra), expected)
        metrics = self.metrics()
        check("kvnode_controller_bad_frames_total{socket=\"pull\"}",
              metrics.get('kvnode_controller_bad_frames_total{socket="pull"}'), 3.0)

    def metrics(self):
        with urllib.request.urlopen(self.orch.base + "/metrics", timeout=HTTP_TIMEOUT_S) as r:
            text = r.read().decode()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values

    def step_orchestrator_lookup(self):
        self.a.pusher.send(self.a.admit_messages(self.token_keys, [5]))
        eventually("P2P lookup of the 5 token-chunk hashes",
                   lambda: self.b.p2p_lookup(self.token_keys),
                   [["inst-A-t1", CPU, 5, "127.0.0.1:18601"]])
        reply = self.orch.post_ok("/lookup", {"tokens": self.token_ids})
        check("/lookup keys", list(reply), ["event_id", "layout_info"])
        check_match("/lookup event_id", reply["event_id"], "Lookup" + UUID4)
        check("/lookup layout_info of tokens 1000..2123", reply["layout_info"],
              {"inst-A-t1": [CPU, 1124]})
        reply = self.orch.post_ok("/lookup", {"tokens": self.token_ids[:768] + [7, 8, 9]})
        check("/lookup layout_info, three matching chunks", reply["layout_info"],
              {"inst-A-t1": [CPU, 768]})
        reply = self.orch.post_ok("/lookup", {"tokens": [1, 2, 3]})
        check("/lookup layout_info of unheld tokens", reply["layout_info"], {})

    def step_fanout(self):
        rep = self.a.control
        reply = self.orch.post_ok("/clear", {"instance_id": "inst-A-t1", "location": CPU})
        check("/clear keys", list(reply), ["event_id", "num_tokens"])
        check_match("/clear event_id", reply["event_id"], "Clear" + UUID4)
        check("/clear num_tokens", reply["num_tokens"], 42)
        check("ClearWorkerMsg received", rep.next_request("ClearWorkerMsg"),
              message("ClearWorkerMsg", worker_event_id="Worker0" + reply["event_id"],
                      location=CPU))

        reply = self.orch.post_ok("/health", {"instance_id": "inst-A-t1"})
        check("/health keys", list(reply), ["event_id", "error_codes"])
        check_match("/health event_id", reply["event_id"], "health" + UUID4)
        check("/health error_codes", reply["error_codes"], {"0": 0})
        got = rep.next_request("HealthWorkerMsg")
        check("HealthWorkerMsg type", got["type"], "HealthWorkerMsg")
        check_match("HealthWorkerMsg worker_event_id", got["worker_event_id"],
                    "HealthWorker0" + UUID4)

        tokens = self.token_ids[:512]
        reply = self.orch.post_ok("/pin", {"instance_id": "inst-A-t1", "location": CPU,
                                           "tokens": tokens})
        check_match("/pin event_id", reply["event_id"], "Pin" + UUID4)
        check("/pin num_tokens", reply["num_tokens"], 512)
        check("PinWorkerMsg received", rep.next_request("PinWorkerMsg"),
              message("PinWorkerMsg", worker_event_id="Worker0" + reply["event_id"],
                      location=CPU, tokens=tokens))

        reply = self.orch.post_ok("/compress", {"instance_id": "inst-A-t1", "method": "cachegen",
                                                "location": CPU, "tokens": tokens})
        check_match("/compress event_id", reply["event_id"], "Compress" + UUID4)
        check("/compress num_tokens", reply["num_tokens"], 128)
        got = rep.next_request("CompressWorkerMsg")
        check_match("CompressWorkerMsg worker_event_id", got["worker_event_id"],
                    "CompressWorker0" + UUID4)
        check("CompressWorkerMsg", got, message(
            "CompressWorkerMsg", worker_event_id=got["worker_event_id"], method="cachegen",
            location=CPU, tokens=tokens))

        reply = self.orch.post_ok("/move", {"old_position": ["inst-A-t1", CPU],
                                            "new_position": ["inst-B-t1", CPU],
                                            "tokens": tokens[:256], "should_copy": False})
        check_match("/move event_id", reply["event_id"], "Move" + UUID4)
        check("/move num_tokens", reply["num_tokens"], 256)
        got = rep.next_request("MoveWorkerMsg")
        check_match("MoveWorkerMsg worker_event_id", got["worker_event_id"],
                    "MoveWorker0" + UUID4)
        check("MoveWorkerMsg", got, message(
            "MoveWorkerMsg", worker_event_id=got["worker_event_id"], old_position=CPU,
            new_position=["127.0.0.1:18602", CPU], tokens=tokens[:256], copy=False))
        rep.check_idle("REP socket of inst-A-t1 after the fan-outs")
        self.b.control.check_idle("REP socket of inst-B-t1 (a move's destination gets nothing)")

    def sync_status(self):
        raw = self.a.request("FullSyncStatusMsg", instance_id="inst-A-t1", worker_id=0,
                             sync_id=self.SYNC_ID)
        reply = decode_reply("FullSyncStatusRetMsg", raw, "FullSyncStatusRetMsg")
        return [reply[k] for k in ("sync_id", "is_complete", "global_progress",
                                   "can_exit_freeze", "missing_batches")]

    def sync_batch(self, batch_id, keys):
        return encode("FullSyncBatchMsg", instance_id="inst-A-t1", worker_id=0, location=CPU,
                      sync_id=self.SYNC_ID, batch_id=batch_id, keys=keys)

    def step_full_sync(self):
        workers = self.orch.get_ok("/controller/workers")["total_count"]
        check("registered workers before the sync (A, B, C)", workers, 3)
        keys = self.held + self.extra  # the worker's LocalCPU hot cache, 120 keys
        batches = [keys[0:50], keys[50:100], keys[100:120]]
        raw = self.a.request("FullSyncStartMsg", instance_id="inst-A-t1", worker_id=0,
                             location=CPU, sync_id=self.SYNC_ID, total_keys=len(keys),
                             batch_count=len(batches))
        check("FullSyncStartRetMsg",
              decode_reply("FullSyncStartRetMsg", raw, "FullSyncStartRetMsg"),
              message("FullSyncStartRetMsg", sync_id=self.SYNC_ID, accepted=True))
        others_ready = (workers - 1) / workers
        check("status before any batch", self.sync_status(),
              [self.SYNC_ID, False, others_ready, False, [0, 1, 2]])
        self.a.pusher.send([self.sync_batch(0, batches[0]), self.sync_batch(1, batches[1])])
        eventually("status after batches 0 and 1", self.sync_status,
                   [self.SYNC_ID, False, others_ready, False, [2]])
        end = encode("FullSyncEndMsg", instance_id="inst-A-t1", worker_id=0, location=CPU,
                     sync_id=self.SYNC_ID, actual_total_keys=len(keys))
        self.a.pusher.send([self.sync_batch(2, batches[2]), end])
        eventually("status after batch 2 and FullSyncEndMsg", self.sync_status,
                   [self.SYNC_ID, True, 1.0, True, []])
        for w in (self.a, self.b, self.c):
            check(f"{w.instance_id} heartbeat after the sync",
                  heartbeat_commands(w, "HeartbeatRetMsg"), [])
        check("P2P lookup of 200 hashes, 120 synced first",
              self.b.p2p_lookup(keys + self.unheld[:80]),
              [["inst-A-t1", CPU, 120, "127.0.0.1:18601"]])
        reply = self.orch.post_ok("/lookup", {"tokens": self.token_ids})
        check("/lookup after a sync without the token chunks", reply["layout_info"], {})

    def step_reaper(self):
        self.c.heartbeat.stop()
        silent_since = self.c.heartbeat.last_sent
        time.sleep(1.0)
        check("inst-C-t1 still listed 1 s after its last heartbeat",
              len(self.orch.listed("inst-C-t1")), 1)
        eventually("inst-C-t1 listed after the reaper ran", lambda: len(self.orch.listed(
            "inst-C-t1")), 0, timeout_s=8.0, interval_s=0.2)
        silent_for = time.monotonic() - silent_since
        if silent_for < 2.5:
            fail("seconds of silence before inst-C-t1 was reaped", ">= 3 (timeout)", silent_for)
        listed = sorted(w["instance_id"] for w in self.orch.worker_infos())
        check("heartbeating workers survive the reaper", listed, ["inst-A-t1", "inst-B-t1"])
        for w in (self.a, self.b):
            check(f"{w.instance_id} heartbeat thread errors", w.heartbeat.errors, [])

    def step_deregister(self):
        self.b.heartbeat.stop()  # the worker's close(): heartbeat loop first, then DeRegisterMsg
        self.b.pusher.send([encode("DeRegisterMsg", instance_id="inst-B-t1", worker_id=0,
                                   ip=self.b.ip, port=self.b.port)])
        eventually("instances in /controller/workers after DeRegisterMsg",
                   lambda: [w["instance_id"] for w in
                            self.orch.get_ok("/controller/workers")["workers"]],
                   ["inst-A-t1"])
        reply = self.orch.get_ok("/controller/workers")
        check("/controller/workers keys", list(reply), ["workers", "total_count"])
        check("/controller/workers total_count", reply["total_count"], 1)
        status, _ = self.orch.get("/controller/workers?instance_id=inst-B-t1")
        check("GET /controller/workers?instance_id=inst-B-t1 status", status, 404)
        info = self.orch.get_ok("/controller/workers?instance_id=inst-A-t1&worker_id=0")
        check("WorkerInfo of inst-A-t1/0",
              {k: info.get(k) for k in ("instance_id", "worker_id", "ip", "port",
                                        "peer_init_url")},
              {"instance_id": "inst-A-t1", "worker_id": 0, "ip": "127.0.0.1",
               "port": self.a.port, "peer_init_url": "127.0.0.1:18601"})
        stats = self.orch.get_ok("/controller/key-stats")
        check("/controller/key-stats", stats, {
            "total_key_count": 120, "total_instance_count": 1, "total_worker_count": 1,
            "instances": [{"instance_id": "inst-A-t1", "key_count": 120, "worker_count": 1}]})
        metrics = self.metrics()
        role = '{role="controller"}'
        check("registered_workers_count gauge",
              metrics.get("lmcache:cache_controller_registered_workers_count" + role), 1.0)
        check("kv_op_seq_discontinuity_count gauge",
              metrics.get("lmcache:cache_controller_kv_op_seq_discontinuity_count" + role), 0.0)

    def step_error_replies(self):
        klass = "<class 'lmcache.v1.cache_controller.message.{}'>"
        cases = [  # (socket, payload, ErrorMsg text), protocol reference §1.5 and §1.6
            (self.a.dealer, encode("KVAdmitMsg", instance_id="inst-A-t1", worker_id=0, key=1,
                                   location=CPU),
             "Unknown message type: " + klass.format("KVAdmitMsg")),
            (self.a.heartbeat.dealer, encode("BatchedP2PLookupMsg", hashes=[1],
                                             instance_id="inst-A-t1", worker_id=0),
             "Expected HeartbeatMsg, got " + klass.format("BatchedP2PLookupMsg")),
            (self.a.dealer, b"\xc1",
             "MessagePack data is malformed: invalid opcode '\\xc1' (byte 0)"),
            (self.a.dealer, pack({"type": "RegisterMsg", "instance_id": "inst-D-t1",
                                  "worker_id": 0, "ip": "127.0.0.1", "port": 1}),
             "Object missing required field `peer_init_url`"),
            (self.a.dealer, pack({"type": "NoSuchMsg"}), "Invalid value 'NoSuchMsg' - at `$.type`"),
        ]
        for dealer, payload, text in cases:
            check(f"reply to {payload[:40]!r}",
                  decode_reply("ErrorMsg", dealer.request(payload), "ErrorMsg"),
                  message("ErrorMsg", error=text))
        check("HeartbeatMsg on the reply socket",
              decode_reply("HeartbeatRetMsg", self.a.request("HeartbeatMsg", **self.a.address()),
                           "HeartbeatRetMsg")["commands"], [])
        reply = self.orch.post_ok("/query_instance", {"event_id": "ignored", "ip": "127.0.0.1"})
        check_match("/query_instance event_id", reply["event_id"], "QueryInst" + UUID4)
        check("/query_instance", {k: v for k, v in reply.items() if k != "event_id"},
              {"res": "inst-A-t1"})
        self.a.heartbeat.stop()
        check("inst-A-t1 heartbeat thread errors", self.a.heartbeat.errors, [])

    def steps(self):
        return [
            ("1 register inst-A-t1", self.step_register_a, True),
            ("2 first heartbeat asks for a full sync", self.step_first_heartbeat, True),
            ("3 heartbeat of unregistered inst-C-t1/3", self.step_unregistered_heartbeat, False),
            ("4 register inst-B-t1, admits, P2P lookups", self.step_register_b_and_p2p_lookup,
             False),
            ("5 garbage PUSH frames do not stop ingest", self.step_garbage_then_admits, False),
            ("6 orchestrator /lookup of tokens 1000..2123", self.step_orchestrator_lookup, False),
            ("7 fan-out: /clear /health /pin /compress /move", self.step_fanout, False),
            ("8 full sync of inst-A-t1", self.step_full_sync, False),
            ("9 reaper removes silent inst-C-t1", self.step_reaper, False),
            ("10 DeRegisterMsg, /controller/workers, key-stats", self.step_deregister, False),
            ("11 error replies a worker can meet; /query_instance", self.step_error_replies,
             False),
        ]


# ---------------------------------------------------------------------------------------------
# Runner

CURRENT_STEP = ["startup"]


def run_steps(steps):
    failures = []
    for name, fn, fatal in steps:
        CURRENT_STEP[0] = name
        started = time.monotonic()
        try:
            fn()
        except CheckFailed as e:
            failures.append(f"step '{name}': {e}")
            print(f"[FAIL] {name}: {e}", flush=True)
            if fatal:
                print("       (later steps depend on it: stopping)", flush=True)
                break
            continue
        except Exception:
            failures.append(f"step '{name}': unexpected error\n{traceback.format_exc()}")
            print(f"[FAIL] {name}: unexpected error\n{traceback.format_exc()}", flush=True)
            if fatal:
                break
            continue
        print(f"[ ok ] {name} ({time.monotonic() - started:.2f} s)", flush=True)
    return failures


def self_test(shared_dir):
    def encoder():
        n = self_test_encoder(shared_dir)
        print(f"       encoder matches §1.8 and {n} conformance vectors")

    def hashes():
        n = self_test_hash(shared_dir)
        print(f"       hash chain matches §5.5 and {n} chunk_hash_vectors.json cases")

    return run_steps([("self-test: msgspec encoder", encoder, False),
                      ("self-test: builtin chunk hash", hashes, False)])


def watchdog(seconds):
    def fire(_signum, _frame):
        print(f"[FAIL] watchdog: no result after {seconds} s (in step '{CURRENT_STEP[0]}')",
              flush=True)
        os._exit(3)
    signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--self-test", action="store_true", help="offline checks only")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--http-port", type=int)
    p.add_argument("--pull-port", type=int)
    p.add_argument("--reply-port", type=int)
    p.add_argument("--heartbeat-port", type=int)
    p.add_argument("--shared-dir", help="directory holding conformance/*.json")
    p.add_argument("--watchdog", type=int, default=60, help="overall limit, seconds")
    args = p.parse_args(argv)
    if not args.self_test and None in (args.http_port, args.pull_port, args.reply_port,
                                       args.heartbeat_port):
        p.error("the four ports are required unless --self-test is given")
    return args


class Ports:
    def __init__(self, args):
        self.host, self.http = args.host, args.http_port
        self.pull, self.reply, self.heartbeat = args.pull_port, args.reply_port, args.heartbeat_port


def main(argv):
    args = parse_args(argv)
    watchdog(args.watchdog)
    failures = self_test(args.shared_dir)
    if not args.self_test and not failures:
        scenario = Scenario(Ports(args))
        try:
            failures = run_steps(scenario.steps())
        finally:
            scenario.close()
    if failures:
        print(f"\n{len(failures)} step(s) failed:", file=sys.stderr)
        for f in failures:
            print(f"  - {f}", file=sys.stderr)
        return 1
    print("all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
