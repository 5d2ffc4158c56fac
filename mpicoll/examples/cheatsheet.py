"""The collectives cheat sheet: every collective's before and after on every rank, drawn
as the tutorials draw them (rank r's data is the letter of r; a number is its chunk).

    mpiexec -n 4 python -m mpicoll.examples.cheatsheet [--algorithm NAME]

    broadcast from rank 0          [A0]  [  ]  [  ]  [  ]  ->  [A0]  [A0]  [A0]  [A0]
    all_to_all (a transpose)       [A0 A1 ..] [B0 B1 ..]   ->  [A0 B0 ..] [A1 B1 ..]
    reduce_scatter (sum)           [A0 A1 ..] [B0 B1 ..]   ->  [A0+B0+..] [A1+B1+..]

reduce and all_reduce show numbers: rank r holds r + 1, and "1+2+3+4" is their sum;
reduce_scatter shows chunks, as the tutorials draw it: rank j ends with only chunk j of
the sum, "Aj+Bj+Cj+Dj", not the whole sum that all_reduce leaves everywhere. With
--algorithm, every collective that has an algorithm of that name runs it (the others run
"auto"). Each result is checked, on every rank, against NumPy applied to every rank's
input; the example fails on any difference. The barrier is checked too: the last rank
arrives late, and no rank may leave before it arrived.
"""

from __future__ import annotations

import socket
import time
import zlib

import numpy as np

import mpicoll
from mpicoll.examples._launch import algorithm_option, check, launch, print_in_rank_order, same

LATE = 0.2  # seconds the last rank arrives late at the barrier


def label(value: int) -> str:
    """100 * rank + chunk -> the letter of the rank and the chunk: 201 -> C1."""
    return f"{chr(ord('A') + value // 100 % 26)}{value % 100}"


def cells(values: object) -> str:
    if values is None:
        return "[ ]"
    flat = np.asarray(values).reshape(-1)
    return "[" + " ".join(label(int(v)) for v in flat) + "]"


