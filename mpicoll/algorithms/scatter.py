"""Scatter: block j of the root's buffer ends up on rank j.

``src`` (root only) holds p equal blocks in rank order; ``dst`` receives this rank's
block. n is the size of the root's whole buffer in bytes.
"""

from __future__ import annotations

import numpy as np

from ..buffers import even_bounds
from ..transport import Transport
from . import register
from .broadcast import binomial_scatter


@register("scatter", "linear")
def linear_scatter(t: Transport, src: np.ndarray | None, dst: np.ndarray, root: int) -> None:
    """The root sends each rank its block directly.

    Steps: p-1 messages from the root; bytes: (p-1)/p n leave the root.
    Cost: (p-1)*alpha + (p-1)/p*n*beta
    """
    p, rank, m = t.size, t.rank, dst.size
    if rank != root:
        t.recv(dst, root)
        return
    assert src is not None
    requests = [t.isend(src[r * m:(r + 1) * m], r) for r in range(p) if r != root]
    dst[...] = src[root * m:(root + 1) * m]
    t.waitall(requests)


@register("scatter", "binomial")
def binomial_scatter_scatter(t: Transport, src: np.ndarray | None, dst: np.ndarray,
                             root: int) -> None:
    """Binomial tree: each rank passes on the blocks of its children's subtrees.

    The root first rotates its blocks into relative-rank order (one copy when root != 0).
    Steps: ceil(lg p); bytes: (p-1)/p n leave the root, halving at each level.
    Cost: ceil(lg p)*alpha + (p-1)/p*n*beta
    """
    p, rank, m = t.size, t.rank, dst.size
    rel = (rank - root) % p
    bounds = even_bounds(m, p)
    if rank == root:
        assert src is not None
        if root == 0:
            work = src
        else:
            work = t.scratch(p * m, dst.dtype, slot=1)
            split = (p - root) * m
            work[:split] = src[root * m:]
            work[split:] = src[: root * m]
    else:
        subtree = min(rel & -rel, p - rel)
        work = dst if subtree == 1 else t.scratch(subtree * m, dst.dtype, slot=1)
    binomial_scatter(t, work, bounds, root)
    if work is not dst:
        dst[...] = work[:m]
