"""kvnode's SGLang integration: ``KvnodeHiCacheStorage``, a HiCache storage backend ("L3")
that SGLang loads from its module path::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \\
        '{"backend_name": "kvnode", "module_path": "kvnode.sglang",
          "class_name": "KvnodeHiCacheStorage", "interface_v1": 1,
          "node": "/tmp/kvnode-<instance>-{tp_rank}.sock"}'

SGLang is not a dependency of the kvnode package, and ``import kvnode.sglang`` does not import
it: the class is resolved (importing SGLang, and refusing a version outside SUPPORTED_SGLANG, as
the storage interface changes between releases) when it is first used.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

SUPPORTED_SGLANG = ("0.5.23",)  # tested with sglang 0.5.23 (its real host pools and factory)

__all__ = ["KvnodeHiCacheStorage", "SUPPORTED_SGLANG"]


def _check_sglang() -> str:
    try:
        version = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        raise ImportError("kvnode.sglang needs SGLang "
                          f"({', '.join(SUPPORTED_SGLANG)}); it is not installed") from None
    if version.split("+")[0] not in SUPPORTED_SGLANG:
        raise ImportError(f"kvnode.sglang supports SGLang {', '.join(SUPPORTED_SGLANG)}; this "
                          f"is SGLang {version}")
    return version


def __getattr__(name: str) -> Any:
    if name == "KvnodeHiCacheStorage":
        _check_sglang()
        from ._storage import KvnodeHiCacheStorage

        return KvnodeHiCacheStorage
    raise AttributeError(f"module 'kvnode.sglang' has no attribute {name!r}")
