"""2-D parallelism: a tensor-parallel MLP inside data parallelism, on a mesh of ranks.

    mpiexec -n 4 python -m mpicoll.examples.mesh_mlp [--steps 5] [--tp 2]
    MPICOLL_RANKS_PER_NODE=2 mpiexec -n 4 python -m mpicoll.examples.mesh_mlp

    y = tanh(x @ W1 + b1) @ W2 + b2       x: (batch, d), W1: (d, h), W2: (h, d)

``comm.mesh((dp, tp), names=("dp", "tp"))`` lays the ranks out in a grid, row-major, and
gives each rank one sub-communicator per dimension: at 4 ranks, ranks 0,1 and 2,3 are the
two ``tp`` groups, ranks 0,2 and 1,3 the two ``dp`` groups. Each collective runs on one:

- tp (tensor parallel): the ranks of a tp group hold one copy of the model between them,
  as Megatron-LM splits an MLP: W1 by columns (b1 with them: column-parallel), W2 by the
  same rows (row-parallel), b2 whole. Forward needs one all_reduce (sum) over tp of the
  partial outputs; the weights' gradients then need nothing more (the gradient of x would
  need the matching all_reduce over tp, but x is the input: nothing to pass it on to).
- dp (data parallel): each tp group trains on its own shard of the global batch, and each
  gradient is all_reduced (avg) over dp, between the ranks that hold the same slices.

tp's all_reduce sits in every forward pass, on activations; dp's once per step, so tp
wants the fastest links. Row-major puts each tp group on consecutive ranks, which are one
node's when ranks are placed by node: ``MPICOLL_RANKS_PER_NODE=2`` simulates nodes of two
ranks on one machine, and the example says whether every tp group is inside one node.

tp is 2 where the number of ranks is even (dp = ranks / 2), else 1 (data parallel only);
``--tp N`` picks another and is refused unless it divides the number of ranks. After a
few SGD steps every rank's slices equal, to float rounding, the same slices of one process
training the whole model on the whole batch, which every rank checks.
"""

from __future__ import annotations

import sys

import numpy as np

import mpicoll
from mpicoll.buffers import chunk_bounds
from mpicoll.examples._launch import check, launch, parser_for, positive


def init_model(d: int, h: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)  # every rank draws the same whole model
    return {"w1": rng.normal(0, d ** -0.5, (d, h)), "b1": np.zeros(h),
            "w2": rng.normal(0, h ** -0.5, (h, d)), "b2": np.zeros(d)}


def tp_slice(model: dict[str, np.ndarray], lo: int, hi: int) -> dict[str, np.ndarray]:
    """A tp rank's part: columns lo:hi of W1 and b1, the same rows of W2, all of b2."""
    return {"w1": model["w1"][:, lo:hi].copy(), "b1": model["b1"][lo:hi].copy(),
            "w2": model["w2"][lo:hi].copy(), "b2": model["b2"].copy()}


def loss_and_grads(p: dict[str, np.ndarray], x: np.ndarray, target: np.ndarray,
                   tp_sum) -> tuple[float, dict[str, np.ndarray]]:
    """The mean squared error over x's rows and its gradients for ``p``: a tp slice, with
    ``tp_sum`` the all_reduce over tp, or the whole model, with ``tp_sum`` doing nothing."""
    a = np.tanh(x @ p["w1"] + p["b1"])      # column-parallel fc1: this rank's hidden units
    y = tp_sum(a @ p["w2"]) + p["b2"]        # row-parallel fc2: partial outputs, summed
    dy = 2 * (y - target) / y.size
    dz = (dy @ p["w2"].T) * (1 - a**2)
    return float(np.mean((y - target) ** 2)), {
        "w1": x.T @ dz, "b1": dz.sum(axis=0), "w2": a.T @ dy, "b2": dy.sum(axis=0)}


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--steps", type=positive, default=5)
    parser.add_argument("--tp", type=positive, default=None,
                        help="tensor-parallel ranks (default 2 when the ranks are even, else 1)")
    parser.add_argument("--batch", type=positive, default=8, help="rows per data-parallel replica")
    parser.add_argument("--model", type=positive, default=6, help="d, the model width")
    parser.add_argument("--hidden", type=positive, default=16, help="h, the hidden width")
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    comm = mpicoll.Communicator()
    tp_size = args.tp if args.tp is not None else (2 if comm.size % 2 == 0 else 1)
    if tp_size < 1 or comm.size % tp_size:  # every rank sees it alike: all leave with 2
        if comm.rank == 0:
            sys.stderr.write(f"{parser.prog}: error: --tp {tp_size} does not divide the "
                             f"{comm.size} ranks; choose a divisor of {comm.size}\n")
        sys.exit(2)
    dp_size = comm.size // tp_size

    mesh = comm.mesh((dp_size, tp_size), names=("dp", "tp"))
    dp, tp = mesh["dp"], mesh["tp"]  # this rank's row and column of the grid
    replica, part = mesh.coordinates  # which batch shard, which slice of the model

    rng = np.random.default_rng(1)  # every rank draws the same global batch
    x = rng.normal(size=(args.batch * dp_size, args.model))
    target = np.sin(x @ rng.normal(size=(args.model, args.model)))
    rows = slice(replica * args.batch, (replica + 1) * args.batch)
    lo, hi = chunk_bounds(args.hidden, tp_size)[part:part + 2]

    mine = tp_slice(init_model(args.model, args.hidden), lo, hi)
    losses = []
    for _ in range(args.steps):
        loss, grads = loss_and_grads(mine, x[rows], target[rows],
                                     lambda partial: tp.all_reduce(partial, "sum"))
        for name, grad in grads.items():
            mine[name] -= args.lr * dp.all_reduce(grad, "avg")
        losses.append(float(dp.all_reduce(np.array([loss]), "avg")[0]))

    # one process, the whole model, the whole batch: the same steps
    whole = init_model(args.model, args.hidden)
    for _ in range(args.steps):
        _, grads = loss_and_grads(whole, x, target, lambda partial: partial)
        for name, grad in grads.items():
            whole[name] -= args.lr * grad
    expected = tp_slice(whole, lo, hi)
    same = all(np.allclose(mine[k], expected[k], rtol=1e-7, atol=1e-10) for k in mine)
    mine_worst = max(float(np.max(np.abs(mine[k] - expected[k]), initial=0)) for k in mine)
    worst, wrong = comm.all_reduce(np.array([mine_worst, 0.0 if same else 1.0]), "max")
    check(wrong == 0, f"a rank's slices differ from single-process training by {worst}")
    local = float(len(tp.nodes) == 1)  # is this rank's tp group inside one node?
    inside = comm.all_reduce(np.array([local]), "min")[0] == 1
    if comm.rank == 0:
        grid = np.arange(comm.size).reshape(dp_size, tp_size)
        print(f"mesh dp={dp_size} x tp={tp_size}: tp groups {grid.tolist()}, "
              f"dp groups {grid.T.tolist()}; nodes {[list(n) for n in comm.nodes]}: "
              + ("every tp group inside one node" if inside else
                 "some tp group spans nodes (its all_reduce crosses the network)"))
        print(f"hidden units per tp rank: {np.diff(chunk_bounds(args.hidden, tp_size)).tolist()}; "
              f"loss {losses[0]:.4f} at step 1, {losses[-1]:.4f} at step {args.steps}")
        print(f"every rank's slices of W1, b1, W2, b2 equal single-process training on the "
              f"whole batch (max difference {worst:.1e})")
    mesh.free()


if __name__ == "__main__":
    launch(main)
