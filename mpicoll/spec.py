"""One description per collective: what its buffers are, who holds them, how it is counted.

``SPECS[name]`` is read by the Communicator's pipeline (which buffers are input and which
receive, what the fingerprint of check mode compares), by the benchmark (bus-bandwidth
factors, buffer sizes), by the diagrams and by the tests, so that a collective is
described in one place (as Gloo's ``AllreduceOptions`` or nccl-tests' per-collective
records are), not re-encoded by every tool.

Terms: *input* is what a rank contributes (a fault there means the rank cannot take part
without sending made-up data); *receive* is where a rank's result lands (a fault there
lets the rank take part with workspace and refuse afterwards). Row-per-rank buffers have
the number of ranks as their first dimension.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .buffers import even_bounds


def _same(p: int) -> float:
    return 1.0


def _ring(p: int) -> float:
    return (p - 1) / p if p > 1 else 0.0


def _all_reduce(p: int) -> float:
    return 2 * (p - 1) / p if p > 1 else 0.0


def _every_rank(rank: int, p: int) -> int:
    return p


# How the pipeline calls each collective's algorithms: one order of arguments for all,
# ``(fn, t, src, dst, bounds, op, root)``, put in the order of the spec's ``signature``.
def _src_dst_op(fn: Callable, t: Any, src: Any, dst: Any, bounds: Any, op: Any, root: int) -> Any:
    return fn(t, src, dst, op)


def _src_dst_op_root(fn: Callable, t: Any, src: Any, dst: Any, bounds: Any, op: Any,
                     root: int) -> Any:
    return fn(t, src, dst, op, root)


def _src_bounds_op_dst(fn: Callable, t: Any, src: Any, dst: Any, bounds: Any, op: Any,
                       root: int) -> Any:
    return fn(t, src, bounds, op, dst)


def _src_dst_bounds_root(fn: Callable, t: Any, src: Any, dst: Any, bounds: Any, op: Any,
                         root: int) -> Any:
    return fn(t, src, dst, bounds, root)


def _dst_bounds(fn: Callable, t: Any, src: Any, dst: Any, bounds: Any, op: Any,
                root: int) -> Any:
    return fn(t, dst, bounds)  # the input is already its row of dst (input_in_result)


def _src_bounds_dst_bounds(fn: Callable, t: Any, src: Any, dst: Any, bounds: Any, op: Any,
                           root: int) -> Any:
    return fn(t, src, bounds, dst, bounds)


def _buf_root(fn: Callable, t: Any, src: Any, dst: Any, bounds: Any, op: Any, root: int) -> Any:
    return fn(t, dst, root)


def _nothing(fn: Callable, t: Any, src: Any, dst: Any, bounds: Any, op: Any, root: int) -> Any:
    return fn(t)


# What rank r of a call must get, from every rank's input (``inputs[j]``: rank j's), as
# ``reference(inputs, r, root, combine)``; ``combine(arrays)`` is the op over a list of
# inputs (avg divided by their number); None: no result there. The tests check every
# algorithm against it; NumPy's stack and indexing only, never mpicoll's own code.
_REFERENCES: dict[str, Callable[[list, int, int, Callable[[list], Any]], Any]] = {
    "broadcast": lambda inputs, r, root, combine: inputs[root],
    "scatter": lambda inputs, r, root, combine: inputs[root][r],
    "gather": lambda inputs, r, root, combine: np.stack(inputs) if r == root else None,
    "all_gather": lambda inputs, r, root, combine: np.stack(inputs),
    "reduce": lambda inputs, r, root, combine: combine(inputs) if r == root else None,
    "all_reduce": lambda inputs, r, root, combine: combine(inputs),
    "reduce_scatter": lambda inputs, r, root, combine: combine(inputs)[r],
    "all_to_all": lambda inputs, r, root, combine: np.stack([x[r] for x in inputs]),
    "barrier": lambda inputs, r, root, combine: None,
    "scan": lambda inputs, r, root, combine: combine(inputs[:r + 1]),
    "exscan": lambda inputs, r, root, combine: combine(inputs[:r]) if r else None,
}


@dataclass(frozen=True)
class CollectiveSpec:
    """What one collective is, for every layer that needs to know."""

    name: str
    rooted: bool  # takes root=
    reduces: bool  # takes op=
    input_rows: bool  # the input is shape (size, *rest): row j for rank j
    result_rows: bool  # the result is shape (size, *x.shape): row i from rank i
    input_at_root_only: bool  # only the root contributes data (broadcast, scatter)
    result_at_root_only: bool  # only the root receives (gather, reduce)
    in_place: str  # the in-place form, as the caller writes it ("" where there is none)
    busbw_factor: Callable[[int], float]  # nccl-tests' doc/PERFORMANCE.md, by ranks
    signature: str  # every algorithm's signature (see mpicoll.algorithms)
    invoke: Callable[..., Any]  # fn(t, src, dst, bounds, op, root) in signature's order
    reference: Callable[..., Any]  # (inputs, rank, root, combine): what rank gets (above)
    native_on: tuple[str, ...] = ("mpi", "nccl")  # the backends whose library has it
    module: str = ""  # its algorithms' file in mpicoll/algorithms/ ("": its own name)
    # the ranks rank r of p combines in its result (avg divides by it); 0: no result
    # there (exscan's rank 0, which MPI leaves undefined)
    combined: Callable[[int, int], int] = _every_rank
    dst_may_be_src: bool = False  # in place (out=x) runs the algorithm with src is dst
    input_in_result: bool = False  # x is copied into its row of the result, which the
    #                                algorithm then completes (all_gather)

    def result_shape(self, shape: tuple[int, ...], p: int) -> tuple[int, ...]:
        """The shape of a rank's result, from its input's shape (DESIGN.md's table)."""
        if self.result_rows and not self.input_rows:
            return (p, *shape)  # gather, all_gather: a row from every rank
        if self.input_rows and not self.result_rows:
            return shape[1:]  # scatter, reduce_scatter: this rank's row
        return shape

    def chosen_bytes(self, nbytes: int, p: int) -> int:
        """The size "auto" chooses by, from one rank's input bytes: the whole result where
        the result gathers a row from every rank."""
        return nbytes * p if self.result_rows and not self.input_rows else nbytes

    def bounds(self, shape: tuple[int, ...], p: int) -> list[int] | None:
        """Each rank's block of the flat rows buffer (None where there are no rows)."""
        if self.input_rows:
            return even_bounds(math.prod(shape[1:]), p)
        if self.result_rows:
            return even_bounds(math.prod(shape), p)
        return None


SPECS: dict[str, CollectiveSpec] = {s.name: s for s in (
    CollectiveSpec("broadcast", True, False, False, False, True, False,
                   "", _same, "(t, buf, root)", _buf_root, _REFERENCES["broadcast"]),
    CollectiveSpec("scatter", True, False, True, False, True, False,
                   "out=x[root] at the root", _ring, "(t, src | None, dst, bounds, root)",
                   _src_dst_bounds_root, _REFERENCES["scatter"]),
    CollectiveSpec("gather", True, False, False, True, False, True,
                   "x=out[root] at the root", _ring, "(t, src, dst | None, bounds, root)",
                   _src_dst_bounds_root, _REFERENCES["gather"]),
    CollectiveSpec("all_gather", False, False, False, True, False, False,
                   "x=out[rank]", _ring, "(t, buf, bounds)", _dst_bounds,
                   _REFERENCES["all_gather"], input_in_result=True),
    CollectiveSpec("reduce", True, True, False, False, False, True,
                   "out=x at the root", _same, "(t, src, dst | None, op, root)",
                   _src_dst_op_root, _REFERENCES["reduce"]),
    CollectiveSpec("all_reduce", False, True, False, False, False, False,
                   "out=x", _all_reduce, "(t, src, dst, op)", _src_dst_op,
                   _REFERENCES["all_reduce"], dst_may_be_src=True),
    CollectiveSpec("reduce_scatter", False, True, True, False, False, False,
                   "", _ring, "(t, src, bounds, op, dst)", _src_bounds_op_dst,
                   _REFERENCES["reduce_scatter"]),
    CollectiveSpec("all_to_all", False, False, True, True, False, False,
                   "out=x", _ring, "(t, src, send_bounds, dst, recv_bounds)",
                   _src_bounds_dst_bounds, _REFERENCES["all_to_all"]),
    CollectiveSpec("barrier", False, False, False, False, False, False,
                   "", _same, "(t)", _nothing, _REFERENCES["barrier"]),
    # prefix reductions in rank order (MPI_Scan, MPI_Exscan); NCCL has neither
    CollectiveSpec("scan", False, True, False, False, False, False,
                   "out=x", _same, "(t, src, dst, op)", _src_dst_op, _REFERENCES["scan"],
                   ("mpi",), combined=lambda rank, p: rank + 1, dst_may_be_src=True),
    CollectiveSpec("exscan", False, True, False, False, False, False,
                   "out=x", _same, "(t, src, dst, op)", _src_dst_op, _REFERENCES["exscan"],
                   ("mpi",), module="scan", combined=lambda rank, p: rank, dst_may_be_src=True),
)}

COLLECTIVES: tuple[str, ...] = tuple(SPECS)
