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
from .gather import binomial_gather
from .reduce_scatter import recursive_halving_reduce_scatter
from .trees import knomial_children, knomial_parent


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
    Cost: ceil(log_k p)*(k-1)*(alpha + n*beta + n*gamma)
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

    Steps: lg p2 + ceil(lg p) (+2 if folded); bytes: about 2 (p-1)/p n at the root.
    Cost: (lg p2 + ceil(lg p) + 2*[p != p2])*alpha + 2*(p-1)/p*n*beta + (p-1)/p*n*gamma
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
          phases={"intra": ("reduce",), "inter": ("reduce",)})
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
