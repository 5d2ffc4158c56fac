"""scan and exscan beyond the registry-wide checks (tests/reference.py's ``scanned``, which
test_local and test_mpi run for every algorithm, native and auto, every dtype and op):
out=, in place and strided out=, exscan's None on rank 0, avg as a running mean, a user op
raising on one rank, plans, what auto picks and where native exists. Local thread-ranks,
and under mpiexec (``-m mpi``)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from reference import SCANS, as_op, make_input, scanned

import mpicoll
from mpicoll.local import run_local
from mpicoll.selection.mpich_rules import BINOMIAL_SCAN_FROM, NATIVE_BELOW
from mpicoll.spec import SPECS

LOCAL = [(c, a) for c in SCANS for a in [*mpicoll.algorithms(c, "local"), "auto"]]
MPI = [(c, a) for c in SCANS for a in [*mpicoll.algorithms(c, "mpi"), "auto"]]


def _result_forms(comm, collective: str, algorithm: str) -> None:
    """out=, out=x (in place), a strided out=, and a strided x in place, on a sum and on
    a non-commutative user op; exscan's rank 0 gets None and its buffer is left alone."""
    p, r = comm.size, comm.rank
    fn = getattr(comm, collective)
    for op, dtype in (("sum", "i8"), ("matmul", None)):
        inputs = [make_input(k, (2, 5), dtype, op) for k in range(p)]
        want = scanned(inputs, op, exclusive=collective == "exscan")[r]
        what = f"{collective}/{algorithm} {op} p={p} rank={r}"
        mine = inputs[r]
        out = np.zeros_like(mine)
        buffers = {"out": (mine, out), "in place": (mine.copy(), None)}
        wide = np.zeros((2, 10), mine.dtype)
        buffers["strided out"] = (mine, wide[:, ::2])
        wide_x = np.zeros((2, 10), mine.dtype)
        wide_x[:, 1::2] = mine
        buffers["strided in place"] = (wide_x[:, 1::2], None)
        for form, (x, out) in buffers.items():
            target = x if out is None else out
            before = target.copy()
            got = fn(x, as_op(op), algorithm=algorithm, out=target)
            if want is None:
                assert got is None, f"{what} {form}"
                assert np.array_equal(target, before), f"{what} {form}: rank 0's buffer changed"
            else:
                assert got is target, f"{what} {form}"
                assert np.array_equal(got, want), f"{what} {form}: {got} != {want}"
        assert np.array_equal(wide_x[:, ::2], np.zeros((2, 5), mine.dtype)), what
        assert np.array_equal(mine, inputs[r]), f"{what}: the input changed"


def _running_mean(comm, collective: str, algorithm: str) -> None:
    """avg: rank r's result divided by the ranks it combines (r + 1, exscan: r)."""
    r = comm.rank
    got = getattr(comm, collective)(np.full(3, r + 1.0), "avg", algorithm=algorithm)
    upto = r + 1 if collective == "scan" else r
    if upto == 0:
        assert got is None
    else:
        np.testing.assert_array_equal(got, np.full(3, (upto + 1) / 2))  # mean of 1..upto


def _raising_on_rank_1(comm, collective: str, algorithm: str) -> None:
    """A user op raising on rank 1 (which combines in every algorithm, p >= 3): OpError
    on every rank, naming rank 1; the next call is right."""
    def flaky(a, b, out):
        if comm.rank == 1:
            raise ZeroDivisionError("flaky")
        np.add(a, b, out=out)

    with pytest.raises(mpicoll.OpError, match="op 'flaky' raised on rank 1;") as caught:
        getattr(comm, collective)(np.ones(4), mpicoll.Op(flaky, name="flaky"),
                                  algorithm=algorithm)
    if comm.rank == 1:
        assert isinstance(caught.value.__cause__, ZeroDivisionError)
    got = getattr(comm, collective)(np.ones(4), algorithm=algorithm)
    upto = comm.rank + 1 if collective == "scan" else comm.rank
    assert (got is None) if upto == 0 else np.array_equal(got, np.full(4, float(upto)))


