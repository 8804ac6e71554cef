"""KvnodeConnector under vLLM 0.33's real Scheduler, against real kvnode processes: what the
scheduler is told it can load, what the worker then loads (byte for byte), what it stores, when
vLLM may free the blocks, and a node that is down. The engine has no model (vllm_rig.Engine)."""

from __future__ import annotations

import random
import time
from typing import List

import pytest
from vllm.v1.kv_cache_layout import KVCacheLayout

from conftest import SHAPE, fill
from vllm_rig import Engine

import kvnode


def prompt(n: int, seed: int) -> List[int]:
    return random.Random(seed).sample(range(1, 50_000), n)


@pytest.fixture
def engine(cluster, tmp_path):
    engines = []

    def make(node=None, **kw) -> Engine:
        e = Engine(tmp_path, node or cluster.a.socket, **kw)
        engines.append(e)
        return e

    yield make
    for e in engines:
        e.close()


def held(node, tokens) -> int:
    with kvnode.connect(node.socket) as c:
        return c.lookup(tokens)


def test_a_cold_prompt_is_stored_in_the_step_that_computed_it_and_its_blocks_wait(cluster, engine):
    e = engine()
    p = prompt(50, 1)  # 3 whole chunks and a partial one
    req = e.add(p, max_tokens=3)
    out = e.step()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 0
    meta = out.kv_connector_metadata
    assert meta.loads == []
    assert [len(s.tokens) for s in meta.saves] == [50]
    e.worker._worker.drain_saves()
    assert held(cluster.a, p) == 50
    e.run()
    assert req.request_id in e.finished_sending, "vLLM freed the blocks only once stored"
    assert not e.scheduler.has_requests()


def test_chunked_prefill_stores_whole_chunks_then_the_rest(cluster, engine):
    e = engine(max_batched=40)
    p = prompt(100, 2)
    e.add(p)
    saves = [len(s.tokens) for _ in range(4) for s in e.step().kv_connector_metadata.saves]
    assert saves == [32, 80, 100]  # 40 computed: 2 chunks; 80: 5; 100: all


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda l: l.name)
def test_a_local_hit_is_loaded_into_the_blocks_in_every_layout(cluster, engine, tmp_path, layout):
    p = prompt(50, 3)
    writer = engine(layout=KVCacheLayout.LBNHC)
    writer.add(p)
    writer.run()
    assert held(cluster.a, p) == 50
    e = engine(layout=layout)
    req = e.add(p)
    out = e.step()
    # At most len(prompt) - 1: vLLM computes the last token for its logits.
    assert out.scheduled_new_reqs[0].num_computed_tokens == 49
    assert out.num_scheduled_tokens[req.request_id] == 1
    (load,) = out.kv_connector_metadata.loads
    assert (load.hit_tokens, len(load.tokens), load.remote) == (49, 50, False)
    assert out.kv_connector_metadata.saves == []  # all there already
    assert e.kv_matches(req, 50) == []
    assert e.load_errors == set()


def test_a_partial_prefix_loads_its_chunks_and_the_rest_is_computed_and_stored(cluster, engine):
    p = prompt(70, 4)
    fill(cluster.a, p[:32])
    e = engine()
    req = e.add(p)
    out = e.step()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 32
    assert [len(s.tokens) for s in out.kv_connector_metadata.saves] == [70]
    e.run()
    assert held(cluster.a, p) == 70
    assert req.request_id in e.finished_sending


def test_a_prefix_at_a_peer_loads_asynchronously(cluster, engine):
    p = prompt(64, 5)
    writer = engine(node=cluster.b.socket)
    writer.add(p)
    writer.run()
    assert held(cluster.b, p) == 64 and held(cluster.a, p) == 0
    e = engine()  # on node A
    req = e.add(p)
    out = e.step()
    assert out.scheduled_new_reqs == []  # waits for the pull, off the step
    (load,) = out.kv_connector_metadata.loads
    assert load.remote and load.hit_tokens == 63
    until = time.monotonic() + 30
    while req.request_id not in e.finished_recving and time.monotonic() < until:
        e.step()  # the steps go on while the worker pulls
        time.sleep(0.02)
    assert req.request_id in e.finished_recving
    assert e.load_errors == set()
    assert e.kv_matches(req, 64) == []  # the blocks vLLM allocated hold the pulled KV
    e.run()
    assert held(cluster.a, p) == 64, "pulled to node A"


