"""CUDA tensors as KV cache layers: where they lie, and the IPC handle the node maps them by.

Imported only when a layer is a CUDA array. Reads a tensor's address, shape, strides and element
size from torch directly (its ``__cuda_array_interface__`` refuses bfloat16), from
``__cuda_array_interface__`` (cupy, numba, ...) or from a DLPack capsule; then asks the CUDA
driver (``libcuda.so.1`` through ctypes: no CUDA toolkit, no runtime version to match) for the
allocation the address lies in (``cuMemGetAddressRange``) and its IPC handle
(``cuIpcGetMemHandle``, which the node opens with ``cudaIpcOpenMemHandle``). The node maps whole
allocations: layers in one allocation (one ``cudaMalloc``, one segment of PyTorch's caching
allocator) share it.

Memory that CUDA IPC cannot share (PyTorch's expandable segments, which are VMM allocations;
``cudaMallocAsync`` pools) is refused with a ValueError saying so: run PyTorch with
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False``.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any, Dict, Optional

from ._errors import Error
from ._view import ArrayView

__all__ = ["CudaAllocation", "allocation_of", "describe", "is_cuda_array"]

_CU_POINTER_ATTRIBUTE_CONTEXT = 1
_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10
_KDL_CUDA = 2
_KDL_CUDA_MANAGED = 13
_DLPACK_TYPE_CODES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}


@dataclass(frozen=True)
class CudaAllocation:
    """One cudaMalloc allocation: its base, size and CUDA IPC handle (64 bytes)."""

    base: int
    nbytes: int
    ipc_handle: bytes
    device: int


def is_cuda_array(obj: Any) -> bool:
    """True for torch CUDA tensors, __cuda_array_interface__ and CUDA DLPack exporters."""
    if type(obj).__module__.startswith("torch") and hasattr(obj, "is_cuda"):
        return bool(obj.is_cuda)
    if hasattr(obj, "__cuda_array_interface__"):
        return True
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is not None and not hasattr(obj, "__array_interface__"):
        try:
            return dev()[0] in (_KDL_CUDA, _KDL_CUDA_MANAGED)
        except Exception:
            return False
    return False


def _torch_view(t: Any) -> ArrayView:
    size = t.element_size()
    return ArrayView(
        ptr=t.data_ptr(),
        shape=tuple(t.shape),
        strides=tuple(s * size for s in t.stride()),
        itemsize=size,
        dtype=str(t.dtype).replace("torch.", ""),
        device=t.device.index,
    )


def _cai_view(obj: Any) -> ArrayView:
    cai = obj.__cuda_array_interface__
    typestr = cai["typestr"]
    itemsize = int(typestr[2:])
    strides = cai.get("strides")
    device = getattr(getattr(obj, "device", None), "id", None)
    return ArrayView(
        ptr=int(cai["data"][0]),
        shape=tuple(int(d) for d in cai["shape"]),
        strides=tuple(int(s) for s in strides) if strides is not None else None,
        itemsize=itemsize,
        dtype=typestr[1:],
        device=device if isinstance(device, int) else None,
    )


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


def _dlpack_view(obj: Any) -> ArrayView:
    """Reads the DLTensor at the head of an unversioned DLManagedTensor capsule. The capsule is
    left unconsumed, so dropping it calls the producer's deleter; `obj` keeps the memory."""
    capsule = obj.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    t = _DLTensor.from_address(get(capsule, b"dltensor"))
    ndim = t.ndim
    shape = tuple(t.shape[i] for i in range(ndim))
    itemsize = t.dtype.bits * t.dtype.lanes // 8
    strides = tuple(t.strides[i] * itemsize for i in range(ndim)) if t.strides else None
    dtype = f"{_DLPACK_TYPE_CODES.get(t.dtype.code, 'code' + str(t.dtype.code))}{t.dtype.bits}"
    view = ArrayView(
        ptr=(t.data or 0) + t.byte_offset,
        shape=shape,
        strides=strides,
        itemsize=itemsize,
        dtype=dtype,
        device=t.device.device_id,
    )
    del capsule
    return view


def describe(obj: Any) -> ArrayView:
    """The address, shape, byte strides, element size and dtype of a CUDA array."""
    if type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr"):
        return _torch_view(obj)
    if hasattr(obj, "__cuda_array_interface__"):
        return _cai_view(obj)
    return _dlpack_view(obj)


