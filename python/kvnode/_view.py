"""ArrayView: what register_kv_cache reads of one layer, whichever library made it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

__all__ = ["ArrayView"]


@dataclass(frozen=True)
class ArrayView:
    """A layer's address, shape, byte strides (None: C-contiguous), element size and dtype."""

    ptr: int
    shape: Tuple[int, ...]
    strides: Optional[Tuple[int, ...]]
    itemsize: int
    dtype: str
    device: Optional[int] = None  # CUDA device ordinal when known; None on the host

    def contiguous(self) -> bool:
        """C-contiguous: strides as a dense row-major array's (size-1 dimensions excepted)."""
        if self.strides is None:
            return True
        expected = self.itemsize
        for dim, stride in zip(reversed(self.shape), reversed(self.strides)):
            if dim != 1 and stride != expected:
                return False
            expected *= dim
        return True

    @property
    def nbytes(self) -> int:
        n = self.itemsize
        for d in self.shape:
            n *= d
        return n
