"""Array libraries: NumPy on the host, CuPy on the GPU, and anything with ``__dlpack__``.

Every collective takes its input through ``as_array``, which returns the array it works
on (a NumPy or CuPy array, a view of the caller's memory, never a copy) and a function
that turns a result back into the caller's kind (a torch tensor comes back a torch
tensor, through DLPack again). Algorithms then call the array's own library: the ops
are ufuncs (NumPy dispatches ``np.add`` on CuPy arrays to ``cupy.add``) and workspace
comes from ``empty(..., like=x)``. CuPy is imported only when a CuPy array (or a CUDA
DLPack tensor) shows up, so nothing here needs CUDA to import.

Nothing here reads a device array as NumPy would (CuPy has no ``__array_interface__``
and refuses implicit conversion): addresses come from ``address``, copies from the
array's own library.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError, UnsupportedDtypeError

# DLPack device types (dlpack.h: DLDeviceType)
DLPACK_CPU, DLPACK_CUDA, DLPACK_CUDA_HOST, DLPACK_CUDA_MANAGED = 1, 2, 3, 13


def same(result: Any) -> Any:
    """The result as it is: what ``as_array`` gives back for NumPy and CuPy input."""
    return result


def is_cupy(x: Any) -> bool:
    """Whether ``x`` is a CuPy array (checked without importing CuPy). Its type is asked,
    not the array: CuPy builds ``__cuda_array_interface__`` anew at each read (a dict, the
    dtype's descr, the current stream), about 2 us on a real GPU's host, and a call asks
    this of its arrays about ten times."""
    kind = type(x)
    return kind.__module__.startswith("cupy") and hasattr(kind, "__cuda_array_interface__")


def cupy_module() -> ModuleType:
    """CuPy, or a clear refusal where it is not installed."""
    try:
        import cupy
    except ImportError as exc:
        raise InvalidArgumentError(
            "x: a GPU array needs CuPy (pip install mpicoll[cuda12] or [cuda13])") from exc
    return cupy


_DEVICE_SEEN: ModuleType | None = None  # the CuPy that found a device once: not asked again


def device_cupy() -> ModuleType:
    """CuPy where it can allocate on a GPU: a clear refusal where there is no CUDA driver
    or device (CuPy itself would raise cudaErrorInsufficientDriver at the first array)."""
    global _DEVICE_SEEN
    cupy = cupy_module()
    if _DEVICE_SEEN is not cupy:
        problem = cuda_problem(cupy)
        if problem:
            raise InvalidArgumentError(f"x: a GPU array needs a CUDA device: {problem}")
        _DEVICE_SEEN = cupy
    return cupy


def cuda_problem(cupy: ModuleType) -> str:
    """Why CuPy cannot reach a GPU on this rank ("" when it can)."""
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError, or a driver library missing
        return f"no usable CUDA driver ({type(exc).__name__}: {exc})"
    return "" if count > 0 else "no CUDA device is visible"


def off_current_gpu(x: Any) -> str:
    """Why the CuPy array ``x`` cannot be used here ("": it can): it lives on another
    GPU than the current one, which the call's kernels, workspace and stream are on."""
    device = getattr(getattr(x, "device", None), "id", None)
    if device is None or not is_cupy(x):
        return ""
    current = cupy_module().cuda.runtime.getDevice()
    if device == current:
        return ""
    return (f"on GPU {device}, not the current GPU {current}: make its GPU current "
            f"(with cupy.cuda.Device({device}): ...) or move it there")


def off_backend_gpu(device: int | None) -> str:
    """Why a call cannot run on a Communicator whose backend runs on GPU ``device`` (NCCL:
    its communicator, streams and workspace are that GPU's) from here ("": it can, or
    ``device`` is None): another GPU is current in this thread (CuPy's current GPU is
    per thread, and a new thread starts on GPU 0)."""
    if device is None:
        return ""
    current = cupy_module().cuda.runtime.getDevice()
    if current == device:
        return ""
    return (f"the current GPU is {current}, not this Communicator's GPU {device}: call it "
            f"with its GPU current (with cupy.cuda.Device({device}): ...; a new thread "
            "starts on GPU 0)")


def module_of(x: Any) -> ModuleType:
    """The array library of ``x``: numpy or cupy."""
    return np if type(x) is np.ndarray or not is_cupy(x) else cupy_module()


def address(x: Any) -> int:
    """Where ``x``'s first element is: a host address for NumPy, a device address for
    CuPy (its data pointer) or anything with the CUDA array interface."""
    if type(x) is np.ndarray:
        return x.__array_interface__["data"][0]
    data = getattr(x, "data", None)
    if hasattr(data, "ptr"):
        return int(data.ptr)
    return int(x.__cuda_array_interface__["data"][0])


def same_memory(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same bytes: one library, one start, one size (an
    in-place call where the input already is its slot of the result)."""
    host = type(a) is np.ndarray
    if host != (type(b) is np.ndarray):
        return False  # host and device memory never coincide
    if a.nbytes != b.nbytes:
        return False
    if host and a.nbytes and not np.may_share_memory(a, b):
        return False  # (the frequent answer, in a fifth of the time an address takes)
    return address(a) == address(b)


# torch dtypes NumPy has no name of its own for: (the integer of their width, ml_dtypes')
_TORCH_AS = {"bfloat16": ("int16", "bfloat16"), "float8_e4m3fn": ("uint8", "float8_e4m3fn"),
             "float8_e5m2": ("uint8", "float8_e5m2"),
             "float8_e4m3fnuz": ("uint8", "float8_e4m3fnuz"),
             "float8_e5m2fnuz": ("uint8", "float8_e5m2fnuz"),
             "float8_e8m0fnu": ("uint8", "float8_e8m0fnu")}
# torch's sub-byte integers (int1..int7, uint1..uint7): placeholders, one element a byte,
# whose DLPack export says int8 or uint8 (a result would come back as that: refused)
_TORCH_SUB_BYTE = frozenset(f"{sign}int{bits}" for sign in ("", "u") for bits in range(1, 8))


# small tensors' views, kept: id -> (the tensor, its data_ptr and shape then, the view,
# its strides and dtype then). Tensor.numpy() costs more than a small collective's own
# overhead; a view is given again while the tensor still has that memory, shape, strides
# and dtype (``t.data = t.data.view(torch.int32)`` keeps the rest). Each view holds its
# tensor: at most _VIEWS_KEPT tensors of at most _VIEW_BYTES are kept alive by it (then it
# starts over).
_VIEWS: dict[int, tuple] = {}
_VIEW_BYTES, _VIEWS_KEPT = 1 << 16, 256


def kept_view(x: Any) -> np.ndarray | None:
    """The kept view of ``x`` (see torch_numpy), where ``x`` is a small CPU tensor still
    on the memory and in the shape it was viewed in; else None. A kept view is
    C-contiguous."""
    kept = _VIEWS.get(id(x))
    try:  # (a tensor whose memory was taken since, torch.utils.swap_tensors with a sparse
        # one: its data_ptr raises; the call's whole path then refuses it, numbered)
        if kept is not None and kept[0] is x and kept[1] == _DATA_PTR[0](x) and \
                kept[2] == x.shape and kept[4] == x.stride() and kept[5] is x.dtype and \
                not _DATA_PTR[1](x):  # (t.data = a negative view of its own memory: refused)
            return kept[3]
    except Exception:  # noqa: BLE001 - no view of it kept
        _VIEWS.pop(id(x), None)
    return None


# torch's Tensor.data_ptr and is_neg, unbound (half the cost of the methods' lookup on
# each call), set with the first view kept
_DATA_PTR: list[Any] = [None, None]


def torch_numpy(x: Any) -> np.ndarray | None:
    """A NumPy view of the torch CPU tensor ``x`` (no copy; ``Tensor.numpy()``, far cheaper
    than a DLPack import, and kept for small tensors), bfloat16 and float8 as ml_dtypes'
    types (a tensor that needs grad: its memory, as torch.distributed's collectives use
    it); None where NumPy cannot view it (a conjugate one: DLPack then says why)."""
    view = kept_view(x)
    if view is not None:
        return view
    view = _torch_numpy(x)
    # kept: contiguous ones (a kept view's caller need not ask), never complex ones (the
    # same memory can be given torch's lazy conjugate bit: t.data = t.data.conj(); a real
    # tensor's lazy negation, torch.conj(c).imag, is never contiguous)
    if view is not None and view.nbytes <= _VIEW_BYTES and view.flags.c_contiguous and \
            view.dtype.kind != "c" and not x.requires_grad and _small_storage(x):
        # (never one that needs grad: the tensor kept would keep its autograd graph)
        if len(_VIEWS) >= _VIEWS_KEPT:
            _VIEWS.clear()
        if _DATA_PTR[0] is None:
            c_api = sys.modules["torch"]._C
            tensor_base = getattr(c_api, "TensorBase", None) or c_api._TensorBase  # (older)
            _DATA_PTR[:] = [tensor_base.data_ptr,
                            getattr(tensor_base, "is_neg", lambda tensor: False)]
        _VIEWS[id(x)] = (x, x.data_ptr(), x.shape, view, x.stride(), x.dtype)
    return view


def _small_storage(x: Any) -> bool:
    """Whether all the memory the tensor ``x`` keeps alive is small (a small slice of a
    large flat buffer is not: a kept view would keep the whole buffer)."""
    try:
        return int(x.untyped_storage().nbytes()) <= _VIEW_BYTES
    except Exception:  # noqa: BLE001 - an older torch: keep nothing
        return False


def _torch_numpy(x: Any) -> np.ndarray | None:
    if x.requires_grad:  # its memory, as torch.distributed reads and writes it (autograd
        x = x.detach()   # does not see a collective)
    try:
        return x.numpy()
    except TypeError:  # a dtype NumPy lacks
        name = str(x.dtype).removeprefix("torch.")
        if name not in _TORCH_AS:
            return None
        import ml_dtypes
        import torch

        width, kind = _TORCH_AS[name]
        try:  # (an older ml_dtypes without the kind: AttributeError, not viewed)
            return x.view(getattr(torch, width)).numpy().view(getattr(ml_dtypes, kind))
        except Exception:  # noqa: BLE001 - needs grad, or a view torch cannot make
            return None
    except Exception:  # noqa: BLE001 - needs grad, conjugate, negative bit
        return None


_FROM_NUMPY: list[Any] = []  # torch.from_numpy, once a result has gone back to torch


def to_torch(result: Any) -> Any:
    """A torch tensor over ``result``'s memory (NumPy or CuPy; ml_dtypes' types as torch's)."""
    if result is None:
        return None
    if type(result) is np.ndarray and _FROM_NUMPY:
        try:
            return _FROM_NUMPY[0](result)  # torch.from_numpy, looked up once
        except TypeError:
            pass
    torch = sys.modules.get("torch")
    if torch is None:  # not imported yet: a caller's tensor came from it, so it is there
        import torch
    if type(result) is np.ndarray:
        _FROM_NUMPY[:] = [torch.from_numpy]
        try:
            return torch.from_numpy(result)
        except TypeError:  # a dtype NumPy has from ml_dtypes (torch refuses those)
            special = _ml_dtypes_as_torch().get(result.dtype)
            if special is None:
                raise
        width, name = special
        return torch.from_numpy(result.view(width)).view(getattr(torch, name))
    return torch.from_dlpack(result)


_ML_AS_TORCH: dict[np.dtype, tuple[str, str]] = {}


def _ml_dtypes_as_torch() -> dict[np.dtype, tuple[str, str]]:
    """ml_dtypes' dtypes that torch has: (the integer of their width, torch's name)."""
    if not _ML_AS_TORCH:
        import ml_dtypes

        for name, (width, kind) in _TORCH_AS.items():
            if hasattr(ml_dtypes, kind):  # (an older ml_dtypes lacks the newest)
                _ML_AS_TORCH[np.dtype(getattr(ml_dtypes, kind))] = (width, name)
    return _ML_AS_TORCH


def is_torch(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (a subclass of the caller's own too)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _back_to(x: Any) -> Callable[[Any], Any]:
    """A function giving a result the kind of the foreign array ``x`` (torch, JAX, ...)."""
    package = type(x).__module__.split(".")[0]
    if package == "torch" or is_torch(x):
        return to_torch
    if package in ("jax", "jaxlib"):
        import jax.numpy as jnp

        return lambda result: None if result is None else jnp.from_dlpack(result)
    return same


def _own_or(x: Any, array: Any, back: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``back``, except that ``array`` itself (the view of ``x``: a broadcast's buffer, the
    result of an in-place call) comes back as the caller's own ``x``, as a decided call
    gives it, not as a new tensor over the same memory."""
    return lambda result: x if result is array else back(result)


def _lazy_bit(x: Any) -> str | None:
    """"conj" or "neg" where the torch tensor ``x`` has that lazy bit set; else None."""
    for bit in ("conj", "neg"):
        method = getattr(x, f"is_{bit}", None)
        if method is not None and is_torch(x) and method():
            return bit
    return None


def _from_dlpack(x: Any, name: str) -> Any:
    """A NumPy (host) or CuPy (CUDA) array over a ``__dlpack__`` tensor's memory.

    Every way the import can fail becomes mpicoll's error, so a root that cannot read its
    input still tells the other ranks (they catch TypeError and ValueError only).
    """
    if getattr(x, "requires_grad", False):  # a torch tensor that needs grad: its memory
        x = x.detach()
    if is_torch(x) and str(x.dtype).removeprefix("torch.") in _TORCH_SUB_BYTE:
        raise UnsupportedDtypeError(
            f"{name}: torch's {x.dtype} is a placeholder type (a byte an element, exported "
            "as 8-bit integers, so a result would come back as those); use int8 or uint8, "
            "or ml_dtypes' int4 and kin on NumPy arrays")
    lazy = _lazy_bit(x)
    if lazy:  # (torch's DLPack export leaves the negative bit out: the raw memory)
        raise InvalidArgumentError(
            f"{name}: this tensor has torch's lazy {lazy} bit set (as torch.conj(c) or "
            f"torch.conj(c).imag give): its memory does not hold the values it shows; "
            f"resolve it first (tensor.resolve_{lazy}())")
    try:
        device_type = int(x.__dlpack_device__()[0])
    except Exception as exc:  # noqa: BLE001 - a producer's own failure
        raise InvalidArgumentError(
            f"{name}: __dlpack_device__() failed ({type(exc).__name__}: {exc})") from exc
    if device_type in (DLPACK_CPU, DLPACK_CUDA_HOST):
        library, load = "NumPy", np.from_dlpack
    elif device_type in (DLPACK_CUDA, DLPACK_CUDA_MANAGED):
        cupy = device_cupy()
        library, load = f"CuPy {cupy.__version__}", cupy.from_dlpack
    else:
        raise InvalidArgumentError(
            f"{name}: DLPack device type {device_type} is neither the host nor CUDA")
    try:
        return load(x)
    except Exception as exc:  # noqa: BLE001 - NumPy, CuPy and producers raise many kinds
        text = f"{type(exc).__name__}: {exc}"
        dtype_problem = isinstance(exc, NotImplementedError) or "dtype" in text.lower() \
            or "bfloat16" in text
        hint = ("; bfloat16 on the GPU needs CuPy >= 14 (with NumPy >= 2.1.2 and ml_dtypes)"
                if "bfloat16" in text else "")
        error = UnsupportedDtypeError if dtype_problem else InvalidArgumentError
        raise error(f"{name}: {library} cannot import this DLPack tensor ({text}){hint}") \
            from exc


def as_array(x: Any, name: str) -> tuple[Any, Callable[[Any], Any]]:
    """``x`` as a NumPy or CuPy array (no copy), and how to give a result x's kind back.

    Raises (nothing else, so a rooted call can always tell the others):
        InvalidArgumentError: x is None, not an array, or a tensor that cannot be read.
        UnsupportedDtypeError: x's dtype cannot be imported (bfloat16 on CuPy <= 13) or
            holds Python objects, which cannot travel as bytes.
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
        array = torch_numpy(x) if is_torch(x) and getattr(x, "is_cpu", False) else None
        array = array if array is not None else _from_dlpack(x, name)
        back = _back_to(x)  # (an unknown package's: NumPy or CuPy results, as they are)
        back = back if back is same else _own_or(x, array, back)
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


def copy_into(dst: Any, src: Any) -> None:
    """``dst[...] = src`` within one array library (a kernel on the GPU), casting as
    NumPy's "same_kind" allows.

    Raises:
        InvalidArgumentError: one is on the host and the other on the GPU.
        UnsupportedDtypeError: src's dtype does not cast to dst's.
    """
    if (type(dst) is np.ndarray) != (type(src) is np.ndarray):
        raise InvalidArgumentError(
            f"a {module_of(src).__name__} array cannot be copied into a "
            f"{module_of(dst).__name__} buffer")
    if not np.can_cast(src.dtype, dst.dtype, casting="same_kind"):
        raise UnsupportedDtypeError(f"cannot cast {src.dtype} to {dst.dtype}")
    dst[...] = src


def to_host(x: Any) -> np.ndarray:
    """A NumPy copy (or x itself when it is one)."""
    return x if type(x) is np.ndarray else x.get()


def may_share_memory(a: Any, b: Any) -> bool:
    if type(a) is np.ndarray and type(b) is np.ndarray:
        return np.may_share_memory(a, b)
    if is_cupy(a) and is_cupy(b):
        return cupy_module().may_share_memory(a, b)
    return False  # host and device memory never overlap


def shares_memory(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` share a byte: exactly for NumPy arrays (disjoint columns of
    one matrix do not, though their bounds overlap), where NumPy solves it in bounded work
    (else, as their bounds overlap, they are said to)."""
    if type(a) is np.ndarray and type(b) is np.ndarray:
        if not np.may_share_memory(a, b):
            return False
        try:
            return bool(np.shares_memory(a, b, max_work=1 << 16))
        except Exception:  # noqa: BLE001 - numpy's TooHardError: too costly to tell
            return True
    return may_share_memory(a, b)


def assign_from_host(dst: Any, host: np.ndarray) -> None:
    """``dst[...] = host`` for a NumPy or CuPy ``dst`` (a host-to-device copy on the GPU)."""
    if type(dst) is np.ndarray:
        dst[...] = host
    elif dst.flags.c_contiguous and dst.shape == host.shape:
        dst.set(np.ascontiguousarray(host))  # on the current stream
    else:
        dst[...] = cupy_module().asarray(host)


def device_like() -> Any:
    """An empty CuPy array: ``like=`` for allocating on the current GPU.

    Raises:
        InvalidArgumentError: CuPy is missing, or there is no CUDA driver or device.
    """
    return device_cupy().empty(0, np.uint8)
