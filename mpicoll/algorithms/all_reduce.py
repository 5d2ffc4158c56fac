"""All-reduce: the reduction of every rank's input ends up on every rank.

``src`` is this rank's input (read only unless it is ``dst``); ``dst`` receives the
result and may be ``src`` itself (in place). n is the message size in bytes.
"""

from __future__ import annotations

import numpy as np

from ..buffers import chunk_bounds
from ..ops import Op
from ..transport import Transport
from . import register
from .all_gather import ring_all_gather
from .broadcast import binomial_broadcast
from .fold import Fold
from .reduce import binomial_reduce
from .reduce_scatter import ring_reduce_scatter_steps


@register("all_reduce", "ring", commutative_only=True)
def ring_all_reduce(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    """Ring: a ring reduce_scatter of p chunks, then a ring all_gather of the chunks.

    Steps: 2(p-1); bytes: 2 (p-1)/p n per rank; reductions: (p-1)/p n per rank.
    Cost: 2*(p-1)*alpha + 2*(p-1)/p*n*beta + (p-1)/p*n*gamma
    """
    p = t.size
    if p == 1:
        if dst is not src:
            dst[...] = src
        return
    bounds = chunk_bounds(src.size, p)
    # the partial sums of each chunk go straight into the result buffer
    ring_reduce_scatter_steps(t, src, bounds, op,
                              lambda step, b: dst[bounds[b]:bounds[b + 1]])
    ring_all_gather(t, dst, bounds)


@register("all_reduce", "recursive_doubling")
def recursive_doubling_all_reduce(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    """Recursive doubling: exchange the whole partial result with the rank 2^k away.

    Any p: the extra ranks are folded onto the largest power of two p2 (2 more steps).
    Operands are combined in rank order, so non-commutative ops are exact too.
    Steps: lg p2 (+2 if folded); bytes: n lg p2 per rank; reductions: n lg p2.
    Cost: (lg p2 + 2*[p != p2])*(alpha + n*beta) + (lg p2 + [p != p2])*n*gamma
    """
    p, rank = t.size, t.rank
    fold = Fold(p)
    incoming = t.scratch(src.size, src.dtype, slot=1)
    cur = src
    if rank < 2 * fold.rem:
        if fold.sits_out(rank):
            t.send(src, rank + 1)
            t.recv(dst, rank + 1)
            return
        t.recv(incoming, rank - 1)
        op(incoming, src, out=dst)
        cur = dst
    new = fold.new_rank(rank)
    mask = 1
    while mask < fold.p2:
        partner = fold.old_rank(new ^ mask)
        t.sendrecv(cur, partner, incoming, partner)
        if partner < rank:
            op(incoming, cur, out=dst)
        else:
            op(cur, incoming, out=dst)
        cur = dst
        mask <<= 1
    if cur is not dst:  # one rank: nothing was exchanged
        dst[...] = src
    if rank < 2 * fold.rem:
        t.send(dst, rank - 1)


@register("all_reduce", "reduce_broadcast")
def reduce_broadcast_all_reduce(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    """A binomial reduce to rank 0, then a binomial broadcast from rank 0.

    Steps: 2 ceil(lg p); bytes: 2 n ceil(lg p) on the critical path.
    Cost: 2*ceil(lg p)*(alpha + n*beta) + ceil(lg p)*n*gamma
    """
    binomial_reduce(t, src, dst, op, 0)
    binomial_broadcast(t, dst, 0)
