"""Fixtures of the Python package's tests: real kvcontroller and kvnode processes
(kvnode_procs.py). `cluster`, one per session, is a controller and nodes A and B past their full
syncs; `fresh_tokens` gives each test token ids no other test used.

Paths come from the environment (ctest sets them): KVNODE_PATH, KVCONTROLLER_PATH,
KVNODE_CLIENT_LIB, PYTHONPATH; else the build tree (build/bin, build/client) and python/.
Without the binaries the tests skip, unless the environment named them (then they fail).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kvnode_procs import Cluster, Missing  # noqa: E402


def start(make):
    """make(), with Missing turned into a skip (or a failure when the environment named it)."""
    try:
        return make()
    except Missing as e:
        if e.named:
            pytest.fail(str(e))
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    c = start(lambda: Cluster(tmp_path_factory.mktemp("kvnode-logs")))
    yield c
    c.stop()


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kvnode-extra-logs")


_next_token = [1_000_000]


@pytest.fixture
def fresh_tokens():
    """fresh_tokens(n): n token ids no other test used (chunks no node holds yet)."""

    def make(n: int) -> List[int]:
        first = _next_token[0]
        _next_token[0] += n + 1000
        return list(range(first, first + n))

    return make
