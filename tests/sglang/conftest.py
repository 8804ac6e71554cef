"""Fixtures of the SGLang backend's tests (the rig is sglang_rig.py): a cluster of kvcontroller
and two kvnodes whose chunk is one SGLang page, per test module."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sglang_rig import Cluster, Missing  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    try:
        c = Cluster(tmp_path_factory.mktemp("cluster"))
    except Missing as e:
        if e.named:
            raise
        pytest.skip(str(e))
    yield c
    c.stop()
