"""From an engine's per-layer KV tensors to kvnode_kv_register's parameters.

Reads each layer (a numpy array over kvnode.host_array memory, or a CUDA tensor), checks that
all are contiguous with one shape and dtype, infers the cache's shape from the layout, and finds
the allocation each layer lies in (layers sharing one are registered once). Every refusal is a
ValueError or TypeError naming the argument (``layers[3]``, ``block_size``, ``layout``).

Layouts, per layer (the engine KV path's presets):

- ``"vllm"``: ``[2, num_blocks, block_size, num_kv_heads, head_size]`` (FlashAttention; K at 0)
- ``"flashinfer"``: ``[num_blocks, 2, block_size, num_kv_heads, head_size]``
- ``"mla"``: ``[num_blocks, block_size, head_size]`` (one latent "head")
- ``"sglang"``: a ``(k, v)`` pair per layer, each ``[num_blocks * block_size, num_kv_heads,
  head_size]`` (MHATokenToKVPool's token slots; a block is block_size slots)
- ``"packed"``: ``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` with any strides (K
  then V in the last axis, which must be contiguous), every layer with the same strides: vLLM
  >= 0.33's views of one allocation, in whichever physical order (KVCacheLayout) it chose
- ``"packed_cpu"``: the same views as vLLM's CPU attention backend reads them: each (block, head)
  page is block_size K rows then block_size V rows of head_size (``cpu_attn.py`` views a layer
  as ``[num_blocks, num_kv_heads, 2 * block_size, head_size]``); a page must be contiguous
- ``"packed_mla"``: ``[num_blocks, 1, block_size, head_size]`` with any strides (vLLM >= 0.33 MLA)
- ``"strided"``: a ``(k, v)`` pair per layer, each ``[num_blocks, num_kv_heads, block_size,
  head_size]`` with any strides (the last axis contiguous), K and V with the same strides and V
  the same number of bytes after K in every layer: views of a buffer in any physical order
  (SGLang's host pools: K in one half of the buffer, V in the other)

The fixed layouts want contiguous layers; the packed ones are registered by their strides.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _lib
from ._host import host_memory_of
from ._view import ArrayView

__all__ = ["LAYOUTS", "Registration", "plan"]

LAYOUTS = {
    "vllm": _lib.KV_VLLM,
    "flashinfer": _lib.KV_FLASHINFER,
    "mla": _lib.KV_MLA,
    "sglang": _lib.KV_SGLANG,
    "packed": _lib.KV_STRIDED,
    "packed_cpu": _lib.KV_STRIDED,
    "packed_mla": _lib.KV_MLA_STRIDED,
    "strided": _lib.KV_STRIDED,
}
_SHAPES = {
    "vllm": "[2, num_blocks, block_size, num_kv_heads, head_size]",
    "flashinfer": "[num_blocks, 2, block_size, num_kv_heads, head_size]",
    "mla": "[num_blocks, block_size, head_size]",
    "sglang": "[num_blocks * block_size, num_kv_heads, head_size] (K and V)",
    "packed": "[num_blocks, num_kv_heads, block_size, 2 * head_size]",
    "packed_cpu": "[num_blocks, num_kv_heads, block_size, 2 * head_size]",
    "packed_mla": "[num_blocks, 1, block_size, head_size]",
    "strided": "[num_blocks, num_kv_heads, block_size, head_size] (K and V)",
}
_PACKED = ("packed", "packed_cpu", "packed_mla", "strided")
_U32 = 0xFFFFFFFF


@dataclass
class Registration:
    """kvnode_kv_register_params_t's contents, in Python values."""

    preset: int
    num_blocks: int
    block_size: int
    kv_heads: int
    head_size: int
    elem_bytes: int
    dtype: str
    device: str  # "host" or "cuda"
    buffers: List[Tuple[int, int, int]] = field(default_factory=list)  # base, bytes, offset
    allocations: List[_lib.KvAllocation] = field(default_factory=list)
    keep: List[Any] = field(default_factory=list)  # HostMemory objects the registration needs
    # packed layouts: (block_stride, token_stride, head_stride, v_offset) in bytes; else None
    strides: Optional[Tuple[int, int, int, int]] = None


