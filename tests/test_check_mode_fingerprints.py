"""Check mode on every collective: a call whose ranks disagree raises MismatchError on
every rank (nothing else), and the same call agreeing runs; on host and device arrays."""

from __future__ import annotations

import re

import numpy as np
import pytest
from fake_cupy import installed

import mpicoll
from mpicoll.local import run_local

P = 3
LAST = P - 1  # the rank that disagrees


def _call(comm, collective: str, disagree: bool, xp):
    """One call of ``collective`` in which, when ``disagree``, the last rank differs in
    what the fingerprint compares (dtype, shape, root or op)."""
    odd = disagree and comm.rank == LAST
    dtype = np.float32 if odd else np.float64
    rows = xp.asarray(np.ones((P, 2), dtype))
    x = xp.asarray(np.ones(3 if odd else 2))
    if collective == "broadcast":
        data = xp.asarray(np.ones(3, dtype))
        return comm.broadcast(data, root=1 if odd else 0)
    if collective == "scatter":
        return comm.scatter(rows if comm.rank == (1 if odd else 0) else None,
                            root=1 if odd else 0)
    if collective == "gather":
        return comm.gather(x, root=0)
    if collective == "all_gather":
        return comm.all_gather(x)
    if collective == "reduce":
        return comm.reduce(xp.asarray(np.ones(2)), op="max" if odd else "sum", root=0)
    if collective == "all_reduce":
        return comm.all_reduce(xp.asarray(np.ones(2, dtype)))
    if collective == "reduce_scatter":
        return comm.reduce_scatter(rows)
    if collective == "all_to_all":
        return comm.all_to_all(xp.asarray(np.ones((P, 3 if odd else 2))))
    if collective == "barrier":
        return comm.barrier(algorithm="dissemination" if odd else "auto")
    if collective in ("scan", "exscan"):
        return getattr(comm, collective)(xp.asarray(np.ones(2)), op="max" if odd else "sum")
    raise ValueError(collective)


@pytest.mark.parametrize("device", [False, True], ids=["host", "device"])
@pytest.mark.parametrize("collective", mpicoll.COLLECTIVES)
def test_a_disagreeing_call_raises_mismatch_on_every_rank(collective, device):
    assert len(mpicoll.COLLECTIVES) == 11

    def body(comm, xp):
        try:
            _call(comm, collective, True, xp)
        except mpicoll.MismatchError as exc:
            outcome = exc
        else:
            outcome = None
        _call(comm, collective, False, xp)  # then an agreeing call runs
        return outcome

    if device:
        with installed() as cupy:
            outcomes = run_local(P, body, cupy, check=True)
    else:
        outcomes = run_local(P, body, np, check=True)
    assert all(isinstance(o, mpicoll.MismatchError) for o in outcomes), outcomes
    assert all(f"rank {LAST}" in str(o) for o in outcomes), outcomes


def _sum(a, b, out):
    np.add(a, b, out=out)


@pytest.mark.parametrize("case", ["fields", "field_types", "user_op_named_as_builtin",
                                  "commutativity", "v_fields"])
def test_what_differs_beyond_a_name_or_a_size_is_a_mismatch(case):
    """Structured dtypes of one size with other fields (NumPy's str and name are '|V8' and
    'void64' for all), a user's Op named as a built-in, or one that differs only in its
    commutativity (native and auto take other paths for them): a MismatchError on every
    rank, then the agreeing call runs."""
    def body(comm):
        odd = comm.rank == LAST
        pair = np.dtype([("b", "<i8")] if odd else [("a", "<f8")])
        if case == "v_fields":  # the v-variants' own exchange compares the rows' dtype too
            pair = np.dtype([("b", "<i4"), ("c", "<f4")] if odd else [("a", "<f8")])
        x = np.zeros(2, pair if case in ("fields", "v_fields") else np.float64)
        if case == "field_types":
            x = np.zeros(2, [("a", "<i8")] if odd else [("a", "<f8")])
        try:
            if case == "user_op_named_as_builtin":
                comm.all_reduce(x, mpicoll.Op(_sum, name="sum") if odd else "sum")
            elif case == "commutativity":
                comm.reduce(x, mpicoll.Op(_sum, commutative=not odd, name="add"), 0)
            elif case == "v_fields":
                comm.all_gather_v(x)
            else:
                comm.all_gather(x)
        except mpicoll.MismatchError as exc:
            outcome = str(exc)
        else:
            outcome = None
        return outcome, comm.all_reduce(np.ones(2))[0]

    for check in (True, False) if case == "v_fields" else (True,):
        outcomes = run_local(P, body, check=check)
        assert all(o is not None and re.search(rf"rank(\(s\))? {LAST}\b", o) and n == P
                   for o, n in outcomes), outcomes


