"""Tensor parallelism (Megatron-LM's MLP): fc1 split by columns, fc2 by rows.

    mpiexec -n 4 python -m mpicoll.examples.tensor_parallel_mlp [--hidden 64]

    y = gelu(x @ W1) @ W2       x: (batch, d), W1: (d, h), W2: (h, d)

Rank r holds the columns h_r of W1 and the same rows h_r of W2 (any split of h, even an
empty one). Forward: each rank computes its slice of the hidden layer with no
communication, multiplies it by its rows of W2, and one all_reduce (sum) of those
partial outputs gives y on every rank. Backward, given dL/dy on every rank: the gradients
of W1[:, h_r] and W2[h_r, :] are local, and dL/dx needs the matching all_reduce (sum) of
each rank's dL/dh_r @ W1[:, h_r].T: Megatron's f and g operators, an identity one way and
an all_reduce the other. Checked against the unsharded MLP: y, dL/dx and both weight
gradients.
"""

from __future__ import annotations

import numpy as np

import mpicoll
from mpicoll.buffers import chunk_bounds
from mpicoll.examples._launch import check, launch, parser_for, positive


def gelu(z: np.ndarray) -> np.ndarray:
    return 0.5 * z * (1 + np.tanh(0.7978845608028654 * (z + 0.044715 * z**3)))


def gelu_grad(z: np.ndarray) -> np.ndarray:
    inner = 0.7978845608028654 * (z + 0.044715 * z**3)
    t = np.tanh(inner)
    return 0.5 * (1 + t) + 0.5 * z * (1 - t**2) * 0.7978845608028654 * (1 + 3 * 0.044715 * z**2)


def mlp(x, w1, w2, dy):
    """Forward and backward of the MLP: y, dx, dW1, dW2 (dW1/dW2 of the slice given)."""
    z = x @ w1
    h = gelu(z)
    y = h @ w2
    dh = dy @ w2.T
    dz = dh * gelu_grad(z)
    return y, dz @ w1.T, x.T @ dz, h.T @ dy


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--batch", type=positive, default=8)
    parser.add_argument("--model", type=positive, default=16, help="d, the model width")
    parser.add_argument("--hidden", type=positive, default=64, help="h, the hidden width")
    args = parser.parse_args()
    comm = mpicoll.Communicator()
    rng = np.random.default_rng(0)  # every rank draws the same full weights and data
    x = rng.normal(size=(args.batch, args.model))
    w1 = rng.normal(0, args.model ** -0.5, (args.model, args.hidden))
    w2 = rng.normal(0, args.hidden ** -0.5, (args.hidden, args.model))
    dy = rng.normal(size=(args.batch, args.model))  # dL/dy from the layers above
    lo, hi = chunk_bounds(args.hidden, comm.size)[comm.rank:comm.rank + 2]

    partial_y, partial_dx, dw1_mine, dw2_mine = mlp(x, w1[:, lo:hi], w2[lo:hi], dy)
    y = comm.all_reduce(partial_y, "sum")          # forward: row-parallel fc2's sum
    dx = comm.all_reduce(partial_dx, "sum")        # backward: column-parallel fc1's sum

    full_y, full_dx, full_dw1, full_dw2 = mlp(x, w1, w2, dy)
    check(np.allclose(y, full_y) and np.allclose(dx, full_dx), "y and dL/dx")
    check(np.allclose(dw1_mine, full_dw1[:, lo:hi]) and np.allclose(dw2_mine, full_dw2[lo:hi]),
          "this rank's slices of dL/dW1 and dL/dW2")
    counts = comm.gather(np.array([hi - lo]), 0)
    if comm.rank == 0:
        print(f"hidden units per rank: {counts.reshape(-1).tolist()}; two all_reduces of "
              f"{y.nbytes} bytes each")
        print(f"y, dL/dx, dL/dW1 and dL/dW2 over {comm.size} rank(s) equal the unsharded MLP's "
              f"(max |y difference| {np.max(np.abs(y - full_y)):.1e})")


if __name__ == "__main__":
    launch(main)
