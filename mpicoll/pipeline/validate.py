"""Validate: this rank's own checks of a call, kept as a Verdict instead of raised.

Where a fault lies decides what the rank does (mpicoll.pipeline):
- ``params``: the call's parameters (root, algorithm, options, op, counts): every rank
  of a correct program passes the same, so each raises at once, before any message.
- ``input``: what this rank contributes (its x): it must not send made-up data, so it
  raises before sending (at the root of broadcast/scatter, in the header it sends).
- ``receive``: where this rank's result lands (its out=, a non-root's receive buffer):
  it takes part with workspace, so the others' results are right, then raises.
In check mode every verdict is exchanged first and every rank raises together.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from ..buffers import overlapping, overlaps_itself, result_buffer
from ..buffers.arrays import as_array, empty, off_current_gpu, same
from ..errors import InvalidArgumentError, MpicollError, UnsupportedDtypeError
from ..ops import resolve_op

MAX_DIMS = 64 if int(np.__version__.split(".")[0]) >= 2 else 32  # NumPy's limit on dimensions


class Verdict:
    """What this rank refuses in one call, by where the fault lies (first one kept)."""

    __slots__ = ("params", "input", "receive", "refused", "strided")

    def __init__(self) -> None:
        self.params: MpicollError | None = None
        self.input: MpicollError | None = None
        self.receive: MpicollError | None = None
        self.refused = False  # any of the three (an attribute: read on every call)
        self.strided: Any = None  # a strided out=: the result is copied into it at the end

    def refuse(self, where: str, error: MpicollError) -> None:
        if getattr(self, where) is None:
            setattr(self, where, error)
        self.refused = True

    @property
    def first(self) -> MpicollError | None:
        return self.params or self.input or self.receive

    def __bool__(self) -> bool:
        return self.refused


def stream_refusal(stream: Any) -> InvalidArgumentError | None:
    """Why ``stream=`` cannot serve the call on this rank (None: it can): not a CUDA
    stream, or one that cannot be made current here (made on another GPU than the
    current one). Found before any message, so the call refuses it as any parameter."""
    if not hasattr(stream, "ptr") or not hasattr(stream, "__enter__"):
        return InvalidArgumentError(
            f"stream: expected a cupy.cuda.Stream, got {type(stream).__name__}")
    try:
        with stream:  # (made current and back: what the call will do)
            pass
    except Exception as exc:  # noqa: BLE001 - CuPy's reason, as the refusal's
        return InvalidArgumentError(
            f"stream: cannot be made current on this rank: {type(exc).__name__}: {exc}")
    return None


def dtype_given(dtype: Any, what: str) -> np.dtype | None:
    """``dtype`` as NumPy's (None: none given), or ``what``'s clear refusal."""
    if dtype is None:
        return None
    try:
        return np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{what}: dtype: {exc}") from None


def _mpicoll_error(exc: BaseException, name: str) -> MpicollError:
    if isinstance(exc, MpicollError):
        return exc
    if isinstance(exc, TypeError):
        return UnsupportedDtypeError(f"{name}: {exc}")
    return InvalidArgumentError(f"{name}: {type(exc).__name__}: {exc}")


def array(verdict: Verdict, x: Any, where: str = "input", name: str = "x",
          device_only: bool = False) -> tuple[Any, Any]:
    """(x as an array, how to give a result back), or (None, same) with the refusal kept.
    ``device_only``: the backend moves device arrays only (NCCL): a host array is refused."""
    if type(x) is np.ndarray and not device_only and not x.dtype.hasobject:
        return x, same  # the common case, without a call
    try:
        x, back = as_array(x, name)
    except Exception as exc:  # noqa: BLE001 - any failure becomes this rank's verdict
        verdict.refuse(where, _mpicoll_error(exc, name))
        return None, same
    if device_only and type(x) is np.ndarray:
        verdict.refuse(where, InvalidArgumentError(
            f"{name}: backend 'nccl' moves GPU arrays (CuPy, or a CUDA __dlpack__ tensor); "
            "got a host array: use backend 'mpi' for host memory"))
        return None, same
    elsewhere = "" if type(x) is np.ndarray else off_current_gpu(x)
    if elsewhere:
        verdict.refuse(where, InvalidArgumentError(f"{name}: {elsewhere}"))
        return None, same
    return x, back


def reduction_op(verdict: Verdict, op: Any, x: Any) -> Any:
    """``op`` resolved for x's dtype (``ops.resolve_op``), or None with the refusal kept
    (None too where x is)."""
    if x is None:
        return None
    try:
        return resolve_op(op, x.dtype)
    except MpicollError as exc:
        verdict.refuse("params", exc)
    except Exception as exc:  # noqa: BLE001 - an unhashable or odd op object
        verdict.refuse("params", InvalidArgumentError(f"op: {type(exc).__name__}: {exc}"))
    return None


def root(verdict: Verdict, root: Any, size: int) -> int:
    """``root`` as an int in range, or 0 with the refusal kept."""
    if isinstance(root, (bool, np.bool_)) or not isinstance(root, (int, np.integer)):
        verdict.refuse("params", InvalidArgumentError(
            f"root: expected an int, got {type(root).__name__}"))
        return 0
    if not 0 <= root < size:
        verdict.refuse("params", InvalidArgumentError(
            f"root: {root} is out of range for {size} ranks"))
        return 0
    return int(root)


def rows(verdict: Verdict, x: Any, size: int, what: str) -> bool:
    """Whether x has one row per rank (the refusal kept when not)."""
    if x is not None and (x.ndim == 0 or x.shape[0] != size):
        verdict.refuse("input", InvalidArgumentError(
            f"x: {what} expects shape ({size}, ...) with one row per rank, got {x.shape}"))
        return False
    return x is not None


def result_dims(verdict: Verdict, x: Any, extra: int) -> None:
    """Refuse a result of more dimensions than the array library allows (every rank sees
    the same shapes, so every rank refuses alike)."""
    if x is not None and x.ndim + extra > MAX_DIMS:
        verdict.refuse("input", InvalidArgumentError(
            f"x: the result would have {x.ndim + extra} dimensions; NumPy allows {MAX_DIMS}"))


def vector(verdict: Verdict, x: Any, collective: str) -> None:
    """Refuse an x without a first dimension for a v-variant."""
    if x is not None and x.ndim == 0:
        verdict.refuse("input", InvalidArgumentError(
            f"x: {collective} needs at least one dimension (the rows this rank gives)"))


def out(verdict: Verdict, out: Any, shape: tuple[int, ...], dtype: np.dtype, like: Any) -> Any:
    """The result buffer (``out`` checked, or a new one), or None with the refusal kept.
    A strided ``out`` is kept in ``verdict.strided`` and a contiguous buffer returned."""
    if out is None and type(like) is np.ndarray:
        return np.empty(shape, dtype)  # the common case, without a call
    try:
        result = result_buffer(out, shape, dtype, like=like)
        elsewhere = "" if type(result) is np.ndarray else off_current_gpu(result)
        if elsewhere:
            raise InvalidArgumentError(f"out: {elsewhere}")
    except Exception as exc:  # noqa: BLE001 - the rank takes part, then raises this
        verdict.refuse("receive", _mpicoll_error(exc, "out"))
        return None
    if not result.flags.c_contiguous:  # a strided view (out=a[:, 0]): the algorithms run
        verdict.strided = result  # into contiguous memory, copied into it once at the end
        result = empty(shape, dtype, like=result)
    return result


def unordered(values: Any) -> bool:
    """Whether ``values`` has no rank order (a dict, its keys, a set): never counts."""
    return isinstance(values, (Mapping, AbstractSet))


def counts(verdict: Verdict, counts: Any, size: int, name: str,
           where: str = "params") -> list[int] | None:
    """``counts`` as ``size`` non-negative ints, or None with the refusal kept (an
    unordered collection too: a dict's keys or a set have no rank order)."""
    if unordered(counts):
        verdict.refuse(where, InvalidArgumentError(
            f"{name}: expected a sequence of {size} ints in rank order, got "
            f"{type(counts).__name__}, which has no order"))
        return None
    try:
        values = list(counts)
    except TypeError:
        verdict.refuse(where, InvalidArgumentError(
            f"{name}: expected a sequence of {size} ints, got {type(counts).__name__}"))
        return None
    if len(values) != size:
        verdict.refuse(where, InvalidArgumentError(
            f"{name}: expecting {size} items (one per rank), got {len(values)}"))
        return None
    for c in values:
        if isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer)) or c < 0:
            verdict.refuse(where, InvalidArgumentError(
                f"{name}: expected non-negative ints, got {c!r}"))
            return None
    return [int(c) for c in values]


def block_counts(verdict: Verdict, given: Any, size: int, x: Any) -> list[int] | None:
    """reduce_scatter's ``counts=``: ``size`` non-negative ints that cut x flat, or None
    with the refusal kept."""
    values = counts(verdict, given, size, "counts")
    if values is not None and x is not None and sum(values) != x.size:
        verdict.refuse("params", InvalidArgumentError(
            f"counts: they add up to {sum(values)}, but x has {x.size} elements"))
    return values


def writeable_receive(verdict: Verdict, x: Any, name: str = "x") -> None:
    """Refuse a receive buffer that cannot be written (read-only NumPy memory)."""
    if x is not None and type(x) is np.ndarray and not x.flags.writeable:
        verdict.refuse("receive", InvalidArgumentError(
            f"{name}: the receive buffer must be writeable"))
    elif x is not None and hasattr(x, "strides") and overlaps_itself(x):
        verdict.refuse("receive", overlapping(name))
