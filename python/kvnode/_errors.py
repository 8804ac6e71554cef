"""kvnode.Error: what every failed call of the node or the C library raises."""

from __future__ import annotations

__all__ = ["Error"]


class Error(RuntimeError):
    """A call the node or libkvnode_client refused or could not complete.

    ``str(error)`` is the node's message (it names the field at fault, e.g.
    ``block_ids[9]: 4096 is out of range (num_blocks 4096)``). ``status`` is the C API's
    status name, stable enough to branch on: ``"invalid"``, ``"not_found"``, ``"no_room"``,
    ``"frozen"`` (a full sync runs: ask again shortly), ``"deadline"``, ``"peer_lost"`` (the
    node went away; the next call connects again), ``"refused"``, ``"io"``, ``"internal"``.
    ``code`` is the numeric ``kvnode_status_t`` (negative), or 0 when the library itself
    could not be loaded.
    """

    def __init__(self, message: str, status: str = "internal", code: int = 0) -> None:
        super().__init__(message)
        self.message: str = message
        self.status: str = status
        self.code: int = code

    def __reduce__(self):  # keep status and code through pickling (multiprocessing)
        return (type(self), (self.message, self.status, self.code))
