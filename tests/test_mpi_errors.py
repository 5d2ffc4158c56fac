"""Bad input raises the same error on every rank, before any message, under mpiexec."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import mpicoll
from mpicoll import InvalidArgumentError, MismatchError, RemoteError, UnsupportedDtypeError
from mpicoll.backends.mpi_native import typed

pytestmark = pytest.mark.mpi


def test_unknown_algorithm(world):
    with pytest.raises(InvalidArgumentError, match="algorithm: unknown all_reduce algorithm 'tree'"):
        world.all_reduce(np.ones(3), algorithm="tree")


def test_unknown_op(world):
    with pytest.raises(InvalidArgumentError, match="op: unknown reduction op 'mean'"):
        world.all_reduce(np.ones(3), "mean")


@pytest.mark.parametrize("op,dtype", [("avg", "i4"), ("band", "f8"), ("min", "c16"),
                                      ("sum", "U3")])
def test_op_that_does_not_fit_the_dtype(world, op, dtype):
    with pytest.raises(TypeError):
        world.all_reduce(np.zeros(3, dtype), op)


def test_native_refuses_a_dtype_mpi_cannot_reduce(world):
    with pytest.raises(UnsupportedDtypeError, match="native"):
        world.all_reduce(np.ones(3, ml_dtypes.bfloat16), algorithm="native")
    # our own algorithms reduce it
    total = world.all_reduce(np.ones(3, ml_dtypes.bfloat16), algorithm="recursive_doubling")
    np.testing.assert_array_equal(total, np.full(3, world.size, ml_dtypes.bfloat16))


@pytest.mark.parametrize("dtype", ["g", "G"])
def test_native_reduces_long_double_where_mpi_has_its_type(world, dtype):
    """MPI_LONG_DOUBLE and MPI_C_LONG_DOUBLE_COMPLEX: MPI's own reductions of them (as
    mpi4py's Allreduce), where the library has a type of their size; else refused."""
    x = (np.arange(4) + world.rank).astype(dtype)
    if typed(np.dtype(dtype)) is None:
        with pytest.raises(UnsupportedDtypeError, match="native"):
            world.all_reduce(x, algorithm="native")
        return
    expected = sum((np.arange(4) + r).astype(dtype) for r in range(world.size))
    for algorithm in ("native", "auto"):
        np.testing.assert_array_equal(world.all_reduce(x, algorithm=algorithm), expected)
        got = world.reduce(x, "max", algorithm=algorithm) if dtype == "g" else \
            world.reduce(x, "prod", algorithm=algorithm)
        if world.rank == 0:
            reference = np.maximum.reduce if dtype == "g" else np.multiply.reduce
            np.testing.assert_array_equal(
                got, reference([(np.arange(4) + r).astype(dtype) for r in range(world.size)]))


@pytest.mark.parametrize("root", [-1, "size", 1.0])
def test_bad_root(world, root):
    root = world.size if root == "size" else root
    with pytest.raises(InvalidArgumentError, match="root"):
        world.reduce(np.ones(2), root=root)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_to_all"])
def test_first_dimension_must_be_the_number_of_ranks(world, collective):
    with pytest.raises(InvalidArgumentError, match=r"x: .* one row per rank"):
        getattr(world, collective)(np.ones((world.size + 1, 2)))


def test_scatter_refusal_at_the_root_reaches_every_rank(world):
    x = np.ones((world.size + 1, 2)) if world.rank == 0 else None
    expected = InvalidArgumentError if world.rank == 0 else RemoteError
    with pytest.raises(expected, match="one row per rank|refused"):
        world.scatter(x, 0)
    # the communicator still works afterwards
    np.testing.assert_array_equal(world.all_reduce(np.ones(1)), [world.size])


def test_broadcast_of_nothing_at_the_root_reaches_every_rank(world):
    expected = InvalidArgumentError if world.rank == 0 else RemoteError
    with pytest.raises(expected):
        world.broadcast(None if world.rank == 0 else np.zeros(2), 0)
    np.testing.assert_array_equal(world.all_reduce(np.ones(1)), [world.size])


def test_broadcast_into_a_buffer_of_the_wrong_shape(world):
    buf = np.arange(4.0) if world.rank == 0 else np.zeros(5)
    if world.size == 1:
        world.broadcast(buf, 0)
        return
    if world.rank == 0:
        world.broadcast(buf, 0)  # the root's own call is fine
    else:
        with pytest.raises(InvalidArgumentError, match="receive buffer has shape"):
            world.broadcast(buf, 0)
    np.testing.assert_array_equal(world.all_reduce(np.ones(1)), [world.size])