def test_check_mode_turned_on_later_checks_the_calls_decided_before():
    """Default calls made before ``comm.check = True`` keep their decisions (which skip
    check mode's exchange): once it is on, a repeated call compares as every call does,
    a differing op raising MismatchError on every rank, never a hit on one rank against
    the fingerprint on another; off again, the calls are decided again."""
    def body(comm):
        x = np.ones(3)
        comm.all_reduce(x)
        comm.all_reduce(x)  # (decided, kept)
        comm.check = True
        try:
            comm.all_reduce(x) if comm.rank == 0 else comm.all_reduce(x, "max")
        except mpicoll.MismatchError as exc:
            outcome = str(exc)
        else:
            outcome = None
        comm.check = False
        assert comm.all_reduce(x).tolist() == [2.0] * 3
        assert comm.all_reduce(x).tolist() == [2.0] * 3
        return outcome, bool(comm._decisions)

    outcomes = run_local(2, body, timeout=10)
    assert all(o is not None and "rank 1 differs in op" in o and kept for o, kept in outcomes), \
        outcomes


def test_check_mode_turned_on_later_checks_a_plans_starts():
    """A plan made outside check mode, its starts settled (the lean path), with an op
    that differs on rank 1: once check mode is on, its next start is agreed first and
    raises MismatchError on every rank, naming the op; a plan alike on every rank runs."""
    def body(comm):
        x = np.ones(3)
        plan = comm.all_reduce_init(x, "sum" if comm.rank == 0 else "max")
        for _ in range(3):
            plan()
        comm.check = True
        try:
            plan()
        except mpicoll.MismatchError as exc:
            outcome = str(exc)
        else:
            outcome = None
        alike = comm.all_reduce_init(x)
        return outcome, [alike().tolist() for _ in range(3)]

    outcomes = run_local(2, body, timeout=10)
    assert all(o is not None and "rank 1 differs in op" in o for o, _ in outcomes), outcomes
    assert all(r == [[2.0] * 3] * 3 for _, r in outcomes)


def test_reduce_scatter_counts_never_pass_for_a_plain_calls_shape():
    """reduce_scatter's v-form against the plain form whose x's shape reads as its
    counts (counts [2, 3] and an x of shape (2, 3)): the two cut x differently, so check
    mode raises on every rank; the agreeing v-form then runs."""
    def body(comm):
        try:
            if comm.rank == 0:
                comm.reduce_scatter(np.arange(5.0), counts=[2, 3])
            else:
                comm.reduce_scatter(np.arange(6.0).reshape(2, 3))
        except mpicoll.MismatchError as exc:
            outcome = str(exc)
        else:
            outcome = None
        return outcome, comm.reduce_scatter(np.arange(5.0), counts=[2, 3]).tolist()

    outcomes = run_local(2, body, timeout=10, check=True)
    assert all(o is not None and "rank 1 differs in shape" in o for o, _ in outcomes), outcomes
    assert [r for _, r in outcomes] == [[0.0, 2.0], [4.0, 6.0, 8.0]]


def test_a_dup_against_another_ranks_call_is_a_mismatch_on_every_rank():
    """dup() is collective (MPI_Comm_dup): in check mode it is a step every rank makes at
    that point, so one rank's dup against another's all_reduce raises on both (before
    any MPI_Comm_dup), and the next dup and call run."""
    def body(comm):
        with pytest.raises(mpicoll.MismatchError, match="rank 1 differs in collective"):
            if comm.rank == 0:
                comm.dup()
            else:
                comm.all_reduce(np.ones(2))
        other = comm.dup()
        return comm.all_reduce(np.ones(2))[0], other.all_reduce(np.ones(2))[0]

    assert run_local(2, body, timeout=10, check=True) == [(2.0, 2.0)] * 2
