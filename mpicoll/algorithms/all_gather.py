"""All-gather: every rank's block ends up on every rank, in rank order.

Algorithms work in place on the result buffer: on entry block [rank] (elements
``bounds[rank]:bounds[rank+1]``) holds this rank's data; on return every block is
filled. Blocks may differ in size. n is the size of the whole result in bytes.
"""

from __future__ import annotations

import numpy as np

from ..buffers import rotated_bounds
from ..transport import Transport
from ..transport.subset import Subset, node_groups, node_layout
from . import REGISTRY, register, swing
from .columns import columns
from .fold import Fold


@register("all_gather", "ring")
def ring_all_gather(t: Transport, buf: np.ndarray, bounds: tuple[int, ...],
                    owner_shift: int = 0) -> None:
    """Ring: at each step pass the block received last to the right neighbour.

    Steps: p-1; bytes: (p-1)/p n per rank. Rank r owns block (r - owner_shift) mod p on
    entry (broadcast's scatter_allgather uses the shift to index blocks by relative rank).
    Cost: (p-1)*alpha + (p-1)/p*n*beta
    """
    p, rank = t.size, t.rank
    right, left = (rank + 1) % p, (rank - 1) % p
    own = (rank - owner_shift) % p
    for step in range(p - 1):
        s = (own - step) % p       # the block this rank got last step (its own at first)
        r = (own - step - 1) % p   # the block the left neighbour got last step
        t.sendrecv(buf[bounds[s]:bounds[s + 1]], right, buf[bounds[r]:bounds[r + 1]], left)


@register("all_gather", "recursive_doubling")
def recursive_doubling_all_gather(t: Transport, buf: np.ndarray, bounds: tuple[int, ...]) -> None:
    """Recursive doubling: exchange all blocks held so far with the rank 2^k away.

    Any p: the extra ranks are folded onto the largest power of two p2 (2 more steps).
    Steps: lg p2 (+2 if p is not a power of two); bytes: (p-1)/p n per rank.
    Cost: (lg p2 + 2*[p != p2])*alpha + (p-1)/p*n*beta + [p != p2]*(n/p + n)*beta
    """
    p, rank = t.size, t.rank
    fold = Fold(p)
    if rank < 2 * fold.rem:
        # fold: the even rank gives its block to the odd rank above it and sits out
        if fold.sits_out(rank):
            t.send(buf[bounds[rank]:bounds[rank + 1]], rank + 1)
        else:
            t.recv(buf[bounds[rank - 1]:bounds[rank]], rank - 1)
    new = fold.new_rank(rank)
    if new is not None:
        mask = 1
        while mask < fold.p2:
            # my window: the mask new ranks aligned with me; the partner's: the next ones
            mine = new & ~(mask - 1)
            theirs = mine ^ mask
            lo, hi = bounds[fold.first_block(mine)], bounds[fold.end_block(mine + mask - 1)]
            plo, phi = bounds[fold.first_block(theirs)], bounds[fold.end_block(theirs + mask - 1)]
            partner = fold.old_rank(new ^ mask)
            t.sendrecv(buf[lo:hi], partner, buf[plo:phi], partner)
            mask <<= 1
    if rank < 2 * fold.rem:
        # unfold: the odd rank hands the whole result to the even rank below it
        if fold.sits_out(rank):
            t.recv(buf, rank + 1)
        else:
            t.send(buf, rank - 1)


