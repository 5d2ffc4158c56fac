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


def _pairs(nodes: tuple[tuple[int, ...], ...], rank: int,
           ) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """(right, left) for a ring inside this rank's node, and for a ring over the nodes
    between the ranks of the same place in each node (both None where the rank has no
    partner: alone in its node, or past the smallest node's size)."""
    mine = next(n for n in nodes if rank in n)
    local = mine.index(rank)
    intra = None
    if len(mine) > 1:
        intra = (mine[(local + 1) % len(mine)], mine[(local - 1) % len(mine)])
    inter = None
    if len(nodes) > 1 and local < min(len(n) for n in nodes):
        node = nodes.index(mine)
        inter = (nodes[(node + 1) % len(nodes)][local], nodes[(node - 1) % len(nodes)][local])
    return intra, inter


def _ring_times(t, control, pair, sizes, iters, send, recv) -> list[float]:
    """Per size, the slowest rank's time of one exchange with ``pair`` = (right, left),
    every rank with a pair exchanging at once (the others wait at the barriers)."""
    from mpi4py import MPI

    times = []
    for size in sizes:
        # every rank begins each exchange, one without a pair too: the tags move alike
        # on every rank, so the pairs of the next phase match (uneven nodes: 2 + 1)
        for _ in range(3):
            t.begin()
            if pair is not None:
                t.sendrecv(send[:size], pair[0], recv[:size], pair[1])
        control.Barrier()
        start = time.perf_counter()
        for _ in range(iters):
            t.begin()
            if pair is not None:
                t.sendrecv(send[:size], pair[0], recv[:size], pair[1])
        mine = (time.perf_counter() - start) / iters if pair is not None else 0.0
        times.append(control.allreduce(mine, op=MPI.MAX))
    return times


def fit(comm=None, sizes: tuple[int, ...] = tuple(1 << s for s in range(0, 25, 2)),
        iters: int = 20) -> Params:
    """Measure alpha and beta with a ring exchange of every size over mpicoll's transport
    (all ranks at once, as the algorithms move data), and gamma with NumPy additions.

    With several nodes (``comm.nodes``: ``MPICOLL_RANKS_PER_NODE``, SLURM's nodes, or
    hosts), alpha and beta are the links between nodes (a ring over the nodes, every
    node's ranks at once) and alpha_intra and beta_intra those inside a node (a ring in
    each node), as the hierarchical algorithms' cost lines take them.

    Every rank returns the same numbers (the slowest rank's times are used).
    """
    import numpy as np
    from mpi4py import MPI

    from ..communicator import Communicator

    comm = comm or Communicator()
    t, control = comm.transport, comm.control_comm
    p, rank = t.size, t.rank
    big = max(sizes)
    send, recv = np.ones(big, np.uint8), np.empty(big, np.uint8)
    nodes = comm.nodes
    alpha_intra = beta_intra = None
    if len(nodes) > 1:
        intra, inter = _pairs(nodes, rank)
        alpha, beta = _alpha_beta(list(sizes),
                                  _ring_times(t, control, inter, sizes, iters, send, recv))
        if any(len(n) > 1 for n in nodes):
            alpha_intra, beta_intra = _alpha_beta(
                list(sizes), _ring_times(t, control, intra, sizes, iters, send, recv))
            alpha_intra, beta_intra = max(alpha_intra, 1e-8), max(beta_intra, 1e-13)
    else:
        ring = ((rank + 1) % p, (rank - 1) % p)
        alpha, beta = _alpha_beta(list(sizes),
                                  _ring_times(t, control, ring, sizes, iters, send, recv))
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
                  ranks=p, source="fit", alpha_intra=alpha_intra, beta_intra=beta_intra)
