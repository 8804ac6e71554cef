"""The vLLM connector's link to its node: kvnode's NodeLink, logging as ``kvnode.vllm``."""

from __future__ import annotations

import logging

from .._link import NodeLink as _NodeLink

__all__ = ["NodeLink"]


class NodeLink(_NodeLink):
    def __init__(self, path: str, timeout_s: float, retry_s: float, what: str) -> None:
        super().__init__(path, timeout_s, retry_s, what, logging.getLogger("kvnode.vllm"))
