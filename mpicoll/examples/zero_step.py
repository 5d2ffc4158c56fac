"""ZeRO-3 / FSDP: data parallelism with the parameters and Adam's state sharded over ranks.

    mpiexec -n 4 python -m mpicoll.examples.zero_step [--steps 5]

Plain data parallelism keeps on every rank the whole model, its gradients and Adam's two
moments, and all_reduces the gradients. ZeRO stage 3 (PyTorch's FSDP) keeps 1/p of each
on a rank: the parameters live in one flat vector (FSDP's FlatParameter), padded with
zeros to a multiple of p, and rank r owns block r of it, with block r of the moments.
One training step, written with ``mpicoll.dist`` (torch.distributed's names):

1. all_gather_into_tensor: every rank's block -> the whole flat vector, which forward and
   backward read as the weight matrices (FSDP frees it right after; here it is overwritten
   at the next step);
2. forward and backward on this rank's shard of the batch: a whole flat gradient;
3. reduce_scatter_tensor with ReduceOp.AVG: the gradient averaged over the ranks, of which
   each rank receives only its own block. An all_reduce is a reduce_scatter then an
   all_gather, so ZeRO moves the bytes data parallelism moves, with the update in between;
4. Adam updates this rank's block of the parameters with its block of the moments.

The model (a 10-23-3 tanh MLP) has 325 parameters, which 2, 3 and 4 ranks do not divide:
the padding makes the blocks equal (its gradient is zero, so Adam leaves it at zero). The
Communicator also splits unevenly without padding: ``comm.reduce_scatter(g, "avg",
counts=counts)`` and ``comm.all_gather_v(block)``. After a few steps every rank's block
equals, to float rounding, the same block of one process training with Adam on the whole
batch, which every rank checks.
"""

from __future__ import annotations

import numpy as np

import mpicoll.dist as dist
from mpicoll.examples._launch import check, launch, parser_for, positive

SHAPES = [(10, 23), (23,), (23, 3), (3,)]  # W1, b1, W2, b2: 325 parameters in all
COUNT = sum(int(np.prod(s)) for s in SHAPES)


def init_flat() -> np.ndarray:
    """The whole model as one flat vector (the same on every rank)."""
    rng = np.random.default_rng(0)
    return np.concatenate([rng.normal(0, s[0] ** -0.5, s).ravel() if len(s) == 2
                           else np.zeros(s) for s in SHAPES])


def unflatten(flat: np.ndarray) -> list[np.ndarray]:
    """Views of the flat vector's first COUNT values as W1, b1, W2, b2."""
    views, start = [], 0
    for shape in SHAPES:
        n = int(np.prod(shape))
        views.append(flat[start:start + n].reshape(shape))
        start += n
    return views


def loss_and_grad(flat: np.ndarray, x: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray]:
    """The mean squared error over x's rows and its gradient, flat as the parameters."""
    w1, b1, w2, b2 = unflatten(flat)
    a = np.tanh(x @ w1 + b1)
    y = a @ w2 + b2
    dy = 2 * (y - target) / y.size
    dz = (dy @ w2.T) * (1 - a**2)
    grads = [x.T @ dz, dz.sum(axis=0), a.T @ dy, dy.sum(axis=0)]
    return float(np.mean((y - target) ** 2)), np.concatenate([g.ravel() for g in grads])