@register("all_gather", "bruck")
def bruck_all_gather(t: Transport, buf: np.ndarray, bounds: tuple[int, ...]) -> None:
    """Bruck: at step k send every block held so far to rank - 2^k; lg p steps at any p.

    Each rank works on its blocks laid out from its own on (rank, rank+1, ...), so the
    blocks it holds are always one prefix and the ones it receives land right after;
    a final local rotation puts them in rank order.
    Steps: ceil(lg p); bytes: (p-1)/p n per rank, plus a local copy of n.
    Cost: ceil(lg p)*alpha + (p-1)/p*n*beta
    """
    p, rank = t.size, t.rank
    with t.workspace() as ws:
        if p == 1:
            return
        total = bounds[p]
        mine = rotated_bounds(bounds, rank)  # position j: block (rank + j) mod p
        work = ws.take(total, buf.dtype)
        work[:mine[1]] = buf[bounds[rank]:bounds[rank + 1]]
        held = 1
        while held < p:
            count = min(held, p - held)
            # the sender's first `count` blocks are exactly the ones after my first `held`
            t.sendrecv(work[:mine[count]], (rank - held) % p,
                       work[mine[held]:mine[held + count]], (rank + held) % p)
            held += count
        split = total - bounds[rank]  # positions 0.. hold blocks rank..p-1, then 0..rank-1
        buf[bounds[rank]:] = work[:split]
        buf[:bounds[rank]] = work[split:]


@register("all_gather", "swing")
def swing_all_gather(t: Transport, buf: np.ndarray, bounds: tuple[int, ...]) -> None:
    """Swing (De Sensi et al., NSDI 2024): double the blocks held at each step, trading
    everything held with the rank rho(k) away, k = lg p - 1 down to 0 (rho = 1, -1, 3,
    -5, ...: ahead of even ranks, behind odd ones): the reduce-scatter's steps backwards.

    The biggest exchange, of n/2, comes last and goes to a neighbour. The blocks a rank
    holds are scattered in rank order, so they are gathered in the order of Bine's
    labels, where each step's blocks are one contiguous range (algorithms/swing.py), and
    put in rank order at the end. Any p: the extra ranks are folded onto p2 (2 more steps).
    Steps: lg p2 (+2 if folded); bytes: (p-1)/p n per rank, plus a local copy of n.
    Cost: (lg p2 + 2*[p != p2])*alpha + (p-1)/p*n*beta + [p != p2]*(n/p + n)*beta
    """
    p, rank = t.size, t.rank
    fold = Fold(p)
    bits = fold.p2.bit_length() - 1
    label, rank_of = swing.labels(fold.p2)
    if fold.sits_out(rank):  # fold: give my block to the odd rank above, get all back
        t.send(buf[bounds[rank]:bounds[rank + 1]], rank + 1)
        t.recv(buf, rank + 1)
        return
    with t.workspace() as ws:
        # position q of work holds the blocks of the (new) rank labelled q
        spans = [(bounds[fold.first_block(i)], bounds[fold.end_block(i)]) for i in rank_of]
        position = [0]
        for lo, hi in spans:
            position.append(position[-1] + hi - lo)
        work = ws.take(bounds[p], buf.dtype)
        new = fold.new_rank(rank)
        mine = label[new]
        at = position[mine]
        if rank < 2 * fold.rem:  # the even rank below's block comes first
            at += bounds[rank] - bounds[rank - 1]
            t.recv(work[position[mine]:at], rank - 1)
        work[at:position[mine + 1]] = buf[bounds[rank]:bounds[rank + 1]]
        for step in reversed(range(bits)):
            there = swing.peer(new, step, fold.p2)
            have = swing.window(mine, step + 1, bits)
            get = swing.window(label[there], step + 1, bits)
            partner = fold.old_rank(there)
            t.sendrecv(work[position[have[0]]:position[have[1]]], partner,
                       work[position[get[0]]:position[get[1]]], partner)
        for q, (lo, hi) in enumerate(spans):
            buf[lo:hi] = work[position[q]:position[q + 1]]
    if rank < 2 * fold.rem:  # unfold: the whole result to the even rank below
        t.send(buf, rank - 1)