def _host_view(obj: Any, name: str) -> ArrayView:
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        dt = obj.dtype
        if dt.hasobject or dt.fields is not None or dt.kind not in "fiuV":
            raise TypeError(f"{name}: dtype {dt} is not a KV element type (float, int or bytes)")
        return ArrayView(
            ptr=obj.__array_interface__["data"][0],
            shape=tuple(obj.shape),
            strides=None if obj.flags.c_contiguous else tuple(obj.strides),
            itemsize=dt.itemsize,
            dtype=dt.name,
        )
    if type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr"):
        size = obj.element_size()
        return ArrayView(
            ptr=obj.data_ptr(),
            shape=tuple(obj.shape),
            strides=tuple(s * size for s in obj.stride()),
            itemsize=size,
            dtype=str(obj.dtype).replace("torch.", ""),
        )
    raise TypeError(
        f"{name}: expected a numpy array from kvnode.host_array or a CUDA tensor (torch, cupy, "
        f"__cuda_array_interface__ or DLPack), got {type(obj).__name__}"
    )


def _view(obj: Any, name: str) -> Tuple[ArrayView, bool]:
    """(view, is_cuda)."""
    if not hasattr(obj, "__array_interface__") and (
        hasattr(obj, "__cuda_array_interface__")
        or hasattr(obj, "__dlpack_device__")
        or getattr(obj, "is_cuda", False)
    ):
        from . import _cuda  # imported for CUDA arrays only

        if _cuda.is_cuda_array(obj):
            return _cuda.describe(obj), True
    return _host_view(obj, name), False


def _dims(shape: Tuple[int, ...], layout: str, block_size: int, name: str) -> Tuple[int, int, int]:
    """(num_blocks, kv_heads, head_size) of one layer's shape under `layout`."""
    want = _SHAPES[layout]
    ndim = {"vllm": 5, "flashinfer": 5, "mla": 3, "sglang": 3, "packed": 4, "packed_cpu": 4,
            "packed_mla": 4, "strided": 4}[layout]
    if len(shape) != ndim:
        raise ValueError(f"{name}: a {layout} layer is {want}; got shape {shape}")
    if layout == "vllm":
        two, num_blocks, bs, heads, head = shape
    elif layout == "flashinfer":
        num_blocks, two, bs, heads, head = shape
    elif layout == "mla":
        num_blocks, bs, head = shape
        two, heads = 2, 1
    elif layout in ("packed", "packed_cpu"):
        num_blocks, heads, bs, channels = shape
        two, head = 2, channels // 2
        if channels % 2:
            raise ValueError(f"{name}: a packed layer's last axis is K then V (2 * head_size); "
                             f"got {channels}, an odd size (shape {shape})")
    elif layout == "strided":
        num_blocks, heads, bs, head = shape
        two = 2
    elif layout == "packed_mla":
        num_blocks, one, bs, head = shape
        two, heads = 2, 1
        if one != 1:
            raise ValueError(f"{name}: a packed_mla layer is {want}; got shape {shape}")
    else:
        slots, heads, head = shape
        two, bs = 2, block_size
        if slots % block_size:
            raise ValueError(
                f"{name}: {slots} token slots are not whole blocks of block_size {block_size}"
            )
        num_blocks = slots // block_size
    if two != 2:
        raise ValueError(f"{name}: a {layout} layer is {want}; got shape {shape} (K and V: 2)")
    if bs != block_size:
        raise ValueError(
            f"{name}: block_size is {block_size} but the layer's blocks hold {bs} tokens "
            f"({layout}: {want}; shape {shape})"
        )
    if min(num_blocks, heads, head) <= 0 or max(num_blocks, heads, head) > _U32:
        raise ValueError(f"{name}: shape {shape} has an empty or oversized dimension")
    return num_blocks, heads, head


def _tensors(layers: Sequence[Any], layout: str) -> List[Tuple[str, Any]]:
    """(name, tensor) for every tensor of `layers` (SGLang: K and V of each layer; strided: K,
    its V checked against it)."""
    if layout == "strided":
        for i, pair in enumerate(layers):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError(f"layers[{i}]: a strided layer is a (k, v) pair of views")
        return [(f"layers[{i}][0]", pair[0]) for i, pair in enumerate(layers)]
    if layout != "sglang":
        return [(f"layers[{i}]", t) for i, t in enumerate(layers)]
    out: List[Tuple[str, Any]] = []
    for i, pair in enumerate(layers):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"layers[{i}]: an sglang layer is a (k, v) pair of tensors")
        out += [(f"layers[{i}][0]", pair[0]), (f"layers[{i}][1]", pair[1])]
    return out


