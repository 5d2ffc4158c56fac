"""Every algorithm under mpiexec, against NumPy references and the MPI library's own collectives.

Run as ``mpiexec -n N python -m mpi4py -m pytest --with-mpi``; the README's test command
does this at 1, 2, 3, 4, 5 and 8 ranks.
"""

from __future__ import annotations

import numpy as np
import pytest
from reference import (
    BARRIER_CASES,
    DTYPE_OPS,
    DTYPES,
    LOC_DTYPE_OPS,
    LOC_DTYPES,
    NO_MPI_REDUCTION,
    REDUCING,
    ROOTED,
    USER_OPS,
    as_op,
    check_late_barrier,
    keeps_order,
    make_input,
    mpi_reduces,
    reduced,
    run_case,
    run_v_case,
    user_op_cases,
    v_cases,
)

import mpicoll

pytestmark = pytest.mark.mpi

CASES = [(c, a) for c in mpicoll.COLLECTIVES if c != "barrier" for a in mpicoll.algorithms(c)]
SHAPES = ((), (0,), (1,), (3,), (17,), (1001,), (2, 3, 4))


def _roots(comm, collective):
    return range(comm.size) if collective in ROOTED else (0,)


@pytest.fixture(scope="module", params=["world", "self", "split"])
def comm(request):
    """COMM_WORLD, COMM_SELF, and the halves of a split COMM_WORLD (all but 1 rank)."""
    from mpi4py import MPI

    if request.param == "world":
        return mpicoll.Communicator(MPI.COMM_WORLD)
    if request.param == "self":
        return mpicoll.Communicator(MPI.COMM_SELF)
    world = MPI.COMM_WORLD
    half = world.Split(world.Get_rank() % 2, world.Get_rank())
    return mpicoll.Communicator(half)


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_against_numpy_every_shape_and_root(comm, collective, algorithm):
    for shape in SHAPES:
        for root in _roots(comm, collective):
            run_case(comm, collective, algorithm, shape, "f8", "sum", root)


def _native_cannot(collective, algorithm, dtype):
    """The MPI library has no bfloat16 or long double: native reductions are refused."""
    return algorithm == "native" and collective in REDUCING and dtype in NO_MPI_REDUCTION


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_every_dtype(world, collective, algorithm):
    for dtype in DTYPES:
        for root in _roots(world, collective):
            if _native_cannot(collective, algorithm, dtype):
                with pytest.raises(mpicoll.UnsupportedDtypeError, match="cannot reduce dtype"):
                    run_case(world, collective, algorithm, (5,), dtype, "sum", root)
            else:
                run_case(world, collective, algorithm, (5,), dtype, "sum", root)


@pytest.mark.parametrize("collective,algorithm",
                         [(c, a) for c, a in CASES if c in REDUCING] + [(c, "auto") for c in REDUCING])
def test_every_op_and_dtype(world, collective, algorithm):
    """Every op on every dtype it takes (minloc/maxloc on (value, index) dtypes, with ties);
    native refuses what the MPI library has no op for, and auto then runs one of ours."""
    for dtype, op in DTYPE_OPS + LOC_DTYPE_OPS:
        if algorithm == "native" and not mpi_reduces(dtype, op):
            with pytest.raises(mpicoll.UnsupportedDtypeError, match="native.*MPI"):
                run_case(world, collective, algorithm, (9,), dtype, op)
            continue
        # every root is run by the tests above and below; here the first and the last
        for root in sorted({0, world.size - 1}) if collective in ROOTED else (0,):
            run_case(world, collective, algorithm, (9,), dtype, op, root)


@pytest.mark.parametrize("collective,algorithm,op", user_op_cases("mpi"))
def test_user_ops(comm, collective, algorithm, op):
    """mpicoll.Op in rank order on every algorithm; native runs it as an MPI user op."""
    for shape in ((0,), (1,), (7,), (2, 3)):
        for root in _roots(comm, collective):
            run_case(comm, collective, algorithm, shape, None, op, root)


@pytest.mark.parametrize("collective,algorithm", v_cases("mpi"))
def test_v_variants(comm, collective, algorithm):
    """Uneven rows, some ranks giving or getting none, against NumPy; native is MPI's *v."""
    roots = range(comm.size) if collective in ("gather_v", "scatter_v") else (0,)
    for rest in ((), (3,), (2, 2)):
        for root in roots:
            run_v_case(comm, collective, algorithm, rest, "i4", "sum", root)
    for op in USER_OPS if collective == "reduce_scatter" else ():
        if keeps_order(collective, algorithm, op):
            run_v_case(comm, collective, algorithm, (), None, op)


@pytest.mark.parametrize("algorithm", [a for a in mpicoll.algorithms("all_reduce")
                                       if a != "native"])
