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

from collections.abc import Callable
from dataclasses import dataclass


def _same(p: int) -> float:
    return 1.0


def _ring(p: int) -> float:
    return (p - 1) / p if p > 1 else 0.0


def _all_reduce(p: int) -> float:
    return 2 * (p - 1) / p if p > 1 else 0.0


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
    native_on: tuple[str, ...] = ("mpi", "nccl")  # the backends whose library has it
    module: str = ""  # its algorithms' file in mpicoll/algorithms/ ("": its own name)


SPECS: dict[str, CollectiveSpec] = {s.name: s for s in (
    CollectiveSpec("broadcast", True, False, False, False, True, False,
                   "", _same, "(t, buf, root)"),
    CollectiveSpec("scatter", True, False, True, False, True, False,
                   "out=x[root] at the root", _ring, "(t, src | None, dst, bounds, root)"),
    CollectiveSpec("gather", True, False, False, True, False, True,
                   "x=out[root] at the root", _ring, "(t, src, dst | None, bounds, root)"),
    CollectiveSpec("all_gather", False, False, False, True, False, False,
                   "x=out[rank]", _ring, "(t, buf, bounds)"),
    CollectiveSpec("reduce", True, True, False, False, False, True,
                   "out=x at the root", _same, "(t, src, dst | None, op, root)"),
    CollectiveSpec("all_reduce", False, True, False, False, False, False,
                   "out=x", _all_reduce, "(t, src, dst, op)"),
    CollectiveSpec("reduce_scatter", False, True, True, False, False, False,
                   "", _ring, "(t, src, bounds, op, dst)"),
    CollectiveSpec("all_to_all", False, False, True, True, False, False,
                   "out=x", _ring, "(t, src, send_bounds, dst, recv_bounds)"),
    CollectiveSpec("barrier", False, False, False, False, False, False,
                   "", _same, "(t)"),
    # prefix reductions in rank order (MPI_Scan, MPI_Exscan); NCCL has neither
    CollectiveSpec("scan", False, True, False, False, False, False,
                   "out=x", _same, "(t, src, dst, op)", ("mpi",)),
    CollectiveSpec("exscan", False, True, False, False, False, False,
                   "out=x", _same, "(t, src, dst, op)", ("mpi",), module="scan"),
)}

COLLECTIVES: tuple[str, ...] = tuple(SPECS)
