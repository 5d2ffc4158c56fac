"""All-reduce: the reduction of every rank's input ends up on every rank.

``src`` is this rank's input (read only unless it is ``dst``); ``dst`` receives the
result and may be ``src`` itself (in place). n is the message size in bytes.
"""

from __future__ import annotations

import numpy as np

from ..buffers import chunk_bounds, even_bounds
from ..ops import Op
from ..transport import Transport
from ..transport.subset import Subset, node_layout
from . import REGISTRY, register
from .all_gather import recursive_doubling_all_gather, ring_all_gather
from .broadcast import binomial_broadcast, segment_bounds
from .fold import Fold
from .reduce import binomial_reduce
from .reduce_scatter import recursive_halving_reduce_scatter, ring_reduce_scatter_steps


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
    ring_reduce_scatter_steps(t, src, bounds, op, lambda step, b: dst[bounds[b]:bounds[b + 1]],
                              src_may_alias=dst is src)
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
    with t.workspace() as ws:
        incoming = ws.take(src.size, src.dtype)
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


@register("all_reduce", "rabenseifner", commutative_only=True)
def rabenseifner_all_reduce(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    """Rabenseifner: a recursive-halving reduce_scatter of p chunks, then a
    recursive-doubling all_gather of the chunks; for large messages at many ranks.

    Half the ring's bandwidth term's steps: lg p2 each way instead of p-1. Any p: each
    half folds the extra ranks onto p2 (2 more steps each).
    Steps: 2 lg p2 (+4 if folded); bytes: 2 (p2-1)/p2 n per rank (+2n + 2n/p folded);
    reductions: (p2-1)/p2 n (+n folded).
    Cost: (2*lg p2 + 4*[p != p2])*alpha + 2*(p2-1)/p2*n*beta + (p2-1)/p2*n*gamma + [p != p2]*(2*n*beta + 2*n/p*beta + n*gamma)
    """
    p, rank = t.size, t.rank
    bounds = chunk_bounds(src.size, p)
    recursive_halving_reduce_scatter(t, src, bounds, op, dst[bounds[rank]:bounds[rank + 1]])
    recursive_doubling_all_gather(t, dst, bounds)


@register("all_reduce", "ring_pipelined", commutative_only=True)
def ring_pipelined_all_reduce(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op, *,
                              segment_bytes: int = 1 << 18) -> None:
    """Ring, with each chunk cut into S segments that are sent as soon as they are ready.

    Every receive and send of a step is posted at once; a segment is reduced the moment
    it arrives, while the next ones are still on the wire, and is sent on to the right
    neighbour at once (the next step's message), so reduction and transfer overlap
    across segments and across steps, as in NCCL's ring.
    Steps: 2(p-1) of S segments each; bytes: 2 (p-1)/p n per rank; reductions:
    (p-1)/p n per rank, overlapped with the transfers.
    Cost: 2*(p-1)*S*alpha + 2*(p-1)/p*n*beta + (p-1)/p*n*gamma/S
    """
    p, rank = t.size, t.rank
    with t.workspace() as ws:
        if p == 1:
            if dst is not src:
                dst[...] = src
            return
        bounds = chunk_bounds(src.size, p)
        segment = max(1, segment_bytes // src.itemsize)
        right, left = (rank + 1) % p, (rank - 1) % p
        # partial sums arrive straight in the result, or in workspace when it is the input
        arrive = dst if dst is not src else None
        staging = ws.take(bounds[1] - bounds[0], src.dtype)  # chunk 0 is the widest

        def segments(block: int) -> list[tuple[int, int]]:
            return segment_bounds(bounds[block], bounds[block + 1], segment)

        # reduce_scatter: at step k receive block (rank - k - 2) mod p, add my input to it,
        # and send each summed segment on; my own input block (rank - 1) starts the ring
        sends = [t.isend(src[lo:hi], right) for lo, hi in segments((rank - 1) % p)]
        for step in range(p - 1):
            block = (rank - step - 2) % p
            base = bounds[block]
            pending = sends
            partials = [arrive[lo:hi] if arrive is not None else staging[lo - base:hi - base]
                        for lo, hi in segments(block)]
            receives = [t.irecv(partial, left) for partial in partials]
            sends = []
            for (lo, hi), partial, request in zip(segments(block), partials, receives, strict=True):
                t.waitall([request])
                op(partial, src[lo:hi], out=dst[lo:hi])
                sends.append(t.isend(dst[lo:hi], right))  # the next step's (or the gather's) message
            t.waitall(pending)  # before the gather overwrites blocks they read
        # all_gather: my block (rank) is on its way; pass each block received on to the
        # right until it has gone round
        for step in range(p - 1):
            block = (rank - step - 1) % p
            receives = [t.irecv(dst[lo:hi], left) for lo, hi in segments(block)]
            for (lo, hi), request in zip(segments(block), receives, strict=True):
                t.waitall([request])
                if step < p - 2:
                    sends.append(t.isend(dst[lo:hi], right))
        t.waitall(sends)


@register("all_reduce", "allgather_reduce")
def allgather_reduce_all_reduce(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    """Every rank gathers every input (recursive doubling), then reduces them locally in
    rank order: the fewest steps, for tiny messages; any op.

    Steps: lg p2 (+2 if folded); bytes: (p-1) n per rank; reductions: (p-1) n per rank.
    Cost: (lg p2 + 2*[p != p2])*alpha + (p-1)*n*beta + (p-1)*n*gamma
    """
    p, rank, m = t.size, t.rank, src.size
    with t.workspace() as ws:
        everyone = ws.take(p * m, src.dtype)
        everyone[rank * m:(rank + 1) * m] = src
        recursive_doubling_all_gather(t, everyone, even_bounds(m, p))
        if p == 1:
            dst[...] = src
            return
        op(everyone[:m], everyone[m:2 * m], out=dst)
        for r in range(2, p):
            op(dst, everyone[r * m:(r + 1) * m], out=dst)


@register("all_reduce", "hierarchical", commutative_only=True,
          phases={"intra": ("reduce", "broadcast"), "inter": ("all_reduce",)})
def hierarchical_all_reduce(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op, *,
                            intra: str = "binomial", inter: str = "ring") -> None:
    """Reduce inside each node to its first rank, all-reduce among those leaders, then
    broadcast inside each node (MPICH's SMP-aware all_reduce, Horovod's hierarchical one):
    the links between nodes carry one rank's share per node, not every rank's.

    Steps: the intra algorithm's reduce and broadcast among the q ranks of a node, the
    inter algorithm's all_reduce among the N leaders (below: binomial and ring).
    Cost: 2*ceil(lg q)*(alpha_intra + n*beta_intra) + ceil(lg q)*n*gamma + 2*(N-1)*alpha + 2*(N-1)/N*n*beta + (N-1)/N*n*gamma
    """
    mine, leaders, _ = node_layout(t)
    node = Subset(t, mine)
    REGISTRY["reduce"][intra].fn(node, src, dst, op, 0)  # dst: the partial at the leader
    if node.rank == 0 and len(leaders) > 1:
        REGISTRY["all_reduce"][inter].fn(Subset(t, leaders), dst, dst, op)
    REGISTRY["broadcast"][intra].fn(node, dst, 0)
