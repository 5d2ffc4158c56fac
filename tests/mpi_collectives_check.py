"""MPI's own collectives over many counts, each result checked against NumPy.

    MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE=tuning-mpich.json \\
        mpiexec -n 4 python tests/mpi_collectives_check.py [MAX_COUNT]

Run by tests/test_tuning_export.py under an exported tuning file: every count from 1 to
MAX_COUNT (default 256K: 2 MiB of float64, 32 times the largest byte limit the tests'
tables use) stepping by 4x, plus the counts around each power of two up to the ranks
(MPICH's ``count < pof2`` preconditions) and around the byte limits the tables use. Allreduce (in place and on bytes too), Reduce, Reduce_scatter_block and
Reduce_scatter, each with sum and a non-commutative user op; Bcast; Allgather and
Alltoall (in place too). Runs under MPICH or Open MPI.
Prints one line, ``checked N calls``, on rank 0; a wrong result raises (the job fails)
and an MPI assertion aborts it.
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

LIMITS = (64, 4096, 1 << 16)  # byte limits of the test tables' ranges


def counts(max_count: int, p: int, itemsize: int) -> list[int]:
    chosen = {1, max_count}
    step = 1
    while step < max_count:
        chosen.add(step)
        step *= 4
    pof2 = 1
    while pof2 <= 2 * p:
        chosen.update({pof2 - 1, pof2, pof2 + 1})
        pof2 *= 2
    for limit in LIMITS:
        for nbytes in (limit - itemsize, limit, limit + itemsize):
            chosen.add(nbytes // itemsize)
            chosen.add(nbytes // itemsize // max(p, 1))  # per-rank blocks
    return sorted(c for c in chosen if 1 <= c <= max_count)


def first_op() -> MPI.Op:
    """A user op, associative but not commutative (a op b = a: the result is rank 0's),
    so MPICH must keep rank order and leave the algorithms that need a built-in op."""

    def fn(inbuf, inoutbuf, datatype):  # inoutbuf = inbuf op inoutbuf
        np.frombuffer(inoutbuf, np.float64)[...] = np.frombuffer(inbuf, np.float64)

    return MPI.Op.Create(fn, commute=False)


def main() -> None:
    max_count = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 18
    comm = MPI.COMM_WORLD
    p, r = comm.Get_size(), comm.Get_rank()
    first = first_op()
    calls = 0

    def check(name: str, count: int, got: np.ndarray, expected: np.ndarray) -> None:
        nonlocal calls
        calls += 1
        if not np.array_equal(got, expected):
            raise AssertionError(f"{name} count {count} at {p} ranks: wrong result on rank {r}")

    for count in counts(max_count, p, 8):
        x = np.arange(count, dtype=np.float64) % 7 + r
        total = sum(np.arange(count, dtype=np.float64) % 7 + k for k in range(p))
        out = np.empty_like(x)
        comm.Allreduce(x, out, MPI.SUM)
        check("Allreduce", count, out, total)
        inplace = x.copy()
        comm.Allreduce(MPI.IN_PLACE, inplace, MPI.SUM)
        check("Allreduce in place", count, inplace, total)
        comm.Allreduce(x, out, first)
        check("Allreduce non-commutative", count, out, np.arange(count, dtype=np.float64) % 7)
        root_out = np.empty_like(x) if r == 0 else None
        comm.Reduce(x, root_out, MPI.SUM, root=0)
        if r == 0:
            check("Reduce", count, root_out, total)
        comm.Reduce(x, root_out, first, root=0)
        if r == 0:
            check("Reduce non-commutative", count, root_out, np.arange(count) % 7.0)
        data = np.arange(count, dtype=np.float64) if r == 0 else np.zeros(count)
        comm.Bcast(data, root=0)
        check("Bcast", count, data, np.arange(count, dtype=np.float64))

        block = max(count // p, 1)  # per-rank blocks of the gathers and alltoall
        mine = np.full(block, r, np.float64)
        gathered = np.empty(block * p)
        comm.Allgather(mine, gathered)
        check("Allgather", block, gathered, np.repeat(np.arange(p, dtype=np.float64), block))
        gathered[r * block:(r + 1) * block] = r
        comm.Allgather(MPI.IN_PLACE, gathered)
        check("Allgather in place", block, gathered,
              np.repeat(np.arange(p, dtype=np.float64), block))
        rows = np.arange(block * p, dtype=np.float64) + r
        part = np.empty(block)
        comm.Reduce_scatter_block(rows, part, MPI.SUM)
        expected = (np.arange(block * p, dtype=np.float64) * p + p * (p - 1) / 2)
        check("Reduce_scatter_block", block, part, expected[r * block:(r + 1) * block])
        comm.Reduce_scatter_block(rows, part, first)
        check("Reduce_scatter_block non-commutative", block, part,
              np.arange(block * p, dtype=np.float64)[r * block:(r + 1) * block])
        uneven = [block + (k % 2) for k in range(p)]
        rows = np.arange(sum(uneven), dtype=np.float64) + r
        part = np.empty(uneven[r])
        comm.Reduce_scatter(rows, part, uneven, MPI.SUM)
        start = sum(uneven[:r])
        expected = np.arange(sum(uneven), dtype=np.float64) * p + p * (p - 1) / 2
        check("Reduce_scatter", block, part, expected[start:start + uneven[r]])
        comm.Reduce_scatter(rows, part, uneven, first)
        check("Reduce_scatter non-commutative", block, part,
              np.arange(sum(uneven), dtype=np.float64)[start:start + uneven[r]])
        send = np.repeat(np.arange(p, dtype=np.float64) + 100 * r, block)
        received = np.empty_like(send)
        comm.Alltoall(send, received)
        expected = np.repeat(np.arange(p, dtype=np.float64) * 100 + r, block)
        check("Alltoall", block, received, expected)
        comm.Alltoall(MPI.IN_PLACE, send)
        check("Alltoall in place", block, send, expected)

    for count in counts(max_count, p, 1):  # bytes: the smallest counts of all
        x = np.full(count, r + 1, np.uint8)
        out = np.empty_like(x)
        comm.Allreduce(x, out, MPI.SUM)
        check("Allreduce uint8", count, out, np.full(count, p * (p + 1) // 2, np.uint8))
    first.Free()
    if r == 0:
        print(f"checked {calls} calls at {p} ranks")


if __name__ == "__main__":
    main()
