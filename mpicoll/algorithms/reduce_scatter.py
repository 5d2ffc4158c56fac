"""Reduce-scatter: block j of the reduction of every rank's input ends up on rank j.

``src`` is this rank's whole input (read only), cut into p blocks by ``bounds``; ``dst``
receives the reduced block [rank]. n is the size of the whole input in bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..ops import Op
from ..transport import Transport
from ..transport.subset import Subset, node_groups, node_layout
from . import REGISTRY, register, swing
from .columns import columns
from .fold import Fold


def ring_reduce_scatter_steps(t: Transport, src: np.ndarray, bounds: tuple[int, ...], op: Op,
                              accumulator: Callable[[int, int], np.ndarray],
                              src_may_alias: bool = False) -> None:
    """The p-1 steps of the ring, shared by reduce_scatter and all_reduce.

    At step k a rank sends the partial sum it made at step k-1 (its own input block at
    first) to the right, and receives block (rank - k - 2) mod p from the left straight
    into ``accumulator(k, block)``, where its own input block is added in place (one
    pass over memory fewer than adding into a third buffer). After the last step the
    accumulator of block [rank] holds the full reduction. ``src_may_alias``: the
    accumulators may be ``src`` itself (an in-place all_reduce), so partial sums
    arrive in workspace first.
    """
    p, rank = t.size, t.rank
    right, left = (rank + 1) % p, (rank - 1) % p
    staging = None
    with t.workspace() as ws:
        if src_may_alias:
            staging = ws.take(max(bounds[i + 1] - bounds[i] for i in range(p)), src.dtype)
        b = (rank - 1) % p
        outgoing = src[bounds[b]:bounds[b + 1]]
        for step in range(p - 1):
            b = (rank - step - 2) % p
            lo, hi = bounds[b], bounds[b + 1]
            acc = accumulator(step, b)
            partial = acc if staging is None else staging[: hi - lo]
            t.sendrecv(outgoing, right, partial, left)
            op(partial, src[lo:hi], out=acc)
            outgoing = acc


@register("reduce_scatter", "ring", commutative_only=True)
def ring_reduce_scatter(t: Transport, src: np.ndarray, bounds: tuple[int, ...], op: Op,
                        dst: np.ndarray) -> None:
    """Ring: p-1 steps, each passing one block's partial sum to the right neighbour.

    Steps: p-1; bytes: (p-1)/p n per rank; reductions: (p-1)/p n per rank.
    Cost: (p-1)*alpha + (p-1)/p*n*(beta + gamma)
    """
    p = t.size
    widest = max(bounds[i + 1] - bounds[i] for i in range(p))
    with t.workspace() as ws:
        pair = ws.take(2 * widest, src.dtype)  # partial sums alternate between halves

        def accumulator(step: int, block: int) -> np.ndarray:
            if step == p - 2:
                return dst
            size = bounds[block + 1] - bounds[block]
            half = (step % 2) * widest
            return pair[half: half + size]

        if p == 1:
            dst[...] = src
            return
        ring_reduce_scatter_steps(t, src, bounds, op, accumulator)


@register("reduce_scatter", "recursive_halving", commutative_only=True)
def recursive_halving_reduce_scatter(t: Transport, src: np.ndarray, bounds: tuple[int, ...],
                                     op: Op, dst: np.ndarray) -> None:
    """Recursive halving: exchange half of the current window with the rank p2/2^k away.

    Any p: the extra ranks are folded onto the largest power of two p2 (2 more steps).
    Steps: lg p2 (+2 if folded); bytes and reductions: (p2-1)/p2 n per rank, plus n sent
    and reduced and one block sent back when folded.
    Cost: (lg p2 + 2*[p != p2])*alpha + (p2-1)/p2*n*(beta + gamma) + [p != p2]*(n*(beta + gamma) + n/p*beta)
    """
    p, rank = t.size, t.rank
    fold = Fold(p)
    total = bounds[p]
    with t.workspace() as ws:
        incoming = ws.take(total, src.dtype)
        cur = src  # the partial sums so far; becomes work after the first reduction
        if rank < 2 * fold.rem:
            if fold.sits_out(rank):
                t.send(src, rank + 1)
                t.recv(dst, rank + 1)
                return
            work = ws.take(total, src.dtype)
            t.recv(incoming, rank - 1)
            op(incoming, src, out=work)  # the lower rank's data is the left operand
            cur = work
        new = fold.new_rank(rank)
        lo_new, hi_new = 0, fold.p2  # the window of new ranks whose blocks are still summed
        mask = fold.p2 >> 1
        while mask:
            mid = lo_new + mask
            if new < mid:  # keep the lower half, send the upper
                keep, give = (lo_new, mid), (mid, hi_new)
            else:
                keep, give = (mid, hi_new), (lo_new, mid)
            klo, khi = bounds[fold.first_block(keep[0])], bounds[fold.end_block(keep[1] - 1)]
            glo, ghi = bounds[fold.first_block(give[0])], bounds[fold.end_block(give[1] - 1)]
            partner = fold.old_rank(new ^ mask)
            partial = incoming[: khi - klo]
            t.sendrecv(cur[glo:ghi], partner, partial, partner)
            before = cur[klo:khi]
            if cur is src:  # the first reduction reads the input and writes the workspace
                cur = ws.take(total, src.dtype)
            if partner < rank:
                op(partial, before, out=cur[klo:khi])
            else:
                op(before, partial, out=cur[klo:khi])
            lo_new, hi_new = keep
            mask >>= 1
        # the window is now this new rank alone: old blocks first_block..end_block
        mine = slice(bounds[rank], bounds[rank + 1])
        if rank < 2 * fold.rem:
            t.send(cur[bounds[rank - 1]:bounds[rank]], rank - 1)
        dst[...] = cur[mine]


@register("reduce_scatter", "pairwise", commutative_only=True)
def pairwise_reduce_scatter(t: Transport, src: np.ndarray, bounds: tuple[int, ...], op: Op,
                            dst: np.ndarray) -> None:
    """Pairwise exchange: at step k send block [rank + k] to its owner, and add in the
    block [rank] that rank - k sends; no partial sums travel, only inputs.

    Steps: p-1; bytes: (p-1)/p n per rank; reductions: (p-1)/p n per rank.
    Cost: (p-1)*(alpha + n/p*(beta + gamma))
    """
    p, rank = t.size, t.rank
    lo, hi = bounds[rank], bounds[rank + 1]
    with t.workspace() as ws:
        incoming = ws.take(hi - lo, src.dtype)
        dst[...] = src[lo:hi]
        for k in range(1, p):
            to, frm = (rank + k) % p, (rank - k) % p
            t.sendrecv(src[bounds[to]:bounds[to + 1]], to, incoming, frm)
            op(dst, incoming, out=dst)  # operands from ranks in any order: commutative only


def _bit_reversed(value: int, bits: int) -> int:
    return int(f"{value:0{bits}b}"[::-1], 2) if bits else 0


@register("reduce_scatter", "recursive_doubling")
def recursive_doubling_reduce_scatter(t: Transport, src: np.ndarray, bounds: tuple[int, ...],
                                      op: Op, dst: np.ndarray) -> None:
    """Recursive doubling for any op: pair with the rank 2^k away (k = 0, 1, ...), so the
    ranks summed so far are always a contiguous range and operands stay in rank order.

    At step k the pair splits the blocks they still hold: a rank keeps those whose bit k
    matches its own (blocks b = rank mod 2^(k+1)). The blocks are stored in bit-reversed
    order, so each kept set is one contiguous half of the window (MPICH's algorithm for
    non-commutative ops). Any p: extra ranks are folded onto p2 (2 more steps).
    Steps: lg p2 (+2 if folded); bytes and reductions: (p2-1)/p2 n per rank, plus n sent
    and reduced and one block sent back when folded, and a local copy of n.
    Cost: (lg p2 + 2*[p != p2])*alpha + (p2-1)/p2*n*(beta + gamma) + [p != p2]*(n*(beta + gamma) + n/p*beta)
    """
    p, rank = t.size, t.rank
    fold = Fold(p)
    bits = fold.p2.bit_length() - 1
    total = bounds[p]
    with t.workspace() as ws:
        incoming = ws.take(total, src.dtype)
        if fold.sits_out(rank):
            t.send(src, rank + 1)
            t.recv(dst, rank + 1)
            return
        # position q of work holds the blocks of new rank bit_reversed(q)
        order = [_bit_reversed(q, bits) for q in range(fold.p2)]
        spans = [(bounds[fold.first_block(i)], bounds[fold.end_block(i)]) for i in order]
        position = [0]
        for lo, hi in spans:
            position.append(position[-1] + hi - lo)
        work = ws.take(total, src.dtype)
        if rank < 2 * fold.rem:  # fold: the even rank below's input comes first
            t.recv(incoming, rank - 1)
            for q, (lo, hi) in enumerate(spans):
                op(incoming[lo:hi], src[lo:hi], out=work[position[q]:position[q + 1]])
        else:
            for q, (lo, hi) in enumerate(spans):
                work[position[q]:position[q + 1]] = src[lo:hi]
        new = fold.new_rank(rank)
        first, last = 0, fold.p2  # the window of positions this rank still holds
        for k in range(bits):
            middle = (first + last) // 2
            keep, give = ((first, middle), (middle, last)) if not new >> k & 1 else \
                ((middle, last), (first, middle))
            klo, khi = position[keep[0]], position[keep[1]]
            partner = new ^ (1 << k)
            partial = incoming[: khi - klo]
            t.sendrecv(work[position[give[0]]:position[give[1]]], fold.old_rank(partner),
                       partial, fold.old_rank(partner))
            kept = work[klo:khi]
            if partner < new:  # the partner's ranks come before mine
                op(partial, kept, out=kept)
            else:
                op(kept, partial, out=kept)
            first, last = keep
        # the window is position bit_reversed(new): the blocks of new rank `new`
        lo, hi = position[first], position[first + 1]
        if rank < 2 * fold.rem:  # hand the even rank below its block
            below = bounds[rank] - bounds[rank - 1]
            t.send(work[lo:lo + below], rank - 1)
            lo += below
        dst[...] = work[lo:hi]


@register("reduce_scatter", "swing", commutative_only=True)
def swing_reduce_scatter(t: Transport, src: np.ndarray, bounds: tuple[int, ...], op: Op,
                         dst: np.ndarray) -> None:
    """Swing (De Sensi et al., NSDI 2024): halve the blocks held at each step, trading
    with the rank rho(k) = 1, -1, 3, -5, ... away (ahead of even ranks, behind odd ones).

    At step k a rank keeps the blocks of the ranks its later steps reach (its subtree)
    and sends the peer those of the peer's subtree, adding in what the peer sends; the
    biggest halves go to the nearest ranks. A subtree's blocks are scattered in rank
    order, so the input is first copied into the order of Bine's labels, where every
    subtree is one contiguous range (algorithms/swing.py): one message per step.
    Commutative ops only. Any p: extra ranks are folded onto p2 (2 more steps).
    Steps: lg p2 (+2 if folded); bytes and reductions: (p2-1)/p2 n per rank, plus n sent
    and reduced and one block sent back when folded, and a local copy of n.
    Cost: (lg p2 + 2*[p != p2])*alpha + (p2-1)/p2*n*(beta + gamma) + [p != p2]*(n*(beta + gamma) + n/p*beta)
    """
    p, rank = t.size, t.rank
    fold = Fold(p)
    bits = fold.p2.bit_length() - 1
    label, rank_of = swing.labels(fold.p2)
    total = bounds[p]
    with t.workspace() as ws:
        incoming = ws.take(total, src.dtype)
        if fold.sits_out(rank):
            t.send(src, rank + 1)
            t.recv(dst, rank + 1)
            return
        # position q of work holds the blocks of the (new) rank labelled q
        spans = [(bounds[fold.first_block(i)], bounds[fold.end_block(i)]) for i in rank_of]
        position = [0]
        for lo, hi in spans:
            position.append(position[-1] + hi - lo)
        work = ws.take(total, src.dtype)
        if rank < 2 * fold.rem:  # fold: add the even rank below's input on the way
            t.recv(incoming, rank - 1)
            for q, (lo, hi) in enumerate(spans):
                op(incoming[lo:hi], src[lo:hi], out=work[position[q]:position[q + 1]])
        else:
            for q, (lo, hi) in enumerate(spans):
                work[position[q]:position[q + 1]] = src[lo:hi]
        new = fold.new_rank(rank)
        mine = label[new]
        for step in range(bits):
            there = swing.peer(new, step, fold.p2)
            keep = swing.window(mine, step + 1, bits)
            give = swing.window(label[there], step + 1, bits)
            kept = work[position[keep[0]]:position[keep[1]]]
            partial = incoming[: kept.size]
            partner = fold.old_rank(there)
            t.sendrecv(work[position[give[0]]:position[give[1]]], partner, partial, partner)
            op(partial, kept, out=kept)
        # what is left is position `mine`: this new rank's blocks
        lo, hi = position[mine], position[mine + 1]
        if rank < 2 * fold.rem:  # hand the even rank below its block
            below = bounds[rank] - bounds[rank - 1]
            t.send(work[lo:lo + below], rank - 1)
            lo += below
        dst[...] = work[lo:hi]


@register("reduce_scatter", "bine", commutative_only=True)
def bine_reduce_scatter(t: Transport, src: np.ndarray, bounds: tuple[int, ...], op: Op,
                        dst: np.ndarray) -> None:
    """Bine (De Sensi et al., SC 2025): recursive halving over the Bine butterfly, on the
    blocks as they lie, then one step that hands each summed block to its owner.

    Bine labels rank r with nu(r) (algorithms/swing.py) and lets it play the part of
    rank nu(r) in recursive halving: at step k it keeps the half of its window of blocks
    that holds block nu(r) and sends the other half to its Swing peer (1, -1, 3, -5, ...
    away), whose label differs in that bit. The windows are ranges of the input in rank
    order, so nothing is copied; it ends holding block nu(r) summed, and one more
    exchange sends it to rank nu(r). Commutative ops only. Any p: extra ranks are folded
    onto p2, and the last step gives each folded rank its block directly.
    Steps: lg p2 + 1 (+1 if folded); bytes and reductions: (p2-1)/p2 n per rank, plus a
    block of n/p2 delivered, and n sent and reduced when folded.
    Cost: (lg p2 + 1 + [p != p2])*alpha + (p2-1)/p2*n*(beta + gamma) + n/p2*beta + [p != p2]*n*(beta + gamma)
    """
    p, rank = t.size, t.rank
    fold = Fold(p)
    bits = fold.p2.bit_length() - 1
    label, rank_of = swing.labels(fold.p2)
    total = bounds[p]

    def span(labels: tuple[int, int]) -> tuple[int, int]:
        """The elements of the blocks of new ranks labels[0]..labels[1]-1."""
        return bounds[fold.first_block(labels[0])], bounds[fold.end_block(labels[1] - 1)]

    # my block is part of new rank j's, summed by the rank labelled j
    j = fold.new_rank(rank + 1 if fold.sits_out(rank) else rank)
    holder = fold.old_rank(rank_of[j])
    with t.workspace() as ws:
        incoming = ws.take(total, src.dtype)
        if fold.sits_out(rank):
            t.send(src, rank + 1)
            t.recv(dst, holder)
            return
        cur = src  # the partial sums so far; workspace after the first reduction
        if rank < 2 * fold.rem:
            work = ws.take(total, src.dtype)
            t.recv(incoming, rank - 1)
            op(incoming, src, out=work)  # the lower rank's data is the left operand
            cur = work
        new = fold.new_rank(rank)
        mine = label[new]
        for step in range(bits):
            there = swing.peer(new, step, fold.p2)
            klo, khi = span(swing.window(mine, step + 1, bits))
            glo, ghi = span(swing.window(label[there], step + 1, bits))
            partial = incoming[: khi - klo]
            partner = fold.old_rank(there)
            t.sendrecv(cur[glo:ghi], partner, partial, partner)
            before = cur[klo:khi]
            if cur is src:  # the first reduction reads the input and writes the workspace
                cur = ws.take(total, src.dtype)
            op(partial, before, out=cur[klo:khi])
        # deliver: block `mine` (one old block, or two when folded) to its owners
        requests = []
        for owner in range(fold.first_block(mine), fold.end_block(mine)):
            summed = cur[bounds[owner]:bounds[owner + 1]]
            if owner == rank:
                dst[...] = summed
            else:
                requests.append(t.isend(summed, owner))
        if holder != rank:
            requests.append(t.irecv(dst, holder))
        t.waitall(requests)


@register("reduce_scatter", "hierarchical", commutative_only=True,
          phases=(("intra", "reduce", "n"), ("inter", "reduce_scatter", "n"),
                  ("intra", "scatter", "q/p*n")))
def hierarchical_reduce_scatter(t: Transport, src: np.ndarray, bounds: tuple[int, ...], op: Op,
                                dst: np.ndarray, *, intra: str = "binomial",
                                inter: str = "ring") -> None:
    """Reduce inside each node to its first rank, reduce-scatter among those leaders so
    each gets its node's blocks, then scatter them inside the node.

    Steps: the intra algorithm's reduce and scatter among the q ranks of a node, the
    inter algorithm's reduce_scatter among the N leaders (below: binomial and ring).
    Cost: ceil(lg q)*(alpha_intra + n*beta_intra + n*gamma) + (N-1)*alpha + (N-1)/N*n*beta + (N-1)/N*n*gamma + ceil(lg q)*alpha_intra + (q-1)/p*n*beta_intra
    """
    mine, leaders, nodes = node_layout(t)
    node = Subset(t, mine)
    members = node_groups(nodes)  # (in the order of their leaders)
    order = tuple(r for group in members for r in group)
    with t.workspace() as ws:
        partial = ws.take(src.size, src.dtype) if node.rank == 0 else None
        REGISTRY["reduce"][intra].fn(node, src, partial, op, 0)
        mine_bounds = tuple(0 if not i else sum(bounds[r + 1] - bounds[r] for r in mine[:i])
                            for i in range(len(mine) + 1))
        ours = None
        if node.rank == 0:
            ours = ws.take(mine_bounds[-1], src.dtype)  # this node's blocks, in rank order
            if len(leaders) > 1:
                packed = ws.take(src.size, src.dtype)  # the blocks, node after node
                k = 0
                for r in order:
                    size = bounds[r + 1] - bounds[r]
                    packed[k:k + size] = partial[bounds[r]:bounds[r + 1]]
                    k += size
                node_bounds = [0]
                for group in members:
                    node_bounds.append(node_bounds[-1] + sum(bounds[r + 1] - bounds[r] for r in group))
                REGISTRY["reduce_scatter"][inter].fn(Subset(t, leaders), packed,
                                                     tuple(node_bounds), op, ours)
            else:
                k = 0
                for r in mine:
                    size = bounds[r + 1] - bounds[r]
                    ours[k:k + size] = partial[bounds[r]:bounds[r + 1]]
                    k += size
        REGISTRY["scatter"][intra].fn(node, ours, dst, mine_bounds, 0)


@register("reduce_scatter", "hierarchical_sharded", commutative_only=True,
          phases=(("intra", "reduce_scatter", "q/s*n"), ("inter", "reduce_scatter", "n/s")))
def hierarchical_sharded_reduce_scatter(t: Transport, src: np.ndarray, bounds: tuple[int, ...],
                                        op: Op, dst: np.ndarray, *, intra: str = "ring",
                                        inter: str = "ring") -> None:
    """Reduce-scatter inside each node into one shard per rank (shard j: the blocks of
    every node's rank j), then reduce-scatter each shard among the ranks that hold it, one
    per node, so that each gets its own block (two hops, as the hierarchical collectives
    of MiCS for sharded training across nodes, Zhang et al. 2022): a rank sends 1/q of
    the data between nodes, and a node's q ranks send theirs at once, where
    ``hierarchical`` sends it all through one leader.

    Steps: the intra algorithm's reduce_scatter among the q ranks of a node, the inter
    algorithm's among the N holders of a shard (below: ring for both). The blocks are
    packed shard by shard first (``columns``: a copy of the input in memory). On uneven
    nodes there are s shards, s the smallest node's ranks; a larger node's rank i >= s
    gets its block from the holder of shard i mod s (one message more, not counted
    below). Between nodes the cost counts each of a node's s streams at the link's beta,
    as if they did not share it.
    Cost: (q-1)*alpha_intra + (q-1)/s*n*(beta_intra + gamma) + (N-1)*alpha + (N-1)/N*n/s*(beta + gamma)
    """
    grid = columns(t, bounds)
    if len(grid.members) == 1:  # one node: its ranks' blocks are its shards, in order
        REGISTRY["reduce_scatter"][intra].fn(t, src, bounds, op, dst)
        return
    with t.workspace() as ws:
        packed = ws.take(bounds[-1], src.dtype)  # the blocks shard by shard (apart from dst)
        grid.pack(src, packed)
        j = grid.column
        shard = ws.take(grid.shard_bounds[j + 1] - grid.shard_bounds[j] if grid.holds else 0,
                        src.dtype)
        REGISTRY["reduce_scatter"][intra].fn(Subset(t, grid.mine), packed, grid.node_bounds,
                                             op, shard)
        if not grid.holds:  # its block comes from its column's holder
            t.recv(dst, grid.holder)
            return
        parts, k = grid.part_bounds, grid.node
        ours = ws.take(parts[k + 1] - parts[k], src.dtype)  # the blocks this column carries
        REGISTRY["reduce_scatter"][inter].fn(Subset(t, grid.holders), shard, parts, op, ours)
        at = 0
        for r in grid.carried:  # this rank's own first, then the others' it carries
            size = bounds[r + 1] - bounds[r]
            if r == t.rank:
                dst[...] = ours[at:at + size]
            else:
                t.send(ours[at:at + size], r)
            at += size