@register("all_gather", "bine")
def bine_all_gather(t: Transport, buf: np.ndarray, bounds: tuple[int, ...]) -> None:
    """Bine (De Sensi et al., SC 2025): recursive doubling over the Bine butterfly, in
    place in the result, after one step that gives each rank the block it starts from.

    Bine labels rank r with nu(r) (algorithms/swing.py), and r plays the part of rank
    nu(r) of recursive doubling: first it gets block nu(r) from that rank, then at steps
    k = lg p - 1 down to 0 it trades all it holds with its Swing peer (rho(k) away: ...,
    3, -1, 1), whose window of blocks is the twin of its own. The windows are ranges of
    the result in rank order, so nothing is copied; the biggest exchange, of n/2, goes
    to a neighbour. Any p: extra ranks are folded onto p2; the first step also gathers
    the folded ranks' blocks.
    Steps: lg p2 + 1 (+1 if folded); bytes: (p2-1)/p2 n + n/p2 per rank (+n folded).
    Cost: (lg p2 + 1 + [p != p2])*alpha + (p2-1)/p2*n*beta + n/p2*beta + [p != p2]*n*beta
    """
    p, rank = t.size, t.rank
    fold = Fold(p)
    bits = fold.p2.bit_length() - 1
    label, rank_of = swing.labels(fold.p2)

    def span(labels: tuple[int, int]) -> tuple[int, int]:
        """The elements of the blocks of new ranks labels[0]..labels[1]-1."""
        return bounds[fold.first_block(labels[0])], bounds[fold.end_block(labels[1] - 1)]

    # my block is part of new rank j's, which the rank labelled j starts from
    j = fold.new_rank(rank + 1 if fold.sits_out(rank) else rank)
    holder = fold.old_rank(rank_of[j])
    own = buf[bounds[rank]:bounds[rank + 1]]
    if fold.sits_out(rank):
        t.waitall([t.isend(own, holder)])
        t.recv(buf, rank + 1)
        return
    new = fold.new_rank(rank)
    mine = label[new]
    requests = [] if holder == rank else [t.isend(own, holder)]
    requests += [t.irecv(buf[bounds[owner]:bounds[owner + 1]], owner)
                 for owner in range(fold.first_block(mine), fold.end_block(mine)) if owner != rank]
    t.waitall(requests)
    for step in reversed(range(bits)):
        there = swing.peer(new, step, fold.p2)
        lo, hi = span(swing.window(mine, step + 1, bits))
        plo, phi = span(swing.window(label[there], step + 1, bits))
        partner = fold.old_rank(there)
        t.sendrecv(buf[lo:hi], partner, buf[plo:phi], partner)
    if rank < 2 * fold.rem:  # unfold: the whole result to the even rank below
        t.send(buf, rank - 1)


def _node_packing(bounds: tuple[int, ...], ranks: tuple[int, ...]) -> tuple[int, ...]:
    """The offsets of ``ranks``' blocks packed one after another (in that order)."""
    offsets = [0]
    for r in ranks:
        offsets.append(offsets[-1] + bounds[r + 1] - bounds[r])
    return tuple(offsets)


@register("all_gather", "hierarchical",
          phases=(("intra", "gather", "q/p*n"), ("inter", "all_gather", "n"),
                  ("intra", "broadcast", "n")))
