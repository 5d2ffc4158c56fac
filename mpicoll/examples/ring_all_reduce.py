"""The ring all_reduce written out with plain send/recv, printing what moves at each step.

    mpiexec -n 4 python -m mpicoll.examples.ring_all_reduce [-n 8] [--quiet]

The vector is cut into p chunks, numbered as the textbook figures of the ring number them
(and as ``python -m mpicoll.viz all_reduce --algorithm ring`` draws them): chunk c is the
c-th of p equal parts of the vector, from 0, and the reduce-scatter leaves rank r holding
chunk r reduced, the block ``reduce_scatter`` gives rank r. Phase 1, reduce-scatter
(p - 1 steps): at step k (from 1), rank r sends chunk (r - k) mod p to rank r + 1 (its
own input at step 1, the partial sum it made at step k - 1 after that) and adds the chunk
(r - k - 1) mod p arriving from rank r - 1 into its own; after p - 1 steps rank r holds
the full sum of chunk r. Phase 2, all-gather (p - 1 steps): the summed chunks go once
more round the ring, rank r sending chunk r first, then passing on the one it received
last. Every rank sends 2 (p - 1) messages of n / p elements: 2 (p - 1) / p * n in all,
which no all_reduce can beat by much. Checked against ``comm.all_reduce`` and NumPy's
sum of every rank's input. (mpicoll's own
ring, mpicoll/algorithms/all_reduce.py, is the same algorithm with the same chunk
numbers, posted receives and no allocation per step.)
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll.buffers import chunk_bounds
from mpicoll.examples._launch import check, launch, parser_for, positive, print_in_rank_order, same


def ring_all_reduce(comm: MPI.Intracomm, x: np.ndarray, report: object = None) -> np.ndarray:
    p, r = comm.Get_size(), comm.Get_rank()
    result = x.copy()
    bounds = chunk_bounds(x.size, p)
    chunk = [result[bounds[i]:bounds[i + 1]] for i in range(p)]  # views into the result
    incoming = np.empty(max(len(c) for c in chunk), x.dtype)
    right, left = (r + 1) % p, (r - 1) % p
    for k in range(1, p):  # reduce-scatter: afterwards chunk r on rank r is the full sum
        send, receive = (r - k) % p, (r - k - 1) % p
        got = incoming[:len(chunk[receive])]
        comm.Sendrecv(chunk[send], right, 0, got, left, 0)
        chunk[receive] += got
        if report:
            report(f"reduce-scatter step {k}", f"sent chunk {send} to rank {right}, "
                   f"added chunk {receive} from rank {left}: now {chunk[receive]}")
    for k in range(1, p):  # all-gather: chunk r first, then pass on the one received last
        send, receive = (r - k + 1) % p, (r - k) % p
        comm.Sendrecv(chunk[send], right, 1, chunk[receive], left, 1)
        if report:
            report(f"all-gather step {p - 1 + k}", f"sent chunk {send} to rank {right}, "
                   f"got chunk {receive} from rank {left}: {chunk[receive]}")
    return result


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("-n", type=positive, default=8, help="vector length")
    parser.add_argument("--quiet", action="store_true", help="no per-step printing")
    args = parser.parse_args()
    comm = mpicoll.Communicator()
    x = np.arange(args.n, dtype=np.int64) + 100 * comm.rank

    def report(title: str, text: str) -> None:
        print_in_rank_order(comm, title, text, width=110)

    if comm.rank == 0:
        print(f"chunk c = the c-th of {comm.size} equal parts of the vector, from 0; after the "
              "reduce-scatter rank r holds chunk r reduced")
    print_in_rank_order(comm, "input", str(x), width=110)
    got = ring_all_reduce(MPI.COMM_WORLD, x, None if args.quiet else report)
    expected = comm.all_reduce(x, "sum")
    same(got, expected, "the ring against comm.all_reduce")
    numpy_sum = np.sum([np.arange(args.n, dtype=np.int64) + 100 * k for k in range(comm.size)],
                       axis=0)
    check(np.array_equal(got, numpy_sum), "the ring against NumPy's sum")
    if comm.rank == 0:
        print(f"\nring all_reduce on {comm.size} rank(s): {got} == comm.all_reduce "
              "== NumPy's sum")


if __name__ == "__main__":
    launch(main)
