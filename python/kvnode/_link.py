"""One connection to a node that may be down, for the engine integrations (kvnode.vllm,
kvnode.sglang): connects lazily, and after a failure treats the node as down for ``retry_s`` (a
dead node costs one failed connect per period, not one per request, and no engine thread ever
loops on it). Failures are logged once per outage, at warning level, and counted."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional, TypeVar

from ._client import Client, connect
from ._errors import Error

__all__ = ["NodeLink"]

T = TypeVar("T")
# Error statuses after which the connection is not trusted: reconnect (after retry_s).
_CONNECTION_LOST = ("peer_lost", "deadline", "io", "internal")


class NodeLink:
    def __init__(self, path: str, timeout_s: float, retry_s: float, what: str,
                 log: logging.Logger) -> None:
        self.log = log  # the integration's logger ("kvnode.vllm", "kvnode.sglang")
        self.path = path
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.what = what  # "scheduler", "worker rank 3", "tp rank 0": for the log
        self.failures = 0  # calls that failed (the node down, a timeout, an error answer)
        self._client: Optional[Client] = None
        self._down_until = 0.0
        self._logged = False
        self._refusals = 0
        self._lock = threading.Lock()
        self.on_connect: Optional[Callable[[Client], None]] = None

    def client(self) -> Optional[Client]:
        """The connected client, or None while the node is down."""
        with self._lock:
            if self._client is not None and not self._client.closed:
                return self._client
            if time.monotonic() < self._down_until:
                return None
            try:
                client = connect(self.path, timeout=self.timeout_s)
                if self.on_connect is not None:
                    self.on_connect(client)
            except Exception as e:  # noqa: BLE001 - any failure is "down"; logged once
                self._down(f"cannot use the node at {self.path}: {e}")
                return None
            self._client = client
            if self._logged:
                self.log.warning("kvnode %s: the node at %s is back", self.what, self.path)
                self._logged = False
            return client

    def call(self, fn: Callable[[Client], T], default: T) -> T:
        """fn(client), or `default` when the node is down or the call fails (logged once)."""
        client = self.client()
        if client is None:
            return default
        try:
            return fn(client)
        except Exception as e:  # noqa: BLE001 - never into the engine: a failure is a miss
            if not isinstance(e, Error) or e.status not in _CONNECTION_LOST:
                # The node's refusal, or an argument the package refused: the link is fine.
                self.fail(f"a request to the node at {self.path} failed: {e}")
                return default
            with self._lock:
                self._drop()
                self._down(f"a request to the node at {self.path} failed: {e}")
            return default

    def fail(self, message: str) -> None:
        """A failure with the link up (a short load, a refusal): counted; the first and then
        every 1000th logged (with the count), so a steady cause cannot flood the engine's log."""
        with self._lock:
            self.failures += 1
            self._refusals += 1
            if self._refusals % 1000 == 1:
                self.log.warning("kvnode %s: %s (%d such failures so far)", self.what,
                                 message, self._refusals)

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
            self._client = None

    def _down(self, message: str) -> None:
        # under self._lock
        self.failures += 1
        self._down_until = time.monotonic() + self.retry_s
        if not self._logged:
            self.log.warning("kvnode %s: %s; treating it as a miss, next try in %.0f s",
                             self.what, message, self.retry_s)
            self._logged = True

    def __repr__(self) -> str:
        return f"<NodeLink {self.path} ({self.what})>"