def adam(param: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray, step: int,
         lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> None:
    """One Adam step, in place: elementwise, so a block of it is the step of the block."""
    m *= beta1
    m += (1 - beta1) * grad
    v *= beta2
    v += (1 - beta2) * grad**2
    param -= lr * (m / (1 - beta1**step)) / (np.sqrt(v / (1 - beta2**step)) + eps)


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--steps", type=positive, default=5)
    parser.add_argument("--batch", type=positive, default=8, help="rows per rank")
    args = parser.parse_args()
    dist.init_process_group("gloo")  # as torch's CPU backend; mpicoll takes it as "mpi"
    rank, p = dist.get_rank(), dist.get_world_size()

    rng = np.random.default_rng(1)  # every rank draws the same global batch
    x = rng.normal(size=(args.batch * p, SHAPES[0][0]))
    target = np.sin(x @ rng.normal(size=(SHAPES[0][0], SHAPES[-1][0])))
    rows = slice(rank * args.batch, (rank + 1) * args.batch)

    block = -(-COUNT // p)  # ceil: p blocks of this size hold the COUNT parameters
    padded = np.zeros(block * p)
    padded[:COUNT] = init_flat()
    mine = padded[rank * block:(rank + 1) * block].copy()  # all this rank keeps between steps
    m, v = np.zeros(block), np.zeros(block)                # ... with its block of Adam's state

    full = np.empty(block * p)   # the gathered parameters, live only during a step
    grad = np.zeros(block * p)   # the whole gradient (its padding stays zero)
    my_grad = np.empty(block)
    losses = np.zeros(args.steps)
    for step in range(1, args.steps + 1):
        dist.all_gather_into_tensor(full, mine)                          # 1. gather
        losses[step - 1], grad[:COUNT] = loss_and_grad(full, x[rows], target[rows])  # 2.
        dist.reduce_scatter_tensor(my_grad, grad, op=dist.ReduceOp.AVG)  # 3. my block, averaged
        if step == 1:
            first_grad = my_grad.copy()  # (checked below: Adam's step hardly shows a scale)
        adam(mine, my_grad, m, v, step)                                  # 4. my block's update
    dist.all_reduce(losses, op=dist.ReduceOp.AVG)  # the mean over the global batch, per step

    # one process, the whole model, the whole batch, Adam over everything: the same steps
    whole = init_flat()
    whole_m, whole_v = np.zeros(COUNT), np.zeros(COUNT)
    whole_losses, whole_first_grad = np.zeros(args.steps), np.zeros(block * p)
    for step in range(1, args.steps + 1):
        whole_losses[step - 1], whole_grad = loss_and_grad(whole, x, target)
        if step == 1:
            whole_first_grad[:COUNT] = whole_grad
        adam(whole, whole_grad, whole_m, whole_v, step)
    expected = np.zeros(block * p)
    expected[:COUNT] = whole
    expected = expected[rank * block:(rank + 1) * block]
    # the parameters, and what Adam's normalized step would hide: the averaged gradient
    # (a sum would scale it by p) and the losses over the global batch
    first_expected = whole_first_grad[rank * block:(rank + 1) * block]
    same = np.allclose(mine, expected, rtol=1e-7, atol=1e-10) and \
        np.allclose(first_grad, first_expected, rtol=1e-9, atol=1e-12) and \
        np.allclose(losses, whole_losses, rtol=1e-9, atol=0)
    result = np.array([np.max(np.abs(mine - expected), initial=0), 0.0 if same else 1.0])
    dist.all_reduce(result, op=dist.ReduceOp.MAX)
    worst, wrong = result
    check(wrong == 0, f"a rank's block, its averaged gradient or the losses differ from "
          f"single-process training (parameters by {worst})")
    if rank == 0:
        print(f"{COUNT} parameters on {p} rank(s): blocks of {block} "
              f"({block * p - COUNT} of padding); each rank keeps {block} parameters and "
              f"{2 * block} Adam moments (the whole model: {COUNT} and {2 * COUNT})")
        print(f"per step: all_gather_into_tensor and reduce_scatter_tensor (avg) of "
              f"{full.nbytes} bytes; loss {losses[0]:.4f} at step 1, {losses[-1]:.4f} at "
              f"step {args.steps}")
        print(f"every rank's block of the parameters, of the first averaged gradient, and the "
              f"losses equal single-process training with Adam (parameters' max difference "
              f"{worst:.1e})")
    dist.destroy_process_group()


if __name__ == "__main__":
    launch(main)