class _Allocations:
    """The allocations a registration's layers lie in, each once (layers may share one)."""

    def __init__(self, reg: Registration,
                 process_memory: Optional[Tuple[int, int]] = None) -> None:
        self.reg = reg
        self.process_memory = process_memory  # (base, bytes) the node copies without mapping
        self.cuda: Dict[int, Any] = {}  # base -> _cuda.CudaAllocation
        self.cuda_device: Any = None
        self.first = ""

    def add(self, name: str, view: ArrayView, on_cuda: bool) -> None:
        """Appends the layer's buffer (base, bytes, offset), and its allocation if new."""
        self.first = self.first or name
        if on_cuda:
            from . import _cuda

            a = _cuda.allocation_of(view.ptr, name, self.cuda)
            if self.cuda_device is None:
                self.cuda_device = a.device
            elif a.device != self.cuda_device:
                raise ValueError(f"{name}: on CUDA device {a.device}, {self.first} on "
                                 f"{self.cuda_device}: one node serves one GPU's cache")
            base, nbytes = a.base, a.nbytes
            if not any(x.base == base for x in self.reg.allocations):
                alloc = _lib.KvAllocation(kind=_lib.MEMORY_CUDA_IPC, base=base, bytes=nbytes, fd=-1)
                ctypes.memmove(alloc.ipc_handle, a.ipc_handle, len(a.ipc_handle))
                self.reg.allocations.append(alloc)
        else:
            m = host_memory_of(view.ptr, _extent(view))
            if m is None and self.process_memory is not None:
                base, nbytes = self.process_memory
                if not (base <= view.ptr and view.ptr + _extent(view) <= base + nbytes):
                    raise ValueError(f"{name}: outside process_memory ({base:#x}, {nbytes})")
                if not self.reg.allocations:
                    self.reg.allocations.append(_lib.KvAllocation(
                        kind=_lib.MEMORY_HOST_PROCESS, base=base, bytes=nbytes, fd=-1))
                self.reg.buffers.append((base, nbytes, view.ptr - base))
                return
            if m is None:
                raise ValueError(f"{name}: not in memory the node can map; allocate the KV cache "
                                 "with kvnode.host_array() (or pass process_memory)")
            base, nbytes = m.base, m.nbytes
            if not any(x.base == base for x in self.reg.allocations):
                self.reg.allocations.append(_lib.KvAllocation(
                    kind=_lib.MEMORY_HOST_FD, base=base, bytes=nbytes, fd=m.fd))
                self.reg.keep.append(m)
        self.reg.buffers.append((base, nbytes, view.ptr - base))


def _extent(view: ArrayView) -> int:
    """Bytes from the view's first element to the end of its last (a strided view's span)."""
    if view.strides is None:
        return view.nbytes
    if any(d == 0 for d in view.shape):
        return 0
    return sum((d - 1) * s for d, s in zip(view.shape, view.strides)) + view.itemsize


