"""Reduction ops: the built-in ones, user-defined ``mpicoll.Op``, and which dtypes fit.

Reductions run in the array library (``np.add(a, b, out=a)``), so the bytes on the wire
need no MPI datatype and every dtype NumPy can reduce works, bfloat16 (ml_dtypes)
included. A built-in op that does not fit the dtype (avg on integers, bitwise ops on
floats, min/max on complex, minloc on anything but a (value, index) structured dtype)
is refused up front. ``reduce_local`` applies an op once, on this process only.
"""

from __future__ import annotations

import enum
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from .buffers import ML_DTYPE_KINDS
from .buffers.arrays import as_array, may_share_memory, same_memory
from .errors import InvalidArgumentError, OpError, UnsupportedDtypeError


class ReduceOp(str, enum.Enum):
    """The built-in reduction ops; each member compares equal to its name ("sum").

    Every reducing call (``reduce``, ``all_reduce``, ``reduce_scatter``, their ``*_init``
    forms, ``mpicoll.reduce_local``) takes a member or its name:

    - ``sum``, ``prod``: bool, integer, floating (bfloat16 included) and complex dtypes
      (on bool, NumPy's: sum is OR, prod is AND).
    - ``min``, ``max``: bool, integer and floating dtypes.
    - ``avg``: floating and complex dtypes; the sum divided by the number of ranks.
    - ``band``, ``bor``, ``bxor``: bitwise, on bool and integer dtypes.
    - ``land``, ``lor``, ``lxor``: logical, as MPI_LAND/LOR/LXOR, on any numeric dtype:
      an element counts as true where it is nonzero, and the result is 1 or 0 in the
      input's dtype (True/False on bool, 1.0/0.0 on floats); as in MPI, on one rank the
      input, combined with nothing, comes back as it is. The MPI library's own
      collectives (``native``) take them on bool and integer dtypes only (MPI defines them
      there), NCCL's on bool only (land, lor); ``auto`` then runs one of mpicoll's.
    - ``minloc``, ``maxloc``: as MPI_MINLOC/MAXLOC, on a structured dtype with fields
      ``value`` (bool, integer or floating) and ``index`` (integer), such as
      ``mpicoll.loc_dtype("f8")``: the least (greatest) value, and on a tie the lowest
      index. ``native`` takes the layouts of MPI's pair types (``loc_dtype`` with a
      float32, float64, C long, int, short or long double value and the default index).
    """

    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"
    LAND = "land"
    LOR = "lor"
    LXOR = "lxor"
    MINLOC = "minloc"
    MAXLOC = "maxloc"

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
    ReduceOp.LAND: "biufc",
    ReduceOp.LOR: "biufc",
    ReduceOp.LXOR: "biufc",
}
# minloc and maxloc take a structured dtype (value, index): see ``loc_fits``
LOC_OPS = frozenset({ReduceOp.MINLOC, ReduceOp.MAXLOC})

_KIND_NAMES = {"b": "bool", "i": "signed integer", "u": "unsigned integer",
               "f": "floating", "c": "complex"}

# ml_dtypes' types have dtype kind "V" but NumPy ufunc loops: its floating types
# (bfloat16, float8_*, float6_*, float4_*) for add, multiply, minimum, maximum and divide,
# to the ops floating; its narrow integers (int4, uint4, ...) the bitwise ones too, to the
# ops signed or unsigned integers (those an installed ml_dtypes has)
_ML_KINDS = {np.dtype(getattr(ml_dtypes, name)): kind
             for name, kind in ML_DTYPE_KINDS.items() if hasattr(ml_dtypes, name)}


def dtype_kind(dtype: np.dtype) -> str:
    """NumPy's dtype kind, with ml_dtypes' types as theirs: bfloat16 (and the other narrow
    floats) "f", int4 "i", uint4 "u" (their kind in NumPy is "V")."""
    return _ML_KINDS.get(dtype, dtype.kind)


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
        try:
            if isinstance(self.fn, np.ufunc):  # ufuncs take out by keyword (np.maximum insists)
                self.fn(a, b, out=out)
            else:
                self.fn(a, b, out)
        except (FloatingPointError, RuntimeWarning) as exc:
            if not self.builtin:
                _failed(self, exc)
            # a built-in op under np.seterr(...="raise") or python -W error: NumPy raises
            # once the op has written its IEEE result (inf, nan), as MPI's own op would:
            # the call goes on (a rank leaving it mid-way would leave the others waiting)
        except Exception as exc:  # noqa: BLE001 - a user's op (a ufunc too): named, with its cause
            _failed(self, exc)