def main() -> None:
    algo = algorithm_option(__doc__)
    comm = mpicoll.Communicator()
    p, r = comm.size, comm.rank

    def show(title: str, before: str, after: str) -> None:
        print_in_rank_order(comm, title, f"{before:>{6 * p + 2}}  ->  {after}")

    mine = np.array([100 * r])                       # one chunk: A0, B0, C0, ...
    chunks = 100 * r + np.arange(p)                  # p chunks: A0 A1 .. on rank A
    everything = 100 * np.arange(p)                  # the root's p chunks: A0 B0 C0 ..
    # every rank's inputs, rebuilt here: the references are NumPy on them
    all_mine = [np.array([100 * k]) for k in range(p)]
    all_chunks = [100 * k + np.arange(p) for k in range(p)]

    got = comm.broadcast(mine if r == 0 else np.empty(1, mine.dtype), 0,
                         algorithm=algo("broadcast"))
    same(got, all_mine[0], "broadcast")
    show("broadcast from rank 0: the root's data on every rank",
         cells(mine if r == 0 else None), cells(got))

    got = comm.scatter(everything.reshape(p, 1) if r == 0 else None, 0, algorithm=algo("scatter"))
    same(got, everything.reshape(p, 1)[r], "scatter")
    show("scatter from rank 0: the root's chunk j to rank j",
         cells(everything if r == 0 else None), cells(got))

    got = comm.gather(mine, 0, algorithm=algo("gather"))
    same(got, np.stack(all_mine) if r == 0 else None, "gather")
    show("gather to rank 0: every rank's chunk, in rank order, on the root", cells(mine), cells(got))

    got = comm.all_gather(mine, algorithm=algo("all_gather"))
    same(got, np.stack(all_mine), "all_gather")
    show("all_gather: every rank's chunk on every rank", cells(mine), cells(got))

    got = comm.all_to_all(chunks.reshape(p, 1), algorithm=algo("all_to_all"))
    same(got, np.stack([c[r] for c in all_chunks]).reshape(p, 1), "all_to_all")
    show("all_to_all: chunk j of rank i goes to rank j, as chunk i (a transpose)",
         cells(chunks), cells(got))

    # reductions: rank r holds r + 1 in every chunk; the sum of all is 1 + 2 + ... + p
    value = np.full(p, r + 1)
    terms = "+".join(str(k + 1) for k in range(p)) if p <= 6 else f"1+..+{p}"
    total = p * (p + 1) // 2

    def sums(values: object) -> str:
        if values is None:
            return "[ ]"
        return "[" + " ".join(terms if v == total and p > 1 else str(int(v))
                              for v in np.asarray(values).reshape(-1)) + "]"

    total_of_all = np.sum([np.full(1, k + 1) for k in range(p)], axis=0)
    got = comm.reduce(value[:1], "sum", 0, algorithm=algo("reduce"))
    same(got, total_of_all if r == 0 else None, "reduce")
    show("reduce (sum) to rank 0: the sum on the root", sums(value[:1]), sums(got))

    got = comm.all_reduce(value[:1], "sum", algorithm=algo("all_reduce"))
    same(got, total_of_all, "all_reduce")
    show("all_reduce (sum): the sum on every rank", sums(value[:1]), sums(got))

    # reduce_scatter: rank r holds chunks 100 r + j (A0 A1 .. on rank A); rank j gets
    # only chunk j summed over the ranks
    got = comm.reduce_scatter(chunks.reshape(p, 1), "sum", algorithm=algo("reduce_scatter"))
    same(got, np.sum(all_chunks, axis=0).reshape(p, 1)[r], "reduce_scatter")
    column = [label(100 * k + r) for k in range(p)]
    show("reduce_scatter (sum): chunk j of every rank, summed, on rank j only",
         cells(chunks), "[" + ("+".join(column) if p <= 6 else f"{column[0]}+..+{column[-1]}") + "]")

    # scan and exscan: the running sum in rank order (exscan: of the ranks before; rank 0
    # gets nothing)
    got = comm.scan(value[:1], "sum", algorithm=algo("scan"))
    same(got, np.full(1, (r + 1) * (r + 2) // 2), "scan")
    show("scan (sum): on rank j the sum over ranks 0..j", sums(value[:1]), str(got))
    got = comm.exscan(value[:1], "sum", algorithm=algo("exscan"))
    same(got, np.full(1, r * (r + 1) // 2) if r > 0 else None, "exscan")
    show("exscan (sum): on rank j the sum over ranks 0..j-1, rank 0 none", sums(value[:1]),
         str(got) if got is not None else "[ ]")

    # barrier: the last rank arrives LATE seconds late; no rank may leave before it came
    if r == p - 1:
        time.sleep(LATE)
    arrived = time.monotonic()
    comm.barrier(algorithm=algo("barrier"))
    left = time.monotonic()
    host = zlib.crc32(socket.gethostname().encode())  # one host: one monotonic clock
    stamps = comm.all_gather(np.array([arrived, left, host], np.float64))
    late_arrived, late_host = stamps[p - 1, 0], stamps[p - 1, 2]
    for k, (_, k_left, k_host) in enumerate(stamps[:p - 1]):
        # on the late rank's host, clocks agree: nobody left before it arrived; elsewhere,
        # each rank must at least have waited a good part of the delay
        check(k_left >= late_arrived if k_host == late_host
              else k_left - stamps[k, 0] >= LATE / 3, f"barrier: rank {k} left too early")
    print_in_rank_order(comm, f"barrier: rank {p - 1} arrives {LATE} s late",
                        f"waited {left - arrived:.2f} s")
    if r == 0:
        print(f"\nbarrier: no rank left before rank {p - 1} arrived")
        print(f"\nevery collective agrees with NumPy on {p} rank(s)")


if __name__ == "__main__":
    launch(main)
