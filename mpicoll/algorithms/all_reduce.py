"""All-reduce: the reduction of every rank's input ends up on every rank.

``src`` is this rank's input (read only unless it is ``dst``); ``dst`` receives the
result and may be ``src`` itself (in place). n is the message size in bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..buffers import chunk_bounds, even_bounds
from ..ops import Op
from ..transport import Transport
from ..transport.subset import Subset, node_groups, node_layout
from . import REGISTRY, register, swing
from .all_gather import recursive_doubling_all_gather, ring_all_gather
from .broadcast import binomial_broadcast, segment_bounds
from .fold import Fold
from .reduce import binomial_reduce
from .reduce_scatter import recursive_halving_reduce_scatter, ring_reduce_scatter_steps
from .trees import double_binary_tree


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


def _whole_vector_exchanges(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op,
                            peer: Callable[[int, int, int], int]) -> None:
    """The steps of recursive doubling and of Swing's latency all_reduce: at step k the
    whole partial result is exchanged with ``peer(new rank, k, p2)`` and added in, over
    the largest power of two p2, the extra ranks folded onto it (``Fold``: 2 more steps).

    Both partners of a step compute the same value, so they must compute it alike, bit
    for bit: the lower rank's operand first (for recursive doubling that is rank order,
    so non-commutative ops are exact too), and into a buffer apart from both operands on
    every rank (NumPy's loop for an output over an input can round otherwise)."""
    rank = t.rank
    fold = Fold(t.size)
    with t.workspace() as ws:
        incoming = ws.take(src.size, src.dtype)
        spare = ws.take(src.size, src.dtype)  # the partial's other home, where dst holds it
        cur = src
        if rank < 2 * fold.rem:
            if fold.sits_out(rank):
                t.send(src, rank + 1)
                t.recv(dst, rank + 1)
                return
            t.recv(incoming, rank - 1)
            into = spare if src is dst else dst
            op(incoming, src, out=into)
            cur = into
        new = fold.new_rank(rank)
        for step in range(fold.p2.bit_length() - 1):
            partner = fold.old_rank(peer(new, step, fold.p2))
            t.sendrecv(cur, partner, incoming, partner)
            into = spare if cur is dst else dst
            if partner > rank:
                op(cur, incoming, out=into)
            else:
                op(incoming, cur, out=into)
            cur = into
        if cur is not dst:  # one rank (nothing exchanged), or the partial in spare
            dst[...] = cur
        if rank < 2 * fold.rem:
            t.send(dst, rank - 1)


@register("all_reduce", "recursive_doubling")
def recursive_doubling_all_reduce(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    """Recursive doubling: exchange the whole partial result with the rank 2^k away.

    Any p: the extra ranks are folded onto the largest power of two p2 (2 more steps).
    Operands are combined in rank order, so non-commutative ops are exact too.
    Steps: lg p2 (+2 if folded); bytes: n lg p2 per rank; reductions: n lg p2.
    Cost: (lg p2 + 2*[p != p2])*(alpha + n*beta) + (lg p2 + [p != p2])*n*gamma
    """
    _whole_vector_exchanges(t, src, dst, op, lambda new, step, p2: new ^ (1 << step))


@register("all_reduce", "swing_latency", commutative_only=True)
def swing_latency_all_reduce(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    """Swing for small messages: recursive doubling with Swing's peers (De Sensi et al.,
    NSDI 2024).

    At step k every rank exchanges its whole partial result with the rank rho(k) = 1, -1,
    3, -5, 11, ... away (ahead of an even rank, behind an odd one; see algorithms/swing.py)
    and adds it in: after lg p steps each rank holds the sum of all. The distances grow
    as about 2^(k+1)/3 rather than 2^k, so on a ring or torus fewer links carry each
    message. Each rank sums circular ranges of ranks, so the operands come in no rank
    order: commutative ops only. Any p: the extra ranks are folded onto the largest
    power of two p2 (2 more steps).
    Steps: lg p2 (+2 if folded); bytes: n lg p2 per rank; reductions: n lg p2.
    Cost: (lg p2 + 2*[p != p2])*(alpha + n*beta) + (lg p2 + [p != p2])*n*gamma
    """
    _whole_vector_exchanges(t, src, dst, op, swing.peer)


@register("all_reduce", "swing_bandwidth", commutative_only=True)
def swing_bandwidth_all_reduce(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    """Swing for large messages: a reduce-scatter then an all-gather over Swing's peers,
    as Rabenseifner's over recursive halving and doubling (De Sensi et al., NSDI 2024).

    The vector is cut into p chunks and each rank ends the reduce-scatter owning one.
    At step k a rank keeps the half of its chunks that its own later peers will own and
    sends the peer the other half, whose partial sums it adds into its own; the
    all-gather runs the steps backwards. The biggest halves go between the nearest
    ranks (the first peer is a neighbour). Chunk j belongs to the rank whose Bine label
    is j (algorithms/swing.py), so every half is one contiguous range of the buffer.
    Commutative ops only. Any p: the extra ranks are folded onto p2 once, before and
    after both phases (2 more steps, not Rabenseifner's 4).
    Steps: 2 lg p2 (+2 if folded); bytes: 2 (p2-1)/p2 n per rank (+2n folded);
    reductions: (p2-1)/p2 n (+n folded).
    Cost: (2*lg p2 + 2*[p != p2])*alpha + 2*(p2-1)/p2*n*beta + (p2-1)/p2*n*gamma + [p != p2]*(2*n*beta + n*gamma)
    """
    p, rank = t.size, t.rank
    fold = Fold(p)
    bits = fold.p2.bit_length() - 1
    label, _ = swing.labels(fold.p2)
    bounds = chunk_bounds(src.size, fold.p2)  # chunk j: the one the rank labelled j owns
    with t.workspace() as ws:
        incoming = ws.take(src.size, src.dtype)
        cur = src  # the partial sums so far; dst from the first reduction on
        if rank < 2 * fold.rem:
            if fold.sits_out(rank):
                t.send(src, rank + 1)
                t.recv(dst, rank + 1)
                return
            t.recv(incoming, rank - 1)
            op(incoming, src, out=dst)
            cur = dst
        new = fold.new_rank(rank)
        mine = label[new]
        # reduce-scatter: the chunks kept shrink to the subtree of the steps still to come
        for step in range(bits):
            there = swing.peer(new, step, fold.p2)
            keep = swing.window(mine, step + 1, bits)
            give = swing.window(label[there], step + 1, bits)
            lo, hi = bounds[keep[0]], bounds[keep[1]]
            partial = incoming[: hi - lo]
            partner = fold.old_rank(there)
            t.sendrecv(cur[bounds[give[0]]:bounds[give[1]]], partner, partial, partner)
            op(partial, cur[lo:hi], out=dst[lo:hi])
            cur = dst  # the halves sent later lie inside this one, now summed in dst
        if cur is not dst:  # one rank: nothing was exchanged
            dst[...] = src
        # all-gather: the same pairs backwards, each sending all it holds
        for step in reversed(range(bits)):
            there = swing.peer(new, step, fold.p2)
            have = swing.window(mine, step + 1, bits)
            get = swing.window(label[there], step + 1, bits)
            partner = fold.old_rank(there)
            t.sendrecv(dst[bounds[have[0]]:bounds[have[1]]], partner,
                       dst[bounds[get[0]]:bounds[get[1]]], partner)
        if rank < 2 * fold.rem:
            t.send(dst, rank - 1)


@register("all_reduce", "bine_latency", commutative_only=True)
def bine_latency_all_reduce(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    """Bine for small messages: the whole vector exchanged along a distance-doubling
    Bine butterfly (De Sensi et al., SC 2025).

    At step k a rank exchanges with the rank at the negabinary distance 1...1 (k+1
    ones: 1, -1, 3, -5, ...), forward from even ranks and backward from odd ones, which
    keeps most traffic between nearby ranks. These are Swing's peers and steps: the
    same messages as ``swing_latency``, under the name the Bine paper gives them (its
    own code runs this very schedule). Commutative ops only; any p, by folding onto p2.
    Steps: lg p2 (+2 if folded); bytes: n lg p2 per rank; reductions: n lg p2.
    Cost: (lg p2 + 2*[p != p2])*(alpha + n*beta) + (lg p2 + [p != p2])*n*gamma
    """
    swing_latency_all_reduce(t, src, dst, op)


@register("all_reduce", "bine_bandwidth", commutative_only=True)
def bine_bandwidth_all_reduce(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    """Bine for large messages: a reduce-scatter then an all-gather over the Bine
    butterfly (De Sensi et al., SC 2025).

    Bine labels rank r with nu(r), the bit-reversed Gray code of r (odd r) or -r (even
    r) in negabinary; chunk nu(r) is rank r's, so the chunks a rank keeps at each step
    are one aligned range of labels and every message is contiguous. The peers are
    Swing's, so these are ``swing_bandwidth``'s messages, under the Bine paper's name.
    Commutative ops only; any p, by folding onto p2 once.
    Steps: 2 lg p2 (+2 if folded); bytes: 2 (p2-1)/p2 n per rank (+2n folded);
    reductions: (p2-1)/p2 n (+n folded).
    Cost: (2*lg p2 + 2*[p != p2])*alpha + 2*(p2-1)/p2*n*beta + (p2-1)/p2*n*gamma + [p != p2]*(2*n*beta + n*gamma)
    """
    swing_bandwidth_all_reduce(t, src, dst, op)


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
    Steps: 2(p-1) of ceil(S/p) segments each (S: the segments of the whole vector, so a
    chunk of n/p has ceil(S/p)); bytes: 2 (p-1)/p n per rank; reductions: (p-1)/p n per
    rank, overlapped with the transfers.
    Cost: 2*(p-1)*ceil(S/p)*alpha + 2*(p-1)/p*n*beta + (p-1)/p*n*gamma/ceil(S/p)
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

    Steps: lg p2 (+2 if folded); bytes: (p-1) n per rank, and where p is no power of two
    the fold's n and the unfold's p n (recursive doubling's all_gather of p n bytes);
    reductions: (p-1) n per rank.
    Cost: (lg p2 + 2*[p != p2])*alpha + (p-1)*n*beta + [p != p2]*(n + p*n)*beta + (p-1)*n*gamma
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
          phases=(("intra", "reduce", "n"), ("inter", "all_reduce", "n"),
                  ("intra", "broadcast", "n")))
def hierarchical_all_reduce(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op, *,
                            intra: str = "binomial", inter: str = "ring") -> None:
    """Reduce inside each node to its first rank, all-reduce among those leaders, then
    broadcast inside each node (MPICH's SMP-aware all_reduce, Open MPI's han): the links
    between nodes carry one rank's share per node, not every rank's; the few steps suit
    small messages (large ones: ``hierarchical_sharded``).

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


@register("all_reduce", "hierarchical_sharded", commutative_only=True,
          phases=(("intra", "reduce_scatter", "q/s*n"), ("inter", "all_reduce", "n/s"),
                  ("intra", "all_gather", "q/s*n")))
def hierarchical_sharded_all_reduce(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op,
                                    *, intra: str = "ring", inter: str = "ring") -> None:
    """Reduce-scatter inside each node into one shard per rank, all-reduce each shard
    among the ranks that hold it (one per node), then all-gather the shards inside each
    node (Horovod's hierarchical all_reduce, NCCL's across nodes): each rank's share of
    the traffic between nodes is 1/q of the data, and a node's q ranks send theirs at
    once, where ``hierarchical`` sends all of it through one leader.

    Steps: the intra algorithm's reduce_scatter and all_gather among the q ranks of a
    node, the inter algorithm's all_reduce of each shard among the N ranks holding it
    (below: ring for both). There are s shards, s the smallest node's ranks (q on even
    nodes; a larger node's other ranks hold none, so each of its ring's q-1 steps moves
    a whole shard, n/s). Between nodes the cost counts each of a node's s streams at the
    link's beta, as if they did not share it (beta as ``model fit`` measures it: one
    stream per node).
    Cost: 2*(q-1)*alpha_intra + 2*(q-1)/s*n*beta_intra + (q-1)/s*n*gamma + 2*(N-1)*alpha + 2*(N-1)/N*n/s*beta + (N-1)/N*n/s*gamma
    """
    mine, _, nodes = node_layout(t)
    members = node_groups(nodes)  # each node's ranks, nodes in order of their first
    shards, local, count = min(map(len, members)), mine.index(t.rank), src.size
    # the node's blocks: one shard per rank up to the smallest node's size, then none
    bounds = chunk_bounds(count, shards) + (count,) * (len(mine) - shards)
    lo, hi = bounds[local], bounds[local + 1]
    node = Subset(t, mine)
    with t.workspace() as ws:
        shard = ws.take(hi - lo, src.dtype)  # (apart from src: dst may be src)
        REGISTRY["reduce_scatter"][intra].fn(node, src, bounds, op, shard)
        if local < shards and len(members) > 1:  # the same shard of every node
            holders = Subset(t, [group[local] for group in members])
            REGISTRY["all_reduce"][inter].fn(holders, shard, shard, op)
        dst[lo:hi] = shard
    REGISTRY["all_gather"][intra].fn(node, dst, bounds)


@register("all_reduce", "double_binary_tree", commutative_only=True)
def double_binary_tree_all_reduce(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op, *,
                                  segment_bytes: int = 1 << 16) -> None:
    """Double binary tree (NCCL's tree all-reduce; Sanders, Speck and Traeff 2009): each
    half of the data is reduced up its own binary tree to that tree's top and broadcast
    back down it, cut into S/2 segments that follow each other up and then down.

    Both trees span all ranks (rank r is label r+1; tree 2 is tree 1 mirrored for even
    p, shifted by one for odd p: ``trees``), so a rank is interior in at most one: it
    combines and forwards at most n bytes each way, where one binary tree's interior
    ranks would handle 2n and its leaves nothing. In a tree of height H, a rank of height
    h (0 at a leaf) and depth d (0 at the top) in round r sends its partial result of
    segment r-h to its parent (a leaf: its input), receives segment r-h' from each child
    of height h' and combines it after the round, receives the result of segment
    r-H-d+1 from its parent, and sends the result of segment r-H-d to its children: the
    top turns a segment around in the round after it is complete. A round's messages are
    posted together (tree 1's first) and waited for together, so two ranks agree on the
    order of the messages between them and NCCL issues one group per round; a partial
    result sent up is out before the result lands on it. The trees reorder the operands:
    commutative ops only.
    Steps: about 2 ceil(lg p) + S rounds (up and down each tree's height, then one per
    segment), each moving up to 2n/S into or out of a rank (a parent's and two children's
    segments); bytes: at most 2n into and out of a rank; reductions: at most n per rank.
    Cost: (2*ceil(lg p) + S)*(alpha + 2*n/S*beta) + n*gamma
    """
    p, rank = t.size, t.rank
    with t.workspace() as ws:
        if p == 1:
            if dst is not src:
                dst[...] = src
            return
        trees = double_binary_tree(p)
        halves = chunk_bounds(src.size, 2)
        segment = max(1, segment_bytes // src.itemsize)
        # segments as offsets into their half; the partial results build up in dst
        cuts = [segment_bounds(0, halves[k + 1] - halves[k], segment) for k in (0, 1)]
        inputs = [src[halves[k]:halves[k + 1]] for k in (0, 1)]
        results = [dst[halves[k]:halves[k + 1]] for k in (0, 1)]
        landing, first = [], []
        for k, tree in enumerate(trees):
            kids = tree.children[rank]
            landing.append([ws.take(halves[k + 1] - halves[k], src.dtype) for _ in kids])
            # the child whose segments come first (the lowest) combines with the input
            heights = [tree.height[child] for child in kids]
            first.append(heights.index(min(heights)) if kids else 0)
        # the round after which this rank has done its part of both trees
        rounds = max(len(cuts[k]) + trees[k].height[trees[k].top] + trees[k].depth[rank]
                     for k in (0, 1))
        for r in range(rounds):
            requests, arrived = [], []
            for k, tree in enumerate(trees):  # sends: my partial up, results down
                kids, parent = tree.children[rank], tree.parent[rank]
                j = r - tree.height[rank]
                if parent is not None and 0 <= j < len(cuts[k]):
                    lo, hi = cuts[k][j]
                    requests.append(t.isend((results if kids else inputs)[k][lo:hi], parent))
                j = r - tree.height[tree.top] - tree.depth[rank]
                if 0 <= j < len(cuts[k]):
                    lo, hi = cuts[k][j]
                    requests += [t.isend(results[k][lo:hi], child) for child in kids]
            for k, tree in enumerate(trees):  # receives: partials up, results down
                for i, child in enumerate(tree.children[rank]):
                    j = r - tree.height[child]
                    if 0 <= j < len(cuts[k]):
                        lo, hi = cuts[k][j]
                        requests.append(t.irecv(landing[k][i][lo:hi], child))
                        arrived.append((k, i, lo, hi))
                j = r - tree.height[tree.top] - tree.depth[rank] + 1
                if tree.parent[rank] is not None and 0 <= j < len(cuts[k]):
                    lo, hi = cuts[k][j]
                    requests.append(t.irecv(results[k][lo:hi], tree.parent[rank]))
            if requests:
                t.waitall(requests)
            for k, i, lo, hi in arrived:
                mine = inputs[k] if i == first[k] else results[k]
                op(mine[lo:hi], landing[k][i][lo:hi], out=results[k][lo:hi])
