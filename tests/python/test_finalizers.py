"""Handles closed by the garbage collector. A KVCache (or Client) that becomes unreachable inside
a reference cycle is closed by its finalizer whenever the cyclic GC runs, which may be in the
middle of a call of the same client on the same thread, while that call holds the client's lock.
The tests run in a child process with a timeout, so a finalizer that waits for that lock fails
the test instead of hanging the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from kvnode_procs import ROOT


def run_child(code: str, *args: str, timeout: float = 120) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "python"), str(ROOT / "tests" / "python"), env.get("PYTHONPATH", "")])
    try:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                             capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the child hung for {timeout} s (a finalizer waiting for the "
                             f"client's lock?); it printed: {e.stdout!r} {e.stderr!r}") from None
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_caches_collected_in_the_middle_of_calls_do_not_hang(cluster):
    """A collection at every function call of the client's code (a profile hook), each freeing
    a KVCache held in a cycle: some run while the client's lock is held (inside info, lookup,
    store, load, and a registration the node refuses, raising kvnode.Error)."""
    out = run_child("""
        import gc
        import os
        import sys

        import kvnode
        from kv_shapes import BLOCK, Shape, make_layers

        class Holder:  # a cycle: only the cyclic GC frees it, and its KVCache with it
            def __init__(self, kv):
                self.kv = kv
                self.me = self

        layers, _ = make_layers(Shape("mla", num_blocks=4))
        package = os.path.dirname(kvnode.__file__)
        client_code = tuple(os.path.join(package, f) for f in ("_client.py", "_lib.py",
                                                                "_errors.py"))
        with kvnode.connect(sys.argv[1]) as client:
            kv = client.register_kv_cache(layers, BLOCK, layout="mla")
            holders = [Holder(client.register_kv_cache(layers, BLOCK, layout="mla"))
                       for _ in range(48)]
            freed = [0]

            def collect_at_every_call(frame, event, arg):
                if event == "call" and holders and frame.f_code.co_filename in client_code:
                    holders.pop()  # now garbage in a cycle
                    freed[0] += gc.collect() > 0

            sys.setprofile(collect_at_every_call)
            try:
                for _ in range(2):
                    assert client.info["chunk_size"] == 16
                    assert client.lookup([1, 2, 3]) == 0
                    assert kv.store(list(range(16)), [1]) == 16
                    assert kv.load(list(range(16)), [2]) == 16
                    try:  # half a page per chunk: the node's error, raised under the lock
                        client.register_kv_cache(layers[:8], BLOCK, layout="mla")
                    except kvnode.Error:
                        pass
            finally:
                sys.setprofile(None)
            holders.clear()
            gc.collect()
            assert not client.closed and not kv.closed
            print("freed", freed[0])
    """, cluster.a.socket)
    assert out.startswith("freed "), out
    assert int(out.split()[1]) > 10, out


def test_a_client_collected_in_a_cycle_closes_its_caches(cluster):
    out = run_child("""
        import gc
        import sys

        import kvnode
        from kv_shapes import BLOCK, Shape, make_layers

        layers, _ = make_layers(Shape("mla", num_blocks=4))
        gc.set_threshold(1)
        for i in range(20):
            client = kvnode.connect(sys.argv[1])
            kv = client.register_kv_cache(layers, BLOCK, layout="mla")
            client.me = client  # the client, and with it its cache, freed by the cyclic GC
            kv.me = kv
            del client, kv
        gc.collect()
        print("ok")
    """, cluster.a.socket)
    assert out.strip() == "ok"