def test_check_mode_names_the_ranks_that_differ(world):
    from mpi4py import MPI

    checked = mpicoll.Communicator(MPI.COMM_WORLD, check=True)
    dtype = "f4" if world.rank == world.size - 1 and world.size > 1 else "f8"
    if world.size == 1:
        checked.all_reduce(np.ones(2, dtype))
        return
    with pytest.raises(MismatchError, match=f"rank {world.size - 1} differs in dtype"):
        checked.all_reduce(np.ones(2, dtype))
    root = world.rank % 2  # roots disagree
    with pytest.raises(MismatchError, match="root"):
        checked.reduce(np.ones(2), root=root)
    # agreeing calls pass the check
    np.testing.assert_array_equal(checked.all_reduce(np.ones(2)), np.full(2, world.size))
    got = checked.broadcast(np.ones(3) if world.rank == 0 else None, 0)
    np.testing.assert_array_equal(got, np.ones(3))


def test_scatter_root_refusing_its_out_takes_part_and_the_others_get_their_rows(world):
    x = np.arange(world.size * 2.0).reshape(world.size, 2) if world.rank == 0 else None
    out = np.empty(3) if world.rank == 0 else None  # the root's out has the wrong shape
    if world.rank == 0:
        with pytest.raises(InvalidArgumentError, match=r"out: expected shape \(2,\)"):
            world.scatter(x, 0, out=out)
    else:  # the root took part with workspace: every other rank has its row
        np.testing.assert_array_equal(world.scatter(x, 0), [2.0 * world.rank, 2.0 * world.rank + 1])
    np.testing.assert_array_equal(world.all_reduce(np.ones(1)), [world.size])


def test_a_number_as_out_or_receive_buffer_is_refused(world):
    """out=3.0 (or a NumPy scalar) could never show the caller its result: refused, the
    rank taking part as for any wrong out=; a receive into one too, before any message."""
    for out in (3.0, np.float64(3.0)):
        with pytest.raises(InvalidArgumentError, match="out: expected an array to write into"):
            world.all_reduce(np.ones(1), out=out)
        np.testing.assert_array_equal(world.all_reduce(np.ones(1)), [world.size])
    with pytest.raises(InvalidArgumentError, match="expected an array to write into"):
        world.recv(3.0, 0)


@pytest.mark.mpi(min_size=2)
def test_a_monitored_barrier_names_the_rank_that_made_another_call_instead():
    """The last rank skips the monitored barrier and broadcasts from itself (call #1 on
    every rank): the others' barrier messages go on tags no call's data uses, so rank 0
    does not take the broadcast's packet as an arrival (MPI's "Message truncated", and
    rank 0 blamed for not arriving): every rank that came names the last one."""
    from mpi4py import MPI

    comm = mpicoll.Communicator(MPI.COMM_WORLD)
    last = comm.size - 1
    try:
        if comm.rank == last:
            comm.broadcast(np.ones(4), root=last, algorithm="linear")
        else:
            with pytest.raises(mpicoll.CollectiveTimeoutError,
                               match=f"monitored_barrier .call #1.: rank {last} did not arrive"):
                comm.monitored_barrier(timeout=1.0)
    finally:
        comm.free()
    world = mpicoll.Communicator(MPI.COMM_WORLD)
    assert world.all_reduce(np.ones(2)).tolist() == [comm.size] * 2
    world.free()


def test_a_communicator_over_comm_null_says_so():
    """MPI.COMM_NULL (what a Split with MPI.UNDEFINED gives) is named as such: it was
    "expected an mpi4py intracommunicator, got Intracomm", which it is."""
    from mpi4py import MPI

    outside = MPI.COMM_SELF.Split(MPI.UNDEFINED)  # (an Intracomm, COMM_NULL)
    for null in (MPI.COMM_NULL, outside):
        with pytest.raises(InvalidArgumentError, match="MPI.COMM_NULL, which no rank is in"):
            mpicoll.Communicator(null)
    with pytest.raises(InvalidArgumentError, match="expected an mpi4py intracommunicator, "
                       "got str"):
        mpicoll.Communicator("world")