def _failed(op: Op, exc: Exception) -> None:
    """``op`` raised ``exc``: an OpError naming it, raised, or inside a guarded call noted
    (the rank goes on with what it has, so it still sends its part of the messages, and
    the call agrees the failure at its end)."""
    error = OpError(f"op {op.name!r} raised {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    failures = getattr(_GUARDED, "failures", None)
    if failures is None:
        raise error from exc
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


def _logical(ufunc: np.ufunc) -> Callable[[Any, Any, Any], None]:
    """MPI's logical op: ``ufunc`` of the operands' truth (nonzero), written into ``out``
    as 1 or 0 of its dtype (bool casts safely to every numeric dtype, bfloat16 included,
    so NumPy and CuPy cast while they write, with no temporary). CuPy's logical ufuncs
    have no complex loops: complex operands are compared with 0 first."""

    def logical(a: Any, b: Any, out: Any) -> None:
        if a.dtype.kind == "c":
            a, b = a != 0, b != 0
        ufunc(a, b, out=out)

    return logical


def _loc(better: np.ufunc) -> Callable[[Any, Any, Any], None]:
    """MPI's MINLOC (``better`` = np.less) or MAXLOC (np.greater) on (value, index)
    elements: b's element where its value is better than a's, or equal with a lower
    index; else a's. A NaN value is better than any other (as NumPy's minimum and
    maximum let a NaN win), the lower index among NaNs: commutative and associative, as
    MPI requires, NaN or not (a comparison with NaN alone is always false, which would
    make the result depend on the operands' order)."""

    def loc(a: Any, b: Any, out: Any) -> None:
        a_value, b_value = a["value"], b["value"]
        lower = b["index"] < a["index"]
        with np.errstate(invalid="ignore"):  # (NaN compared: decided below, no warning)
            take_b = better(b_value, a_value)
            take_b |= (b_value == a_value) & lower
        if dtype_kind(a_value.dtype) == "f":  # (bfloat16's kind is "V")
            a_nan, b_nan = np.isnan(a_value), np.isnan(b_value)
            take_b = np.where(a_nan | b_nan, b_nan & (~a_nan | lower), take_b)
        out[...] = np.where(take_b, b, a)  # a temporary: out may be a or b

    return loc


_BUILTINS: dict[ReduceOp, Op] = {
    ReduceOp.SUM: Op(np.add, True, 0, "sum", builtin=True),
    ReduceOp.PROD: Op(np.multiply, True, 1, "prod", builtin=True),
    ReduceOp.MIN: Op(np.minimum, True, None, "min", builtin=True),
    ReduceOp.MAX: Op(np.maximum, True, None, "max", builtin=True),
    ReduceOp.AVG: Op(np.add, True, 0, "avg", average=True, builtin=True),
    ReduceOp.BAND: Op(np.bitwise_and, True, -1, "band", builtin=True),
    ReduceOp.BOR: Op(np.bitwise_or, True, 0, "bor", builtin=True),
    ReduceOp.BXOR: Op(np.bitwise_xor, True, 0, "bxor", builtin=True),
    ReduceOp.LAND: Op(_logical(np.logical_and), True, 1, "land", builtin=True),
    ReduceOp.LOR: Op(_logical(np.logical_or), True, 0, "lor", builtin=True),
    ReduceOp.LXOR: Op(_logical(np.logical_xor), True, 0, "lxor", builtin=True),
    ReduceOp.MINLOC: Op(_loc(np.less), True, None, "minloc", builtin=True),
    ReduceOp.MAXLOC: Op(_loc(np.greater), True, None, "maxloc", builtin=True),
}


def op_name(op: object) -> str:
    """The name of an op given as an Op, a string or a ReduceOp; raises on anything else."""
    if isinstance(op, Op):
        return op.name
    try:
        return ReduceOp(op).value
    except ValueError:
        if op == "premul_sum":  # (mpicoll.dist's ReduceOp.PREMUL_SUM)
            raise InvalidArgumentError(
                "op: PREMUL_SUM (NCCL's sum of inputs each scaled first) is not supported; "
                "scale the tensor, then reduce with SUM") from None
        names = ", ".join(repr(m.value) for m in ReduceOp)
        raise InvalidArgumentError(
            f"op: unknown reduction op {op!r}; expected one of {names} or an mpicoll.Op"
        ) from None


_RESOLVED: dict[tuple[object, np.dtype], Op] = {}


def resolve_op(op: object, dtype: np.dtype) -> Op:
    """``_resolve_op`` with a cache, as it runs on every reducing call (a user's Op is
    returned as it is and never cached: the cache must not keep it alive)."""
    if isinstance(op, Op):
        return _resolve_op(op, dtype) if op.average else op
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
            floats, min/max on complex, any op on a dtype that is not numeric,
            minloc/maxloc on one that is not a (value, index) structured dtype).
    """
    if isinstance(op, Op):
        if op.average and not op.builtin and dtype_kind(dtype) not in _KINDS[ReduceOp.AVG]:
            raise UnsupportedDtypeError(  # (the result is divided by the ranks, in place)
                f"op {op.name!r} averages (average=True): it cannot reduce dtype {dtype}; "
                f"it takes {', '.join(_KIND_NAMES[k] for k in _KINDS[ReduceOp.AVG])} dtypes")
        return op
    member = ReduceOp(op_name(op))
    if member in LOC_OPS:
        loc_check(member.value, dtype)
        return _BUILTINS[member]
    kinds = _KINDS[member]
    if dtype_kind(dtype) not in kinds:
        allowed = ", ".join(_KIND_NAMES[k] for k in kinds)
        raise UnsupportedDtypeError(
            f"op {member.value!r} cannot reduce dtype {dtype}: it takes {allowed} dtypes"
        )
    if member in _LOGICAL and not _holds_zero(dtype):
        raise UnsupportedDtypeError(
            f"op {member.value!r} cannot reduce dtype {dtype}: its result is 1 or 0 of the "
            "dtype, which has no 0 (powers of two only)")
    return _BUILTINS[member]


_LOGICAL = frozenset((ReduceOp.LAND, ReduceOp.LOR, ReduceOp.LXOR))


@functools.cache
def _holds_zero(dtype: np.dtype) -> bool:
    """Whether ``dtype`` has a 0 (ml_dtypes' float8_e8m0fnu, powers of two, has none)."""
    with np.errstate(all="ignore"):
        return bool(np.zeros(1, dtype)[0] == 0)


def loc_dtype(value: Any, index: Any = "i4") -> np.dtype:
    """The structured dtype ``minloc`` and ``maxloc`` reduce: fields ``value``, ``index``.

    Laid out as C's ``struct {value; index;}`` (``align=True``), so with the default C int
    index and a float32, float64, C long, int, short or long double value it is the
    layout of MPI's pair types (MPI_FLOAT_INT, MPI_DOUBLE_INT, MPI_LONG_INT, MPI_2INT,
    MPI_SHORT_INT, MPI_LONG_DOUBLE_INT) and ``algorithm="native"`` can reduce it too;
    any other value (bool, bfloat16, float16, int8, unsigned) or index dtype is reduced by
    mpicoll's own algorithms.

        x = np.zeros(n, mpicoll.loc_dtype("f8"))
        x["value"], x["index"] = values, np.arange(n) + offset
        best = comm.all_reduce(x, "maxloc")  # best["value"], best["index"]

    Args:
        value: the value's dtype: bool, integer or floating (bfloat16 included).
        index: the index's dtype: an integer dtype (default "i4", C's int).

    Raises:
        UnsupportedDtypeError: the value is not bool, integer or floating (complex has no
            order), or the index is not an integer.
    """
    try:
        dtype = np.dtype([("value", value), ("index", index)], align=True)
    except (TypeError, ValueError) as exc:
        raise UnsupportedDtypeError(f"loc_dtype: {exc}") from None
    if not loc_fits(dtype):
        raise UnsupportedDtypeError(
            f"loc_dtype: the value must be bool, integer or floating and the index an "
            f"integer, got value {dtype.fields['value'][0]} and index "
            f"{dtype.fields['index'][0]}")
    return dtype


def loc_fits(dtype: np.dtype) -> bool:
    """Whether ``minloc``/``maxloc`` reduce ``dtype``: structured with exactly the fields
    ``value`` (bool, integer or floating, one item) and ``index`` (an integer)."""
    fields = dtype.fields or {}
    value = fields["value"][0] if "value" in fields else None
    index = fields["index"][0] if "index" in fields else None
    return len(fields) == 2 and value is not None and index is not None \
        and not value.shape and not index.shape \
        and dtype_kind(value) in "biuf" and index.kind in "iu"


def loc_check(name: str, dtype: np.dtype) -> None:
    """Refuse a dtype that ``minloc``/``maxloc`` (``name``) cannot reduce."""
    if not loc_fits(dtype):
        raise UnsupportedDtypeError(
            f"op {name!r} cannot reduce dtype {dtype}: it takes a structured dtype with "
            "fields 'value' (bool, integer or floating) and 'index' (an integer), such as "
            "mpicoll.loc_dtype('f8')")


def reduce_local(a: Any, b: Any, op: str | ReduceOp | Op) -> Any:
    """``b = a (op) b`` element by element, in place, on this process only (MPI_Reduce_local).

    The same computation as one step of a reducing collective, with no messages: a
    non-commutative ``Op`` gets ``a`` first, as rank order gives the lower rank first.

    Args:
        a: the first operand: a NumPy or CuPy array (or any ``__dlpack__`` tensor).
        b: the second operand and the result: an array of a's shape, dtype and library,
            writeable; it may be ``a`` itself.
        op: a built-in op's name or ``ReduceOp`` member (see ``ReduceOp`` for the
            dtypes each takes; not "avg", whose division needs a number of ranks), or an
            ``mpicoll.Op``.

    Returns:
        b, holding a (op) b.

    Raises:
        InvalidArgumentError: a or b is not an array, they differ in shape, dtype or
            array library, b is read-only, op is unknown, or op is "avg".
        UnsupportedDtypeError: the op does not fit the dtype.
        OpError: a user's op raised.
    """
    x, _ = as_array(a, "a")
    if b is None or isinstance(b, (bool, int, float, complex, np.generic)):
        raise InvalidArgumentError(f"b: expected an array to write into, got {type(b).__name__}")
    y, _ = as_array(b, "b")
    if (type(x) is np.ndarray) != (type(y) is np.ndarray):
        raise InvalidArgumentError(
            f"a and b: one is a NumPy array, the other {type(x if type(y) is np.ndarray else y)}"
            "; reduce_local needs both in one array library")
    if x.shape != y.shape or x.dtype != y.dtype:
        raise InvalidArgumentError(
            f"b: shape {y.shape} and dtype {y.dtype}, but a has shape {x.shape} and dtype "
            f"{x.dtype}; reduce_local needs the same shape and dtype")
    if type(y) is np.ndarray and not y.flags.writeable:
        raise InvalidArgumentError("b: the array is read-only; reduce_local writes into it")
    resolved = resolve_op(op, y.dtype)
    if resolved.average:
        raise InvalidArgumentError(
            "op: 'avg' divides by the number of ranks, which reduce_local has not; use 'sum'")
    if x.flags.c_contiguous and y.flags.c_contiguous and may_share_memory(x, y) \
            and not same_memory(x, y):
        x = x.copy()  # a overlaps b, shifted: the op must not read what it wrote
    first = x.reshape(-1)  # a copy where x is not contiguous
    out = y.reshape(-1) if y.flags.c_contiguous else y.ravel()  # ravel: a copy
    resolved(first, out, out)
    if not y.flags.c_contiguous:
        y[...] = out.reshape(y.shape)
    return b