def test_a_node_that_is_down_is_a_miss(cluster, engine, tmp_path):
    e = engine(node=str(tmp_path / "no-such-node.sock"))
    req = e.add(prompt(40, 6))
    out = e.step()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 0
    assert out.kv_connector_metadata.loads == [] and out.kv_connector_metadata.saves == []
    e.run()
    assert not e.scheduler.has_requests()
    assert req.request_id not in e.finished_sending  # no store planned: freed at once


def test_a_socket_file_left_by_a_killed_node_is_a_miss(cluster, engine, tmp_path):
    stale = tmp_path / "stale.sock"
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()  # the file stays, nobody listens: what SIGKILL leaves behind
    e = engine(node=str(stale))
    e.add(prompt(40, 7))
    out = e.step()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 0
    e.run()


def test_with_tensor_parallelism_a_prefix_counts_when_every_ranks_node_holds_it(cluster, tmp_path):
    from kvnode.vllm._config import ConnectorConfig
    from kvnode.vllm._scheduler import SchedulerSide

    p = prompt(48, 8)
    fill(cluster.a, p)  # rank 0's node: all 3 chunks
    fill(cluster.b, p[:32])  # rank 1's node: 2
    for rank, node in enumerate((cluster.a, cluster.b)):
        (tmp_path / f"tp-{rank}.sock").symlink_to(node.socket)
    side = SchedulerSide(ConnectorConfig(node=str(tmp_path / "tp-{rank}.sock"), peers=False),
                         block_size=SHAPE.block, tp_size=2)

    class Req:
        request_id = "tp"
        prompt_token_ids = p

    try:
        assert side.get_num_new_matched_tokens(Req, 0) == (32, False)
        assert side.get_num_new_matched_tokens(Req, 32) == (0, False)
    finally:
        side.close()


def test_a_node_cut_for_another_model_is_refused_by_name_and_costs_misses(cluster, engine,
                                                                          tmp_path, caplog):
    from kvnode_procs import NodeProcess

    other = NodeProcess("vllm-other", cluster.controller, tmp_path,
                        chunk_bytes=2 * SHAPE.chunk_bytes, chunk_tokens=SHAPE.block)
    try:
        with caplog.at_level("WARNING", logger="kvnode.vllm"):
            e = engine(node=other.socket)
            e.add(prompt(40, 9))
            e.run()
        said = " ".join(r.getMessage() for r in caplog.records)
        assert f"--chunk-bytes {SHAPE.chunk_bytes}" in said, said
        assert not e.scheduler.has_requests()
    finally:
        other.stop()


def test_a_producer_only_stores_and_a_consumer_only_loads(cluster, engine):
    p = prompt(48, 10)
    producer = engine(role="kv_producer")
    producer.add(p)
    out = producer.step()
    assert out.kv_connector_metadata.loads == []
    assert [len(s.tokens) for s in out.kv_connector_metadata.saves] == [48]
    producer.run()
    assert held(cluster.a, p) == 48
    again = producer.add(p)  # held now, but a producer does not load
    assert producer.step().scheduled_new_reqs[0].num_computed_tokens == 0
    producer.run()
    consumer = engine(role="kv_consumer")
    fresh = prompt(48, 11)
    consumer.add(p)
    consumer.add(fresh)
    out = consumer.step()
    assert sorted(n.num_computed_tokens for n in out.scheduled_new_reqs) == [0, 47]
    assert out.kv_connector_metadata.saves == []  # a consumer stores nothing
    consumer.run()
    assert held(cluster.a, fresh) == 0
    assert again.request_id in producer.finished_sending


def test_a_peer_prefix_ending_in_a_partial_chunk_past_the_hits_blocks_loads_whole_chunks(cluster,
                                                                                         engine):
    """65 tokens held at B (4 chunks and one of 1 token); the hit is 64, and vLLM allocates an
    asynchronous load 4 blocks: the load must not ask for the 5th chunk."""
    p = prompt(65, 12)
    fill(cluster.b, p)
    with kvnode.connect(cluster.a.socket) as c:  # the controller hears of B's chunks in batches
        until = time.monotonic() + 30
        while c.lookup_peers(p)["peer_tokens"] < 65 and time.monotonic() < until:
            time.sleep(0.05)
    e = engine()
    req = e.add(p)
    (load,) = e.step().kv_connector_metadata.loads
    assert (load.remote, load.hit_tokens, len(load.tokens), len(load.block_ids)) == (True, 64, 64, 4)
    until = time.monotonic() + 30
    while req.request_id not in e.finished_recving and time.monotonic() < until:
        e.step()
        time.sleep(0.02)
    assert req.request_id in e.finished_recving
    assert e.load_errors == set()
