"""A DLPack producer written with ctypes: tensors that no array library made.

``Tensor(memory, device_type)`` exports any C-contiguous NumPy memory as a DLPack
capsule (``__dlpack__``/``__dlpack_device__``) naming the host (kDLCPU) or, for the CuPy
stand-in, a "CUDA" device (kDLCUDA), as torch or CuPy would. Consumers (NumPy, mpi4py,
mpicoll) see only the capsule: the struct layout is dlpack.h's unversioned
``DLManagedTensor``.
"""

from __future__ import annotations

import ctypes

import numpy as np

KDL_CPU, KDL_CUDA = 1, 2
# dlpack.h: DLDataTypeCode
_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
_BFLOAT = 4


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


class DLManagedTensorVersioned(ctypes.Structure):  # DLPack 1.0: a version, and flags
    pass


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
_DELETER_VERSIONED = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", _DELETER)]
DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER_VERSIONED), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]

_ALIVE: dict[int, object] = {}  # address of a DLManagedTensor -> what keeps it valid


def _forget(managed) -> None:  # the consumer is done: drop what kept the memory alive
    _ALIVE.pop(ctypes.addressof(managed.contents), None)


_delete, _delete_versioned = _DELETER(_forget), _DELETER_VERSIONED(_forget)


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def dlpack_dtype(dtype: np.dtype) -> DLDataType:
    """dlpack.h's type of ``dtype``; BufferError for what DLPack cannot name."""
    if dtype.name == "bfloat16":
        return DLDataType(_BFLOAT, 16, 1)
    if dtype.kind not in _CODES or dtype.byteorder not in "=|" or dtype.fields:
        raise BufferError(f"dtype {dtype} is not supported for dlpack export")
    return DLDataType(_CODES[dtype.kind], 8 * dtype.itemsize, 1)


def capsule(memory: np.ndarray, device_type: int, device_id: int = 0,
            versioned: bool = True) -> object:
    """A capsule over ``memory`` (kept alive until the consumer deletes it): DLPack 1.0's
    "dltensor_versioned" (writeable), or the older "dltensor"."""
    ndim = memory.ndim
    shape = (ctypes.c_int64 * max(ndim, 1))(*memory.shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*(s // max(memory.itemsize, 1)
                                                 for s in memory.strides))
    address = memory.__array_interface__["data"][0]
    tensor = DLTensor(address, DLDevice(device_type, device_id), ndim,
                      dlpack_dtype(memory.dtype), shape, strides, 0)
    if versioned:
        managed = DLManagedTensorVersioned(DLPackVersion(1, 0), None, _delete_versioned, 0,
                                           tensor)
    else:
        managed = DLManagedTensor(tensor, None, _delete)
    _ALIVE[ctypes.addressof(managed)] = (managed, shape, strides, memory)
    name = b"dltensor_versioned" if versioned else b"dltensor"
    return _capsule_new(ctypes.addressof(managed), name, None)


class Tensor:
    """A tensor of a library that is not NumPy: it speaks DLPack only."""

    def __init__(self, memory: np.ndarray, device_type: int = KDL_CPU, device_id: int = 0):
        self._memory, self._device = memory, (device_type, device_id)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("this producer never copies")
        versioned = max_version is not None and max_version[0] >= 1
        return capsule(self._memory, *self._device, versioned=versioned)

    def __dlpack_device__(self):
        return self._device
