"""Softmax of a vector sharded across ranks: the numerically stable way, in two all_reduces.

    mpiexec -n 4 python -m mpicoll.examples.distributed_softmax [-n 10]

softmax(x)_i = exp(x_i - m) / sum_j exp(x_j - m), with m = max_j x_j so that no exp
overflows. Each rank holds a slice of x (any length, none at all included):
  1. all_reduce MAX of the local maxima  -> m on every rank
  2. local exp(x - m)
  3. all_reduce SUM of the local sums    -> the denominator on every rank
  4. local divide.
Checked against the softmax of the whole vector, gathered on every rank.
"""

from __future__ import annotations

import numpy as np

import mpicoll
from mpicoll.buffers import chunk_bounds
from mpicoll.examples._launch import check, launch, parser_for, positive, print_in_rank_order


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("-n", type=positive, default=10, help="length of the whole vector")
    args = parser.parse_args()
    comm = mpicoll.Communicator()
    whole = np.random.default_rng(1).normal(0, 30, args.n)  # large values: exp would overflow
    bounds = chunk_bounds(args.n, comm.size)
    x = whole[bounds[comm.rank]:bounds[comm.rank + 1]]

    local_max = x.max() if x.size else -np.inf            # an empty slice takes no part
    m = comm.all_reduce(np.array([local_max]), "max")[0]
    e = np.exp(x - m)
    denominator = comm.all_reduce(np.array([e.sum()]), "sum")[0]
    mine = e / denominator

    print_in_rank_order(comm, "each rank: its slice of x -> its slice of softmax(x)",
                        f"x[{bounds[comm.rank]}:{bounds[comm.rank + 1]}] "
                        f"-> {np.array2string(mine, precision=3, max_line_width=200)}")
    gathered, _ = comm.all_gather_v(mine)
    reference = np.exp(whole - whole.max()) / np.exp(whole - whole.max()).sum()
    check(np.allclose(gathered, reference, rtol=1e-12, atol=1e-300),
          "the sharded softmax differs from the unsharded one")
    if comm.rank == 0:
        print(f"\nsoftmax of {args.n} values over {comm.size} rank(s) sums to "
              f"{gathered.sum():.12f} and equals the unsharded softmax")


if __name__ == "__main__":
    launch(main)
