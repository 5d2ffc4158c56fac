"""Every registered algorithm on the local transport (ranks as threads), 1..16 ranks."""

from __future__ import annotations

import numpy as np
import pytest
from reference import DTYPE_OPS, DTYPES, REDUCING, ROOTED, run_case

import mpicoll
from mpicoll.transport.local import run_local

SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 11, 16)
SHAPES = ((0,), (1,), (5,), (37,), (2, 3))
CASES = [(c, a) for c in mpicoll.COLLECTIVES if c != "barrier"
         for a in mpicoll.algorithms(c, "local")]


def _all_roots(comm, collective, algorithm, shape, dtype, op="sum"):
    roots = range(comm.size) if collective in ROOTED else (0,)
    for root in roots:
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
        for dtype, op in DTYPE_OPS:
            _all_roots(comm, collective, algorithm, (6,), dtype, op)

    run_local(6, body, timeout=20)


@pytest.mark.parametrize("algorithm", mpicoll.algorithms("barrier", "local"))
@pytest.mark.parametrize("size", SIZES)
def test_barrier(algorithm, size):
    run_local(size, lambda comm: [comm.barrier(algorithm=algorithm) for _ in range(3)], timeout=20)


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
