"""Pipeline parallelism (GPipe): one layer per rank, micro-batches forward, gradients back.

    mpiexec -n 4 python -m mpicoll.examples.pipeline_parallel [--micro-batches 4] [--steps 3]

The model is a stack of p layers (tanh between them), p the number of ranks, and rank s
holds layer s only: pipeline stage s. Each step cuts the batch into M micro-batches:

- forward: stage 0 runs micro-batch m through its layer and sends the activations to
  stage 1 (``comm.send``, tag m); every later stage receives them from the stage before
  (``comm.recv``), runs its layer and sends on; each stage keeps its input and output of
  every micro-batch for backward. The last stage computes the loss's gradient.
- backward, micro-batches in reverse: each stage receives dL/d(its output) from the
  stage after (the last one has it already), adds up its layer's gradients over the
  micro-batches, and sends dL/d(its input) to the stage before.
- update: each stage takes an SGD step on its own layer; no collective is needed.

The GPipe schedule (all forwards, then all backwards), drawn by rank 0 in the order each
rank runs it: a stage waits for its first micro-batch and again, at the turn, for the first
gradient, so it idles (p-1)/(M+p-1) of the step (the bubble), which more micro-batches
shrink, at the cost of keeping the activations of all M micro-batches until backward
(1F1B schedules start backward early and keep at most p). Runs on any number of ranks (1
too: one stage, no messages). After a few steps every stage's layer equals, to float
rounding, the same layer of one process training the whole model on the whole batch.
"""

from __future__ import annotations

import numpy as np

import mpicoll
from mpicoll.examples._launch import check, launch, parser_for, positive


def init_layers(widths: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(W, b) of every layer (every rank draws all of them alike)."""
    rng = np.random.default_rng(0)
    return [(rng.normal(0, n_in ** -0.5, (n_in, n_out)), np.zeros(n_out))
            for n_in, n_out in zip(widths[:-1], widths[1:], strict=True)]


def layer_forward(w: np.ndarray, b: np.ndarray, x: np.ndarray, last: bool) -> np.ndarray:
    z = x @ w + b
    return z if last else np.tanh(z)


def layer_backward(w: np.ndarray, x: np.ndarray, out: np.ndarray, d_out: np.ndarray,
                   last: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dL/dW, dL/db and dL/dx of one layer, given its input, output and dL/d(output)."""
    dz = d_out if last else d_out * (1 - out**2)
    return x.T @ dz, dz.sum(axis=0), dz @ w.T


def gpipe_schedule(stages: int, micro: int) -> list[str]:
    """Each stage's time line, one slot per micro-batch and stage (forward and backward
    taken as equally long): Fm and Bm the forward and backward of micro-batch m, . idle."""
    width = len(str(micro - 1)) + 1
    slots = 2 * (micro + stages - 1)
    lines = []
    for s in range(stages):
        row = ["." * width] * slots
        for m in range(micro):
            row[s + m] = f"F{m}".ljust(width)
            row[micro + stages - 1 + (stages - 1 - s) + (micro - 1 - m)] = f"B{m}".ljust(width)
        lines.append(f"  stage {s}: {' '.join(row)}".rstrip())
    return lines


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--micro-batches", type=positive, default=4, help="M")
    parser.add_argument("--micro-batch", type=positive, default=4, help="rows per micro-batch")
    parser.add_argument("--steps", type=positive, default=3)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    comm = mpicoll.Communicator()
    stage, stages, micro, rows = comm.rank, comm.size, args.micro_batches, args.micro_batch
    first, last = stage == 0, stage == stages - 1
    widths = [4] + [8] * (stages - 1) + [2]  # layer s maps widths[s] -> widths[s + 1]

    rng = np.random.default_rng(1)  # every rank draws the same batch (stage 0 reads x,
    x = rng.normal(size=(micro * rows, widths[0]))  # the last stage the target)
    target = np.sin(x @ rng.normal(size=(widths[0], widths[-1])))
    batch = [slice(m * rows, (m + 1) * rows) for m in range(micro)]
    w, b = init_layers(widths)[stage]  # this stage's layer: all it keeps

    losses = []
    for _ in range(args.steps):
        saved = []  # (input, output) of each micro-batch, for backward
        for m in range(micro):  # forward: from the stage before, to the stage after
            if first:
                inputs = x[batch[m]]
            else:
                inputs = np.empty((rows, widths[stage]))
                comm.recv(inputs, stage - 1, tag=m)
            out = layer_forward(w, b, inputs, last)
            saved.append((inputs, out))
            if not last:
                comm.send(out, stage + 1, tag=m)
        grad_w, grad_b = np.zeros_like(w), np.zeros_like(b)
        loss = 0.0
        for m in reversed(range(micro)):  # backward: from the stage after, to the one before
            inputs, out = saved[m]
            if last:  # the mean squared error over the whole batch: this micro-batch's share
                loss += float(np.sum((out - target[batch[m]]) ** 2)) / target.size
                d_out = 2 * (out - target[batch[m]]) / target.size
            else:
                d_out = np.empty((rows, widths[stage + 1]))
                comm.recv(d_out, stage + 1, tag=m)
            dw, db, d_in = layer_backward(w, inputs, out, d_out, last)
            grad_w += dw
            grad_b += db
            if not first:
                comm.send(d_in, stage - 1, tag=m)
        w -= args.lr * grad_w
        b -= args.lr * grad_b
        losses.append(loss)

    # one process, every layer, the whole batch: the same steps
    layers = init_layers(widths)
    for _ in range(args.steps):
        acts = [x]
        for k, (lw, lb) in enumerate(layers):
            acts.append(layer_forward(lw, lb, acts[-1], k == stages - 1))
        d_out = 2 * (acts[-1] - target) / target.size
        for k in reversed(range(stages)):
            dw, db, d_out = layer_backward(layers[k][0], acts[k], acts[k + 1], d_out,
                                           k == stages - 1)
            layers[k][0][...] -= args.lr * dw
            layers[k][1][...] -= args.lr * db
    expected_w, expected_b = layers[stage]
    same = np.allclose(w, expected_w, rtol=1e-7, atol=1e-10) and \
        np.allclose(b, expected_b, rtol=1e-7, atol=1e-10)
    mine = max(float(np.max(np.abs(w - expected_w))), float(np.max(np.abs(b - expected_b))))
    worst, wrong = comm.all_reduce(np.array([mine, 0.0 if same else 1.0]), "max")
    check(wrong == 0, f"a stage's layer differs from single-process training by {worst}")
    losses = comm.broadcast(np.array(losses), root=stages - 1)  # the last stage has them
    if comm.rank == 0:
        print(f"GPipe over {stages} stage(s), {micro} micro-batches of {rows} rows; each stage "
              f"idles {stages - 1}/{micro + stages - 1} of a step (the bubble):")
        print("\n".join(gpipe_schedule(stages, micro)))
        print(f"loss {losses[0]:.4f} at step 1, {losses[-1]:.4f} at step {args.steps}; every "
              f"stage's layer equals single-process training (max difference {worst:.1e})")


if __name__ == "__main__":
    launch(main)
