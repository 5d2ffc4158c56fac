"""Gather: every rank's block ends up on the root, in rank order.

``src`` is this rank's block; ``dst`` (root only) receives p equal blocks.
n is the size of the root's whole result in bytes.
"""

from __future__ import annotations

import numpy as np

from ..transport import Transport
from . import register


@register("gather", "linear")
def linear_gather(t: Transport, src: np.ndarray, dst: np.ndarray | None, root: int) -> None:
    """Every rank sends its block straight to the root.

    Steps: p-1 messages into the root; bytes: (p-1)/p n into the root.
    Cost: (p-1)*alpha + (p-1)/p*n*beta
    """
    p, rank, m = t.size, t.rank, src.size
    if rank != root:
        t.send(src, root)
        return
    assert dst is not None
    requests = [t.irecv(dst[r * m:(r + 1) * m], r) for r in range(p) if r != root]
    dst[root * m:(root + 1) * m] = src
    t.waitall(requests)


@register("gather", "binomial")
def binomial_gather(t: Transport, src: np.ndarray, dst: np.ndarray | None, root: int) -> None:
    """Binomial tree: each rank collects its subtree's blocks and sends them up at once.

    Blocks travel in relative-rank order; the root rotates them back (one copy when
    root != 0). Steps: ceil(lg p); bytes: (p-1)/p n into the root.
    Cost: ceil(lg p)*alpha + (p-1)/p*n*beta
    """
    p, rank, m = t.size, t.rank, src.size
    rel = (rank - root) % p
    subtree = p if rel == 0 else min(rel & -rel, p - rel)
    if rel and subtree == 1:  # a leaf
        t.send(src, (rank - (rel & -rel)) % p)
        return
    if rank == root and root == 0:
        work = dst
    else:
        work = t.scratch(subtree * m, src.dtype, slot=1)
    work[:m] = src
    # children rel + mask for every mask below rel's lowest set bit, each with a subtree
    requests = []
    mask = 1
    while mask < subtree:
        child = rel + mask
        hi = min(child + mask, p, rel + subtree)
        requests.append(t.irecv(work[mask * m:(hi - rel) * m], (rank + mask) % p))
        mask <<= 1
    t.waitall(requests)
    if rank != root:
        t.send(work, (rank - (rel & -rel)) % p)
    elif work is not dst:
        assert dst is not None
        split = (p - root) * m
        dst[root * m:] = work[:split]
        dst[: root * m] = work[split:]
