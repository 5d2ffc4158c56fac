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
from .trees import BineTree, knomial_children, knomial_parent, knomial_subtree_end


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
    Cost: ceil(log_k p)*min(k-1, p-1)*alpha + (p-1)/p*n*beta
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


@register("scatter", "bine")
def bine_scatter(t: Transport, src: np.ndarray | None, dst: np.ndarray,
                 bounds: tuple[int, ...], root: int) -> None:
    """Bine tree (De Sensi et al., SC 2025): a binomial scatter whose step-s edges are
    rho(s) = 1, -1, 3, -5, 11, ... ranks long instead of 2^s (``trees``, Bine trees).

    A rank receives its subtree's blocks in one message and hands each child its
    subtree's share, the farthest child first. Blocks travel laid out by position
    (negabinary value order, position j being rank ``tree.start`` + j), where every
    subtree's blocks are one slice. The root sends straight from its buffer, except to a
    child whose ranks wrap past rank p-1 (at most one): those blocks are staged in
    workspace, one copy. A leaf receives straight into its result.
    Steps: ceil(lg p); bytes: (p-1)/p n leave the root, halving at each level.
    Cost: ceil(lg p)*alpha + (p-1)/p*n*beta
    """
    p, rank = t.size, t.rank
    tree = BineTree(p, root)
    at = rotated_bounds(bounds, tree.start)  # the blocks laid out by position
    me = tree.label(rank)
    parent, children = tree.parent(me), tree.children(me)
    with t.workspace() as ws:
        if parent is None:  # the root
            assert src is not None
            sends = []
            for child in reversed(children):
                lo, hi = tree.span(child)
                first, count = (tree.start + lo) % p, hi - lo  # its ranks, from first on
                if at[hi] == at[lo]:
                    continue  # empty blocks: no message (the child knows from bounds)
                if first + count <= p:
                    piece = src[bounds[first]:bounds[first + count]]
                else:  # ranks first..p-1, then 0..
                    piece = ws.take(at[hi] - at[lo], src.dtype)
                    split = bounds[p] - bounds[first]
                    piece[:split] = src[bounds[first]:]
                    piece[split:] = src[:bounds[first + count - p]]
                sends.append(t.isend(piece, tree.rank(child)))
            dst[...] = src[bounds[root]:bounds[root + 1]]
            t.waitall(sends)
            return
        if not children:  # a leaf
            if dst.size:
                t.recv(dst, tree.rank(parent))
            return
        lo, hi = tree.span(me)
        base = at[lo]
        work = ws.take(at[hi] - base, dst.dtype)
        if work.size:
            t.recv(work, tree.rank(parent))
        sends = []
        for child in reversed(children):
            child_lo, child_hi = tree.span(child)
            if at[child_hi] > at[child_lo]:
                sends.append(t.isend(work[at[child_lo] - base:at[child_hi] - base],
                                     tree.rank(child)))
        mine = tree.position[me]
        dst[...] = work[at[mine] - base:at[mine + 1] - base]
        t.waitall(sends)
