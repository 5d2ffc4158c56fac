"""Gather: every rank's block ends up on the root, in rank order.

``src`` is this rank's block; ``dst`` (root only) receives p blocks, block j at
``bounds[j]:bounds[j+1]`` (equal for gather, uneven for gather_v). Trees work on
relative ranks (rel = (rank - root) mod p) and collect blocks in that order, so a
subtree's blocks are one contiguous slice; the root rotates them back at the end.
n is the size of the root's whole result in bytes.
"""

from __future__ import annotations

import numpy as np

from ..buffers import rotated_bounds
from ..transport import Transport
from . import register
from .trees import BineTree, knomial_children, knomial_parent, knomial_subtree_end


@register("gather", "linear")
def linear_gather(t: Transport, src: np.ndarray, dst: np.ndarray | None,
                  bounds: tuple[int, ...], root: int) -> None:
    """Every rank sends its block straight to the root.

    Steps: p-1 messages into the root; bytes: (p-1)/p n into the root.
    Cost: (p-1)*alpha + (p-1)/p*n*beta
    """
    p, rank = t.size, t.rank
    if rank != root:
        t.send(src, root)
        return
    assert dst is not None
    requests = [t.irecv(dst[bounds[r]:bounds[r + 1]], r) for r in range(p) if r != root]
    dst[bounds[root]:bounds[root + 1]] = src
    t.waitall(requests)


def _tree_gather(t: Transport, src: np.ndarray, dst: np.ndarray | None,
                 bounds: tuple[int, ...], root: int, parent: int | None,
                 children: list[tuple[int, int]], end: int) -> None:
    """Collect the subtree [rel, end) from ``children``, then send it to ``parent``."""
    p, rank = t.size, t.rank
    rel = (rank - root) % p
    rel_bounds = rotated_bounds(bounds, root)
    base = rel_bounds[rel]
    with t.workspace() as ws:
        if parent is not None and not children:  # a leaf
            if src.size:
                t.send(src, (parent + root) % p)
            return
        work = dst if rel == 0 and root == 0 else ws.take(rel_bounds[end] - base, src.dtype)
        assert work is not None
        work[:src.size] = src
        requests = []
        for child, child_end in children:
            lo, hi = rel_bounds[child] - base, rel_bounds[child_end] - base
            if hi > lo:  # an empty subtree sends nothing
                requests.append(t.irecv(work[lo:hi], (child + root) % p))
        t.waitall(requests)
        if parent is not None:
            if rel_bounds[end] > base:
                t.send(work[:rel_bounds[end] - base], (parent + root) % p)
        elif work is not dst:  # the root, root != 0: relative order back to rank order
            assert dst is not None
            split = bounds[p] - bounds[root]
            dst[bounds[root]:] = work[:split]
            dst[:bounds[root]] = work[split:]


@register("gather", "binomial")
def binomial_gather(t: Transport, src: np.ndarray, dst: np.ndarray | None,
                    bounds: tuple[int, ...], root: int) -> None:
    """Binomial tree: each rank collects its subtree's blocks and sends them up at once.

    Blocks travel in relative-rank order; the root rotates them back (one copy when
    root != 0). Steps: ceil(lg p); bytes: (p-1)/p n into the root.
    Cost: ceil(lg p)*alpha + (p-1)/p*n*beta
    """
    rel = (t.rank - root) % t.size
    _tree_gather(t, src, dst, bounds, root, knomial_parent(rel, 2),
                 knomial_children(rel, t.size, 2), knomial_subtree_end(rel, t.size, 2))


@register("gather", "knomial")
def knomial_gather(t: Transport, src: np.ndarray, dst: np.ndarray | None,
                   bounds: tuple[int, ...], root: int, *, radix: int = 4) -> None:
    """K-nomial tree: a rank collects up to k-1 children per level, then sends up at once.

    Steps: ceil(log_k p) levels of up to k-1 receives; bytes: (p-1)/p n into the root.
    Cost: ceil(log_k p)*min(k-1, p-1)*alpha + (p-1)/p*n*beta
    """
    rel = (t.rank - root) % t.size
    _tree_gather(t, src, dst, bounds, root, knomial_parent(rel, radix),
                 knomial_children(rel, t.size, radix), knomial_subtree_end(rel, t.size, radix))


@register("gather", "bine")
def bine_gather(t: Transport, src: np.ndarray, dst: np.ndarray | None,
                bounds: tuple[int, ...], root: int) -> None:
    """Bine tree (De Sensi et al., SC 2025): a binomial gather whose step-s edges are
    rho(s) = 1, -1, 3, -5, 11, ... ranks long instead of 2^s (``trees``, Bine trees).

    A rank collects its subtree's blocks, nearest child first, and sends them up in one
    message. A Bine subtree is a range of the tree's positions (negabinary value order,
    position j being rank ``tree.start`` + j), so blocks travel laid out by position and
    a subtree's blocks are one slice of workspace. The root receives each child's blocks
    straight into its result, except a child whose ranks wrap past rank p-1 (at most
    one): its blocks land in workspace and are copied in, in two pieces. Steps:
    ceil(lg p); bytes: (p-1)/p n into the root.
    Cost: ceil(lg p)*alpha + (p-1)/p*n*beta
    """
    p, rank = t.size, t.rank
    tree = BineTree(p, root)
    at = rotated_bounds(bounds, tree.start)  # the blocks laid out by position
    me = tree.label(rank)
    parent, children = tree.parent(me), tree.children(me)
    with t.workspace() as ws:
        if parent is not None and not children:  # a leaf
            if src.size:
                t.send(src, tree.rank(parent))
            return
        if parent is None:  # the root
            assert dst is not None
            requests, wrapped = [], []
            for child in children:
                lo, hi = tree.span(child)
                first, count = (tree.start + lo) % p, hi - lo  # its ranks, from first on
                if at[hi] == at[lo]:
                    continue  # empty blocks: no message
                if first + count <= p:
                    requests.append(t.irecv(dst[bounds[first]:bounds[first + count]],
                                            tree.rank(child)))
                else:
                    landing = ws.take(at[hi] - at[lo], src.dtype)
                    requests.append(t.irecv(landing, tree.rank(child)))
                    wrapped.append((landing, first, first + count - p))
            dst[bounds[root]:bounds[root + 1]] = src
            t.waitall(requests)
            for landing, first, end in wrapped:  # ranks first..p-1, then 0..end-1
                split = bounds[p] - bounds[first]
                dst[bounds[first]:] = landing[:split]
                dst[:bounds[end]] = landing[split:]
            return
        lo, hi = tree.span(me)
        base = at[lo]
        work = ws.take(at[hi] - base, src.dtype)
        mine = tree.position[me]
        work[at[mine] - base:at[mine + 1] - base] = src
        requests = []
        for child in children:
            child_lo, child_hi = tree.span(child)
            if at[child_hi] > at[child_lo]:
                requests.append(t.irecv(work[at[child_lo] - base:at[child_hi] - base],
                                        tree.rank(child)))
        t.waitall(requests)
        if work.size:
            t.send(work, tree.rank(parent))
