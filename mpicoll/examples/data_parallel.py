"""Data-parallel training of a small NumPy MLP, with DDP's gradient bucketing and overlap.

    mpiexec -n 4 python -m mpicoll.examples.data_parallel [--steps 20] [--bucket-mb 0.25]

Every rank holds the same model and a different slice of each global batch. Backward runs
from the last layer to the first; as soon as a layer's gradients exist they go into a
``mpicoll.Bucketer``, which starts the all_reduce of a bucket (``async_op=True``) the
moment it is full, while the earlier layers' gradients are still being computed; the
optimizer step waits for all of them. The bucket cap is DDP's ``bucket_cap_mb``: DDP's
default, 25 MB, suits models of hundreds of MB; this model's gradients are 0.6 MB, so at
25 MB they would make one bucket, whose all_reduce can start only once backward has ended,
and nothing would overlap. The default here, 0.25 MB, makes three buckets (the last
layers', the big hidden layer's, the first layer's), so the first two are all_reduced
while backward goes on. Each rank's loss is its share of the mean over the
*global* batch, so the summed gradients are exactly the full batch's, and the weights
equal, to float rounding, those of one process training on the whole batch, which every
rank checks at the end (rank 0 reports the largest difference of any rank). Printed: how long the all_reduces ran, and how much of that the
ranks spent blocked in ``wait`` rather than overlapped with the backward pass.
"""

from __future__ import annotations

import time

import numpy as np

import mpicoll
from mpicoll.buffers import chunk_bounds
from mpicoll.examples._launch import check, launch, megabytes, parser_for, positive, widths


def init_params(sizes: list[int], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        params += [rng.normal(0, 1 / np.sqrt(fan_in), (fan_in, fan_out)), np.zeros(fan_out)]
    return params


def forward(params: list[np.ndarray], x: np.ndarray) -> list[np.ndarray]:
    """The activations of every layer (tanh between layers, linear output)."""
    acts = [x]
    for k in range(0, len(params), 2):
        z = acts[-1] @ params[k] + params[k + 1]
        acts.append(np.tanh(z) if k + 2 < len(params) else z)
    return acts


def backward(params: list[np.ndarray], acts: list[np.ndarray], y: np.ndarray, scale: float):
    """Yield (index, gradient) from the last parameter to the first, for the loss
    sum((out - y)^2) * scale."""
    delta = 2 * (acts[-1] - y) * scale
    for k in range(len(params) - 2, -1, -2):
        yield k + 1, delta.sum(axis=0)
        yield k, acts[k // 2].T @ delta
        if k:
            delta = (delta @ params[k].T) * (1 - acts[k // 2] ** 2)


def train(params, x, y, steps, lr, scale, step_grads):
    for _ in range(steps):
        acts = forward(params, x)
        grads = step_grads(backward(params, acts, y, scale))
        for p_, g in zip(params, grads, strict=True):
            p_ -= lr * g
    return params


def least_overlap(times: np.ndarray) -> float:
    """The least time any rank's all_reduces ran while it was not blocked in wait (rows:
    each rank's blocked, running, elapsed seconds). Per rank: the two maxima over ranks
    come of different ranks, and their difference is no rank's."""
    return float(np.clip(times[:, 1] - times[:, 0], 0, None).min())


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--steps", type=positive, default=20)
    parser.add_argument("--batch", type=positive, default=512, help="global batch size")
    parser.add_argument("--sizes", type=widths, default="32,256,256,8",
                        help="layer widths, comma-separated")
    parser.add_argument("--bucket-mb", type=megabytes, default=0.25,
                        help="bucket cap in MB, DDP's bucket_cap_mb (DDP's default 25 would "
                             "hold this model's 0.6 MB of gradients in one bucket: no overlap)")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    comm = mpicoll.Communicator()
    sizes = args.sizes
    rng = np.random.default_rng(42)
    x = rng.normal(size=(args.batch, sizes[0]))
    y = np.sin(x @ rng.normal(size=(sizes[0], sizes[-1])))  # a smooth target
    lo, hi = chunk_bounds(args.batch, comm.size)[comm.rank:comm.rank + 2]
    scale = 1.0 / (args.batch * sizes[-1])  # the mean over the global batch

    params = init_params(sizes)
    buckets = mpicoll.Bucketer(comm, params[::-1], cap_bytes=int(args.bucket_mb * 2**20))
    blocked = running = 0.0

    def all_reduced(grads):  # gradients arrive last layer first: bucket i holds params[-1 - i]
        nonlocal blocked, running
        n = len(params)
        for index, grad in grads:
            buckets.add(n - 1 - index, grad)
        start = time.perf_counter()
        reduced = buckets.wait()
        blocked += time.perf_counter() - start
        running += sum(w.finished_at - w.started_at for w in buckets.works)
        return reduced[::-1]

    start = time.perf_counter()
    params = train(params, x[lo:hi], y[lo:hi], args.steps, args.lr, scale, all_reduced)
    elapsed = time.perf_counter() - start
    times = comm.gather(np.array([blocked, running, elapsed]), 0)

    # every rank's weights against one process training on the whole batch
    alone = train(init_params(sizes), x, y, args.steps, args.lr, scale,
                  lambda grads: [g for _, g in sorted(grads, key=lambda ig: ig[0])])
    mine = max(float(np.max(np.abs(a - b))) for a, b in zip(params, alone, strict=True))
    worst = float(comm.all_reduce(np.array([mine]), "max")[0])
    check(worst < 1e-9, f"weights differ from single-process training by {worst}")
    if comm.rank == 0:
        loss = float(np.mean((forward(params, x)[-1] - y) ** 2))
        blocked_max, running_max, elapsed_max = times.max(axis=0)
        print(f"{comm.size} rank(s), {args.steps} steps, global batch {args.batch}, "
              f"{len(buckets.buffers)} bucket(s) of {buckets.bucket_bytes} bytes")
        gradients = sum(p_.nbytes for p_ in params) / 2**20
        print(f"bucket cap {args.bucket_mb:g} MB (DDP's bucket_cap_mb) for {gradients:.2f} MB "
              "of gradients: " + (
                  "one bucket, whose all_reduce can start only once backward has ended, so "
                  "nothing overlaps; lower --bucket-mb to see overlap" if len(buckets.buffers) == 1
                  else "each bucket's all_reduce starts as soon as backward has filled it, "
                       "the last one's once backward has ended"))
        print(f"final loss {loss:.5f}; weights equal single-process training on every rank "
              f"(max difference {worst:.1e})")
        overlapped = least_overlap(times)
        print(f"all_reduce ran up to {running_max * 1e3:.1f} ms in all on a rank; ranks "
              f"blocked in wait up to {blocked_max * 1e3:.1f} ms; every rank overlapped at "
              f"least {overlapped * 1e3:.1f} ms of it with the backward pass; training took "
              f"{elapsed_max * 1e3:.1f} ms")


if __name__ == "__main__":
    launch(main)
