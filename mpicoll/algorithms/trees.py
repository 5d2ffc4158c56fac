"""Tree shapes: k-nomial trees, Bine trees and double binary trees (sections below).

K-nomial trees are over relative ranks (rel = (rank - root) mod p), rooted at rel 0.

Write rel in base k (the radix). Its parent clears its lowest nonzero digit; its children
are rel + d*k^i for every digit position i below that lowest nonzero digit (every
position, for the root) and d = 1..k-1, when they are < p. The child rel + d*k^i heads
the subtree [rel + d*k^i, rel + (d+1)*k^i): a contiguous range of relative ranks, which
is what lets gather and scatter move a whole subtree's blocks in one message. With k = 2
this is the binomial tree. Depth: ceil(log_k p).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache


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


# -- Bine trees ---------------------------------------------------------------------------
#
# A Bine tree (De Sensi et al., "Bine Trees", SC 2025) is a binomial tree whose step-s
# edges join ranks rho(s) = 1, -1, 3, -5, 11, ... apart (the sum of (-2)^i for i <= s),
# forward from an even relative rank and backward from an odd one, instead of 2^s apart:
# |rho(s)| is about 2^(s+1)/3, so on a ring or a torus most messages cross fewer links.
#
# Negabinary (base -2) turns it into a plain binomial tree. The L = ceil(lg p) digit
# numerals of base -2 have 2^L consecutive values (-2..5 for L = 3), so each relative
# rank v mod 2^L has exactly one of them. Label it g = digits XOR (digits >> 1) (a Gray
# code). Flipping the lowest s+1 digits of a numeral whose lowest s+1 digits are equal
# moves its value by rho(s) (from 0...0, an even value) or -rho(s) (from 1...1, an odd
# one), and flips bit s of g alone. So the Bine tree is the binomial tree of the labels:
# g's parent clears g's lowest set bit, its children set one bit below it.
#
# Contiguous subtrees. The subtree of g, the labels that agree with g above bit s, are the
# numerals that agree with g's above digit s: a fixed high part plus any s-digit numeral,
# whose values are consecutive. Laid out by value, every subtree is one contiguous range,
# so gather and scatter move a subtree's blocks in one message. For p = 2^L the value
# order is the relative-rank order rotated by the smallest L-digit value (-2, -10, -42..):
# blocks need only a rotation. (A subtree other than the whole tree leaves out the
# root's value 0, so its values have one sign: it is a range of relative ranks too. The
# paper's code keeps blocks in rank order and sends a range that wraps past rank p-1 as
# two messages; here blocks go by position, and only the root copies one such range.)
#
# Any p. Keep the binomial tree of the labels 0..p-1: a dropped label (>= p) has only
# higher labels below it, so they go with it and what is left is a tree, binomial's tree
# of p ranks (ceil(lg p) steps). Lay the kept labels out in the order of their values,
# closing the gaps:
# subtrees stay contiguous (an interval less some points, closed up), no edge gets longer
# than in the tree of 2^L ranks, and for p = 2^L nothing is dropped: the paper's tree.


def negabinary_value(digits: int) -> int:
    """The integer whose base -2 digits are the bits of ``digits``: 0b111 -> 1 - 2 + 4 = 3."""
    value, weight = 0, 1
    while digits:
        if digits & 1:
            value += weight
        digits >>= 1
        weight *= -2
    return value


@cache
def bine_layout(p: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(position, label_at, first) of the Bine tree of ``p`` ranks: ``position[g]`` is
    where label g sits in the value order, ``label_at`` its inverse, and ``first[g]`` the
    lowest position in g's subtree, which holds the positions [first[g], first[g] + size).
    """
    values = []
    for g in range(p):
        digits, shift = g, g >> 1
        while shift:  # undo the Gray code: digit i is the XOR of g's bits i and above
            digits ^= shift
            shift >>= 1
        values.append(negabinary_value(digits))
    label_at = tuple(sorted(range(p), key=values.__getitem__))
    position = [0] * p
    for j, g in enumerate(label_at):
        position[g] = j
    first = list(position)
    for g in range(p - 1, 0, -1):  # a child's label is higher than its parent's
        parent = g & (g - 1)
        first[parent] = min(first[parent], first[g])
    return tuple(position), label_at, tuple(first)


