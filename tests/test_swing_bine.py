"""Swing and Bine: the peer schedule against its definition, Bine's labels against the
subtrees they must lay out, the messages the algorithms send, and their results against
NumPy at 1..16 ranks on the local backend (uneven blocks, count 0, in place)."""

from __future__ import annotations

import numpy as np
import pytest

from mpicoll import viz
from mpicoll.algorithms.swing import labels, negabinary, peer, rho, window
from mpicoll.local import run_local

POWERS = [1 << s for s in range(11)]  # 1 .. 1024 ranks
ALL_REDUCE = ("swing_latency", "swing_bandwidth", "bine_latency", "bine_bandwidth")
BLOCKED = ("swing", "bine")  # the reduce_scatter and all_gather algorithms


def subtree(rank: int, step: int, size: int) -> set[int]:
    """S_step(rank) by its definition: the ranks reached by steps step, step+1, ..."""
    if 1 << step == size:
        return {rank}
    return subtree(rank, step + 1, size) | subtree(peer(rank, step, size), step + 1, size)


def test_rho_is_the_alternating_sum_of_powers_of_two():
    assert [rho(k) for k in range(8)] == [1, -1, 3, -5, 11, -21, 43, -85]
    assert all(rho(k) == sum((-2) ** i for i in range(k + 1)) for k in range(30))


def test_negabinary_digits():
    assert [negabinary(v) for v in (0, 1, -1, 2, -2, 3, 6)] == [0, 1, 0b11, 0b110, 0b10,
                                                                0b111, 0b11010]
    for value in range(-300, 300):
        digits = negabinary(value)
        assert sum((-2) ** i for i in range(digits.bit_length()) if digits >> i & 1) == value
    # rho(k) is the negabinary number of k + 1 ones
    assert all(negabinary(rho(k)) == (1 << (k + 1)) - 1 for k in range(20))


def test_swing_peers_at_8_ranks():
    """Worked by hand from the definition: even ranks go +1, -1, +3; odd ones -1, +1, -3."""
    expected = {0: [1, 7, 3], 1: [0, 2, 6], 2: [3, 1, 5], 3: [2, 4, 0],
                4: [5, 3, 7], 5: [4, 6, 2], 6: [7, 5, 1], 7: [6, 0, 4]}
    assert {r: [peer(r, k, 8) for k in range(3)] for r in range(8)} == expected


@pytest.mark.parametrize("size", POWERS[1:])
def test_every_step_pairs_the_ranks(size):
    for step in range(size.bit_length() - 1):
        for r in range(size):
            q = peer(r, step, size)
            assert q != r and q % 2 != r % 2 and peer(q, step, size) == r, (size, step, r)


@pytest.mark.parametrize("size", POWERS[:9])
def test_subtrees_halve_and_bine_labels_make_them_contiguous(size):
    """Every S_k(r) has p/2^k ranks (so a butterfly reaches each rank once), and is the
    ranks whose Bine labels fall in r's aligned window of labels."""
    bits = size.bit_length() - 1
    label, rank_of = labels(size)
    assert sorted(label) == list(range(size))
    assert all(rank_of[label[r]] == r for r in range(size))
    for step in range(bits + 1):
        for r in range(size):
            members = subtree(r, step, size)
            assert len(members) == size >> step, (size, step, r)
            lo, hi = window(label[r], step, bits)
            assert members == {rank_of[g] for g in range(lo, hi)}, (size, step, r)


def pairs(step: int, size: int) -> list[tuple[int, int]]:
    return sorted((r, peer(r, step, size)) for r in range(size))


