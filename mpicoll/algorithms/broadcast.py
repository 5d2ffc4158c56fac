"""Broadcast: the root's buffer ends up on every rank.

Ranks are numbered relative to the root (rel = (rank - root) mod p) so that every tree
below is rooted at rel 0. n is the message size in bytes.
"""

from __future__ import annotations

import numpy as np

from ..buffers import chunk_bounds
from ..transport import Transport
from ..transport.subset import Subset, heads_for, node_layout
from . import REGISTRY, register
from .all_gather import ring_all_gather
from .trees import BineTree, double_binary_tree, knomial_children, knomial_parent


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


def segment_bounds(lo: int, hi: int, segment: int) -> list[tuple[int, int]]:
    """Cut elements [lo, hi) into segments of ``segment`` elements (the last one shorter)."""
    return [(s, min(s + segment, hi)) for s in range(lo, hi, segment)]


@register("broadcast", "pipelined_chain")
def pipelined_chain_broadcast(t: Transport, buf: np.ndarray, root: int, *,
                              segment_bytes: int = 1 << 16) -> None:
    """Chain: root -> root+1 -> ... -> root-1, the data cut into S segments that follow
    each other down the chain, so every link carries a segment at once.

    Each rank forwards a segment as soon as it has it. Steps: p-1+S-1 segment times;
    bytes: n per rank (received once, sent once).
    Cost: (p-1 + S-1)*(alpha + n/S*beta)
    """
    p, rank = t.size, t.rank
    if p == 1:
        return
    rel = (rank - root) % p
    right, left = (rank + 1) % p, (rank - 1) % p
    segments = segment_bounds(0, buf.size, max(1, segment_bytes // buf.itemsize))
    if rel == 0:
        t.waitall([t.isend(buf[lo:hi], right) for lo, hi in segments])
        return
    receives = [t.irecv(buf[lo:hi], left) for lo, hi in segments]
    sends = []
    for (lo, hi), request in zip(segments, receives, strict=True):
        t.waitall([request])
        if rel < p - 1:  # the last rank of the chain only receives
            sends.append(t.isend(buf[lo:hi], right))
    t.waitall(sends)


@register("broadcast", "knomial")
def knomial_broadcast(t: Transport, buf: np.ndarray, root: int, *, radix: int = 4) -> None:
    """K-nomial tree: each rank that has the data sends it to up to k-1 children per level.

    Fewer rounds than binomial (log_k p) for more messages per round; k = 2 is binomial.
    Steps: ceil(log_k p) rounds of up to k-1 sends; bytes: n per message, (p-1) n in all.
    Cost: ceil(log_k p)*min(k-1, p-1)*(alpha + n*beta)
    """
    p, rank = t.size, t.rank
    rel = (rank - root) % p
    parent = knomial_parent(rel, radix)
    if parent is not None:
        t.recv(buf, (parent + root) % p)
    children = knomial_children(rel, p, radix)
    # the children with the largest subtrees first: they have the most forwarding to do
    t.waitall([t.isend(buf, (child + root) % p) for child, _ in reversed(children)])


@register("broadcast", "hierarchical",
          phases=(("inter", "broadcast", "n"), ("intra", "broadcast", "n")))
def hierarchical_broadcast(t: Transport, buf: np.ndarray, root: int, *, intra: str = "binomial",
                           inter: str = "binomial") -> None:
    """The root sends to one rank per node (itself for its own node), each of which then
    broadcasts inside its node (MPICH's SMP-aware broadcast, Open MPI's han): the data
    crosses between nodes N-1 times, not p-1.

    Steps: the inter algorithm among the N node heads, then the intra algorithm among the
    q ranks of each node (below: binomial for both).
    Cost: ceil(lg N)*(alpha + n*beta) + ceil(lg q)*(alpha_intra + n*beta_intra)
    """
    mine, leaders, nodes = node_layout(t)
    heads = heads_for(root, leaders, nodes)
    if t.rank in heads and len(heads) > 1:
        REGISTRY["broadcast"][inter].fn(Subset(t, heads), buf, heads.index(root))
    head = next(h for h in heads if nodes[h] == nodes[t.rank])
    REGISTRY["broadcast"][intra].fn(Subset(t, mine), buf, mine.index(head))


@register("broadcast", "bine")
def bine_broadcast(t: Transport, buf: np.ndarray, root: int) -> None:
    """Bine tree (De Sensi et al., SC 2025): a binomial tree whose step-s edges are
    rho(s) = 1, -1, 3, -5, 11, ... ranks long (forward from an even relative rank,
    backward from an odd one) instead of 2^s, so the data crosses fewer links of a ring
    or torus.

    Each rank receives the buffer from its parent, then sends it to its children, the
    one with the largest subtree (the farthest) first. Any p: the binomial tree of the
    labels < p, laid out in negabinary value order (``trees``, Bine trees), so no edge
    is longer than in the paper's tree of the next power of two. Steps: ceil(lg p)
    rounds; bytes: n per message, (p-1) n in all, as binomial; the alpha-beta model does
    not see that the messages travel about a third less far.
    Cost: ceil(lg p)*(alpha + n*beta)
    """
    tree = BineTree(t.size, root)
    me = tree.label(t.rank)
    parent = tree.parent(me)
    if parent is not None:
        t.recv(buf, tree.rank(parent))
    t.waitall([t.isend(buf, tree.rank(child)) for child in reversed(tree.children(me))])


@register("broadcast", "double_binary_tree")
def double_binary_tree_broadcast(t: Transport, buf: np.ndarray, root: int, *,
                                 segment_bytes: int = 1 << 16) -> None:
    """Double binary tree (Sanders, Speck and Traeff 2009; NCCL's tree): each half of the
    buffer goes down its own binary tree, cut into S/2 segments that follow each other,
    so every level of both trees carries a segment at once.

    Any p, any root: the other p-1 ranks, labelled rel = (rank - root) mod p, form both
    trees, in-order binary trees over the labels 1..p-1 where tree 2 is tree 1 mirrored
    (p-1 even) or shifted by one (p-1 odd) (``trees``). So a rank is interior in at most
    one tree: it forwards at most n bytes (two children times half the data), where one
    binary tree's interior ranks would forward 2n and its leaves nothing. The root sends
    half 1 to tree 1's top and half 2 to tree 2's top, a segment of each in turn.

    Rounds: in round r a rank at depth d (the root's is 0) sends segment r-d of each half
    to its children in that tree and receives segment r-d+1 from its parent; a round's
    messages are posted together, tree 1's first, and waited for together, so two ranks
    always agree on the order of the messages between them (one tag per call) and NCCL
    issues one group per round. Steps: about 2 ceil(lg p) + S segment times (two sends per
    level); bytes: n into every rank but the root, at most n out of any rank.
    Cost: (2*ceil(lg p) + S)*(alpha + n/S*beta)
    """
    p, rank = t.size, t.rank
    if p == 1:
        return
    trees = double_binary_tree(p, root)
    halves = chunk_bounds(buf.size, 2)
    segment = max(1, segment_bytes // buf.itemsize)
    cuts = [segment_bounds(halves[k], halves[k + 1], segment) for k in (0, 1)]
    for r in range(max(len(cuts[k]) + trees[k].depth[rank] for k in (0, 1))):
        requests = []
        for tree, segments in zip(trees, cuts, strict=True):
            j = r - tree.depth[rank]  # received last round (the root holds them all)
            if 0 <= j < len(segments):
                lo, hi = segments[j]
                requests += [t.isend(buf[lo:hi], child) for child in tree.children[rank]]
        for tree, segments in zip(trees, cuts, strict=True):
            j = r - tree.depth[rank] + 1
            if tree.parent[rank] is not None and 0 <= j < len(segments):
                lo, hi = segments[j]
                requests.append(t.irecv(buf[lo:hi], tree.parent[rank]))
        if requests:
            t.waitall(requests)
