"""Reduce: the reduction of every rank's input ends up on the root.

``src`` is this rank's input (read only unless it is ``dst``); ``dst`` receives the result
at the root and may be None elsewhere (where it is given, it serves as workspace).
Operands are combined in rank order (x0 op x1 op ...), so non-commutative ops are exact.
n is the message size in bytes.
"""

from __future__ import annotations

import numpy as np

from ..ops import Op
from ..transport import Transport
from . import register


@register("reduce", "linear")
def linear_reduce(t: Transport, src: np.ndarray, dst: np.ndarray | None, op: Op, root: int) -> None:
    """Every rank sends its input to the root, which combines them in rank order.

    Steps: p-1 messages into the root; bytes: (p-1) n into the root.
    Cost: (p-1)*(alpha + n*beta + n*gamma)
    """
    p, rank = t.size, t.rank
    if rank != root:
        t.send(src, root)
        return
    assert dst is not None
    incoming = t.scratch(src.size, src.dtype, slot=1)
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
    incoming = t.scratch(src.size, src.dtype, slot=1)
    acc = dst if dst is not None else t.scratch(src.size, src.dtype, slot=2)
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
    if tree_root != root:
        if rank == tree_root:
            t.send(cur, root)
        elif rank == root:
            t.recv(dst, tree_root)
        return
    if rank == root and cur is not dst:  # one rank, or no child
        dst[...] = src