@pytest.mark.parametrize("collective,algorithm,order", [
    ("all_reduce", "swing_latency", [0, 1, 2]),
    ("all_reduce", "bine_latency", [0, 1, 2]),
    ("all_reduce", "swing_bandwidth", [0, 1, 2, 2, 1, 0]),
    ("all_reduce", "bine_bandwidth", [0, 1, 2, 2, 1, 0]),
    ("reduce_scatter", "swing", [0, 1, 2]),
    ("all_gather", "swing", [2, 1, 0]),
])
def test_messages_follow_the_swing_peers(collective, algorithm, order):
    """At 8 ranks, round k of the traced messages pairs each rank with peer(r, step)."""
    steps = viz.flow(collective, algorithm, 8)
    assert [sorted((s, d) for s, d, _, _ in messages) for messages in steps] == \
        [pairs(step, 8) for step in order]


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_bine_moves_each_block_once_to_or_from_its_label(collective):
    """Bine's reduce_scatter and all_gather: the butterfly's messages, plus one message per
    rank whose label is not its own rank, between it and the rank its label names."""
    label, rank_of = labels(8)
    butterfly = [pair for step in range(3) for pair in pairs(step, 8)]
    if collective == "reduce_scatter":  # rank r sends the block it summed, block label[r]
        moved = [(r, label[r]) for r in range(8) if label[r] != r]
    else:  # rank r sends its block to the rank labelled r
        moved = [(r, rank_of[r]) for r in range(8) if rank_of[r] != r]
    steps = viz.flow(collective, "bine", 8)
    assert sorted((s, d) for messages in steps for s, d, _, _ in messages) == \
        sorted(butterfly + moved)


@pytest.mark.parametrize("size,rounds", [(2, 1), (3, 3), (5, 4), (6, 4), (7, 4), (8, 3),
                                         (12, 5), (16, 4)])
def test_latency_rounds_fold_onto_a_power_of_two(size, rounds):
    """lg p2 rounds, 2 more when the extra ranks are folded in and out."""
    folded = size & (size - 1) != 0
    assert len(viz.flow("all_reduce", "swing_latency", size)) == rounds
    assert len(viz.flow("all_reduce", "swing_bandwidth", size)) == 2 * rounds - 2 * folded


def _counts(size: int) -> list[list[int]]:
    """Block sizes: even, uneven with zeros, all zero."""
    return [[3] * size, [(r * 3 + 1) % 4 for r in range(size)], [0] * size]


def _check(comm) -> bool:
    p, r = comm.size, comm.rank
    for n in (0, 1, 7, 50):
        inputs = [np.arange(n, dtype="i8") * (q + 1) + q for q in range(p)]
        total = sum(inputs)
        for algorithm in ALL_REDUCE:
            x = inputs[r].copy()
            x.setflags(write=False)  # src is read only unless it is dst
            got = comm.all_reduce(x, algorithm=algorithm)
            np.testing.assert_array_equal(got, total, err_msg=f"{algorithm} p={p} n={n}")
            y = inputs[r].copy()
            assert comm.all_reduce(y, out=y, algorithm=algorithm) is y
            np.testing.assert_array_equal(y, total, err_msg=f"{algorithm} in place p={p}")
    for counts in _counts(p):
        inputs = [np.arange(sum(counts), dtype="i8") * (q + 2) - q for q in range(p)]
        total = sum(inputs)
        start = sum(counts[:r])
        for algorithm in BLOCKED:
            x = inputs[r].copy()
            x.setflags(write=False)
            got = comm.reduce_scatter(x, "sum", counts=counts, algorithm=algorithm)
            np.testing.assert_array_equal(got, total[start:start + counts[r]],
                                          err_msg=f"reduce_scatter {algorithm} {counts}")
            got, gathered = comm.all_gather_v(inputs[r][:counts[r]], algorithm=algorithm)
            assert gathered == counts
            np.testing.assert_array_equal(
                got, np.concatenate([inputs[q][:counts[q]] for q in range(p)]),
                err_msg=f"all_gather {algorithm} {counts}")
    return True


@pytest.mark.parametrize("size", range(1, 17))
def test_results_match_numpy(size):
    assert all(run_local(size, _check, timeout=30))


def test_floats_every_rank_gets_the_same_bits():
    """The butterflies add in a different order on each rank; the results still agree
    to rounding, and every rank's copy of a block is the same bits."""
    def body(comm):
        x = np.random.default_rng(comm.rank).standard_normal(1000).astype("f4")
        return [comm.all_reduce(x, algorithm=a) for a in ALL_REDUCE]

    results = run_local(6, body)
    expected = sum(np.random.default_rng(r).standard_normal(1000).astype("f8") for r in range(6))
    for per_rank in results:
        for got in per_rank:
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    for i in range(len(ALL_REDUCE)):
        if "bandwidth" in ALL_REDUCE[i]:  # each chunk is summed once, then copied
            assert all(np.array_equal(results[0][i], rank[i]) for rank in results)
