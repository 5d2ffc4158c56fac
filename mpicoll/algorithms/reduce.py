"""Reduce: the reduction of every rank's input ends up on the root.

``src`` is this rank's input (read only unless it is ``dst``); ``dst`` receives the result
at the root and may be None elsewhere (where it is given, it serves as workspace).
Operands are combined in rank order (x0 op x1 op ...), so non-commutative ops are exact.
n is the message size in bytes.
"""

from __future__ import annotations

import numpy as np

from ..buffers import chunk_bounds
from ..ops import Op
from ..transport import Transport
from ..transport.subset import Subset, heads_for, node_layout
from . import REGISTRY, register
from .broadcast import segment_bounds
from .gather import binomial_gather
from .reduce_scatter import recursive_halving_reduce_scatter
from .trees import BineTree, bine_layout, double_binary_tree, knomial_children, knomial_parent


@register("reduce", "linear")
def linear_reduce(t: Transport, src: np.ndarray, dst: np.ndarray | None, op: Op, root: int) -> None:
    """Every rank sends its input to the root, which combines them in rank order.

    Steps: p-1 messages into the root; bytes: (p-1) n into the root.
    Cost: (p-1)*(alpha + n*beta + n*gamma)
    """
    p, rank = t.size, t.rank
    with t.workspace() as ws:
        if rank != root:
            t.send(src, root)
            return
        assert dst is not None
        incoming = ws.take(src.size, src.dtype)
        for r in range(p):
            if r == 0:
                if root == 0:
                    if dst is not src:
                        dst[...] = src
                else:
                    t.recv(dst, 0)
            else:
                operand = src if r == root else incoming
                if r != root:
                    t.recv(incoming, r)
                op(dst, operand, out=dst)


def _deliver(t: Transport, cur: np.ndarray, src: np.ndarray, dst: np.ndarray | None, root: int,
             tree_root: int) -> None:
    """End of a tree reduce: the tree root's result ``cur`` into the root's ``dst``."""
    rank = t.rank
    if tree_root != root:  # a non-commutative op's tree is rooted at 0: one more step
        if rank == tree_root:
            t.send(cur, root)
        elif rank == root:
            t.recv(dst, tree_root)
    elif rank == root and cur is not dst:  # one rank, or no child
        dst[...] = src


@register("reduce", "binomial")
def binomial_reduce(t: Transport, src: np.ndarray, dst: np.ndarray | None, op: Op,
                    root: int) -> None:
    """Binomial tree: each rank combines its children's results, then sends to its parent.

    Steps: ceil(lg p); bytes: n per message; reductions: n per received message.
    For a non-commutative op and root != 0 the tree is rooted at 0 and the result is
    sent on to the root (one step more), so that operands stay in rank order.
    Cost: ceil(lg p)*(alpha + n*beta + n*gamma)
    """
    p, rank = t.size, t.rank
    tree_root = root if op.commutative else 0
    rel = (rank - tree_root) % p
    with t.workspace() as ws:
        incoming = ws.take(src.size, src.dtype)
        acc = dst if dst is not None else ws.take(src.size, src.dtype)
        cur = src
        mask = 1
        while mask < p:
            if rel & mask:
                t.send(cur, (rank - mask) % p)  # to the parent
                break
            if rel + mask < p:  # a child, whose subtree holds higher relative ranks
                t.recv(incoming, (rank + mask) % p)
                op(cur, incoming, out=acc)
                cur = acc
            mask <<= 1
        _deliver(t, cur, src, dst, root, tree_root)


@register("reduce", "knomial")
def knomial_reduce(t: Transport, src: np.ndarray, dst: np.ndarray | None, op: Op, root: int, *,
                   radix: int = 4) -> None:
    """K-nomial tree: each rank combines up to k-1 children per level, then sends up.

    All children's results are received at once into separate workspace and combined
    in rank order as they arrive. For a non-commutative op and root != 0 the tree is
    rooted at 0 and the result is sent on to the root (one step more).
    Steps: ceil(log_k p) levels of up to k-1 messages; reductions: n per message.
    Cost: ceil(log_k p)*min(k-1, p-1)*(alpha + n*beta + n*gamma)
    """
    p, rank, m = t.size, t.rank, src.size
    tree_root = root if op.commutative else 0
    rel = (rank - tree_root) % p
    children = knomial_children(rel, p, radix)
    with t.workspace() as ws:
        incoming = ws.take(len(children) * m, src.dtype)
        requests = [t.irecv(incoming[i * m:(i + 1) * m], (child + tree_root) % p)
                    for i, (child, _) in enumerate(children)]
        acc = dst if dst is not None else ws.take(m, src.dtype)
        cur = src
        for i, request in enumerate(requests):  # children hold increasing ranks
            t.waitall([request])
            op(cur, incoming[i * m:(i + 1) * m], out=acc)
            cur = acc
        parent = knomial_parent(rel, radix)
        if parent is not None:
            t.send(cur, (parent + tree_root) % p)
        _deliver(t, cur, src, dst, root, tree_root)


