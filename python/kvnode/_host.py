"""Host memory the node can map (kvnode.host_array), and finding it again from an array.

``host_array`` allocates with ``kvnode_host_memory_create`` (a sealed memfd, mapped here and
zeroed) and returns a numpy array over it. The memory is freed when the last array (or view)
over it goes away: numpy's ``base`` chain ends at a ctypes buffer that holds the HostMemory,
whose finalizer calls ``kvnode_host_memory_free``. :func:`host_memory_of` finds the live
allocation an address lies in, so any view of a host array (``kv[3]``, a reshape, a
``torch.from_numpy`` of it) finds its allocation and its offset in it.
"""

from __future__ import annotations

import ctypes
import math
import operator
import sys
import weakref
from typing import Any, Optional, Sequence, Tuple, Union

from . import _lib

__all__ = ["HostMemory", "host_array", "host_memory_of"]

_MEMORY_ATTR = "_kvnode_host_memory"
_live: "weakref.WeakSet[HostMemory]" = weakref.WeakSet()  # for host_memory_of


class HostMemory:
    """One allocation from kvnode_host_memory_create: ``base`` (address), ``nbytes``, ``fd``."""

    def __init__(self, nbytes: int, name: Optional[str] = None) -> None:
        lib = _lib.library()
        handle = ctypes.c_void_p()
        err = _lib.ErrorStruct()
        code = lib.kvnode_host_memory_create(
            nbytes, name.encode() if name else None, ctypes.byref(handle), ctypes.byref(err)
        )
        _lib.check(code, err, "kvnode_host_memory_create")
        self.base: int = lib.kvnode_host_memory_data(handle)
        self.nbytes: int = lib.kvnode_host_memory_size(handle)
        self.fd: int = lib.kvnode_host_memory_fd(handle)
        self._free = weakref.finalize(self, lib.kvnode_host_memory_free, handle.value)
        _live.add(self)

    def __repr__(self) -> str:
        return f"<kvnode.HostMemory {self.nbytes} bytes at {self.base:#x}, fd {self.fd}>"


def _numpy() -> Any:
    try:
        import numpy
    except ImportError as e:  # pragma: no cover - numpy is there wherever the tests run
        raise ImportError("kvnode.host_array needs numpy (apt install python3-numpy)") from e
    return numpy


def host_array(shape: Union[int, Sequence[int]], dtype: Any) -> Any:
    """A zeroed C-contiguous ``numpy.ndarray`` in memory the node can map.

    For CPU engines and tests: register its views with :meth:`Client.register_kv_cache`. Several
    layers may be views of one host array (one allocation, registered once). The memory lives as
    long as any array or view over it.

    Args:
        shape: the array's shape (an int or a sequence of ints, none negative, not all zero).
        dtype: any numpy dtype (``numpy.float16``, ``"uint8"``, ...).
    """
    np = _numpy()
    if hasattr(shape, "__index__"):
        shape = (shape,)
    try:
        if isinstance(shape, (str, bytes)):
            raise TypeError(type(shape).__name__)
        dims: Tuple[int, ...] = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise TypeError(f"shape: expected an int or a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"shape: {dims} has a negative dimension")
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"dtype: {dtype!r} is not a numpy dtype ({e})") from None
    if dt.hasobject:
        raise TypeError(f"dtype: {dt} holds Python objects; the node maps plain bytes")
    count = math.prod(dims)
    nbytes = count * dt.itemsize
    if nbytes == 0:
        raise ValueError(f"shape: {dims} of {dt} holds no bytes")
    if nbytes > sys.maxsize:  # numpy's bound on an array's bytes (and past size_t's half)
        raise ValueError(f"shape: {dims} of {dt} is {nbytes} bytes, more than an array holds")
    memory = HostMemory(nbytes, "kvnode-python")
    buffer = (ctypes.c_uint8 * memory.nbytes).from_address(memory.base)
    setattr(buffer, _MEMORY_ATTR, memory)  # the buffer keeps the memory; arrays keep the buffer
    return np.frombuffer(buffer, dtype=dt, count=count).reshape(dims)


def host_memory_of(ptr: int, nbytes: int) -> Optional[HostMemory]:
    """The live HostMemory holding bytes [ptr, ptr + nbytes), or None."""
    for memory in list(_live):
        if memory.base <= ptr and ptr + nbytes <= memory.base + memory.nbytes:
            return memory
    return None
