"""A stand-in for CuPy made of NumPy, so the GPU code paths run where there is no GPU.

Its arrays are NumPy arrays of another type whose module is "cupy": mpicoll takes them
for device arrays and goes down every GPU path (library-aware allocation, staging through
"pinned" memory, results given back as "CuPy" arrays), while the memory is host memory
and the arithmetic NumPy's. It checks mpicoll's logic, not CUDA: the real thing runs in
tests/test_gpu.py on a GPU.
"""

from __future__ import annotations

import sys
import types

import numpy as np


class ndarray(np.ndarray):  # noqa: N801  (CuPy's name)
    """A 'device' array: NumPy memory, CuPy's type name and copy methods."""

    def get(self, stream=None, order="C", out=None, blocking=True):
        if out is None:
            return np.array(self.view(np.ndarray))
        out[...] = self.view(np.ndarray)
        return out

    def set(self, arr, stream=None):
        assert isinstance(arr, np.ndarray) and type(arr) is np.ndarray, "set takes host memory"
        self.view(np.ndarray)[...] = arr

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (self.__array_interface__["data"][0], False), "strides": None}


ndarray.__module__ = "cupy._core.core"


class _Stream:
    ptr = 0
    synchronized = 0

    def synchronize(self):
        _Stream.synchronized += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _device(a):
    return np.asarray(a).view(ndarray)


def make_module() -> types.ModuleType:
    cupy = types.ModuleType("cupy")
    cupy.ndarray = ndarray
    cupy.empty = lambda shape, dtype=float: np.empty(shape, dtype).view(ndarray)
    cupy.zeros = lambda shape, dtype=float: np.zeros(shape, dtype).view(ndarray)
    cupy.asarray = lambda a, dtype=None: np.array(a, dtype=dtype).view(ndarray)
    cupy.ascontiguousarray = lambda a: np.ascontiguousarray(a.view(np.ndarray)).view(ndarray)
    cupy.may_share_memory = np.may_share_memory
    cupy.asnumpy = lambda a: np.array(a.view(np.ndarray))
    stream = _Stream()
    cupy.cuda = types.SimpleNamespace(
        get_current_stream=lambda: stream,
        alloc_pinned_memory=lambda nbytes: bytearray(nbytes),
        Stream=_Stream,
    )
    return cupy


class installed:
    """``with installed():`` makes ``import cupy`` give the stand-in."""

    def __enter__(self):
        self._saved = sys.modules.get("cupy")
        sys.modules["cupy"] = make_module()
        return sys.modules["cupy"]

    def __exit__(self, *exc):
        if self._saved is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = self._saved
        return False
