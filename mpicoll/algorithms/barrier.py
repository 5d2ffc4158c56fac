"""Barrier: no rank leaves before every rank has entered. Messages are empty."""

from __future__ import annotations

import numpy as np

from ..transport import Transport
from ..transport.subset import Subset, node_layout
from . import REGISTRY, register
from .trees import knomial_children, knomial_parent

_EMPTY = np.empty(0, np.uint8)


@register("barrier", "linear")
def linear_barrier(t: Transport) -> None:
    """Every rank tells rank 0 it arrived; rank 0 then releases them all.

    Steps: 2 rounds of p-1 messages through rank 0.
    Cost: 2*(p-1)*alpha
    """
    p, rank = t.size, t.rank
    if rank == 0:
        t.waitall([t.irecv(_EMPTY, r) for r in range(1, p)])
        t.waitall([t.isend(_EMPTY, r) for r in range(1, p)])
    else:
        t.send(_EMPTY, 0)
        t.recv(_EMPTY, 0)


@register("barrier", "dissemination")
def dissemination_barrier(t: Transport) -> None:
    """Dissemination: in round k every rank signals rank + 2^k and waits for rank - 2^k.

    Steps: ceil(lg p) rounds, any p.
    Cost: ceil(lg p)*alpha
    """
    p, rank = t.size, t.rank
    distance = 1
    while distance < p:
        t.sendrecv(_EMPTY, (rank + distance) % p, _EMPTY, (rank - distance) % p)
        distance <<= 1


@register("barrier", "recursive_doubling")
def recursive_doubling_barrier(t: Transport) -> None:
    """Recursive doubling: in round k exchange with the rank 2^k away (rank XOR 2^k).

    Any p: each rank >= p2 first signals rank - p2, which answers once the p2 ranks are
    through. Steps: lg p2 (+2 if p is not a power of two).
    Cost: (lg p2 + 2*[p != p2])*alpha
    """
    p, rank = t.size, t.rank
    p2 = 1 << (p.bit_length() - 1)
    if rank >= p2:
        t.send(_EMPTY, rank - p2)
        t.recv(_EMPTY, rank - p2)
        return
    extra = rank + p2 < p
    if extra:
        t.recv(_EMPTY, rank + p2)
    mask = 1
    while mask < p2:
        t.sendrecv(_EMPTY, rank ^ mask, _EMPTY, rank ^ mask)
        mask <<= 1
    if extra:
        t.send(_EMPTY, rank + p2)


@register("barrier", "knomial")
def knomial_barrier(t: Transport, *, radix: int = 4) -> None:
    """K-nomial tree: arrivals gather up the tree to rank 0, the release goes back down.

    Steps: 2 ceil(log_k p) levels of up to k-1 messages each.
    Cost: 2*ceil(log_k p)*min(k-1, p-1)*alpha
    """
    p, rank = t.size, t.rank
    children = [child for child, _ in knomial_children(rank, p, radix)]
    parent = knomial_parent(rank, radix)
    t.waitall([t.irecv(_EMPTY, child) for child in children])
    if parent is not None:
        t.send(_EMPTY, parent)
        t.recv(_EMPTY, parent)
    t.waitall([t.isend(_EMPTY, child) for child in children])


@register("barrier", "hierarchical",
          phases=(("intra", "barrier", "0"), ("inter", "barrier", "0"), ("intra", "barrier", "0")))
def hierarchical_barrier(t: Transport, *, intra: str = "dissemination",
                         inter: str = "dissemination") -> None:
    """A barrier inside each node, one among the nodes' first ranks, and one inside each
    node again: no rank leaves before every node's leader knew its node had arrived.

    Steps: twice the intra algorithm among the q ranks of a node, once the inter
    algorithm among the N leaders (below: dissemination for both).
    Cost: 2*ceil(lg q)*alpha_intra + ceil(lg N)*alpha
    """
    mine, leaders, _ = node_layout(t)
    node = Subset(t, mine)
    REGISTRY["barrier"][intra].fn(node)
    if node.rank == 0 and len(leaders) > 1:
        REGISTRY["barrier"][inter].fn(Subset(t, leaders))
    REGISTRY["barrier"][intra].fn(node)