def test_all_reduce_leaves_the_same_bits_on_every_rank(comm, algorithm):
    """Where two ranks compute the same value (recursive doubling's partners), they
    compute it alike: the bits agree on every rank (min of +0.0 and -0.0, complex
    products, one element or many). (MPICH's own does not always: its min of +0.0 and
    -0.0 differs between ranks at 4.) Swing's latency all_reduce (and Bine's, over the
    same peers) groups the partial sums differently on different ranks from 8 ranks on:
    there the ranks agree to rounding, not to the bit."""
    exact = not (algorithm in ("swing_latency", "bine_latency") and comm.size >= 8)
    rng = np.random.default_rng(comm.rank)
    cases = [(np.array([0.0 if comm.rank % 2 else -0.0] * 3), "min"),
             (np.array([0.0 if comm.rank % 2 else -0.0] * 3), "max")]
    for n in (1, 7, 1000):
        cases.append(((rng.standard_normal(n) + 1j * rng.standard_normal(n)), "prod"))
        cases.append((rng.standard_normal(n).astype(np.float32) * 1e3, "sum"))
    for x, op in cases:
        got = comm.all_reduce(x, op, algorithm=algorithm)
        mine = np.frombuffer(got.tobytes(), np.uint8)
        every = comm.all_gather(mine)
        if exact:
            assert (every == mine).all(), (algorithm, op, x.dtype, x.size)
        else:
            values = comm.all_gather(got)
            np.testing.assert_allclose(values, np.broadcast_to(got, values.shape), rtol=1e-5)


@pytest.mark.parametrize("algorithm", ["auto", *(a for v, a in v_cases("mpi")
                                                if v == "all_to_all_v")])
def test_all_to_all_v_even_on_some_ranks_only(comm, algorithm):
    """Every rank sends one row to each, the last rank two to itself: the others' counts
    are even, its own are not. Whatever each rank's own counts, every rank makes the same
    collective (native: MPI_Alltoallv on every rank, never MPI_Alltoall on some)."""
    p, rank = comm.size, comm.rank
    send = [1] * p
    if rank == p - 1:
        send[rank] = 2
    x = np.arange(sum(send), dtype=float) + 100 * rank
    rows, received = comm.all_to_all_v(x, send, algorithm=algorithm)
    expected = [1] * p
    if rank == p - 1:
        expected[rank] = 2
    assert list(received) == expected
    want = [100.0 * r + rank for r in range(p)]
    if rank == p - 1:
        want[rank:] = [100.0 * rank + rank, 100.0 * rank + rank + 1]
    np.testing.assert_array_equal(rows, want)


@pytest.mark.parametrize("collective,algorithm",
                         [(c, a) for c, a in CASES if c in REDUCING and a != "native"])
def test_matches_native(world, collective, algorithm):
    """Our result is bit-identical to the MPI library's own collective's."""
    ops = [(d, o) for d, o in DTYPE_OPS + LOC_DTYPE_OPS if mpi_reduces(d, o)] + \
        [(None, o) for o in USER_OPS]
    for dtype, op in ops:
        if not keeps_order(collective, algorithm, op):
            continue
        shape = (world.size, 4) if collective == "reduce_scatter" else (13,)
        x = make_input(world.rank, shape, dtype, op)
        fn = getattr(world, collective)
        args = (x, as_op(op)) if collective != "reduce" else (x, as_op(op), world.size - 1)
        ours, theirs = fn(*args, algorithm=algorithm), fn(*args, algorithm="native")
        if theirs is None:
            assert ours is None
        else:
            np.testing.assert_array_equal(ours, theirs, err_msg=f"{dtype} {op}")


def test_barrier_cases_cover_every_barrier():
    assert {a for a, _ in BARRIER_CASES} == set(mpicoll.algorithms("barrier"))


@pytest.mark.parametrize("algorithm,options", BARRIER_CASES,
                         ids=[f"{a}{o.get('radix', '')}" for a, o in BARRIER_CASES])
def test_barrier_waits_for_a_late_rank(world, algorithm, options):
    """The last rank (then the first) enters late: on every rank, no rank left before it
    entered."""
    check_late_barrier(world, algorithm, options)


@pytest.mark.parametrize("algorithm", mpicoll.algorithms("all_reduce"))
def test_all_reduce_in_place_and_out(world, algorithm):
    x = make_input(world.rank, (12,), "i4")
    expected = sum(make_input(r, (12,), "i4") for r in range(world.size)).astype("i4")
    out = np.empty_like(x)
    assert world.all_reduce(x, out=out, algorithm=algorithm) is out
    np.testing.assert_array_equal(out, expected)
    assert world.all_reduce(x, out=x, algorithm=algorithm) is x
    np.testing.assert_array_equal(x, expected)


@pytest.mark.parametrize("algorithm", mpicoll.algorithms("broadcast"))
def test_broadcast_into_a_receive_buffer(world, algorithm):
    root = world.size - 1
    data = np.arange(10.0).reshape(2, 5)
    buf = data.copy() if world.rank == root else np.zeros((2, 5))
    assert world.broadcast(buf, root, algorithm=algorithm) is buf
    np.testing.assert_array_equal(buf, data)
    # a non-contiguous receive buffer is filled through a staging copy
    big = np.zeros((2, 10))
    view = big[:, ::2] if world.rank != root else data
    world.broadcast(view, root, algorithm=algorithm)
    np.testing.assert_array_equal(view, data)


