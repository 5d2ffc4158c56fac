"""Bine trees and double binary trees: their shapes at 1..33 ranks, checked against the
papers' definitions, and their algorithms against NumPy at 1..16 thread-ranks, with the
segments, roots and uneven blocks the registry-wide tests do not reach."""

from __future__ import annotations

import numpy as np
import pytest
from reference import run_case

from mpicoll.algorithms.trees import BineTree, double_binary_tree
from mpicoll.local import run_local


def rho(step: int) -> int:
    """Bine's (and Swing's) distance of step ``step``: 1, -1, 3, -5, 11, ..."""
    return sum((-2) ** i for i in range(step + 1))


def walk(top, children) -> list:
    """Every node reached from ``top``, parents before children (a node twice if the
    children lists make it a graph, not a tree)."""
    order = [top]
    for node in order:
        order.extend(children(node))
    return order


# -- double binary trees -------------------------------------------------------------------


def _labelled(p: int, root: int | None):
    """(n, label -> rank, rank -> label) of the ranks the binary trees are made of."""
    if root is None:
        return p, (lambda i: i - 1), (lambda r: r + 1)
    return p - 1, (lambda i: (root + i) % p), (lambda r: (r - root) % p)


@pytest.mark.parametrize("p", range(1, 34))
def test_double_binary_trees_span_and_share_the_work(p):
    for root in (None, *range(p)):
        trees = double_binary_tree(p, root)
        n, rank_of, label_of = _labelled(p, root)
        for tree in trees:
            assert sorted(walk(tree.top, tree.children.__getitem__)) == list(range(p))
            assert tree.parent[tree.top] is None
            for r in range(p):
                assert len(tree.children[r]) <= 2
                for c in tree.children[r]:
                    assert tree.parent[c] == r and tree.depth[c] == tree.depth[r] + 1
                assert tree.height[r] == max((tree.height[c] + 1 for c in tree.children[r]),
                                             default=0)
            # a binary tree of n nodes: depth floor(lg n), one more under a root
            assert max(tree.depth) <= max(n.bit_length() - 1, 0) + (root is not None and n > 0)
        for i in range(1, n + 1):
            interior = [bool(tree.children[rank_of(i)]) for tree in trees]
            assert sum(interior) <= 1, f"p={p} root={root}: rank {rank_of(i)} interior twice"
        leaves_in_both = [i for i in range(1, n + 1)
                          if not any(tree.children[rank_of(i)] for tree in trees)]
        assert leaves_in_both == ([] if n % 2 == 0 else [1])
        if root is not None and p > 1:
            assert [tree.top for tree in trees] == [root, root]
            assert all(len(tree.children[root]) == 1 for tree in trees)


def _place(i: int, n: int) -> int:
    """The label whose place label i takes in tree 2: mirrored (n even), shifted (n odd)."""
    if n % 2 == 0:
        return n + 1 - i
    return i - 1 if i > 1 else n


@pytest.mark.parametrize("p", range(1, 34))
def test_double_binary_tree_one_is_in_order_and_two_mirrored_or_shifted(p):
    for root in (None, 0, p - 1):
        one, two = double_binary_tree(p, root)
        n, rank_of, label_of = _labelled(p, root)
        for i in range(1, n + 1):
            # in-order: a left subtree's labels are below the node's, a right one's above
            kids = one.children[rank_of(i)]
            below = [sorted(label_of(x) for x in walk(k, one.children.__getitem__)) for k in kids]
            if kids:
                assert below[0][-1] < i
            if len(kids) == 2:
                assert below[1][0] > i
            # tree 2 gives label i the place that label _place(i) has in tree 1
            mine = {_place(label_of(c), n) for c in two.children[rank_of(i)]}
            assert mine == {label_of(c) for c in one.children[rank_of(_place(i, n))]}


# -- Bine trees ----------------------------------------------------------------------------


def paper_bine_parents(p: int) -> dict[int, int | None]:
    """The Bine tree of p = 2^L relative ranks, from the paper's definition: in steps
    s = L-1, ..., 0 every rank that has the data sends it rho(s) ahead (even rank) or
    behind (odd rank); each rank's parent is the rank it got the data from."""
    parent: dict[int, int | None] = {0: None}
    for step in reversed(range(p.bit_length() - 1)):
        for holder in list(parent):
            peer = (holder + (rho(step) if holder % 2 == 0 else -rho(step))) % p
            assert peer not in parent
            parent[peer] = holder
    return parent


