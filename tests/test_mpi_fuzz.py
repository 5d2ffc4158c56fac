"""Seeded random cases under mpiexec: what the parametrized tests take one axis at a time,
drawn together. Each case is a collective, one of its algorithms ("auto", or none given),
a dtype and op, a shape (0-d, empty, odd, 2-D), a root, an input laid out contiguous,
strided or read-only, a result given as out= (contiguous or strided) or not, on some ranks
only, and called one to three times with new values (the repeated calls run as decided,
``mpicoll.pipeline.decided``), or made a plan refilled between its starts; every rank's
result against NumPy's. A case every rank refuses alike (an algorithm that takes no such
dtype or op) is fine if the next call runs; one refused on some ranks only is a failure.

Every rank draws the same cases (one seed). ``MPICOLL_FUZZ_SEED`` and ``MPICOLL_FUZZ_CASES``
draw others (the suite's: seed 0, 150 cases at each number of ranks); a failure names
the case's number, so ``MPICOLL_FUZZ_SEED=s`` reruns it.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from reference import DTYPE_OPS, DTYPES, reduced, strided

import mpicoll
from mpicoll.pipeline.decided import TAKES_OUT
from mpicoll.spec import SPECS

pytestmark = pytest.mark.mpi

SEED = int(os.environ.get("MPICOLL_FUZZ_SEED", "0"))
CASES = int(os.environ.get("MPICOLL_FUZZ_CASES", "150"))
DRAWN = [c for c in mpicoll.COLLECTIVES if c != "barrier"]
SHAPES = ((), (0,), (1,), (2,), (7,), (3, 2), (181,))  # (a row's, where x has rows)


class Case:
    """One drawn case: the same on every rank."""

    def __init__(self, rng: np.random.Generator, p: int) -> None:
        self.collective = str(rng.choice(DRAWN))
        self.spec = SPECS[self.collective]
        algorithm = rng.choice([*mpicoll.algorithms(self.collective), "auto", None])
        self.algorithm = None if algorithm is None else str(algorithm)
        if self.spec.reduces:
            self.dtype, self.op = DTYPE_OPS[int(rng.integers(len(DTYPE_OPS)))]
        else:
            self.dtype, self.op = DTYPES[int(rng.integers(len(DTYPES)))], "sum"
        row = SHAPES[int(rng.integers(len(SHAPES)))]
        self.shape = (p, *row) if self.spec.input_rows else row
        self.root = int(rng.integers(p))
        self.layout = str(rng.choice(["contiguous", "strided", "read-only"]) if self.shape
                          else rng.choice(["contiguous", "read-only"]))
        self.out = [str(rng.choice(["none", "given", "strided"])) for _ in range(p)]  # each rank's
        self.receive_into = [bool(rng.integers(2)) for _ in range(p)]  # a broadcast's buffer
        self.calls = int(rng.integers(1, 4))
        self.plan = self.layout != "read-only" and rng.random() < 0.25

    def __repr__(self) -> str:
        return (f"{self.collective} algorithm={self.algorithm} {self.dtype} {self.op} "
                f"shape={self.shape} root={self.root} {self.layout} out={self.out} "
                f"calls={self.calls}{' plan' if self.plan else ''}")

    def inputs(self, step: int, p: int) -> list[np.ndarray]:
        """Every rank's input at call ``step`` (exact under the op: small values)."""
        from reference import make_input

        return [make_input(r + 7 * step, self.shape, self.dtype, self.op) for r in range(p)]

    def expected(self, step: int, p: int, rank: int) -> np.ndarray | None:
        return self.spec.reference(self.inputs(step, p), rank, self.root,
                                   lambda some: reduced(some, self.op))


def _laid_out(values: np.ndarray, layout: str) -> np.ndarray:
    x = strided(values) if layout == "strided" else values.copy()
    if layout == "read-only":
        x.setflags(write=False)
    return x


def _result_buffer(kind: str, like: np.ndarray | None) -> np.ndarray | None:
    """A rank's out= (None: none given), zeroed; strided: every other element."""
    if like is None or kind == "none":
        return None
    if kind == "strided" and like.ndim:
        return strided(np.zeros_like(like))
    return np.zeros_like(like)


def _run(comm: mpicoll.Communicator, case: Case) -> None:
    p, rank, spec = comm.size, comm.rank, case.spec
    gives = rank == case.root or not spec.input_at_root_only
    expected = case.expected(0, p, rank)
    out = _result_buffer(case.out[rank], expected) if case.collective in TAKES_OUT else None
    if case.collective == "broadcast" and not gives and case.receive_into[rank]:
        out = np.zeros(case.shape, expected.dtype)  # (a receiver's x: its receive buffer)
    kwargs: dict = {} if case.algorithm is None else {"algorithm": case.algorithm}
    if out is not None and case.collective != "broadcast":
        kwargs["out"] = out
    args: tuple = (case.op,) if spec.reduces else ()
    args += (case.root,) if spec.rooted else ()
    x = _laid_out(case.inputs(0, p)[rank], case.layout) if gives else \
        (out if case.collective == "broadcast" else None)
    plan = getattr(comm, f"{case.collective}_init")(x, *args, **kwargs) if case.plan else None
    for step in range(case.calls):
        values = case.inputs(step, p)[rank]
        if gives and step and case.plan:
            x[...] = values  # refilled: the plan's bound input
        elif gives and step:
            x = _laid_out(values, case.layout)
        before = None if x is None or x is out else x.copy()
        got = plan() if plan is not None else getattr(comm, case.collective)(x, *args, **kwargs)
        want = case.expected(step, p, rank)
        if want is None:
            assert got is None, f"expected None, got {got!r}"
            continue
        assert isinstance(got, np.ndarray) and got.shape == want.shape and \
            got.dtype == want.dtype and np.array_equal(got, want), f"got {got!r}, want {want!r}"
        if out is not None:
            assert np.array_equal(out, want), f"out= holds {out!r}, want {want!r}"
        if before is not None:
            assert np.array_equal(x, before), "the input was written"
    if plan is not None:
        plan.free()


def test_random_cases_against_numpy():
    from mpi4py import MPI

    comm = mpicoll.Communicator()
    control = MPI.COMM_WORLD.Dup()  # (each rank's outcome, apart from comm's calls)
    rng = np.random.default_rng([SEED, comm.size])
    refused, failures = 0, []
    for number in range(CASES):
        case = Case(rng, comm.size)
        outcome = "ran"
        try:
            _run(comm, case)
        except mpicoll.MpicollError as exc:
            outcome = f"refused: {type(exc).__name__}: {exc}"
        except AssertionError as exc:
            outcome = f"WRONG: {exc}"
        outcomes = control.allgather(outcome.split(":")[0])
        if outcome.startswith("WRONG") or len(set(outcomes)) > 1:
            failures.append(f"case {number} ({case!r}) on rank {comm.rank}: {outcome}; "
                            f"every rank's: {outcomes}")
        refused += outcome.startswith("refused")
        np.testing.assert_array_equal(comm.all_reduce(np.ones(2)), np.full(2, comm.size),
                                      err_msg=f"the call after case {number} ({case!r})")
    control.Free()
    assert not failures, "\n".join(failures[:5])
    assert refused < CASES // 4, f"{refused} of {CASES} cases refused"
