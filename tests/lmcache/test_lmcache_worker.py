"""Scenario 2: LMCache 0.5.6's LMCacheWorker (W, over a stub engine, reporting through LMCache's
BatchedMessageSender) under kvcontroller (the `kvc` cluster): registration, the full sync of the
chunks W held before it registered and after a kvcontroller restart, admits, /lookup by tokens,
heartbeats over several periods under a reaper, /health, /pin and /clear reaching W's engine.

Admits travel asynchronously (LMCache batches them every 10 ms): a test waits until the registry
has its own chunks (a P2P lookup by their hashes, `wait_held`) before it relies on them."""

from __future__ import annotations

import os
import time

from lmc_procs import (CHUNK_TOKENS, LOCATION, PRELOADED, WORKER_HEARTBEAT, KvController,
                       LmcWorker, import_lmcache, p2p_probe, wait_for, wait_held, wait_unheld)


def key_count_reaches(controller, instance, want, timeout=30.0):
    last = [None]

    def check():
        last[0] = controller.key_count(instance)
        return last[0] == want

    wait_for(check, timeout, 0.2)
    return last[0]


def test_worker_registers(kvc):
    w = kvc.controller.worker(kvc.w.instance)
    assert w is not None, f"W is not registered: {kvc.controller.workers()}"
    assert (w["worker_id"], w["ip"], w["port"], w["peer_init_url"]) == \
        (0, "127.0.0.1", kvc.w.port, kvc.w.peer_url)
    status, info = kvc.controller.post("/query_worker_info", {"instance_id": kvc.w.instance,
                                                              "worker_ids": [0]})
    assert status == 200 and len(info["worker_infos"]) == 1, info
    assert info["worker_infos"][0]["port"] == kvc.w.port


def test_full_sync_reports_preloaded_chunks(kvc):
    """W held 3 chunks before registering and never admitted them: kvcontroller learns them from
    W's full sync (FullSyncStart/Batch/End/Status through LMCache's FullSyncSender), which ran to
    its end (W froze, then thawed)."""
    engine = kvc.w.engine
    assert engine.freezes[:1] == [True] and engine.freezes[-1] is False, engine.freezes
    preloaded = engine.hashes(PRELOADED)
    assert len(preloaded) == 3
    # Who holds them, by hash, as kvcontroller answers another instance's P2P lookup.
    assert p2p_probe(kvc.controller, preloaded) == \
        [(kvc.w.instance, LOCATION, 3, kvc.w.peer_url)]


def test_full_sync_after_kvcontroller_restart(tmp_path, fresh_tokens):
    """A kvcontroller restarted on the same ports knows nothing; W's next heartbeat makes it
    register W again and ask for a full sync, which brings W's chunks back (its own cluster)."""
    import_lmcache()
    controller = KvController(tmp_path)
    worker = None
    try:
        worker = LmcWorker(f"restart-W-{os.getpid()}", controller)
        assert wait_for(worker.engine.synced, 60, 0.2), worker.engine.freezes
        tokens = fresh_tokens(4 * CHUNK_TOKENS)
        assert worker.engine.store(tokens) == 4
        wait_held(controller, worker.instance, worker.engine.hashes(tokens))
        syncs = worker.engine.freezes.count(True)
        ports = [controller.http_port, controller.pull, controller.reply, controller.heartbeat]
        assert controller.stop() == 0, f"kvcontroller exit: {controller.log()}"
        controller = KvController(tmp_path, ports=ports)
        assert wait_for(lambda: worker.engine.freezes.count(True) > syncs
                        and worker.engine.synced(), 60, 0.2), (
            f"no full sync after the restart: freezes {worker.engine.freezes}\n"
            f"{controller.log()}")
        listing = controller.worker(worker.instance)
        assert listing is not None and listing["port"] == worker.port
        assert listing["peer_init_url"] == worker.peer_url
        assert key_count_reaches(controller, worker.instance, 4) == 4
        assert p2p_probe(controller, worker.engine.hashes(tokens)) == \
            [(worker.instance, LOCATION, 4, worker.peer_url)]
    finally:
        try:
            if worker is not None:
                worker.close()
        finally:
            controller.stop()


def test_admits_reach_kvcontroller(kvc, fresh_tokens):
    c, w = kvc.controller, kvc.w
    tokens = fresh_tokens(4 * CHUNK_TOKENS + 10)
    assert w.engine.store(tokens) == 5
    assert wait_held(c, w.instance, w.engine.hashes(tokens)) == \
        [(w.instance, LOCATION, 5, w.peer_url)]
    # Every chunk W holds, and no other, once its admits are in.
    assert key_count_reaches(c, w.instance, len(w.engine.chunks)) == len(w.engine.chunks)