@pytest.mark.parametrize("p", range(1, 34))
def test_bine_tree_spans_with_contiguous_subtrees_and_short_edges(p):
    power = 1 << (p - 1).bit_length()
    paper = paper_bine_parents(p) if p == power else None
    for root in range(p):
        tree = BineTree(p, root)
        assert tree.rank(0) == root
        order = walk(0, tree.children)
        assert sorted(tree.rank(g) for g in order) == list(range(p))
        depth = {0: 0}
        for g in order:
            assert tree.label(tree.rank(g)) == g
            lo, hi = tree.span(g)
            assert sorted(tree.position[x] for x in walk(g, tree.children)) == list(range(lo, hi))
            a = b = tree.position[g]
            b += 1
            for c in tree.children(g):
                assert tree.parent(c) == g
                depth[c] = depth[g] + 1
                c_lo, c_hi = tree.span(c)
                assert c_hi == a or c_lo == b, "a child's blocks adjoin the ones combined so far"
                a, b = min(a, c_lo), max(b, c_hi)
                step = (c & -c).bit_length() - 1
                apart = (tree.rank(c) - tree.rank(g)) % p
                assert min(apart, p - apart) <= abs(rho(step)), "no edge longer than 2^L's"
                if paper is not None:  # exactly the paper's tree
                    rel = (tree.rank(c) - root) % p
                    assert (paper[rel] + root) % p == tree.rank(g)
            assert (a, b) == (lo, hi)
        # binomial: a label's depth is its number of set bits; the root sends ceil(lg p) times
        assert all(depth[g] == bin(g).count("1") for g in range(p))
        assert len(tree.children(0)) == (p - 1).bit_length()


# -- the algorithms against NumPy ------------------------------------------------------------

# the default (one segment a half here), and segments of 2 items (of 8 bytes), the last of
# a half shorter: 13 items are halves of 7 and 6, in 4 and 3 segments
SEGMENTS = ({}, {"segment_bytes": 20})


def _roots(p: int) -> list[int]:
    return sorted({0, 1 % p, p // 2, p - 1})


def _check_rooted(comm, counts: tuple[int, ...]) -> None:
    p, rank = comm.size, comm.rank
    for count in counts:
        inputs = [np.arange(count, dtype="i8") * (r + 2) + r for r in range(p)]
        total = sum(inputs)
        for root in _roots(p):
            for options in SEGMENTS:
                x = inputs[rank].copy() if rank == root else np.zeros(count, "i8")
                got = comm.broadcast(x, root, algorithm="double_binary_tree", **options)
                np.testing.assert_array_equal(got, inputs[root])
                got = comm.reduce(inputs[rank], "sum", root, algorithm="double_binary_tree",
                                  **options)
                if rank == root:
                    np.testing.assert_array_equal(got, total)
            got = comm.broadcast(inputs[rank].copy() if rank == root else np.zeros(count, "i8"),
                                 root, algorithm="bine")
            np.testing.assert_array_equal(got, inputs[root])
            got = comm.reduce(inputs[rank], "sum", root, algorithm="bine")
            if rank == root:
                np.testing.assert_array_equal(got, total)
            run_case(comm, "reduce", "bine", (count,), None, "concat", root)  # rank order


def _check_all_reduce(comm, counts: tuple[int, ...]) -> None:
    p, rank = comm.size, comm.rank
    for count in counts:
        inputs = [np.arange(count, dtype="f8") * (r + 1) - r for r in range(p)]
        for options in SEGMENTS:
            got = comm.all_reduce(inputs[rank], algorithm="double_binary_tree", **options)
            np.testing.assert_array_equal(got, sum(inputs))
            x = inputs[rank].copy()
            got = comm.all_reduce(x, out=x, algorithm="double_binary_tree", **options)
            assert got is x
            np.testing.assert_array_equal(x, sum(inputs))


def _check_blocks(comm) -> None:
    """gather_v and scatter_v with uneven rows, zeros among them, from several roots."""
    p, rank = comm.size, comm.rank
    rng = np.random.default_rng(p)
    rows = [int(v) for v in rng.integers(0, 4, p)]
    blocks = [np.arange(rows[r] * 3, dtype="i4").reshape(rows[r], 3) + 100 * r for r in range(p)]
    for root in _roots(p):
        got, counts = comm.gather_v(blocks[rank], root, algorithm="bine")
        assert counts == rows
        if rank == root:
            np.testing.assert_array_equal(got, np.concatenate(blocks))
        got = comm.scatter_v(np.concatenate(blocks) if rank == root else None, rows, root,
                             algorithm="bine")
        np.testing.assert_array_equal(got, blocks[rank])
        x = np.arange(p * 5, dtype="f4").reshape(p, 5) + root
        got = comm.gather(x[rank], root, algorithm="bine")
        if rank == root:
            np.testing.assert_array_equal(got, x)
        got = comm.scatter(x if rank == root else None, root, algorithm="bine")
        np.testing.assert_array_equal(got, x[rank])


@pytest.mark.parametrize("p", range(1, 17))
def test_tree_algorithms_match_numpy(p):
    def body(comm):
        _check_rooted(comm, (0, 1, 13))
        _check_all_reduce(comm, (0, 1, 13))
        _check_blocks(comm)
        return True

    assert run_local(p, body, timeout=30) == [True] * p