@register("reduce", "rabenseifner", commutative_only=True)
def rabenseifner_reduce(t: Transport, src: np.ndarray, dst: np.ndarray | None, op: Op,
                        root: int) -> None:
    """Rabenseifner: a recursive-halving reduce_scatter of p chunks, then a binomial
    gather of the chunks to the root; for large messages.

    Steps: lg p2 + ceil(lg p) (+2 if folded); bytes: about 2 (p-1)/p n at the root, and
    where p is no power of two the fold's n more (its two phases' costs, summed).
    Cost: (lg p2 + ceil(lg p) + 2*[p != p2])*alpha + (p2-1)/p2*n*(beta + gamma) + (p-1)/p*n*beta + [p != p2]*(n*(beta + gamma) + n/p*beta)
    """
    p, rank = t.size, t.rank
    bounds = chunk_bounds(src.size, p)
    lo, hi = bounds[rank], bounds[rank + 1]
    with t.workspace() as ws:
        # my reduced chunk goes where the gather reads it: the root's result, or workspace
        chunk = dst[lo:hi] if dst is not None else ws.take(hi - lo, src.dtype)
        recursive_halving_reduce_scatter(t, src, bounds, op, chunk)
        binomial_gather(t, chunk, dst if rank == root else None, bounds, root)


@register("reduce", "hierarchical", commutative_only=True,
          phases=(("intra", "reduce", "n"), ("inter", "reduce", "n")))
def hierarchical_reduce(t: Transport, src: np.ndarray, dst: np.ndarray | None, op: Op, root: int,
                        *, intra: str = "binomial", inter: str = "binomial") -> None:
    """Reduce inside each node to one rank (the root in its own node), then reduce among
    those heads to the root: one partial crosses between nodes per node.

    Steps: the intra algorithm among the q ranks of a node, then the inter algorithm among
    the N heads (below: binomial for both).
    Cost: ceil(lg q)*(alpha_intra + n*beta_intra + n*gamma) + ceil(lg N)*(alpha + n*beta + n*gamma)
    """
    mine, leaders, nodes = node_layout(t)
    heads = heads_for(root, leaders, nodes)
    head = next(h for h in heads if nodes[h] == nodes[t.rank])
    with t.workspace() as ws:
        # the root's partial is its result only where no inter phase follows: an inter
        # algorithm may write its result before it has read its input (linear does)
        partial = dst if t.rank == root and len(heads) == 1 else \
            ws.take(src.size, src.dtype) if t.rank == head else None
        REGISTRY["reduce"][intra].fn(Subset(t, mine), src, partial, op, mine.index(head))
        if t.rank in heads and len(heads) > 1:
            REGISTRY["reduce"][inter].fn(Subset(t, heads), partial, dst if t.rank == root else None,
                                         op, heads.index(root))