@pytest.mark.parametrize("algorithm", mpicoll.algorithms("scatter"))
def test_scatter_into_out(world, algorithm):
    x = np.arange(world.size * 3, dtype="u2").reshape(world.size, 3)
    out = np.empty(3, "u2")
    got = world.scatter(x if world.rank == 0 else None, 0, algorithm=algorithm, out=out)
    assert got is out
    np.testing.assert_array_equal(out, x[world.rank])


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_non_contiguous_input(world, collective, algorithm):
    for root in _roots(world, collective):
        run_case(world, collective, algorithm, (3,), "f8", "max", root, non_contiguous=True)


def test_library_messages_never_match_user_messages(world):
    """A user message in flight on COMM_WORLD is not taken by mpicoll, nor the reverse."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    mine = np.full(4, comm.rank, "i8")
    incoming = np.empty(4, "i8")
    request = comm.Irecv(incoming, left, tag=1)
    comm.Send(mine, right, tag=1) if comm.size == 1 else comm.Isend(mine, right, tag=1).Wait()
    for algorithm in mpicoll.algorithms("all_reduce"):
        total = world.all_reduce(np.ones(4, "i8"), algorithm=algorithm)
        np.testing.assert_array_equal(total, np.full(4, comm.size))
    request.Wait()
    np.testing.assert_array_equal(incoming, np.full(4, left))


@pytest.mark.parametrize("collective", ["broadcast", "scatter"])
@pytest.mark.parametrize("nbytes", [8, 100_000, 2_000_000])
def test_auto_agrees_when_only_the_root_knows_the_size(world, collective, nbytes):
    """Non-roots pass None, so "auto" must be resolved from the header on every rank."""
    root = world.size - 1
    count = nbytes // 8
    if collective == "broadcast":
        x = np.arange(count, dtype="f8") if world.rank == root else None
        np.testing.assert_array_equal(world.broadcast(x, root), np.arange(count, dtype="f8"))
    else:
        x = np.arange(world.size * count, dtype="f8").reshape(world.size, count)
        got = world.scatter(x if world.rank == root else None, root)
        np.testing.assert_array_equal(got, x[world.rank])


@pytest.mark.parametrize("collective,algorithm",
                         [(c, a) for c, a in CASES if c in ("reduce", "all_to_all")])
def test_out_may_be_the_input(world, collective, algorithm):
    """A result buffer that is the input itself is read before it is overwritten."""
    rows = (world.size, 3) if collective == "all_to_all" else (5,)
    inputs = [make_input(r, rows, "i8") for r in range(world.size)]
    x = inputs[world.rank].copy()
    if collective == "all_to_all":
        got = world.all_to_all(x, algorithm=algorithm, out=x)
        expected = np.stack([inputs[i][world.rank] for i in range(world.size)])
    else:
        root = world.size - 1
        got = world.reduce(x, "sum", root, algorithm=algorithm,
                           out=x if world.rank == root else None)
        expected = sum(inputs) if world.rank == root else None
    if expected is None:
        assert got is None
    else:
        assert got is x
        np.testing.assert_array_equal(x, expected)


def test_reduce_local_matches_the_mpi_library():
    """mpicoll.reduce_local gives MPI_Reduce_local's result for every op the MPI library
    has on every dtype it reduces with it (bool through MPI's logical ops), and NumPy's."""
    from mpi4py import MPI

    mpi = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
           "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR, "land": MPI.LAND,
           "lor": MPI.LOR, "lxor": MPI.LXOR, "minloc": MPI.MINLOC, "maxloc": MPI.MAXLOC}
    on_bool = {"sum": MPI.LOR, "prod": MPI.LAND, "min": MPI.LAND, "max": MPI.LOR,
               "band": MPI.LAND, "bor": MPI.LOR, "bxor": MPI.LXOR}
    pairs = {"loc:float_int": MPI.FLOAT_INT, "loc:double_int": MPI.DOUBLE_INT,
             "loc:long_int": MPI.LONG_INT, "loc:2int": MPI.TWOINT,
             "loc:short_int": MPI.SHORT_INT, "loc:long_double_int": MPI.LONG_DOUBLE_INT}
    checked = 0
    for dtype, op in DTYPE_OPS + LOC_DTYPE_OPS:
        if op == "avg" or not mpi_reduces(dtype, op):
            continue
        a, b = make_input(0, (2, 9), dtype, op), make_input(1, (2, 9), dtype, op)
        theirs = b.copy()
        mop = on_bool.get(op, mpi[op]) if a.dtype.kind == "b" else mpi[op]
        if dtype in LOC_DTYPES:
            mop.Reduce_local([a, a.size, pairs[dtype]], [theirs, a.size, pairs[dtype]])
        else:
            mop.Reduce_local(a, theirs)
        ours = b.copy()
        assert mpicoll.reduce_local(a, ours, op) is ours
        assert np.array_equal(ours, theirs), f"{dtype} {op}: {ours} != MPI's {theirs}"
        assert np.array_equal(ours, reduced([a, b], op)), f"{dtype} {op}"
        checked += 1
    assert checked > 100
