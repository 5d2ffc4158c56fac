"""The mean of values spread unevenly over the ranks: one all_reduce of (sum, count).

    mpiexec -n 4 python -m mpicoll.examples.distributed_mean [--seed 0]

Averaging the ranks' own means would be wrong when they hold different numbers of values
(rank r holds 3r + 1 here, rank 0 one value); summing both the values and their count in
one two-element all_reduce gives the exact mean in a single collective. Every rank's
mean is checked against np.mean of all the values gathered on rank 0.
"""

from __future__ import annotations

import numpy as np

import mpicoll
from mpicoll.examples._launch import check, launch, parser_for, print_in_rank_order, seed


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--seed", type=seed, default=0)
    args = parser.parse_args()
    comm = mpicoll.Communicator()
    values = np.random.default_rng(args.seed + comm.rank).normal(comm.rank, 1.0, 3 * comm.rank + 1)

    sum_and_count = comm.all_reduce(np.array([values.sum(), values.size], np.float64), "sum")
    mean = sum_and_count[0] / sum_and_count[1]

    naive = comm.all_reduce(np.array([values.mean()]), "avg")[0]  # the mean of the means
    print_in_rank_order(comm, "each rank: its values, and the global mean it computed",
                        f"{values.size:3d} values, local mean {values.mean():+.4f}, "
                        f"global mean {mean:+.6f}")
    everything, _ = comm.gather_v(values, 0)
    means = comm.gather(np.array([mean]), 0)  # what every rank computed
    if comm.rank == 0:
        check(np.allclose(means, everything.mean(), rtol=1e-12, atol=1e-12),
              f"the ranks' means {means.reshape(-1)} != np.mean {everything.mean()}")
        print(f"\nmean of {everything.size} values = {mean:+.6f} on every rank (np.mean on all of them: "
              f"{everything.mean():+.6f}); the mean of the ranks' means would be {naive:+.6f}")


if __name__ == "__main__":
    launch(main)