@register("reduce", "bine")
def bine_reduce(t: Transport, src: np.ndarray, dst: np.ndarray | None, op: Op, root: int) -> None:
    """Bine tree (De Sensi et al., SC 2025): a binomial reduce whose step-s edges are
    rho(s) = 1, -1, 3, -5, 11, ... ranks long instead of 2^s (``trees``, Bine trees).

    Each rank combines its children's results, nearest child first, then sends to its
    parent. Every subtree is a contiguous range of the tree's positions, and each child's
    range adjoins, left or right, the range combined so far: combined on that side, the
    operands stay in position order. For a non-commutative op the tree is rooted where
    position j is rank j, and the result is sent on to the root (one step more), so they
    stay in rank order. Steps: ceil(lg p); bytes: n per message; reductions: n per
    received message.
    Cost: ceil(lg p)*(alpha + n*beta + n*gamma)
    """
    p, rank = t.size, t.rank
    position = bine_layout(p)[0]
    tree_root = root if op.commutative else position[0]  # then position j is rank j
    tree = BineTree(p, tree_root)
    me = tree.label(rank)
    with t.workspace() as ws:
        incoming = ws.take(src.size, src.dtype)
        acc = dst if dst is not None else ws.take(src.size, src.dtype)
        cur = src
        lo = position[me]  # the first position combined into cur so far
        for child in tree.children(me):
            t.recv(incoming, tree.rank(child))
            child_lo, child_hi = tree.span(child)
            if child_hi == lo:  # the child's range lies left of mine
                op(incoming, cur, out=acc)
                lo = child_lo
            else:
                op(cur, incoming, out=acc)
            cur = acc
        parent = tree.parent(me)
        if parent is not None:
            t.send(cur, tree.rank(parent))
        _deliver(t, cur, src, dst, root, tree_root)


@register("reduce", "double_binary_tree", commutative_only=True)
def double_binary_tree_reduce(t: Transport, src: np.ndarray, dst: np.ndarray | None, op: Op,
                              root: int, *, segment_bytes: int = 1 << 16) -> None:
    """Double binary tree (Sanders, Speck and Traeff 2009; NCCL's tree): each half of the
    input is reduced up its own binary tree to the root, cut into S/2 segments that
    follow each other, so every level of both trees works on a segment at once.

    The trees of ``double_binary_tree_broadcast``, the messages going up: a rank is
    interior in at most one tree, so it receives and combines at most n bytes. Rounds: in
    round r a rank of height h (0 at a leaf) sends its partial result of segment r-h of
    each half to its parent (a leaf: its input itself), and receives segment r-h' from
    each child of height h'; it combines them once the round's messages are in. The
    trees reorder the operands: commutative ops only.
    Steps: about 2 ceil(lg p) + S segment times; bytes: at most n into a rank, n out of
    every rank but the root; reductions: at most n per rank.
    Cost: (2*ceil(lg p) + S)*(alpha + n/S*beta + n/S*gamma)
    """
    p, rank = t.size, t.rank
    with t.workspace() as ws:
        if p == 1:
            if dst is not src:
                dst[...] = src
            return
        trees = double_binary_tree(p, root)
        halves = chunk_bounds(src.size, 2)
        segment = max(1, segment_bytes // src.itemsize)
        # segments as offsets into their half
        cuts = [segment_bounds(0, halves[k + 1] - halves[k], segment) for k in (0, 1)]
        inputs = [src[halves[k]:halves[k + 1]] for k in (0, 1)]
        partial, landing, first = [], [], []
        for k, tree in enumerate(trees):
            kids, size = tree.children[rank], halves[k + 1] - halves[k]
            # this rank's subtree's partial result of half k: the root's is its result,
            # a leaf's is its input
            partial.append(dst[halves[k]:halves[k + 1]] if rank == root else
                           ws.take(size, src.dtype) if kids else inputs[k])
            landing.append([ws.take(size, src.dtype) for _ in kids])
            # the child whose segments come first (the lowest) combines with the input
            heights = [tree.height[child] for child in kids]
            first.append(heights.index(min(heights)) if kids else 0)
        for r in range(max(len(cuts[k]) + trees[k].height[rank] for k in (0, 1))):
            requests, arrived = [], []
            for k, tree in enumerate(trees):
                j = r - tree.height[rank]
                if tree.parent[rank] is not None and 0 <= j < len(cuts[k]):
                    lo, hi = cuts[k][j]
                    requests.append(t.isend(partial[k][lo:hi], tree.parent[rank]))
            for k, tree in enumerate(trees):
                for i, child in enumerate(tree.children[rank]):
                    j = r - tree.height[child]
                    if 0 <= j < len(cuts[k]):
                        lo, hi = cuts[k][j]
                        requests.append(t.irecv(landing[k][i][lo:hi], child))
                        arrived.append((k, i, lo, hi))
            if requests:
                t.waitall(requests)
            for k, i, lo, hi in arrived:
                mine = inputs[k] if i == first[k] else partial[k]
                op(mine[lo:hi], landing[k][i][lo:hi], out=partial[k][lo:hi])
