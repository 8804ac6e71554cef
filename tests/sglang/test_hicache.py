"""KvnodeHiCacheStorage through SGLang's own factory and real host pools on the CPU: pages set
from one pool and got into other pages of a pool in every MHA and MLA layout, every bit compared
(the comparison is shown to catch a corrupted page); SGLang's generic (flat page) path; keys kept
apart by model name and TP rank; MLA's one writer."""

from __future__ import annotations

import threading

import pytest
import torch

import kvnode
from sglang_rig import MHA_LAYOUTS, MLA_LAYOUTS, backend, host_pool, keys_for, same_pages

CASES = [(False, layout) for layout in MHA_LAYOUTS] + [(True, layout) for layout in MLA_LAYOUTS]


def name(case):
    return ("mla-" if case[0] else "mha-") + case[1]


@pytest.mark.parametrize("zero_copy", [True, False], ids=["direct", "bounce"])
@pytest.mark.parametrize("case", CASES, ids=[name(c) for c in CASES])
def test_set_exists_get_every_layout(cluster, case, zero_copy):
    """Zero-copy: the node copies straight from and into the host pools (process_vm_readv and
    writev); else through the bounce buffers it maps."""
    mla, layout = case
    src = host_pool(mla, layout)
    dst = host_pool(mla, layout)
    keys = keys_for(5, seed=10 + CASES.index(case) + 100 * zero_copy)
    b_src = backend(cluster.a, src, zero_copy=zero_copy)
    b_dst = backend(cluster.a, dst, zero_copy=zero_copy)
    try:
        assert b_src.batch_exists(keys) == 0
        put = src.alloc(5 * 16)
        assert b_src.batch_set_v1(keys, put) == [True] * 5
        assert b_dst.batch_exists(keys) == 5
        assert b_dst.batch_exists(keys[:2] + keys_for(1, seed=999) + keys[3:]) == 2
        dst.alloc(3 * 16)  # other slots than src's
        got = dst.alloc(5 * 16)
        assert b_dst.batch_get_v1(keys, got) == [True] * 5
        assert same_pages(src, put, dst, got) == 0
        direct = zero_copy and layout != "page_head"  # page_head always bounces (slower direct)
        for path in (b_src.set_path, b_dst.get_path):  # the path this test meant to take
            assert (path.direct is not None) == direct
            assert (path.cache is not None) == (not direct)
        # The comparison can fail: one bit flipped in one page is found.
        page = dst.get_data_page(int(got[0]), flat=False).view(torch.int16)  # a view
        page[(0,) * page.dim()] ^= 1
        assert same_pages(src, put, dst, got) == 1
    finally:
        b_src.close()
        b_dst.close()


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_pages_cross_layouts(cluster, mla):
    """A page is the same chunk whichever layout stored it."""
    layouts = MLA_LAYOUTS if mla else MHA_LAYOUTS
    src = host_pool(mla, "page_first")
    keys = keys_for(3, seed=70 + mla)
    put = src.alloc(3 * 16)
    with_src = backend(cluster.a, src)
    assert with_src.batch_set_v1(keys, put) == [True] * 3
    with_src.close()
    for layout in layouts:
        dst = host_pool(mla, layout)
        b = backend(cluster.a, dst)
        got = dst.alloc(3 * 16)
        assert b.batch_get_v1(keys, got) == [True] * 3, layout
        assert same_pages(src, put, dst, got) == 0, layout
        b.close()


@pytest.mark.parametrize("case", [(False, "layer_first"), (False, "page_head"),
                                  (True, "page_first_direct")], ids=name)
