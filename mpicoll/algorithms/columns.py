"""Each node's ranks dealt into columns: the layout of the sharded hierarchical algorithms.

With s the smallest node's number of ranks, rank i of a node (its ranks in rank order)
is in column i mod s, and the node's first s ranks hold its s columns. Shard j is column
j of every node, node after node: the blocks of those ranks, so that one rank per node
(the holders of shard j) can reduce-scatter or all-gather it between nodes while the
node's other holders do the same with theirs. On even nodes every rank holds its own
column (s = q); on uneven ones a larger node's rank i >= s has its block carried by the
holder of column i mod s.

The blocks are packed shard after shard, node after node, so that each shard, and each
node's part of it, is one contiguous range of the packed buffer::

    ranks 0 1 2 3 | 4 5 6 7   (2 nodes of 4)   packed: 0 4 | 1 5 | 2 6 | 3 7
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..transport.subset import node_groups, node_layout


def columns(t: Any, bounds: tuple[int, ...]) -> Columns:
    """This rank's ``Columns`` for blocks cut by ``bounds`` (made once per layout: a plan
    and a repeated call find it again)."""
    mine, _, nodes = node_layout(t)
    return _columns(nodes, mine, t.rank, tuple(bounds))


@functools.lru_cache(maxsize=64)
def _columns(nodes: tuple[int, ...], mine: tuple[int, ...], rank: int,
             bounds: tuple[int, ...]) -> Columns:
    return Columns(nodes, mine, rank, bounds)


class Columns:
    """This rank's place in the grid of nodes x columns, for blocks cut by ``bounds``
    (``nodes``: each rank's node; ``mine``: this rank's node's ranks)."""

    def __init__(self, nodes: tuple[int, ...], mine: tuple[int, ...], rank: int,
                 bounds: tuple[int, ...]) -> None:
        self.members = node_groups(nodes)  # each node's ranks, nodes in order of their first
        self.mine = mine  # this node's ranks
        self.shards = s = min(map(len, self.members))
        self.local = mine.index(rank)
        self.column = self.local % s
        self.holds = self.local < s  # whether this rank holds its column
        self.holder = mine[self.column]  # the rank holding this rank's column
        # the blocks in packed order (shard by shard, node by node), and where each lands
        self.order = tuple(r for j in range(s) for group in self.members for r in group[j::s])
        offsets = [0]
        for r in self.order:
            offsets.append(offsets[-1] + bounds[r + 1] - bounds[r])
        self.packed_bounds = tuple(offsets)  # packed_bounds[i]: where order[i]'s block starts
        # shard j: the order's ranks [first[j], first[j + 1]); node k's part of it: the
        # ranks of that node in column j
        first = [0]
        for j in range(s):
            first.append(first[-1] + sum(len(group[j::s]) for group in self.members))
        self.shard_bounds = tuple(offsets[i] for i in first)  # s + 1 offsets
        # the node's intra-node blocks: shard i for its rank i < s, nothing for the others
        self.node_bounds = self.shard_bounds + (offsets[-1],) * (len(mine) - s)
        # shard j's parts (offsets within it), node after node, for this rank's column
        j, parts = self.column, [0]
        base, i = offsets[first[j]], first[j]
        for group in self.members:
            i += len(group[j::s])
            parts.append(offsets[i] - base)
        self.part_bounds = tuple(parts)  # N + 1 offsets
        self.holders = tuple(group[j] for group in self.members)  # shard j's, node by node
        self.node = next(k for k, group in enumerate(self.members) if group == mine)
        # the ranks whose blocks this rank's column carries, its holder first
        self.carried = mine[self.column::s]
        self.bounds = bounds
        # N nodes of q consecutive ranks each (rank r on node r // q), equal blocks of b:
        # packing is a transpose of (N, q, b) into (q, N, b), one copy (else one per block)
        p, q, b = len(nodes), len(mine), bounds[1] - bounds[0]
        consecutive = all(group == tuple(range(k * q, k * q + q))
                          for k, group in enumerate(self.members))
        equal = all(bounds[i + 1] - bounds[i] == b for i in range(p))
        self.transposed = (len(self.members), q, b) if consecutive and equal else None

    def pack(self, src: np.ndarray, packed: np.ndarray) -> None:
        """The blocks of ``src`` (in rank order) into ``packed`` (in packed order)."""
        if self.transposed is not None and packed.flags.c_contiguous and \
                src.flags.c_contiguous:
            # (reshape gives views of contiguous arrays: the copy lands in packed itself)
            nodes, q, b = self.transposed
            packed.reshape(q, nodes, b)[...] = src.reshape(nodes, q, b).transpose(1, 0, 2)
            return
        bounds, offsets = self.bounds, self.packed_bounds
        for i, r in enumerate(self.order):
            packed[offsets[i]:offsets[i + 1]] = src[bounds[r]:bounds[r + 1]]

    def unpack(self, packed: np.ndarray, dst: np.ndarray) -> None:
        """The blocks of ``packed`` (in packed order) into ``dst`` (in rank order)."""
        if self.transposed is not None and packed.flags.c_contiguous and \
                dst.flags.c_contiguous:
            nodes, q, b = self.transposed
            dst.reshape(nodes, q, b)[...] = packed.reshape(q, nodes, b).transpose(1, 0, 2)
            return
        bounds, offsets = self.bounds, self.packed_bounds
        for i, r in enumerate(self.order):
            dst[bounds[r]:bounds[r + 1]] = packed[offsets[i]:offsets[i + 1]]