def _plans(comm, collective: str, algorithm: str) -> None:
    """``<collective>_init``: started again and again on the refilled bound input."""
    r = comm.rank
    x = np.zeros(6)
    with getattr(comm, f"{collective}_init")(x, "sum", algorithm=algorithm) as plan:
        for step in range(3):
            x[...] = np.arange(6.0) + 10 * r + 100 * step
            got = plan()
            upto = r + 1 if collective == "scan" else r
            if upto == 0:
                assert got is None
            else:
                want = sum(np.arange(6.0) + 10 * k + 100 * step for k in range(upto))
                np.testing.assert_array_equal(got, want)
        assert plan.starts == 3


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("collective,algorithm", LOCAL)
def test_local_result_forms_and_running_mean(collective, algorithm, size):
    def body(comm):
        _result_forms(comm, collective, algorithm)
        _running_mean(comm, collective, algorithm)
        _plans(comm, collective, algorithm)
        return True

    assert all(run_local(size, body, timeout=20))


@pytest.mark.parametrize("collective,algorithm", LOCAL)
def test_local_user_op_raising_on_one_rank(collective, algorithm):
    def body(comm):
        _raising_on_rank_1(comm, collective, algorithm)
        return True

    assert all(run_local(4, body, timeout=20))


@pytest.mark.mpi
@pytest.mark.parametrize("collective,algorithm", MPI)
def test_mpi_result_forms_running_mean_and_plans(world, collective, algorithm):
    _result_forms(world, collective, algorithm)
    _running_mean(world, collective, algorithm)
    _plans(world, collective, algorithm)


@pytest.mark.mpi
@pytest.mark.parametrize("collective,algorithm", MPI)
def test_mpi_user_op_raising_on_one_rank(world, collective, algorithm):
    if world.size < 3:
        pytest.skip("needs 3 ranks (at 2, exscan's rank 1 combines nothing)")
    _raising_on_rank_1(world, collective, algorithm)


def test_auto_picks_native_then_recursive_doubling_then_binomial():
    from mpi4py import MPI

    comm = mpicoll.Communicator(MPI.COMM_SELF)
    for collective in SCANS:
        assert NATIVE_BELOW[collective] <= BINOMIAL_SCAN_FROM
        picks = [comm.auto_algorithm(collective, n, "sum", "f4")
                 for n in (8, NATIVE_BELOW[collective], BINOMIAL_SCAN_FROM)]
        assert picks == ["native", "recursive_doubling", "binomial"], collective
        # the MPI library has no bfloat16: mpicoll's own at every size
        assert comm.auto_algorithm(collective, 8, "sum", ml_dtypes.bfloat16) == \
            "recursive_doubling"
    comm.free()

    def body(local):
        return [local.auto_algorithm(c, n, "prod", "i4") for c in SCANS
                for n in (8, BINOMIAL_SCAN_FROM)]

    assert run_local(2, body) == [["recursive_doubling", "binomial"] * 2] * 2


def test_native_exists_where_the_spec_says():
    """NCCL has no scan: ``native`` is listed (and the MPI backend's table holds it) only
    where ``SPECS[c].native_on`` names the backend."""
    from mpicoll.backends.mpi_native import NATIVE

    assert set(NATIVE) == {c for c, s in SPECS.items() if "mpi" in s.native_on}
    for collective in SCANS:
        assert SPECS[collective].native_on == ("mpi",)
        assert "native" in mpicoll.algorithms(collective, "mpi")
        assert "native" not in mpicoll.algorithms(collective, "nccl")
        assert "native" not in mpicoll.algorithms(collective, "local")
    assert all("native" in mpicoll.algorithms(c, "nccl") for c, s in SPECS.items()
               if "nccl" in s.native_on)


def test_native_is_refused_on_the_local_backend():
    def body(comm):
        with pytest.raises(mpicoll.InvalidArgumentError, match="'local' has none"):
            comm.scan(np.ones(2), algorithm="native")
        return True

    assert all(run_local(2, body))
