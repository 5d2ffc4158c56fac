"""Fit the cost model's alpha, beta and gamma on this machine (a tool: ``auto`` never
imports it). Run by ``python -m mpicoll.model fit`` under mpiexec."""

from __future__ import annotations

import time

from . import Params


def _alpha_beta(sizes: list[int], times: list[float]) -> tuple[float, float]:
    """alpha: the time of the smallest messages; beta: the median time per byte beyond
    alpha of the large ones (a straight least-squares line lets the large sizes swamp
    the intercept)."""
    small = [t for s, t in zip(sizes, times, strict=True) if s <= 256] or [min(times)]
    alpha = sorted(small)[len(small) // 2]
    large = sorted((t - alpha) / s for s, t in zip(sizes, times, strict=True) if s >= 1 << 16)
    beta = large[len(large) // 2] if large else 0.0
    return alpha, beta


def fit(comm=None, sizes: tuple[int, ...] = tuple(1 << s for s in range(0, 25, 2)),
        iters: int = 20) -> Params:
    """Measure alpha and beta with a ring exchange of every size over mpicoll's transport
    (all ranks at once, as the algorithms move data), and gamma with NumPy additions.

    Every rank returns the same numbers (the slowest rank's times are used).
    """
    import numpy as np
    from mpi4py import MPI

    from ..communicator import Communicator

    comm = comm or Communicator()
    t, control = comm.transport, comm.control_comm
    p, rank = t.size, t.rank
    right, left = (rank + 1) % p, (rank - 1) % p
    big = max(sizes)
    send, recv = np.ones(big, np.uint8), np.empty(big, np.uint8)
    per_message = []
    for size in sizes:
        for _ in range(3):
            t.begin()
            t.sendrecv(send[:size], right, recv[:size], left)
        control.Barrier()
        start = time.perf_counter()
        for _ in range(iters):
            t.begin()
            t.sendrecv(send[:size], right, recv[:size], left)
        per_message.append(control.allreduce((time.perf_counter() - start) / iters, op=MPI.MAX))
    alpha, beta = _alpha_beta(list(sizes), per_message)
    # gamma: per byte reduced, float32 sums on arrays as large as the transfers
    x = np.ones(big // 4, np.float32)
    y = np.ones_like(x)
    reduce_sizes = [s // 4 for s in sizes if s >= 4096]
    reduce_times = []
    for count in reduce_sizes:
        np.add(x[:count], y[:count], out=y[:count])
        start = time.perf_counter()
        for _ in range(iters):
            np.add(x[:count], y[:count], out=y[:count])
        reduce_times.append(control.allreduce((time.perf_counter() - start) / iters, op=MPI.MAX))
    per_byte = sorted(t / (4.0 * c) for c, t in zip(reduce_sizes, reduce_times, strict=True))
    gamma = per_byte[len(per_byte) // 2]
    return Params(alpha=max(alpha, 1e-8), beta=max(beta, 1e-13), gamma=max(gamma, 1e-13),
                  ranks=p, source="fit")