def _packed_strides(name: str, view: ArrayView, layout: str) -> Tuple[int, int, int, int]:
    """(block, token, head, v_offset) in bytes of a packed layer; ValueError when its rows are
    not contiguous or a stride is negative."""
    strides = view.strides
    if strides is None:  # C-contiguous
        _, heads, bs, channels = view.shape
        strides = (heads * bs * channels * view.itemsize, bs * channels * view.itemsize,
                   channels * view.itemsize, view.itemsize)
    block, head, token, channel = strides
    if layout == "strided":
        channel = channel if view.shape[3] > 1 else view.itemsize  # one element: any stride
    if channel != view.itemsize or min(strides) < 0:
        raise ValueError(f"{name}: a {layout} layer's last axis must be contiguous with positive "
                         f"strides; got strides {strides} (bytes) for shape {view.shape}")
    row = (view.shape[3] // 2) * view.itemsize  # one head's K (or V) of one token
    if layout == "packed_cpu":
        if token != 2 * row:
            raise ValueError(f"{name}: a packed_cpu layer's (block, head) pages must be "
                             f"contiguous; got strides {strides} (bytes) for shape {view.shape}")
        return block, row, head, view.shape[2] * row  # K rows, then the page's V rows
    if layout == "strided":
        return block, token, head, 0  # v_offset: from the V view (_strided_v)
    return block, token, head, row if layout == "packed" else 0


def _strided_v(layers: Sequence[Any], i: int, k: ArrayView, on_cuda: bool) -> int:
    """The bytes from layer i's K to its V (a strided pair); ValueError naming the V view."""
    name = f"layers[{i}][1]"
    v, v_cuda = _view(layers[i][1], name)
    _same(name, v, v_cuda, f"layers[{i}][0]", k, on_cuda)
    if v.strides != k.strides:
        raise ValueError(f"{name}: strides {v.strides} differ from its K's {k.strides}")
    if v.ptr <= k.ptr:
        raise ValueError(f"{name}: V must lie after K in memory (K at {k.ptr:#x}, V at "
                         f"{v.ptr:#x})")
    return v.ptr - k.ptr


def _same(name: str, view: ArrayView, on_cuda: bool, first: str, v0: ArrayView,
          cuda0: bool) -> None:
    """ValueError naming `name` when it differs from the first layer."""
    where = {True: "cuda", False: "the host"}
    if on_cuda != cuda0:
        raise ValueError(f"{name}: on {where[on_cuda]}, but {first} is on {where[cuda0]}: all "
                         "layers live in one place")
    if view.shape != v0.shape:
        raise ValueError(f"{name}: shape {view.shape} differs from {first}'s {v0.shape}")
    if view.dtype != v0.dtype or view.itemsize != v0.itemsize:
        raise ValueError(f"{name}: dtype {view.dtype} differs from {first}'s {v0.dtype}")


def plan(layers: Sequence[Any], block_size: int, layout: str,
         process_memory: Optional[Tuple[int, int]] = None) -> Registration:
    """Checks `layers` and finds their allocations; the registration to send."""
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
        raise TypeError(
            f"layers: expected a list with one array per layer, got {type(layers).__name__}"
        )
    if len(layers) == 0:
        raise ValueError("layers: empty; pass one array per model layer")
    tensors = _tensors(layers, layout)
    first_name = tensors[0][0]
    v0, cuda0 = _view(tensors[0][1], first_name)
    num_blocks, heads, head = _dims(v0.shape, layout, block_size, first_name)
    reg = Registration(
        preset=LAYOUTS[layout], num_blocks=num_blocks, block_size=block_size, kv_heads=heads,
        head_size=head, elem_bytes=v0.itemsize, dtype=v0.dtype,
        device="cuda" if cuda0 else "host",
    )
    allocations = _Allocations(reg, process_memory)
    for i, (name, tensor) in enumerate(tensors):
        view, on_cuda = (v0, cuda0) if i == 0 else _view(tensor, name)
        _same(name, view, on_cuda, first_name, v0, cuda0)
        _check_layout(reg, name, view, layout)
        if layout == "strided":
            v_offset = _strided_v(layers, i, view, on_cuda)
            assert reg.strides is not None
            if i == 0:
                reg.strides = reg.strides[:3] + (v_offset,)
            elif v_offset != reg.strides[3]:
                raise ValueError(f"layers[{i}][1]: V lies {v_offset} bytes after K, in "
                                 f"layers[0] {reg.strides[3]}: one distance for every layer")
            # V must lie in K's allocation: the node maps that one (checked by the node too).
            allocations.add(f"layers[{i}][1]", _view(layers[i][1], f"layers[{i}][1]")[0],
                            on_cuda)
            reg.buffers.pop()  # V is not a buffer of its own: K's offset plus v_offset
        allocations.add(name, view, on_cuda)
    return reg


def _check_layout(reg: Registration, name: str, view: ArrayView, layout: str) -> None:
    """Contiguity (fixed layouts) or the shared strides (packed ones), naming the layer."""
    if layout not in _PACKED:
        if not view.contiguous():
            raise ValueError(f"{name}: not contiguous (shape {view.shape}, strides "
                             f"{view.strides}); pass the cache's contiguous tensors")
        return
    strides = _packed_strides(name, view, layout)
    if reg.strides is None:
        reg.strides = strides
    elif strides[:3] != reg.strides[:3]:
        raise ValueError(f"{name}: strides {view.strides} differ from the first layer's; a "
                         f"{layout} cache's layers share one layout")