def test_generic_path_flat_pages(cluster, case):
    """SGLang without interface_v1: batch_set of get_data_page's flat pages, batch_get into its
    dummy pages, set_from_flat_data_page."""
    mla, layout = case
    src, dst = host_pool(mla, layout), host_pool(mla, layout)
    b_src, b_dst = backend(cluster.a, src), backend(cluster.a, dst)
    keys = keys_for(4, seed=80 + len(layout))
    put = src.alloc(4 * 16)
    assert b_src.batch_set(keys, [src.get_data_page(int(put[i * 16])) for i in range(4)])
    assert all(b_dst.exists(k) for k in keys)
    pages = b_dst.batch_get(keys, [dst.get_dummy_flat_data_page() for _ in keys])
    assert all(p is not None for p in pages)
    got = dst.alloc(4 * 16)
    for i, p in enumerate(pages):
        dst.set_from_flat_data_page(int(got[i * 16]), p)
    assert same_pages(src, put, dst, got) == 0
    assert b_dst.get(keys_for(1, seed=1)[0], dst.get_dummy_flat_data_page()) is None
    b_src.close()
    b_dst.close()


def test_model_names_and_tp_ranks_are_kept_apart(cluster):
    pool = host_pool(False, "page_first")
    keys = keys_for(2, seed=90)
    put = pool.alloc(2 * 16)
    writer = backend(cluster.a, pool, model="model-a", tp_rank=0, tp_size=2)
    assert writer.batch_set_v1(keys, put) == [True, True]
    others = [backend(cluster.a, pool, model="model-b", tp_rank=0, tp_size=2),
              backend(cluster.a, pool, model="model-a", tp_rank=1, tp_size=2),
              backend(cluster.a, pool, model="model-a", tp_rank=0, tp_size=4)]
    for other in others:
        assert other.batch_exists(keys) == 0
        other.close()
    same = backend(cluster.a, pool, model="model-a", tp_rank=0, tp_size=2)
    assert same.batch_exists(keys) == 2
    same.close()
    writer.close()


def test_mla_ranks_share_pages_and_only_the_writer_stores(cluster):
    pool = host_pool(True, "page_first")
    keys = keys_for(2, seed=91)
    put = pool.alloc(2 * 16)
    rank1 = backend(cluster.a, pool, tp_rank=1, tp_size=2)
    assert rank1.batch_set_v1(keys, put) == [True, True]  # SGLang's rule: rank 0 writes
    assert rank1.batch_exists(keys) == 0
    rank0 = backend(cluster.a, pool, tp_rank=0, tp_size=2)
    assert rank0.batch_set_v1(keys, put) == [True, True]
    assert rank1.batch_exists(keys) == 2  # an MLA page is every rank's
    rank0.close()
    rank1.close()


def test_a_node_that_may_not_copy_from_the_process_falls_back(cluster, monkeypatch):
    """The node refuses the host pool as process memory (another user, Yama's ptrace_scope):
    the backend says so once and moves pages through the bounce buffer instead."""
    from kvnode.sglang import _storage

    real = _storage.register_pages

    def refuse(client, geo, chunks, process_memory=None):
        if process_memory is not None:
            raise kvnode.Error("process_vm_readv: Operation not permitted", "refused", -7)
        return real(client, geo, chunks, process_memory)

    monkeypatch.setattr(_storage, "register_pages", refuse)
    pool = host_pool(False, "layer_first")
    b = backend(cluster.a, pool)
    keys = keys_for(3, seed=95)
    put, got = pool.alloc(3 * 16), pool.alloc(3 * 16)
    assert b.batch_set_v1(keys, put) == [True] * 3
    assert b.batch_get_v1(keys, got) == [True] * 3
    assert same_pages(pool, put, pool, got) == 0
    assert b.set_path.direct is None and b.set_path.cache is not None
    b.close()


def test_exists_answers_while_another_thread_stores(cluster):
    """SGLang's prefetch, backup and lookup threads call at once: nothing is lost or mixed."""
    pool = host_pool(False, "page_first", pages=96)
    b = backend(cluster.a, pool)
    stored = keys_for(8, seed=92)
    assert b.batch_set_v1(stored, pool.alloc(8 * 16)) == [True] * 8
    errors = []

    def look():
        for _ in range(200):
            if b.batch_exists(stored) != 8:
                errors.append("exists")

    def write(seed):
        ks = keys_for(24, seed=seed)
        if b.batch_set_v1(ks, pool.alloc(24 * 16)) != [True] * 24:
            errors.append("set")

    threads = [threading.Thread(target=look)] + [threading.Thread(target=write, args=(s,))
                                                 for s in (93, 94)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    b.close()
