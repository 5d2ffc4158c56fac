"""Where is the global maximum? Its value, the rank that holds it, and its index there.

    mpiexec -n 4 python -m mpicoll.examples.distributed_argmax [--seed 3]

MPI has MAXLOC for this; here it is a user-defined op (mpicoll.Op) on a structured dtype
(value, rank, index): combining two candidates keeps the larger value, and on a tie the
lower rank, so every rank agrees on one answer. One all_reduce of one element per rank.
Every rank's answer is checked against np.argmax of all values gathered on rank 0.
"""

from __future__ import annotations

import numpy as np

import mpicoll
from mpicoll.examples._launch import check, launch, parser_for, print_in_rank_order, seed

CANDIDATE = np.dtype([("value", "f8"), ("rank", "i8"), ("index", "i8")])


def better(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = the better candidate of a and b, element by element (out may be a or b)."""
    take_b = (b["value"] > a["value"]) | ((b["value"] == a["value"]) & (b["rank"] < a["rank"]))
    out[...] = np.where(take_b, b, a)


MAXLOC = mpicoll.Op(better, commutative=True)


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--seed", type=seed, default=3)
    args = parser.parse_args()
    comm = mpicoll.Communicator()
    values = np.random.default_rng(args.seed + comm.rank).integers(0, 1000, 5 + comm.rank)

    mine = np.zeros(1, CANDIDATE)
    mine[0] = (values.max(), comm.rank, values.argmax())
    best = comm.all_reduce(mine, MAXLOC)[0]

    print_in_rank_order(comm, "each rank: its values, and the global maximum it learned",
                        f"{values} -> max {best['value']:.0f} on rank {best['rank']} "
                        f"at index {best['index']}")
    everything, counts = comm.gather_v(values.astype(np.float64), 0)
    answers = comm.gather(np.array([best]), 0)  # what every rank learned
    if comm.rank == 0:
        flat = int(np.argmax(everything))  # the first maximum: the lowest rank on a tie
        owner = int(np.searchsorted(np.cumsum(counts), flat, side="right"))
        expected = (everything[flat], owner, flat - sum(counts[:owner]))
        for rank, answer in enumerate(answers.reshape(-1)):
            check((answer["value"], answer["rank"], answer["index"]) == expected,
                  f"rank {rank} learned {answer}, np.argmax says {expected}")
        print(f"\nthe maximum {best['value']:.0f} is on rank {best['rank']}, index "
              f"{best['index']} on every rank (np.argmax over everything agrees)")


if __name__ == "__main__":
    launch(main)
