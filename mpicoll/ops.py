"""Reduction ops: which dtypes each accepts, and how it combines two arrays.

Reductions run in the array library (``np.add(a, b, out=a)``), so the bytes on the wire
need no MPI datatype and every dtype NumPy can reduce works. An op that does not fit the
dtype (avg on integers, bitwise ops on floats, min/max on complex) is refused up front.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .errors import InvalidArgumentError, UnsupportedDtypeError


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

_UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.PROD: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.AVG: np.add,  # summed by the algorithm, divided by the number of ranks after
    ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or,
    ReduceOp.BXOR: np.bitwise_xor,
}

_KIND_NAMES = {"b": "bool", "i": "signed integer", "u": "unsigned integer",
               "f": "floating", "c": "complex"}


@dataclass(frozen=True)
class Op:
    """A reduction op bound to what algorithms need: ``op(a, b, out)`` computes a (op) b.

    Attributes:
        name: the op's name ("sum", ...).
        combine: a ufunc-like ``f(a, b, out=out)``; out may alias a or b.
        commutative: whether a (op) b == b (op) a; algorithms that reorder operands
            (ring, recursive halving) need it.
        average: divide the summed result by the number of ranks at the end.
    """

    name: str
    combine: Callable[..., object]
    commutative: bool = True
    average: bool = False

    def __call__(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        self.combine(a, b, out=out)


def op_name(op: object) -> str:
    """The name of a built-in op given as a string or ReduceOp; raises on anything else."""
    try:
        return ReduceOp(op).value
    except ValueError:
        names = ", ".join(repr(m.value) for m in ReduceOp)
        raise InvalidArgumentError(f"op: unknown reduction op {op!r}; expected one of {names}") from None


_RESOLVED: dict[tuple[object, np.dtype], Op] = {}


def resolve_op(op: object, dtype: np.dtype) -> Op:
    """``_resolve_op`` with a cache, as it runs on every reducing call."""
    try:
        return _RESOLVED[op, dtype]
    except (KeyError, TypeError):  # TypeError: an unhashable op, refused below
        pass
    resolved = _resolve_op(op, dtype)
    _RESOLVED[op, dtype] = resolved
    return resolved


def _resolve_op(op: object, dtype: np.dtype) -> Op:
    """Check that ``op`` can reduce ``dtype`` and return the Op the algorithms call.

    Raises:
        InvalidArgumentError: op is not a known op.
        UnsupportedDtypeError: the op does not fit the dtype (avg on ints, band on floats,
            min/max on complex, any op on a dtype that is not numeric).
    """
    member = ReduceOp(op_name(op))
    kinds = _KINDS[member]
    if dtype.kind not in kinds:
        allowed = ", ".join(_KIND_NAMES[k] for k in kinds)
        raise UnsupportedDtypeError(
            f"op {member.value!r} cannot reduce dtype {dtype}: it takes {allowed} dtypes"
        )
    return Op(member.value, _UFUNCS[member], commutative=True, average=member is ReduceOp.AVG)
