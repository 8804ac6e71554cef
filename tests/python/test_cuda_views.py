"""The CUDA side's host-checkable half: reading a tensor's address, shape, strides and dtype from
__cuda_array_interface__ and from a DLPack capsule (numpy's, on the CPU: the same DLTensor
layout a CUDA producer hands over), and the refusal where no CUDA driver is there. The driver
calls themselves run on the GPU machine (test_gpu.py)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import kvnode
from kvnode import _cuda


class FakeCudaArray:
    """Just the interface cupy and numba offer; the address means nothing."""

    def __init__(self, shape, typestr="<f2", strides=None, ptr=0x7F0000000000):
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": typestr, "data": (ptr, False), "strides": strides,
            "version": 3,
        }


def test_cuda_array_interface():
    a = FakeCudaArray((2, 4, 16, 8, 64))
    assert _cuda.is_cuda_array(a)
    v = _cuda.describe(a)
    assert (v.ptr, v.shape, v.itemsize, v.dtype) == (0x7F0000000000, (2, 4, 16, 8, 64), 2, "f2")
    assert v.contiguous()
    strided = _cuda.describe(FakeCudaArray((2, 3), strides=(12, 2)))
    assert not strided.contiguous()


def test_dlpack_capsule():
    a = np.arange(2 * 3 * 4, dtype=np.float16).reshape(2, 3, 4)
    v = _cuda._dlpack_view(a)
    assert v.ptr == a.ctypes.data
    assert (v.shape, v.itemsize, v.dtype) == ((2, 3, 4), 2, "float16")
    assert v.contiguous()
    view = a[:, :, ::2]
    w = _cuda._dlpack_view(view)
    assert w.ptr == view.ctypes.data and w.shape == (2, 3, 2) and w.strides == (24, 8, 4)
    assert not w.contiguous()
    assert not _cuda.is_cuda_array(a)  # a CPU exporter


def test_without_a_cuda_driver_a_cuda_layer_is_refused_by_name(cluster):
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("a CUDA driver is here: test_gpu.py covers CUDA layers")
    except OSError:
        pass
    layers = [FakeCudaArray((2, 32, 16, 8, 64)) for _ in range(8)]
    with kvnode.connect(cluster.a.socket) as client:
        with pytest.raises(kvnode.Error, match="libcuda.so.1") as e:
            client.register_kv_cache(layers, 16)
        assert e.value.status == "refused"
