"""Mixture-of-experts token routing: all_to_all_v out to the experts and back.

    mpiexec -n 4 python -m mpicoll.examples.moe_all_to_all [--experts-per-rank 2]

Each rank holds a different number of tokens and owns ``experts-per-rank`` experts (expert
e lives on rank e // experts-per-rank). A router picks each token's expert (top-1 of a
linear gate). Dispatch: sort the tokens by destination rank and send each rank its tokens
and their expert ids with all_to_all_v (send counts per rank; the receive counts come
back). Each rank runs its experts on what arrived, and a second all_to_all_v, with the
counts reversed, returns every token to the rank it came from, where the original order
is restored. Checked against running every token through its expert locally.
"""

from __future__ import annotations

import numpy as np

import mpicoll
from mpicoll.examples._launch import check, launch, parser_for, positive, print_in_rank_order


def expert_weights(expert: int, width: int) -> np.ndarray:
    return np.random.default_rng(1000 + expert).normal(0, width ** -0.5, (width, width))


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--experts-per-rank", type=positive, default=2)
    parser.add_argument("--width", type=positive, default=8)
    args = parser.parse_args()
    comm = mpicoll.Communicator()
    p, r, per = comm.size, comm.rank, args.experts_per_rank
    experts = p * per
    rng = np.random.default_rng(r)
    tokens = rng.normal(size=(5 + 3 * r, args.width))         # a different count per rank
    gate = np.random.default_rng(7).normal(size=(args.width, experts))  # the same everywhere
    choice = np.argmax(tokens @ gate, axis=1)                   # top-1 routing
    owner = choice // per

    order = np.argsort(owner, kind="stable")                    # grouped by destination rank
    send_counts = np.bincount(owner, minlength=p)
    arrived, received = comm.all_to_all_v(tokens[order], send_counts)
    arrived_expert, _ = comm.all_to_all_v(choice[order], send_counts)

    out = np.empty_like(arrived)
    for e in range(r * per, (r + 1) * per):                     # my experts
        mine = arrived_expert == e
        out[mine] = np.tanh(arrived[mine] @ expert_weights(e, args.width))

    returned, back_counts = comm.all_to_all_v(out, received)    # the way back
    check(np.array_equal(back_counts, send_counts), "the counts on the way back")
    result = np.empty_like(returned)
    result[order] = returned                                    # the original order again

    expected = np.stack([np.tanh(t @ expert_weights(int(e), args.width))
                         for t, e in zip(tokens, choice, strict=True)]) if len(tokens) else tokens
    check(np.allclose(result, expected), "tokens processed by their experts")
    print_in_rank_order(comm, "each rank: tokens sent to ranks 0..p-1 -> tokens its experts got",
                        f"{len(tokens):3d} tokens, sent {send_counts.tolist()} -> received "
                        f"{np.asarray(received).tolist()}")
    if comm.rank == 0:
        print(f"\n{experts} experts on {p} rank(s): every token came back processed by its "
              "expert, in its original order")


if __name__ == "__main__":
    launch(main)