def test_lookup_by_tokens_names_worker(kvc, fresh_tokens):
    """kvcontroller hashes /lookup tokens itself: with its default hash generation it must find
    the chunks LMCache's token database hashed, a partial last chunk included."""
    c, w = kvc.controller, kvc.w
    tokens = fresh_tokens(3 * CHUNK_TOKENS + 100)
    assert w.engine.store(tokens) == 4
    wait_held(c, w.instance, w.engine.hashes(tokens))
    status, body = c.post("/lookup", {"tokens": tokens})
    assert status == 200, body
    assert body["layout_info"] == {w.instance: [LOCATION, len(tokens)]}, (
        f"kvcontroller's /lookup of tokens W stored answers {body['layout_info']}: its hashes "
        "differ from LMCache 0.5.6's (hash generation)")


def test_heartbeats_keep_worker_registered(kvc):
    """kvcontroller reaps a worker silent for 5 s (--lmcache-worker-timeout 5, checked every
    second): over 7 s W's heartbeats (every second, LMCache's own loop) keep it registered,
    without re-registration, and each moves last_heartbeat_time on."""
    c = kvc.controller
    first = c.worker(kvc.w.instance)
    seen = {first["last_heartbeat_time"]}
    until = time.monotonic() + 7 * WORKER_HEARTBEAT
    while time.monotonic() < until:
        time.sleep(0.25)
        now = c.worker(kvc.w.instance)
        assert now is not None, "kvcontroller reaped W although it heartbeats"
        assert now["registration_time"] == first["registration_time"], "W registered anew"
        seen.add(now["last_heartbeat_time"])
    assert len(seen) >= 5, f"only {len(seen)} heartbeat times seen in 7 s: {sorted(seen)}"
    assert max(seen) > first["last_heartbeat_time"]


def test_health_reaches_worker(kvc):
    c, w = kvc.controller, kvc.w
    calls = len(w.engine.called("health"))
    status, body = c.post("/health", {"instance_id": w.instance})
    assert status == 200 and body["error_codes"] == {"0": 0}, body
    assert len(w.engine.called("health")) == calls + 1
    w.engine.health_code = -1
    try:
        status, body = c.post("/health", {"instance_id": w.instance})
        assert status == 200 and body["error_codes"] == {"0": -1}, body
    finally:
        w.engine.health_code = 0


def test_pin_reaches_worker(kvc, fresh_tokens):
    c, w = kvc.controller, kvc.w
    tokens = fresh_tokens(2 * CHUNK_TOKENS)
    assert w.engine.store(tokens) == 2
    status, body = c.post("/pin", {"instance_id": w.instance, "location": LOCATION,
                                   "tokens": tokens})
    assert status == 200 and body["num_tokens"] == len(tokens), body
    call = w.engine.called("lookup")[-1]
    assert call["pin"] is True and call["search_range"] == [LOCATION]
    assert call["tokens"] == len(tokens)
    # LMCache's executor names a worker's pin "Worker{worker_id}{event_id}".
    assert call["lookup_id"] == "Worker0" + body["event_id"], (call, body)
    assert w.engine.pinned[call["lookup_id"]] == w.engine.hashes(tokens)


def test_clear_reaches_worker(kvc, fresh_tokens):
    c, w = kvc.controller, kvc.w
    tokens = fresh_tokens(3 * CHUNK_TOKENS)
    hashes = w.engine.hashes(tokens)
    assert w.engine.store(tokens) == 3
    wait_held(c, w.instance, hashes)
    with w.engine.lock:
        pinned = {h for hs in w.engine.pinned.values() for h in hs}
        unpinned_tokens = sum(n for h, n in w.engine.chunks.items() if h not in pinned)
        remaining = len([h for h in w.engine.chunks if h in pinned])
    status, body = c.post("/clear", {"instance_id": w.instance, "location": LOCATION})
    assert status == 200, body
    assert body["num_tokens"] == unpinned_tokens and body["event_id"].startswith("Clear")
    assert w.engine.called("clear")[-1] == {"locations": [LOCATION]}
    assert len(w.engine.chunks) == remaining
    # W's evicts (LMCache's BatchedMessageSender) empty its entry but for the pinned chunks.
    wait_unheld(c, hashes)
    assert key_count_reaches(c, w.instance, remaining) == remaining
