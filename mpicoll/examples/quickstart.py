"""Every collective once, with each rank's input and result printed in rank order.

    mpiexec -n 4 python -m mpicoll.examples.quickstart [--algorithm NAME]

With --algorithm, each collective that has an algorithm of that name runs it (the others
run "auto"); every result is checked against NumPy and the example fails if one differs.
"""

from __future__ import annotations

import numpy as np

import mpicoll
from mpicoll.examples._launch import algorithm_option, launch, print_in_rank_order


def show(comm: mpicoll.Communicator, title: str, before: object, after: object) -> None:
    print_in_rank_order(comm, title, f"{before!s:>24} -> {after!s}", width=72)


def main() -> None:
    algo = algorithm_option(__doc__.splitlines()[0])
    comm = mpicoll.Communicator()
    p, r = comm.size, comm.rank

    x = np.array([10 * r + 1, 10 * r + 2])
    rows = np.arange(p * 2).reshape(p, 2) + 100 * r

    got = comm.broadcast(x if r == 0 else None, 0, algorithm=algo("broadcast"))
    assert np.array_equal(got, [1, 2])
    show(comm, "broadcast from rank 0", x, got)

    got = comm.scatter(rows if r == 0 else None, 0, algorithm=algo("scatter"))
    assert np.array_equal(got, np.arange(2 * r, 2 * r + 2))
    show(comm, "scatter from rank 0: row j of the root goes to rank j", rows.tolist(), got)

    got = comm.gather(x, 0, algorithm=algo("gather"))
    show(comm, "gather to rank 0", x, None if got is None else got.tolist())

    got = comm.all_gather(x, algorithm=algo("all_gather"))
    assert np.array_equal(got[:, 0], 10 * np.arange(p) + 1)
    show(comm, "all_gather", x, got.tolist())

    got = comm.reduce(x, "sum", 0, algorithm=algo("reduce"))
    show(comm, "reduce sum to rank 0", x, got)

    got = comm.all_reduce(x, "max", algorithm=algo("all_reduce"))
    assert np.array_equal(got, x + 10 * (p - 1 - r))
    show(comm, "all_reduce max", x, got)

    got = comm.reduce_scatter(rows, "sum", algorithm=algo("reduce_scatter"))
    assert np.array_equal(got, p * np.arange(2 * r, 2 * r + 2) + 100 * p * (p - 1) // 2)
    show(comm, "reduce_scatter sum: rank j gets row j of the sum", rows.tolist(), got)

    got = comm.all_to_all(rows, algorithm=algo("all_to_all"))
    assert np.array_equal(got[:, 0], 2 * r + 100 * np.arange(p))
    show(comm, "all_to_all: row j goes to rank j (a transpose)", rows.tolist(), got.tolist())

    comm.barrier(algorithm=algo("barrier"))
    if r == 0:
        print(f"\nall collectives agree with NumPy on {p} rank(s)")


if __name__ == "__main__":
    launch(main)
