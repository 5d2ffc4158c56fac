"""Array libraries: NumPy on the host, CuPy on the GPU, and anything with ``__dlpack__``.

Every collective takes its input through ``as_array``, which returns the array it works
on (a NumPy or CuPy array, a view of the caller's memory, never a copy) and a function
that turns a result back into the caller's kind (a torch tensor comes back a torch
tensor, through DLPack again). Algorithms then call the array's own library: the ops
are ufuncs (NumPy dispatches ``np.add`` on CuPy arrays to ``cupy.add``) and workspace
comes from ``empty(..., like=x)``. CuPy is imported only when a CuPy array (or a CUDA
DLPack tensor) shows up, so nothing here needs CUDA to import.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from .errors import InvalidArgumentError, UnsupportedDtypeError

# DLPack device types (dlpack.h: DLDeviceType)
DLPACK_CPU, DLPACK_CUDA, DLPACK_CUDA_HOST, DLPACK_CUDA_MANAGED = 1, 2, 3, 13


def same(result: Any) -> Any:
    """The result as it is: what ``as_array`` gives back for NumPy and CuPy input."""
    return result


def is_cupy(x: Any) -> bool:
    """Whether ``x`` is a CuPy array (checked without importing CuPy)."""
    return type(x).__module__.startswith("cupy") and hasattr(x, "__cuda_array_interface__")


def cupy_module() -> ModuleType:
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - exercised where CuPy is missing
        raise InvalidArgumentError(
            "x: a GPU array needs CuPy (pip install mpicoll[cuda12] or [cuda13])") from exc
    return cupy


def module_of(x: Any) -> ModuleType:
    """The array library of ``x``: numpy or cupy."""
    return np if type(x) is np.ndarray or not is_cupy(x) else cupy_module()


def _back_to(x: Any) -> Callable[[Any], Any]:
    """A function giving a result the kind of the foreign array ``x`` (torch, JAX, ...)."""
    package = type(x).__module__.split(".")[0]
    if package == "torch":
        import torch

        return lambda result: None if result is None else torch.from_dlpack(result)
    if package in ("jax", "jaxlib"):
        import jax.numpy as jnp

        return lambda result: None if result is None else jnp.from_dlpack(result)
    return same


def as_array(x: Any, name: str) -> tuple[Any, Callable[[Any], Any]]:
    """``x`` as a NumPy or CuPy array (no copy), and how to give a result x's kind back.

    Raises:
        InvalidArgumentError: x is None or not an array.
        UnsupportedDtypeError: x holds Python objects, which cannot travel as bytes.
    """
    if type(x) is np.ndarray or is_cupy(x):
        array, back = x, same
    elif x is None:
        raise InvalidArgumentError(f"{name}: expected an array, got None")
    elif isinstance(x, (bool, int, float, complex, np.generic)):
        array, back = np.asarray(x), same
    elif isinstance(x, np.ndarray):  # a subclass (np.matrix, memmap): its base class
        array, back = x.view(np.ndarray), same
    elif hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        device_type = int(x.__dlpack_device__()[0])
        if device_type in (DLPACK_CPU, DLPACK_CUDA_HOST):
            array = np.from_dlpack(x)
        elif device_type in (DLPACK_CUDA, DLPACK_CUDA_MANAGED):
            array = cupy_module().from_dlpack(x)
        else:
            raise InvalidArgumentError(
                f"{name}: DLPack device type {device_type} is neither the host nor CUDA")
        back = _back_to(x)
    else:
        raise InvalidArgumentError(
            f"{name}: expected a NumPy or CuPy array (or any __dlpack__ tensor), "
            f"got {type(x).__name__}")
    if array.dtype.hasobject:
        raise UnsupportedDtypeError(
            f"{name}: dtype {array.dtype} holds Python objects, which cannot travel as bytes")
    return array, back


def empty(shape: Any, dtype: Any, like: Any = None) -> Any:
    """A new array in ``like``'s library (NumPy when like is None or a NumPy array)."""
    if like is None or type(like) is np.ndarray or not is_cupy(like):
        return np.empty(shape, dtype)
    return cupy_module().empty(shape, dtype)


def to_host(x: Any) -> np.ndarray:
    """A NumPy copy (or x itself when it is one)."""
    return x if type(x) is np.ndarray else x.get()


def may_share_memory(a: Any, b: Any) -> bool:
    if type(a) is np.ndarray and type(b) is np.ndarray:
        return np.may_share_memory(a, b)
    if is_cupy(a) and is_cupy(b):
        return cupy_module().may_share_memory(a, b)
    return False  # host and device memory never overlap


def assign_from_host(dst: Any, host: np.ndarray) -> None:
    """``dst[...] = host`` for a NumPy or CuPy ``dst`` (a host-to-device copy on the GPU)."""
    if type(dst) is np.ndarray:
        dst[...] = host
    elif dst.flags.c_contiguous and dst.shape == host.shape:
        dst.set(np.ascontiguousarray(host))  # on the current stream
    else:
        dst[...] = cupy_module().asarray(host)


def device_like() -> Any:
    """An empty CuPy array: ``like=`` for allocating on the current GPU."""
    return cupy_module().empty(0, np.uint8)
