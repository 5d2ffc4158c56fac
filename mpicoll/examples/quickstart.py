"""Every collective once, with each rank's input and result printed in rank order.

    mpiexec -n 4 python -m mpicoll.examples.quickstart [--algorithm NAME]

With --algorithm, each collective that has an algorithm of that name runs it (the others
run "auto"); each title names the algorithm that ran. Every result, on every rank, is
checked against NumPy applied to every rank's input (rebuilt on each rank), and the
example fails if one differs. The barrier is only called, not checked (the cheatsheet
example checks that it waits).
"""

from __future__ import annotations

import numpy as np

import mpicoll
from mpicoll.examples._launch import (
    algorithm_option,
    algorithm_ran,
    launch,
    print_in_rank_order,
    same,
)


def show(comm: mpicoll.Communicator, title: str, before: object, after: object) -> None:
    # wide enough for all_to_all's p rows of 2 at 8 ranks and more, never cut mid-row
    width = 40 + 24 * comm.size
    print_in_rank_order(comm, title, f"{before!s:>24} -> {after!s}", width=width)


def main() -> None:
    algo = algorithm_option(__doc__)
    comm = mpicoll.Communicator()
    p, r = comm.size, comm.rank

    x = np.array([10 * r + 1, 10 * r + 2])
    rows = np.arange(p * 2).reshape(p, 2) + 100 * r
    # every rank's inputs, rebuilt here: the references are NumPy on them
    all_x = [np.array([10 * k + 1, 10 * k + 2]) for k in range(p)]
    all_rows = [np.arange(p * 2).reshape(p, 2) + 100 * k for k in range(p)]

    def ran(collective: str, data: np.ndarray, op: str | None = None) -> str:
        return algorithm_ran(comm, collective, algo(collective), data.nbytes, op, data.dtype)

    got = comm.broadcast(x if r == 0 else None, 0, algorithm=algo("broadcast"))
    same(got, all_x[0], "broadcast")
    show(comm, f"broadcast from rank 0 ({ran('broadcast', x)})", x, got)

    got = comm.scatter(rows if r == 0 else None, 0, algorithm=algo("scatter"))
    same(got, all_rows[0][r], "scatter")
    show(comm, f"scatter from rank 0: row j of the root goes to rank j ({ran('scatter', rows)})",
         rows.tolist(), got)

    got = comm.gather(x, 0, algorithm=algo("gather"))
    same(got, np.stack(all_x) if r == 0 else None, "gather")
    show(comm, f"gather to rank 0 ({ran('gather', rows)})", x, None if got is None else got.tolist())

    got = comm.all_gather(x, algorithm=algo("all_gather"))
    same(got, np.stack(all_x), "all_gather")
    show(comm, f"all_gather ({ran('all_gather', rows)})", x, got.tolist())

    got = comm.reduce(x, "sum", 0, algorithm=algo("reduce"))
    same(got, np.sum(all_x, axis=0) if r == 0 else None, "reduce")
    show(comm, f"reduce sum to rank 0 ({ran('reduce', x, 'sum')})", x, got)

    got = comm.all_reduce(x, "max", algorithm=algo("all_reduce"))
    same(got, np.max(all_x, axis=0), "all_reduce")
    show(comm, f"all_reduce max ({ran('all_reduce', x, 'max')})", x, got)

    got = comm.reduce_scatter(rows, "sum", algorithm=algo("reduce_scatter"))
    same(got, np.sum(all_rows, axis=0)[r], "reduce_scatter")
    show(comm, f"reduce_scatter sum: rank j gets row j of the sum "
         f"({ran('reduce_scatter', rows, 'sum')})", rows.tolist(), got)

    got = comm.all_to_all(rows, algorithm=algo("all_to_all"))
    same(got, np.stack([all_rows[k][r] for k in range(p)]), "all_to_all")
    show(comm, f"all_to_all: row j goes to rank j, a transpose ({ran('all_to_all', rows)})",
         rows.tolist(), got.tolist())

    got = comm.scan(x, "sum", algorithm=algo("scan"))
    same(got, np.sum(all_x[:r + 1], axis=0), "scan")
    show(comm, f"scan sum: rank j gets the sum over ranks 0..j ({ran('scan', x, 'sum')})", x, got)

    got = comm.exscan(x, "sum", algorithm=algo("exscan"))
    same(got, np.sum(all_x[:r], axis=0) if r > 0 else None, "exscan")
    show(comm, f"exscan sum: rank j gets the sum over ranks 0..j-1, rank 0 nothing "
         f"({ran('exscan', x, 'sum')})", x, got)

    comm.barrier(algorithm=algo("barrier"))
    if r == 0:
        print(f"\nall collectives agree with NumPy on {p} rank(s) (the barrier: called, "
              "not checked)")


if __name__ == "__main__":
    launch(main)
