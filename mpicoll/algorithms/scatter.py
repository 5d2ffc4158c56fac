"""Scatter: block j of the root's buffer ends up on rank j.

``src`` (root only) holds p blocks in rank order, block j at ``bounds[j]:bounds[j+1]``
(equal for scatter, uneven for scatter_v); ``dst`` receives this rank's block. Trees
work on relative ranks (rel = (rank - root) mod p) and lay blocks out in that order, so
a subtree's blocks are one contiguous slice. n is the size of the root's whole buffer
in bytes.
"""

from __future__ import annotations

import numpy as np

from ..buffers import rotated_bounds
from ..transport import Transport, Workspace
from . import register
from .broadcast import binomial_scatter
from .trees import knomial_children, knomial_parent, knomial_subtree_end


@register("scatter", "linear")
def linear_scatter(t: Transport, src: np.ndarray | None, dst: np.ndarray,
                   bounds: tuple[int, ...], root: int) -> None:
    """The root sends each rank its block directly.

    Steps: p-1 messages from the root; bytes: (p-1)/p n leave the root.
    Cost: (p-1)*alpha + (p-1)/p*n*beta
    """
    p, rank = t.size, t.rank
    if rank != root:
        t.recv(dst, root)
        return
    assert src is not None
    requests = [t.isend(src[bounds[r]:bounds[r + 1]], r) for r in range(p) if r != root]
    dst[...] = src[bounds[root]:bounds[root + 1]]
    t.waitall(requests)


def _relative_order(ws: Workspace, src: np.ndarray, bounds: tuple[int, ...],
                    root: int) -> np.ndarray:
    """The root's blocks rotated into relative-rank order (a copy unless root is 0)."""
    if root == 0:
        return src
    work = ws.take(bounds[-1], src.dtype)
    split = bounds[-1] - bounds[root]
    work[:split] = src[bounds[root]:]
    work[split:] = src[:bounds[root]]
    return work


@register("scatter", "binomial")
def binomial_scatter_scatter(t: Transport, src: np.ndarray | None, dst: np.ndarray,
                             bounds: tuple[int, ...], root: int) -> None:
    """Binomial tree: each rank passes on the blocks of its children's subtrees.

    The root first rotates its blocks into relative-rank order (one copy when root != 0).
    Steps: ceil(lg p); bytes: (p-1)/p n leave the root, halving at each level.
    Cost: ceil(lg p)*alpha + (p-1)/p*n*beta
    """
    p, rank = t.size, t.rank
    rel = (rank - root) % p
    rel_bounds = rotated_bounds(bounds, root)
    with t.workspace() as ws:
        if rank == root:
            assert src is not None
            work = _relative_order(ws, src, bounds, root)
        else:
            end = min(rel + (rel & -rel), p)
            work = ws.take(rel_bounds[end] - rel_bounds[rel], dst.dtype)
        binomial_scatter(t, work, rel_bounds, root)
        dst[...] = work[:dst.size]


@register("scatter", "knomial")
def knomial_scatter(t: Transport, src: np.ndarray | None, dst: np.ndarray,
                    bounds: tuple[int, ...], root: int, *, radix: int = 4) -> None:
    """K-nomial tree: a rank receives its subtree's blocks, then hands each child its share.

    Steps: ceil(log_k p) levels of up to k-1 sends; bytes: (p-1)/p n leave the root.
    Cost: ceil(log_k p)*(k-1)*alpha + (p-1)/p*n*beta
    """
    p, rank = t.size, t.rank
    rel = (rank - root) % p
    rel_bounds = rotated_bounds(bounds, root)
    base = rel_bounds[rel]
    end = knomial_subtree_end(rel, p, radix)
    with t.workspace() as ws:
        if rank == root:
            assert src is not None
            work = _relative_order(ws, src, bounds, root)
        else:
            work = ws.take(rel_bounds[end] - base, dst.dtype)
            if work.size:
                t.recv(work, (knomial_parent(rel, radix) + root) % p)
        sends = []
        for child, child_end in reversed(knomial_children(rel, p, radix)):  # farthest first
            lo, hi = rel_bounds[child] - base, rel_bounds[child_end] - base
            if hi > lo:  # an empty subtree gets no message (its ranks know from bounds)
                sends.append(t.isend(work[lo:hi], (child + root) % p))
        dst[...] = work[:dst.size]
        t.waitall(sends)
