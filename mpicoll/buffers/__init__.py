"""The buffer layer: flat contiguous views, chunk bounds, and the dtype table of headers.

Algorithms see only flat 1-D contiguous arrays; a block or chunk is a slice (a view,
never a copy) of such an array between two offsets of a bounds list.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from typing import Any

import ml_dtypes
import numpy as np
from numpy.lib import format as npy_format

from ..errors import InvalidArgumentError, UnsupportedDtypeError
from .arrays import as_array, empty, module_of

Bounds = tuple[int, ...]


def chunk_bounds(count: int, parts: int) -> Bounds:
    """Offsets that cut ``count`` elements into ``parts`` chunks as evenly as possible.

    The first ``count % parts`` chunks get one element more; chunk i is
    ``[bounds[i], bounds[i+1])``. Chunks may be empty when count < parts.

    >>> chunk_bounds(10, 4)
    (0, 3, 6, 8, 10)
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    base, extra = divmod(count, parts)
    return tuple(i * base + min(i, extra) for i in range(parts + 1))


@lru_cache(maxsize=1024)
def even_bounds(block: int, parts: int) -> Bounds:
    """Offsets of ``parts`` blocks of ``block`` elements each."""
    return tuple(i * block for i in range(parts + 1))


def counts_bounds(counts: list[int] | tuple[int, ...]) -> Bounds:
    """Offsets of blocks of the given sizes: the prefix sums, starting at 0."""
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + int(c))
    return tuple(bounds)


def rotated_bounds(bounds: Bounds, first: int) -> Bounds:
    """Offsets of the same blocks laid out from block ``first`` on, wrapping around.

    Block ``(first + j) mod p`` sits at position j. Trees rooted at ``root`` lay their
    blocks out by relative rank this way, as does Bruck's all_gather from each rank.
    """
    p = len(bounds) - 1
    return counts_bounds([bounds[(first + j) % p + 1] - bounds[(first + j) % p] for j in range(p)])


def flat(x: Any) -> Any:
    """A flat 1-D contiguous view of ``x`` (one copy when ``x`` is not C-contiguous)."""
    if x.flags.c_contiguous:
        return x.reshape(-1)
    return module_of(x).ascontiguousarray(x).reshape(-1)


def writable(out: Any, name: str) -> None:
    """Refuse a Python or NumPy number as a buffer to write into: the caller could never
    read what is written there."""
    if isinstance(out, (bool, int, float, complex, np.generic)):
        raise InvalidArgumentError(
            f"{name}: expected an array to write into, got {type(out).__name__}")


def overlaps_itself(a: Any) -> bool:
    """Whether elements of ``a`` share memory (a stride of 0 on a dimension longer than 1:
    a broadcast or expanded view), which no result can be written into: each element's
    value would be the last one written there (torch refuses such outputs alike)."""
    return a.itemsize > 0 and a.size > 1 and any(
        s == 0 and n > 1 for s, n in zip(a.strides, a.shape, strict=True))
    # (no elements, or elements of no bytes, np.dtype([]): nothing to overlap; NumPy
    # gives an empty array's dimensions a stride of 0)


def overlapping(name: str) -> InvalidArgumentError:
    """What writing into an array that ``overlaps_itself`` raises."""
    return InvalidArgumentError(f"{name}: more than one of its elements refers to one place "
                                "in memory (a stride of 0: a broadcast or expanded view); "
                                "write into an array of its own (a copy)")


def result_buffer(out: Any, shape: tuple[int, ...], dtype: np.dtype, name: str = "out",
                  like: Any = None) -> Any:
    """Check a user's result buffer (as an array of ``like``'s library: any writeable
    view of the right shape and dtype, strided too), or allocate one when ``out`` is None."""
    if out is None:
        return empty(shape, dtype, like=like)
    writable(out, name)
    out, _ = as_array(out, name)
    if module_of(out) is not module_of(like if like is not None else out):
        raise InvalidArgumentError(
            f"{name}: a {module_of(out).__name__} array for a {module_of(like).__name__} input")
    if out.shape != tuple(shape) or out.dtype != dtype:
        raise InvalidArgumentError(
            f"{name}: expected shape {tuple(shape)} and dtype {dtype}, "
            f"got shape {out.shape} and dtype {out.dtype}"
        )
    if type(out) is np.ndarray and not out.flags.writeable:
        raise InvalidArgumentError(f"{name}: must be a writeable array")
    if overlaps_itself(out):
        raise overlapping(name)
    return out  # it may be a strided view: the pipeline then runs into workspace


# Dtypes that a header can name by a small integer (broadcast/scatter with None); any
# other dtype travels as its description (``dtype_text``). ml_dtypes' types need a code:
# their description is only "this many bytes" (kind V). Each code is fixed, whatever
# this rank's ml_dtypes has: a name an older ml_dtypes lacks keeps its place, as None
# (ranks with two versions of ml_dtypes still read each other's codes alike; a code this
# rank lacks is refused). New names go at the end.
# (each with its kind as ``ops.dtype_kind`` says it: floating, signed or unsigned)
ML_DTYPE_KINDS = {
    **dict.fromkeys(("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                     "float8_e5m2fnuz", "float8_e4m3b11fnuz", "float8_e4m3", "float8_e3m4",
                     "float8_e8m0fnu", "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn"), "f"),
    "int2": "i", "int4": "i", "uint2": "u", "uint4": "u", "int1": "i", "uint1": "u"}
ML_DTYPE_NAMES = tuple(ML_DTYPE_KINDS)
_NUMPY_CODES = ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8",
                "f2", "f4", "f8", "g", "c8", "c16", "G")
DTYPE_TABLE: tuple[np.dtype | None, ...] = tuple(np.dtype(c) for c in _NUMPY_CODES) + tuple(
    np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else None
    for name in ML_DTYPE_NAMES)
_DTYPE_CODES = {dt: i for i, dt in enumerate(DTYPE_TABLE) if dt is not None}


def dtype_code(dtype: np.dtype) -> int:
    """The header code of ``dtype``, or -1 when the table cannot name it."""
    return _DTYPE_CODES.get(np.dtype(dtype), -1)


def dtype_text(dtype: np.dtype) -> str | None:
    """``dtype`` as text that ``dtype_from_text`` turns back into the same dtype (NumPy's
    own .npy header description: byte order, structured fields, padding, units), or None
    where no text can (Python objects, types only a library's registration names)."""
    if dtype.hasobject:
        return None
    text = repr(npy_format.dtype_to_descr(dtype))
    try:
        return text if dtype_from_text(text) == dtype else None
    except UnsupportedDtypeError:
        return None


def dtype_from_text(text: str) -> np.dtype:
    """The dtype described by ``dtype_text``'s text (a literal, never pickle)."""
    try:
        return npy_format.descr_to_dtype(ast.literal_eval(text))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise UnsupportedDtypeError(f"dtype description {text[:80]!r}: {exc}") from None


def dtype_from_code(code: int) -> np.dtype:
    if not 0 <= code < len(DTYPE_TABLE):
        raise UnsupportedDtypeError(f"dtype code {code} is not in mpicoll's dtype table")
    dtype = DTYPE_TABLE[code]
    if dtype is None:
        name = ML_DTYPE_NAMES[code - len(_NUMPY_CODES)]
        raise UnsupportedDtypeError(
            f"dtype code {code}: ml_dtypes' {name}, which this rank's ml_dtypes "
            f"{getattr(ml_dtypes, '__version__', '?')} lacks (a newer one has it)")
    return dtype