class _Driver:
    """The few CUDA driver entry points used here, from libcuda.so.1."""

    def __init__(self) -> None:
        try:
            cu = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise Error(f"CUDA tensors need the CUDA driver: libcuda.so.1: {e}", "refused", -7)
        c_int, c_void_p, c_size_t, c_uint64 = (
            ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64,
        )
        self.cu = cu
        proto = {
            "cuInit": [ctypes.c_uint],
            "cuPointerGetAttribute": [c_void_p, c_int, c_uint64],
            "cuCtxPushCurrent_v2": [c_void_p],
            "cuCtxPopCurrent_v2": [ctypes.POINTER(c_void_p)],
            "cuMemGetAddressRange_v2": [
                ctypes.POINTER(c_uint64), ctypes.POINTER(c_size_t), c_uint64,
            ],
            "cuIpcGetMemHandle": [ctypes.c_char_p, c_uint64],
            "cuGetErrorName": [c_int, ctypes.POINTER(ctypes.c_char_p)],
        }
        for name, argtypes in proto.items():
            fn = getattr(cu, name)
            fn.argtypes = argtypes
            fn.restype = c_int
        self.check(self.call("cuInit", 0), "cuInit")

    def error_name(self, code: int) -> str:
        name = ctypes.c_char_p()
        if self.cu.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
            return name.value.decode()
        return f"CUresult {code}"

    def call(self, name: str, *args: Any) -> int:
        return getattr(self.cu, name)(*args)

    def check(self, code: int, what: str) -> None:
        if code != 0:
            raise Error(f"{what}: {self.error_name(code)}", "internal", -9)


_driver: Optional[_Driver] = None
_driver_lock = threading.Lock()


def _get_driver() -> _Driver:
    global _driver
    with _driver_lock:
        if _driver is None:
            _driver = _Driver()
        return _driver


def allocation_of(ptr: int, name: str, cache: Dict[int, CudaAllocation]) -> CudaAllocation:
    """The cudaMalloc allocation `ptr` lies in, with its IPC handle. `cache` (by base) saves a
    second handle for layers of one allocation. ValueError naming `name` when CUDA IPC cannot
    share it."""
    d = _get_driver()
    capable = ctypes.c_int(1)
    if d.call("cuPointerGetAttribute", ctypes.byref(capable),
              _CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ptr) == 0 and not capable.value:
        raise ValueError(
            f"{name}: this CUDA memory cannot be shared through CUDA IPC (a VMM allocation, "
            "e.g. PyTorch's expandable segments, or a cudaMallocAsync pool); run PyTorch with "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False"
        )
    ctx = ctypes.c_void_p()
    code = d.call("cuPointerGetAttribute", ctypes.byref(ctx), _CU_POINTER_ATTRIBUTE_CONTEXT, ptr)
    if code != 0:
        raise ValueError(f"{name}: {ptr:#x} is not CUDA device memory ({d.error_name(code)})")
    device = ctypes.c_int()
    d.check(
        d.call("cuPointerGetAttribute", ctypes.byref(device),
               _CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr),
        f"{name}: cuPointerGetAttribute(DEVICE_ORDINAL)",
    )
    pushed = bool(ctx.value)  # the allocation's context, current while asking about it
    if pushed:
        d.check(d.call("cuCtxPushCurrent_v2", ctx), f"{name}: cuCtxPushCurrent")
    try:
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        d.check(
            d.call("cuMemGetAddressRange_v2", ctypes.byref(base), ctypes.byref(size), ptr),
            f"{name}: cuMemGetAddressRange",
        )
        known = cache.get(base.value)
        if known is not None:
            return known
        handle = ctypes.create_string_buffer(64)
        code = d.call("cuIpcGetMemHandle", handle, base.value)
        if code != 0:
            raise ValueError(
                f"{name}: cuIpcGetMemHandle refused this allocation ({d.error_name(code)}): "
                "CUDA IPC shares cudaMalloc memory only (for PyTorch: "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False)"
            )
        found = CudaAllocation(base.value, size.value, handle.raw, device.value)
        cache[found.base] = found
        return found
    finally:
        if pushed:
            popped = ctypes.c_void_p()
            d.call("cuCtxPopCurrent_v2", ctypes.byref(popped))