def hierarchical_all_gather(t: Transport, buf: np.ndarray, bounds: tuple[int, ...], *,
                            intra: str = "binomial", inter: str = "ring") -> None:
    """Gather each node's blocks on its first rank, all-gather the nodes' packs among
    those leaders, then broadcast the whole result inside each node: each node's data
    crosses between nodes once per other node, not once per rank.

    Steps: the intra algorithm's gather and broadcast among the q ranks of a node, the
    inter algorithm's all_gather among the N leaders (below: binomial and ring).
    Cost: ceil(lg q)*alpha_intra + (q-1)/p*n*beta_intra + (N-1)*alpha + (N-1)/N*n*beta + ceil(lg q)*(alpha_intra + n*beta_intra)
    """
    mine, leaders, nodes = node_layout(t)
    node = Subset(t, mine)
    members = node_groups(nodes)  # (in the order of their leaders)
    with t.workspace() as ws:
        packs = ws.take(bounds[-1], buf.dtype)  # every node's blocks, node after node
        pack_bounds = _node_packing(bounds, tuple(r for group in members for r in group))
        n = leaders.index(next(lead for lead in leaders if nodes[lead] == nodes[t.rank]))
        first = sum(len(group) for group in members[:n])
        pack = packs[pack_bounds[first]:pack_bounds[first + len(mine)]]
        own = buf[bounds[t.rank]:bounds[t.rank + 1]]
        REGISTRY["gather"][intra].fn(node, own, pack if node.rank == 0 else None,
                                     _node_packing(bounds, mine), 0)
        if node.rank == 0:
            if len(leaders) > 1:
                node_bounds = tuple(pack_bounds[sum(len(g) for g in members[:k])]
                                    for k in range(len(members) + 1))
                REGISTRY["all_gather"][inter].fn(Subset(t, leaders), packs, node_bounds)
            k = 0
            for group in members:  # the packs into their ranks' places
                for r in group:
                    buf[bounds[r]:bounds[r + 1]] = packs[pack_bounds[k]:pack_bounds[k + 1]]
                    k += 1
    REGISTRY["broadcast"][intra].fn(node, buf, 0)

@register("all_gather", "hierarchical_sharded",
          phases=(("inter", "all_gather", "n/s"), ("intra", "all_gather", "q/s*n")))
def hierarchical_sharded_all_gather(t: Transport, buf: np.ndarray, bounds: tuple[int, ...], *,
                                    intra: str = "ring", inter: str = "ring") -> None:
    """All-gather each shard among the ranks that hold it, one per node (shard j: the
    blocks of every node's rank j), then all-gather the shards inside each node (two
    hops, as MiCS's hierarchical all-gather for sharded training across nodes, Zhang et
    al. 2022): a rank sends 1/q of the data between nodes, and a node's q ranks send
    theirs at once, where ``hierarchical`` sends it all through one leader.

    Steps: the inter algorithm's all_gather among the N holders of a shard, the intra
    algorithm's among the q ranks of a node (below: ring for both). The shards land
    packed (``columns``) and are put in rank order last: a copy of the result in memory.
    On uneven nodes there are s shards, s the smallest node's ranks; a larger node's rank
    i >= s first sends its block to the holder of shard i mod s (one message more, not
    counted below). Between nodes the cost counts each of a node's s streams at the
    link's beta, as if they did not share it.
    Cost: (N-1)*alpha + (N-1)/N*n/s*beta + (q-1)*alpha_intra + (q-1)/s*n*beta_intra
    """
    grid = columns(t, bounds)
    if len(grid.members) == 1:  # one node: its ranks' blocks are its shards, in order
        REGISTRY["all_gather"][intra].fn(t, buf, bounds)
        return
    with t.workspace() as ws:
        packed = ws.take(bounds[-1], buf.dtype)  # the blocks shard by shard
        if grid.holds:
            j, parts, k = grid.column, grid.part_bounds, grid.node
            shard = packed[grid.shard_bounds[j]:grid.shard_bounds[j + 1]]
            at = parts[k]
            for r in grid.carried:  # this rank's own block, then the others' it carries
                size = bounds[r + 1] - bounds[r]
                if r == t.rank:
                    shard[at:at + size] = buf[bounds[r]:bounds[r + 1]]
                else:
                    t.recv(shard[at:at + size], r)
                at += size
            REGISTRY["all_gather"][inter].fn(Subset(t, grid.holders), shard, parts)
        else:  # its column's holder carries its block
            t.send(buf[bounds[t.rank]:bounds[t.rank + 1]], grid.holder)
        REGISTRY["all_gather"][intra].fn(Subset(t, grid.mine), packed, grid.node_bounds)
        grid.unpack(packed, buf)
