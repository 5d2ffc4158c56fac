"""Reduction ops: the built-in ones, user-defined ``mpicoll.Op``, and which dtypes fit.

Reductions run in the array library (``np.add(a, b, out=a)``), so the bytes on the wire
need no MPI datatype and every dtype NumPy can reduce works, bfloat16 (ml_dtypes)
included. A built-in op that does not fit the dtype (avg on integers, bitwise ops on
floats, min/max on complex) is refused up front.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from .errors import InvalidArgumentError, OpError, UnsupportedDtypeError


class ReduceOp(str, enum.Enum):
    """The built-in reduction ops; each member compares equal to its name ("sum")."""

    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    def __str__(self) -> str:
        return self.value


# dtype kinds: b bool, i signed, u unsigned, f floating, c complex
_KINDS = {
    ReduceOp.SUM: "biufc",
    ReduceOp.PROD: "biufc",
    ReduceOp.MIN: "biuf",
    ReduceOp.MAX: "biuf",
    ReduceOp.AVG: "fc",
    ReduceOp.BAND: "biu",
    ReduceOp.BOR: "biu",
    ReduceOp.BXOR: "biu",
}

_KIND_NAMES = {"b": "bool", "i": "signed integer", "u": "unsigned integer",
               "f": "floating", "c": "complex"}

# ml_dtypes' floating types (bfloat16, float8_*) have dtype kind "V" but NumPy ufunc loops
# for add, multiply, minimum, maximum and divide: to the ops they are floating.
_ML_FLOATS = frozenset(np.dtype(getattr(ml_dtypes, name)) for name in (
    "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
    if hasattr(ml_dtypes, name))


def dtype_kind(dtype: np.dtype) -> str:
    """NumPy's dtype kind, with ml_dtypes' floating types (bfloat16, ...) as "f"."""
    return "f" if dtype in _ML_FLOATS else dtype.kind


@dataclass(frozen=True, eq=False)
class Op:
    """A reduction op: ``fn(a, b, out)`` computes a (op) b elementwise into ``out``.

    Build your own with ``mpicoll.Op(fn, commutative=..., identity=...)``. ``fn`` gets
    arrays of the input's array library and dtype (equal-length 1-D slices, any length
    including 0) and must write into ``out``, which may be ``a`` or ``b`` itself. For an
    op that combines groups of numbers (a 2x2 matrix product), give the input a
    structured dtype whose one element is the whole group, so no algorithm cuts a group.

    Args:
        fn: ``fn(a, b, out)``; a NumPy ufunc such as ``np.add`` works as it is.
        commutative: whether a (op) b == b (op) a. A non-commutative op is combined in
            rank order (rank 0 op rank 1 op ...); algorithms that reorder operands (ring,
            pairwise, rabenseifner, recursive halving) refuse it.
        identity: the value e with e (op) x == x, when there is one. It travels with
            the op for callers (and the MPI library gets none); no algorithm needs it,
            as every one combines real operands only.
        name: how errors and the benchmark name the op (default: ``fn``'s name).

    Ops are compared by identity. An Op may be made per call (a closure per step): the
    MPI library's handle for ``native`` lives as long as the Op, and no cache keeps it.
    If ``fn`` raises on some rank, every rank raises ``OpError`` naming the op and the
    ranks where it raised (the call still completes its messages, so the next call is
    right); the result is not delivered.
    """

    fn: Callable[..., object]
    commutative: bool = True
    identity: Any = None
    name: str = ""
    average: bool = False  # avg: the algorithms sum, then the result is divided by p
    builtin: bool = field(default=False, repr=False)  # one of ReduceOp's, not a user's

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise InvalidArgumentError(f"op: fn must be callable, got {type(self.fn).__name__}")
        if not isinstance(self.commutative, (bool, np.bool_)):
            raise InvalidArgumentError("op: commutative must be True or False")
        if not self.name:
            object.__setattr__(self, "name", getattr(self.fn, "__name__", "user_op"))

    def __call__(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        if isinstance(self.fn, np.ufunc):  # ufuncs take out by keyword (np.maximum insists)
            self.fn(a, b, out=out)
            return
        try:
            self.fn(a, b, out)
        except Exception as exc:  # noqa: BLE001 - a user's op: named, with its cause
            error = OpError(f"op {self.name!r} raised {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            failures = getattr(_GUARDED, "failures", None)
            if failures is None:
                raise error from exc
            # inside a guarded call: note it and go on, so this rank still sends its part
            # of the messages (with what it has) and the call agrees the failure at its end
            if not failures:
                failures.append(error)


_GUARDED = threading.local()  # this thread's guarded call: the failures of user ops in it


class guarded_ops:
    """Run a collective whose user op may raise: ``with guarded_ops() as failures: ...``.

    A user op that raises inside does not leave the call (the other ranks would wait for
    this rank's next message, and MPI's user-op callback cannot raise at all: mpi4py
    aborts the job): the first failure is kept in ``failures`` and the op's output is
    left as it is, so the rank finishes its part of the messages; the caller then agrees
    the failures across ranks and raises ``OpError`` on every rank. Per thread, so the
    local backend's ranks (threads) and MPI's callbacks (run in the calling thread) each
    see their own.
    """

    __slots__ = ("failures", "saved")

    def __enter__(self) -> list[OpError]:
        self.saved = getattr(_GUARDED, "failures", None)
        self.failures: list[OpError] = []
        _GUARDED.failures = self.failures
        return self.failures

    def __exit__(self, *exc: Any) -> None:
        _GUARDED.failures = self.saved


_BUILTINS: dict[ReduceOp, Op] = {
    ReduceOp.SUM: Op(np.add, True, 0, "sum", builtin=True),
    ReduceOp.PROD: Op(np.multiply, True, 1, "prod", builtin=True),
    ReduceOp.MIN: Op(np.minimum, True, None, "min", builtin=True),
    ReduceOp.MAX: Op(np.maximum, True, None, "max", builtin=True),
    ReduceOp.AVG: Op(np.add, True, 0, "avg", average=True, builtin=True),
    ReduceOp.BAND: Op(np.bitwise_and, True, -1, "band", builtin=True),
    ReduceOp.BOR: Op(np.bitwise_or, True, 0, "bor", builtin=True),
    ReduceOp.BXOR: Op(np.bitwise_xor, True, 0, "bxor", builtin=True),
}


def op_name(op: object) -> str:
    """The name of an op given as an Op, a string or a ReduceOp; raises on anything else."""
    if isinstance(op, Op):
        return op.name
    try:
        return ReduceOp(op).value
    except ValueError:
        names = ", ".join(repr(m.value) for m in ReduceOp)
        raise InvalidArgumentError(
            f"op: unknown reduction op {op!r}; expected one of {names} or an mpicoll.Op"
        ) from None


_RESOLVED: dict[tuple[object, np.dtype], Op] = {}


def resolve_op(op: object, dtype: np.dtype) -> Op:
    """``_resolve_op`` with a cache, as it runs on every reducing call (a user's Op is
    returned as it is and never cached: the cache must not keep it alive)."""
    if isinstance(op, Op):
        return op
    try:
        return _RESOLVED[op, dtype]
    except (KeyError, TypeError):  # TypeError: an unhashable op, refused below
        pass
    resolved = _resolve_op(op, dtype)
    if len(_RESOLVED) > 4096:
        _RESOLVED.clear()
    _RESOLVED[op, dtype] = resolved
    return resolved


def _resolve_op(op: object, dtype: np.dtype) -> Op:
    """Check that ``op`` can reduce ``dtype`` and return the Op the algorithms call.

    A user's Op is taken as it is: its ``fn`` decides which dtypes it reduces.

    Raises:
        InvalidArgumentError: op is not a known op.
        UnsupportedDtypeError: a built-in op does not fit the dtype (avg on ints, band on
            floats, min/max on complex, any op on a dtype that is not numeric).
    """
    if isinstance(op, Op):
        return op
    member = ReduceOp(op_name(op))
    kinds = _KINDS[member]
    if dtype_kind(dtype) not in kinds:
        allowed = ", ".join(_KIND_NAMES[k] for k in kinds)
        raise UnsupportedDtypeError(
            f"op {member.value!r} cannot reduce dtype {dtype}: it takes {allowed} dtypes"
        )
    return _BUILTINS[member]
