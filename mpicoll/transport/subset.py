"""Some ranks of a transport as a transport of their own, and the nodes ranks are on.

Hierarchical algorithms run a phase among the ranks of a node and another among one
rank per node: ``Subset(t, ranks)`` is rank ``ranks[i]`` of ``t`` as rank i, so every
algorithm written over a Transport runs unchanged on the subset. Its messages go on
``t`` with ``t``'s tag: the phases of one call follow each other in every rank's program
order, and messages between a pair of ranks are matched in order, so two phases never
take each other's messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class Subset:
    """Ranks ``ranks`` of ``t`` (this rank among them) as ranks 0..len(ranks)-1."""

    def __init__(self, t: Any, ranks: Sequence[int]) -> None:
        self._t, self.ranks = t, tuple(ranks)
        self.rank, self.size = self.ranks.index(t.rank), len(self.ranks)

    def send(self, buf: Any, dest: int) -> None:
        self._t.send(buf, self.ranks[dest])

    def recv(self, buf: Any, source: int) -> None:
        self._t.recv(buf, self.ranks[source])

    def sendrecv(self, sendbuf: Any, dest: int, recvbuf: Any, source: int) -> None:
        self._t.sendrecv(sendbuf, self.ranks[dest], recvbuf, self.ranks[source])

    def isend(self, buf: Any, dest: int) -> Any:
        return self._t.isend(buf, self.ranks[dest])

    def irecv(self, buf: Any, source: int) -> Any:
        return self._t.irecv(buf, self.ranks[source])

    def waitall(self, requests: Sequence[Any]) -> None:
        self._t.waitall(requests)

    def workspace(self) -> Any:
        return self._t.workspace()

    def take(self, count: int, dtype: Any, like: Any = None) -> Any:
        return self._t.take(count, dtype, like)

    def __getattr__(self, name: str) -> Any:  # synchronize, use, step ... of the whole
        return getattr(self._t, name)


def node_layout(t: Any) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(the ranks of this rank's node, the first rank of every node, each rank's node),
    from ``t.nodes`` (each rank's node, agreed when the Communicator was made); one node
    where the transport does not know."""
    nodes = getattr(t, "nodes", None)
    if nodes is None or len(nodes) != t.size:
        nodes = (0,) * t.size
    groups = node_groups(nodes)
    mine = next(group for group in groups if t.rank in group)
    return mine, tuple(group[0] for group in groups), tuple(nodes)


def node_groups(nodes: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """Each node's ranks (in rank order), the nodes in the order of their first rank,
    from each rank's node."""
    groups: dict[int, list[int]] = {}
    for r, node in enumerate(nodes):
        groups.setdefault(node, []).append(r)
    return tuple(tuple(group) for group in groups.values())


def heads_for(root: int, leaders: tuple[int, ...], nodes: tuple[int, ...]) -> tuple[int, ...]:
    """One rank per node, the root standing in for its own node's first rank."""
    return tuple(root if nodes[r] == nodes[root] else r for r in leaders)
