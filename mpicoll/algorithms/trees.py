"""K-nomial trees over relative ranks (rel = (rank - root) mod p), rooted at rel 0.

Write rel in base k (the radix). Its parent clears its lowest nonzero digit; its children
are rel + d*k^i for every digit position i below that lowest nonzero digit (every
position, for the root) and d = 1..k-1, when they are < p. The child rel + d*k^i heads
the subtree [rel + d*k^i, rel + (d+1)*k^i): a contiguous range of relative ranks, which
is what lets gather and scatter move a whole subtree's blocks in one message. With k = 2
this is the binomial tree. Depth: ceil(log_k p).
"""

from __future__ import annotations


def knomial_parent(rel: int, radix: int) -> int | None:
    """The parent of relative rank ``rel`` (None for the root)."""
    if rel == 0:
        return None
    place = 1
    while rel % (place * radix) == 0:
        place *= radix
    return rel - (rel // place % radix) * place


def knomial_subtree_end(rel: int, p: int, radix: int) -> int:
    """One past the last relative rank of ``rel``'s subtree."""
    if rel == 0:
        return p
    place = 1
    while rel % (place * radix) == 0:
        place *= radix
    return min(rel + place, p)


def knomial_children(rel: int, p: int, radix: int) -> list[tuple[int, int]]:
    """``(child, subtree_end)`` of every child of ``rel``, in increasing rank order."""
    end = knomial_subtree_end(rel, p, radix)
    children = []
    place = 1
    while rel + place < end:
        for d in range(1, radix):
            child = rel + d * place
            if child >= end:
                break
            children.append((child, min(child + place, end)))
        place *= radix
    return children
