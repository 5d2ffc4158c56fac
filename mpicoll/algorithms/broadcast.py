"""Broadcast: the root's buffer ends up on every rank.

Ranks are numbered relative to the root (rel = (rank - root) mod p) so that every tree
below is rooted at rel 0. n is the message size in bytes.
"""

from __future__ import annotations

import numpy as np

from ..buffers import chunk_bounds
from ..transport import Transport
from . import register
from .all_gather import ring_all_gather


@register("broadcast", "linear")
def linear_broadcast(t: Transport, buf: np.ndarray, root: int) -> None:
    """The root sends the whole buffer to each rank in turn.

    Steps: p-1 messages, all from the root; bytes: (p-1) n leave the root.
    Cost: (p-1)*(alpha + n*beta)
    """
    if t.rank == root:
        t.waitall([t.isend(buf, r) for r in range(t.size) if r != root])
    else:
        t.recv(buf, root)


@register("broadcast", "binomial")
def binomial_broadcast(t: Transport, buf: np.ndarray, root: int) -> None:
    """Binomial tree: each rank that has the data sends it to a rank 2^k away.

    Steps: ceil(lg p) rounds; bytes: n per message, (p-1) n in all.
    Cost: ceil(lg p)*(alpha + n*beta)
    """
    p, rank = t.size, t.rank
    rel = (rank - root) % p
    # receive from the parent: the rank that differs in rel's lowest set bit
    mask = 1
    while mask < p:
        if rel & mask:
            t.recv(buf, (rank - mask) % p)
            break
        mask <<= 1
    # send to the children rel + mask for every mask below that bit, farthest first
    mask >>= 1
    while mask > 0:
        if rel + mask < p:
            t.send(buf, (rank + mask) % p)
        mask >>= 1


def binomial_scatter(t: Transport, work: np.ndarray, bounds: tuple[int, ...], root: int) -> None:
    """Scatter blocks indexed by relative rank down a binomial tree, in place.

    Block j (elements ``bounds[j]:bounds[j+1]``) belongs to relative rank j. ``work``
    starts at this rank's own block and has room for its whole subtree, the relative
    ranks [rel, rel + subtree); the root's ``work`` holds every block. On return each
    rank's ``work`` holds its subtree's blocks. Empty blocks send no message.
    """
    p, rank = t.size, t.rank
    rel = (rank - root) % p
    base = bounds[rel]
    mask = 1
    while mask < p:
        if rel & mask:
            hi = bounds[min(rel + mask, p)]
            if hi > base:
                t.recv(work[: hi - base], (rank - mask) % p)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        child = rel + mask
        if child < p:
            lo, hi = bounds[child], bounds[min(child + mask, p)]
            if hi > lo:
                t.send(work[lo - base: hi - base], (rank + mask) % p)
        mask >>= 1


@register("broadcast", "scatter_allgather")
def scatter_allgather_broadcast(t: Transport, buf: np.ndarray, root: int) -> None:
    """Van de Geijn: binomial scatter of p chunks, then a ring all_gather of the chunks.

    Steps: ceil(lg p) + p-1; bytes: about 2 (p-1)/p n per rank, for large messages.
    Cost: (ceil(lg p) + p-1)*alpha + 2*(p-1)/p*n*beta
    """
    p = t.size
    bounds = chunk_bounds(buf.size, p)  # chunk j belongs to relative rank j
    rel = (t.rank - root) % p
    binomial_scatter(t, buf[bounds[rel]:], bounds, root)
    ring_all_gather(t, buf, bounds, owner_shift=root)