class BineTree:
    """The Bine tree of ``p`` ranks rooted at ``root``, in binomial labels (the root is 0).

    Position j of the value order is rank ``(start + j) mod p``; every subtree is the
    positions ``span(label)``, so blocks laid out by position (``rotated_bounds(bounds,
    start)``) put each subtree's blocks side by side.
    """

    def __init__(self, p: int, root: int) -> None:
        self.p = p
        self.position, self.label_at, self._first = bine_layout(p)
        self.start = (root - self.position[0]) % p  # the rank at position 0

    def label(self, rank: int) -> int:
        return self.label_at[(rank - self.start) % self.p]

    def rank(self, label: int) -> int:
        return (self.start + self.position[label]) % self.p

    def parent(self, label: int) -> int | None:
        """The parent's label (None for the root): ``label`` less its lowest set bit."""
        return label & (label - 1) if label else None

    def children(self, label: int) -> list[int]:
        """The children's labels, nearest (smallest subtree) first."""
        return [child for child, _ in knomial_children(label, self.p, 2)]

    def span(self, label: int) -> tuple[int, int]:
        """The positions [lo, hi) of ``label``'s subtree."""
        lo = self._first[label]
        return lo, lo + knomial_subtree_end(label, self.p, 2) - label


# -- double binary trees ------------------------------------------------------------------
#
# The in-order binary tree over labels 1..n: label i's height is the position h of its
# lowest set bit; its children are i - 2^(h-1) and i + 2^j for the largest j < h with
# i + 2^j <= n; the top is the largest power of two <= n. Left subtrees hold smaller
# labels, right ones larger. The odd labels are its leaves, the even ones interior.
#
# Two such trees (Sanders, Speck and Traeff 2009; NCCL's double binary tree): tree 2
# gives rank label i the place of label n+1-i (mirrored) when n is even, i-1 (shifted by
# one; label 1 takes n's place) when n is odd. Mirroring or shifting turns odd labels
# into even ones, so each rank is interior in at most one tree and a leaf in the other
# (with n odd, label 1 is a leaf in both): every rank sends each half of the data at most
# twice, and the two trees together use the links in both directions, at full bandwidth.


@cache
def inorder_children(n: int) -> tuple[tuple[int, ...], ...]:
    """The children of labels 1..n in the in-order binary tree (index 0 is unused)."""
    children: list[tuple[int, ...]] = [()]
    for i in range(1, n + 1):
        half = (i & -i) >> 1
        if not half:  # odd: a leaf
            children.append(())
            continue
        step = half
        while step and i + step > n:
            step >>= 1
        children.append((i - half, i + step) if step else (i - half,))
    return tuple(children)


@dataclass(frozen=True)
class RankTree:
    """A tree over ranks, indexed by rank: its root ``top``, each rank's parent (None at
    the top), children, depth (0 at the top) and height (0 at a leaf)."""

    top: int
    parent: tuple[int | None, ...]
    children: tuple[tuple[int, ...], ...]
    depth: tuple[int, ...]
    height: tuple[int, ...]


def _rank_tree(top: int, children: list[tuple[int, ...]]) -> RankTree:
    p = len(children)
    parent: list[int | None] = [None] * p
    depth, height = [0] * p, [0] * p
    order = [top]  # breadth first: parents before children
    for rank in order:
        for child in children[rank]:
            parent[child], depth[child] = rank, depth[rank] + 1
            order.append(child)
    for rank in reversed(order):
        height[rank] = max((height[c] + 1 for c in children[rank]), default=0)
    return RankTree(top, tuple(parent), tuple(children), tuple(depth), tuple(height))


@lru_cache(maxsize=256)
def double_binary_tree(p: int, root: int | None = None) -> tuple[RankTree, RankTree]:
    """The two trees of a double binary tree of ``p`` ranks.

    With ``root`` None (all_reduce) both trees span all ranks, rank r holding label r+1.
    With a root (broadcast, reduce), the other ranks hold labels rel = (rank - root) mod p
    in 1..p-1 and the root sits above both trees' tops, with that one child in each.
    """
    n = p if root is None else p - 1

    def rank_of(label: int) -> int:
        return label - 1 if root is None else (root + label) % p

    def place(i: int, second: bool) -> int:
        """The label of tree 1 whose place label i takes in tree ``second``."""
        if not second:
            return i
        if n % 2 == 0:
            return n + 1 - i  # mirrored
        return i - 1 if i > 1 else n  # shifted by one

    def holder(j: int, second: bool) -> int:
        """The label that takes label j's place (``place``'s inverse)."""
        if not second or n % 2 == 0:
            return place(j, second)
        return j + 1 if j < n else 1

    trees = []
    inorder = inorder_children(n)
    top = 1 << (n.bit_length() - 1) if n else 0
    for second in (False, True):
        children: list[tuple[int, ...]] = [()] * p
        for i in range(1, n + 1):
            children[rank_of(i)] = tuple(rank_of(holder(c, second))
                                         for c in inorder[place(i, second)])
        tree_top = rank_of(holder(top, second)) if n else 0
        if root is not None:
            if n:
                children[root] = (tree_top,)
            tree_top = root
        trees.append(_rank_tree(tree_top, children))
    return trees[0], trees[1]
