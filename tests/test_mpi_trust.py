"""Trust, round two, under mpiexec: a user op that raises on one rank, user ops that come
and go, dtypes without a header code, strided out=, async calls from several threads and
check mode's async and v-variant cases. Each test ends with a call that must be right.

Run as ``mpiexec -n N python -m mpi4py -m pytest --with-mpi -m mpi`` with MPICOLL_TIMEOUT
set (the test command sets it): a hang ends with a report, not a silent wait.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import mpicoll
from mpicoll.algorithms import REGISTRY

pytestmark = pytest.mark.mpi

REDUCING = [(c, a) for c in ("all_reduce", "reduce", "reduce_scatter")
            for a in [*REGISTRY[c], "native", "auto"]]


def _next_call_is_right(comm) -> None:
    got = comm.all_reduce(np.full(5, comm.rank + 1.0), algorithm="ring")
    np.testing.assert_array_equal(got, np.full(5, comm.size * (comm.size + 1) / 2))


def _reduce(comm, collective, x, op, algorithm):
    if collective == "all_reduce":
        return comm.all_reduce(x, op, algorithm=algorithm)
    if collective == "reduce":
        return comm.reduce(x, op, root=0, algorithm=algorithm)
    return comm.reduce_scatter(x, op, algorithm=algorithm)


# -- 1. a user op that raises on one rank ------------------------------------------------


@pytest.mark.parametrize(("collective", "algorithm"), REDUCING)
@pytest.mark.parametrize("commutative", [True, False])
def test_a_user_op_raising_on_one_rank_raises_op_error_on_every_rank(world, collective,
                                                                     algorithm, commutative):
    if not commutative and REGISTRY[collective].get(algorithm) is not None \
            and REGISTRY[collective][algorithm].commutative_only:
        pytest.skip("refused for a non-commutative op")
    calls = []
    failing = world.size - 1  # the last rank: it combines in every algorithm but linear reduce

    def flaky(a, b, out):
        calls.append(a.size)
        if world.rank == failing:
            raise ZeroDivisionError("flaky op")
        np.add(a, b, out=out)

    op = mpicoll.Op(flaky, commutative=commutative, name="flaky")
    x = np.ones((world.size, 6), np.float64)
    raised_here = None
    try:
        _reduce(world, collective, x, op, algorithm)
    except mpicoll.OpError as exc:
        raised_here = exc
    # every rank raises, or none does (the failing rank's op never ran with data)
    flags = np.zeros(world.size, np.int64)
    flags[world.rank] = raised_here is not None
    flags = world.all_reduce(flags, algorithm="native")
    ran_on_failing = world.all_reduce(np.array([len(calls) if world.rank == failing else 0]),
                                      algorithm="native")[0]
    if ran_on_failing:
        assert flags.tolist() == [1] * world.size
        assert "'flaky'" in str(raised_here) and f"rank {failing}" in str(raised_here)
        if world.rank == failing:
            assert isinstance(raised_here.__cause__, ZeroDivisionError)
    else:
        assert flags.tolist() == [0] * world.size
    _next_call_is_right(world)


def test_a_user_op_raising_on_every_rank_with_native_does_not_abort(world):
    def broken(a, b, out):
        raise ValueError("never")

    if world.size == 1:  # one rank combines nothing: the op never runs
        np.testing.assert_array_equal(
            world.all_reduce(np.ones(4), mpicoll.Op(broken), algorithm="native"), np.ones(4))
    else:
        with pytest.raises(mpicoll.OpError, match="op 'broken' raised on rank"):
            world.all_reduce(np.ones(4), mpicoll.Op(broken), algorithm="native")
    _next_call_is_right(world)


# -- 2. user ops that come and go ----------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["native", "auto", "recursive_doubling"])
def test_a_fresh_op_per_call_never_runs_out_of_mpi_user_ops(world, algorithm):
    for step in range(80):  # MPICH has room for a few dozen user ops at once
        op = mpicoll.Op(lambda a, b, out: np.add(a, b, out=out), name=f"step{step}")
        got = world.all_reduce(np.full(3, step, np.int64), op, algorithm=algorithm)
        np.testing.assert_array_equal(got, np.full(3, step * world.size))
    _next_call_is_right(world)


@pytest.mark.parametrize(("collective", "algorithm"), REDUCING)
def test_no_call_keeps_a_user_op_alive(world, collective, algorithm):
    op = mpicoll.Op(lambda a, b, out: np.add(a, b, out=out))
    _reduce(world, collective, np.ones((world.size, 2)), op, algorithm)
    world.all_reduce(np.ones((world.size, 2)), op, async_op=True).wait()
    gone = weakref.ref(op)
    del op
    gc.collect()
    assert gone() is None, "a cache, record or callback still holds the user's Op"
