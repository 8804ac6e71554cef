"""Checking and converting the arguments of store, load and lookup: tokens and block ids.

Both become a C buffer without a copy where they already are one (a contiguous numpy array of
int64 tokens, uint32 block ids) and through ``array.array`` otherwise (a list of ints: about as
fast as numpy's conversion, and it refuses floats instead of truncating them). A bad argument
raises TypeError or ValueError naming it.
"""

from __future__ import annotations

import array
import sys
from typing import Any, Tuple

__all__ = ["as_block_ids", "as_tokens", "positive_int"]

_SEQUENCES = (list, tuple, range)
_INT64_MAX = 2**63 - 1


def _numpy_array(value: Any, name: str) -> Any:
    """`value` as a numpy array when it is one, or offers one (__array__: torch CPU tensors)."""
    np = sys.modules.get("numpy")
    if np is None:
        return None
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__array__") or hasattr(value, "__array_interface__"):
        try:
            return np.asarray(value)
        except Exception as e:  # e.g. a CUDA tensor: "can't convert cuda:0 device type tensor"
            kind = type(value).__name__
            raise TypeError(f"{name}: cannot read {kind} on the host ({e})") from None
    return None


def _from_numpy(arr: Any, name: str, np_type: str, what: str) -> Tuple[Any, int, int]:
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of {what}, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integer {what}, got an array of {arr.dtype}")
    if arr.dtype != np_type or not arr.flags.c_contiguous:
        if np_type == "uint32" and arr.size and (arr.min() < 0 or arr.max() > 0xFFFFFFFF):
            raise ValueError(f"{name}: block ids are in [0, 2**32), got {arr.min()}..{arr.max()}")
        # uint64 values past int64's range would wrap to negative ids: refused, as for a list
        # (compared as a Python int: numpy compares uint64 with an int as float64).
        if np_type == "int64" and arr.dtype.kind == "u" and arr.size:
            top = int(arr.max())
            if top > _INT64_MAX:
                raise ValueError(f"{name}: {what} are int64, got {top} (2**63 or more)")
        arr = arr.astype(np_type, order="C")
    return arr, arr.ctypes.data, int(arr.shape[0])


def _from_sequence(value: Any, name: str, code: str, what: str) -> Tuple[Any, int, int]:
    if not isinstance(value, _SEQUENCES):
        raise TypeError(
            f"{name}: expected a list of ints or a 1-D integer array, got {type(value).__name__}"
        )
    try:
        buf = array.array(code, value)
    except TypeError as e:
        raise TypeError(f"{name}: expected integer {what} ({e})") from None
    except OverflowError as e:
        raise ValueError(f"{name}: a value is out of range for {what} ({e})") from None
    return buf, buf.buffer_info()[0], len(buf)


def as_tokens(tokens: Any, name: str = "tokens") -> Tuple[Any, int, int]:
    """(keep-alive object, int64 buffer address, count) for a list or 1-D integer array."""
    arr = _numpy_array(tokens, name)
    if arr is not None:
        return _from_numpy(arr, name, "int64", "token ids")
    return _from_sequence(tokens, name, "q", "token ids")


def as_block_ids(block_ids: Any, name: str = "block_ids") -> Tuple[Any, int, int]:
    """(keep-alive object, uint32 buffer address, count) for a list or 1-D integer array."""
    arr = _numpy_array(block_ids, name)
    if arr is not None:
        return _from_numpy(arr, name, "uint32", "block ids")
    return _from_sequence(block_ids, name, "I", "block ids")


def positive_int(value: Any, name: str) -> int:
    """`value` as an int > 0; TypeError or ValueError naming it otherwise."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    n = value.__index__()
    if n <= 0:
        raise ValueError(f"{name}: must be positive, got {n}")
    return n
