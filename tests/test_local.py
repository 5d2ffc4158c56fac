"""Every registered algorithm on the local transport (ranks as threads), 1..16 ranks."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest
from reference import (
    BARRIER_CASES,
    DTYPE_OPS,
    DTYPES,
    LOC_DTYPE_OPS,
    NUMPY_OPS,
    REDUCING,
    ROOTED,
    USER_OPS,
    check_late_barrier_local,
    run_case,
    run_v_case,
    user_op_cases,
    v_cases,
)

import mpicoll
from mpicoll.algorithms import REGISTRY
from mpicoll.local import run_local
from mpicoll.spec import SPECS

SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 11, 16)
SHAPES = ((0,), (1,), (5,), (37,), (2, 3))
CASES = [(c, a) for c in mpicoll.COLLECTIVES if c != "barrier"
         for a in mpicoll.algorithms(c, "local")]
V_CASES = v_cases("local")


def _roots(size, collective, every_up_to=8):
    """Every root up to ``every_up_to`` ranks; past it the first two, the middle and the
    last (root rotation is the same arithmetic at every size: 11 and 16 ranks at every
    root took a tenth of the suite)."""
    if collective not in ROOTED:
        return (0,)
    if size <= every_up_to:
        return range(size)
    return sorted({0, 1, size // 2, size - 1})


def _all_roots(comm, collective, algorithm, shape, dtype, op="sum", every_up_to=8):
    for root in _roots(comm.size, collective, every_up_to):
        run_case(comm, collective, algorithm, shape, dtype, op, root)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("collective,algorithm", CASES)
def test_every_algorithm_every_size_shape_and_root(collective, algorithm, size):
    def body(comm):
        for shape in SHAPES:
            _all_roots(comm, collective, algorithm, shape, "f4")

    run_local(size, body, timeout=20)


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_every_dtype(collective, algorithm):
    def body(comm):
        for dtype in DTYPES:
            _all_roots(comm, collective, algorithm, (7,), dtype)

    run_local(5, body, timeout=20)


@pytest.mark.parametrize("collective,algorithm",
                         [(c, a) for c, a in CASES if c in REDUCING])
def test_every_op_on_every_dtype(collective, algorithm):
    def body(comm):
        for dtype, op in DTYPE_OPS + LOC_DTYPE_OPS:
            # (every root of 6 in test_every_algorithm_every_size_shape_and_root; here
            # each dtype and op at four of them)
            _all_roots(comm, collective, algorithm, (6,), dtype, op, every_up_to=4)

    run_local(6, body, timeout=20)


LOCAL_BARRIERS = [(a, o) for a, o in BARRIER_CASES if a in mpicoll.algorithms("barrier", "local")]


def test_local_barrier_cases_cover_every_barrier():
    assert {a for a, _ in LOCAL_BARRIERS} == set(REGISTRY["barrier"])


@pytest.mark.parametrize("algorithm,options", LOCAL_BARRIERS,
                         ids=[f"{a}{o.get('radix', '')}" for a, o in LOCAL_BARRIERS])
@pytest.mark.parametrize("size", SIZES)
def test_barrier_waits_for_a_late_rank(algorithm, options, size):
    """The last rank, then the first, enters late (the threads share one clock): no rank
    leaves before it entered."""
    check_late_barrier_local(size, algorithm, options)


@pytest.mark.parametrize("algorithm", mpicoll.algorithms("all_reduce", "local"))
def test_all_reduce_in_place(algorithm):
    def body(comm):
        x = np.arange(10, dtype="i8") + comm.rank
        y = comm.all_reduce(x, out=x, algorithm=algorithm)
        assert y is x
        return x

    results = run_local(5, body)
    expected = sum(np.arange(10, dtype="i8") + r for r in range(5))
    for got in results:
        np.testing.assert_array_equal(got, expected)


def test_local_transport_reports_a_failing_rank():
    def body(comm):
        if comm.rank == 1:
            raise RuntimeError("rank 1 fails")
        return comm.all_reduce(np.ones(3), algorithm="ring")

    with pytest.raises(RuntimeError, match="rank 1 fails"):
        run_local(3, body, timeout=5)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16])
@pytest.mark.parametrize("collective,algorithm", V_CASES)
def test_v_variants_with_zero_length_contributions(collective, algorithm, size):
    """Rows per rank 1, 0, 3, 2, 1, 0, ...: some ranks give or get nothing."""
    def body(comm):
        roots = range(comm.size) if collective in ("gather_v", "scatter_v") else (0,)
        for rest in ((), (3,), (2, 2)):
            for root in roots:
                run_v_case(comm, collective, algorithm, rest, "f4", "sum", root)

    run_local(size, body, timeout=20)


@pytest.mark.parametrize("collective,algorithm", V_CASES)
def test_v_variants_every_dtype(collective, algorithm):
    def body(comm):
        for dtype in DTYPES:
            run_v_case(comm, collective, algorithm, (2,), dtype, "sum", comm.size - 1)

    run_local(5, body, timeout=20)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 6, 7, 8, 11, 16])
@pytest.mark.parametrize("collective,algorithm,op", user_op_cases("local"))
def test_user_ops_in_rank_order(collective, algorithm, op, size):
    """2x2 matrix products and digit-string concatenation come out in rank order."""
    def body(comm):
        for shape in ((0,), (1,), (6,), (2, 3)):
            _all_roots(comm, collective, algorithm, shape, None, op)

    run_local(size, body, timeout=20)


@pytest.mark.parametrize("collective,algorithm",
                         [(c, a) for c in REDUCING for a in mpicoll.algorithms(c, "local")
                          if REGISTRY[c][a].commutative_only])
def test_non_commutative_op_is_refused_by_name(collective, algorithm):
    op = USER_OPS["matmul"][0]

    def body(comm):
        x = np.zeros(3, USER_OPS["matmul"][1])
        args = (x, op, 0) if collective == "reduce" else (x, op)
        with pytest.raises(mpicoll.UnsupportedOpError,
                           match=f"{algorithm}' needs a commutative op; 'matmul' is not. "
                                 "Algorithms that keep rank order: "):
            getattr(comm, collective)(*args, algorithm=algorithm)
        return True

    assert all(run_local(3, body, timeout=5))


@pytest.mark.parametrize("collective", REDUCING)
@pytest.mark.parametrize("count", [0, 5, 1 << 12, 1 << 18])
def test_auto_keeps_rank_order(collective, count):
    """"auto" picks an algorithm that serves a non-commutative op, at every size."""
    def body(comm):
        run_case(comm, collective, "auto", (count,), None, "concat", comm.size - 1)

    run_local(6, body, timeout=30)


@pytest.mark.parametrize("collective,algorithm,options", [
    ("broadcast", "knomial", {"radix": 2}), ("broadcast", "knomial", {"radix": 7}),
    ("broadcast", "pipelined_chain", {"segment_bytes": 8}),
    ("scatter", "knomial", {"radix": 3}), ("gather", "knomial", {"radix": 5}),
    ("reduce", "knomial", {"radix": 3}),
    ("all_reduce", "ring_pipelined", {"segment_bytes": 4}),
    ("all_reduce", "ring_pipelined", {"segment_bytes": 1}),
])
def test_tuning_options(collective, algorithm, options):
    def body(comm):
        p, rank = comm.size, comm.rank
        x = np.arange(p * 10, dtype="f8").reshape(p, 10) + rank
        if collective == "broadcast":
            got = comm.broadcast(x if rank == 1 else None, 1, algorithm=algorithm, **options)
            np.testing.assert_array_equal(got, np.arange(p * 10.0).reshape(p, 10) + 1)
        elif collective == "scatter":
            got = comm.scatter(x if rank == 1 else None, 1, algorithm=algorithm, **options)
            np.testing.assert_array_equal(got, x[rank] - rank + 1)
        elif collective == "gather":
            got = comm.gather(x[0], 2, algorithm=algorithm, **options)
            if rank == 2:
                np.testing.assert_array_equal(got, [x[0] - rank + r for r in range(p)])
        elif collective == "reduce":
            got = comm.reduce(x, "sum", 2, algorithm=algorithm, **options)
            if rank == 2:
                np.testing.assert_array_equal(got, sum(x - rank + r for r in range(p)))
        else:
            got = comm.all_reduce(x, algorithm=algorithm, **options)
            np.testing.assert_array_equal(got, sum(x - rank + r for r in range(p)))
        comm.barrier(algorithm="knomial", radix=options.get("radix", 3))
        return True

    assert all(run_local(7, body, timeout=10))


@pytest.mark.parametrize("collective", ["broadcast", "scatter", "gather", "all_gather",
                                        "all_to_all", "all_gather_v", "scatter_v"])
def test_a_dtype_of_no_bytes_moves_through_every_algorithm(collective):
    """An empty structured dtype (itemsize 0): nothing to move, and every algorithm moves
    it (the workspace hands out views of it too), each call a few times in a row."""
    empty = np.dtype([])
    v = collective.endswith("_v")
    name = collective[:-2] if v else collective

    def body(comm, algorithm):
        p, root = comm.size, 0
        for _ in range(3):
            rows = np.zeros((p, 2), empty)
            if collective == "broadcast":
                got = comm.broadcast(np.zeros(2, empty), root, algorithm=algorithm)
            elif collective == "scatter":
                got = comm.scatter(rows if comm.rank == root else None, root, algorithm=algorithm)
            elif collective == "scatter_v":
                got = comm.scatter_v(rows if comm.rank == root else None,
                                     [1] * p if comm.rank == root else None, root,
                                     algorithm=algorithm)
            elif collective == "gather":
                got = comm.gather(np.zeros(2, empty), root, algorithm=algorithm)
            elif collective == "all_gather_v":
                got, _ = comm.all_gather_v(np.zeros((1, 2), empty), algorithm=algorithm)
            else:
                got = getattr(comm, collective)(rows if collective == "all_to_all"
                                                else np.zeros(2, empty), algorithm=algorithm)
            got = got[0] if type(got) is tuple else got
        return None if got is None else (got.shape, got.dtype == empty)

    names = ["auto"] if v else [*REGISTRY[name], "auto"]  # (local: no library's own)
    for algorithm in names:
        for result in run_local(3, body, algorithm, timeout=10):
            assert result is None or result[1], (algorithm, result)


# ml_dtypes' narrow types (those the installed ml_dtypes has): NumPy reduces them with
# its ufuncs, so every algorithm does; values each can hold exactly (float8_e8m0fnu holds
# powers of two only, no zero: no sum of one-hot rows)
NARROW = [np.dtype(getattr(ml_dtypes, name)) for name in (
    "float8_e4m3", "float8_e3m4", "float8_e8m0fnu", "float6_e2m3fn", "float6_e3m2fn",
    "float4_e2m1fn", "int4", "uint4", "int2", "uint2") if hasattr(ml_dtypes, name)]


def _narrow_input(rank, shape, dtype, op):
    """Rank ``rank``'s input in ``dtype``: one-hot rows for sum (sums of 0s and a 1 per
    element), small values that differ by rank for the orderings."""
    index = np.arange(int(np.prod(shape))).reshape(shape)
    if op == "sum":
        return ((index + rank) % 5 == 0).astype(dtype)
    if dtype == np.dtype(ml_dtypes.float8_e8m0fnu):
        return (2.0 ** ((index + rank) % 3)).astype(dtype)
    return ((index + 3 * rank) % 2).astype(dtype)  # (0 and 1: int2 holds -2..1)


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_ml_dtypes_narrow_types_move_and_reduce(collective, algorithm):
    """int4, uint4, float8_e4m3, float4_e2m1fn and kin: moved by every algorithm, reduced
    by sum, min and max as NumPy reduces them, and broadcast to receivers that pass None
    (their header names them by code)."""
    spec = SPECS[collective]
    ops = ("sum", "min", "max") if spec.reduces else ("sum",)

    def body(comm):
        p, rank = comm.size, comm.rank
        for dtype in NARROW:
            for op in ops:
                if op == "sum" and dtype == np.dtype(ml_dtypes.float8_e8m0fnu):
                    continue
                shape = (p, 5) if spec.input_rows else (5,)
                inputs = [_narrow_input(r, shape, dtype, op) for r in range(p)]
                for root in (0, p - 1) if spec.rooted else (0,):
                    given = {"algorithm": algorithm}
                    if spec.reduces:
                        given["op"] = op
                    if spec.rooted:
                        given["root"] = root
                    x = inputs[rank] if rank == root or not spec.input_at_root_only else None
                    got = getattr(comm, collective)(x, **given)
                    expected = spec.reference(
                        inputs, rank, root,
                        lambda some, op=op: functools.reduce(NUMPY_OPS[op], some))
                    what = f"{collective}/{algorithm} {dtype} {op} root={root} rank={rank}"
                    if expected is None:
                        assert got is None, what
                    else:
                        assert got.dtype == dtype and np.array_equal(
                            got.astype(np.float64), expected.astype(np.float64)), what

    run_local(4, body, timeout=30)
