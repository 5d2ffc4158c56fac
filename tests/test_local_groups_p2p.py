"""Sub-communicators and point-to-point messages on the local backend (thread-ranks)."""

from __future__ import annotations

import numpy as np
import pytest

import mpicoll
from mpicoll.local import run_local


@pytest.mark.parametrize("size", [1, 3, 5])
def test_split_and_new_group_on_thread_ranks(size):
    def body(comm):
        sub = comm.split(comm.rank % 2, key=-comm.rank)
        members = sorted((r for r in range(size) if r % 2 == comm.rank % 2), reverse=True)
        assert (sub.rank, sub.size) == (members.index(comm.rank), len(members))
        gathered = sub.all_gather(np.array([comm.rank]))[:, 0].tolist()
        group = comm.new_group([size - 1, 0] if size > 1 else [0])
        inside = comm.rank in (size - 1, 0)
        assert (group is None) == (not inside)
        total = None if group is None else int(group.all_reduce(np.array([comm.rank]))[0])
        return gathered == members, total

    results = run_local(size, body, timeout=10)
    assert all(ok for ok, _ in results)
    assert {t for _, t in results if t is not None} == {size - 1}


def test_a_bad_key_on_one_thread_rank_raises_everywhere():
    def body(comm):
        with pytest.raises(mpicoll.InvalidArgumentError, match=r"rank\(s\) 1: key"):
            comm.split(0, key=1.5 if comm.rank == 1 else 0)
        return comm.all_reduce(np.ones(1))[0]

    assert run_local(3, body, timeout=10) == [3.0] * 3


def test_point_to_point_on_thread_ranks():
    def body(comm):
        p, r = comm.size, comm.rank
        out = np.empty(4)
        if r == 0:
            sources = sorted(comm.recv(out, mpicoll.ANY, tag=1) for _ in range(p - 1))
            assert sources == list(range(1, p))
        else:
            comm.send(np.full(4, float(r)), 0, tag=1)
        right, left = (r + 1) % p, (r - 1) % p
        a, b = np.empty(2), np.empty(2)
        requests = comm.batch_isend_irecv([mpicoll.P2POp("isend", np.full(2, r * 1.0), right, 7),
                                           mpicoll.P2POp("irecv", a, left, 7),
                                           mpicoll.P2POp("isend", np.full(2, r * 2.0), right, 8),
                                           mpicoll.P2POp("irecv", b, left, 8)])
        sources = [req.wait() for req in requests]
        assert sources[1] == sources[3] == left
        assert a[0] == left and b[0] == 2 * left
        small = np.empty(1)
        if r == 1:
            comm.send(np.ones(3), 0, tag=2)
        if r == 0:
            with pytest.raises(mpicoll.MismatchError, match="only 8"):
                comm.recv(small, 1, tag=2)
        return True

    assert run_local(3, body, timeout=10) == [True] * 3


def test_a_receive_that_never_comes_times_out_on_thread_ranks():
    def body(comm):
        if comm.rank == 0:
            with pytest.raises(mpicoll.CollectiveTimeoutError, match="no message from rank 1"):
                comm.recv(np.empty(1), 1, tag=5)
        return True

    with pytest.raises(mpicoll.AbortedError):  # rank 1 is told its world gave up
        run_local(2, lambda comm: body(comm) and comm.barrier(), timeout=0.5)


# -- nodes and hierarchical algorithms ----------------------------------------------------


@pytest.mark.parametrize(("size", "per_node"), [(4, 2), (4, 3), (5, 2), (3, 1)])
def test_nodes_from_ranks_per_node_and_hierarchical_messages_stay_in_their_place(
        monkeypatch, size, per_node):
    """Every rank talks inside its node, and only one rank per node (the leader, or the
    root standing in for its node's) talks to other nodes."""
    monkeypatch.setenv("MPICOLL_RANKS_PER_NODE", str(per_node))
    node_of = [r // per_node for r in range(size)]

    def body(comm):
        assert comm.node == node_of[comm.rank]
        assert comm.nodes == tuple(tuple(r for r in range(size) if node_of[r] == n)
                                   for n in sorted(set(node_of)))
        x = np.arange(6.0) + comm.rank
        peers = {}
        for collective, call in (
                ("all_reduce", lambda: comm.all_reduce(x, algorithm="hierarchical")),
                ("broadcast", lambda: comm.broadcast(x.copy(), root=size - 1,
                                                     algorithm="hierarchical")),
                ("reduce", lambda: comm.reduce(x, root=size - 1, algorithm="hierarchical")),
                ("barrier", lambda: comm.barrier(algorithm="hierarchical")),
                ("all_gather", lambda: comm.all_gather(x, algorithm="hierarchical")),
                ("reduce_scatter", lambda: comm.reduce_scatter(
                    np.arange(size * 3.0).reshape(size, 3) + comm.rank, algorithm="hierarchical"))):
            before = len(comm.trace_events())
            got = call()
            if collective == "all_reduce":
                np.testing.assert_array_equal(got, size * np.arange(6.0) + sum(range(size)))
            if collective == "broadcast":
                np.testing.assert_array_equal(got, np.arange(6.0) + size - 1)
            if collective == "reduce" and comm.rank == size - 1:
                np.testing.assert_array_equal(got, size * np.arange(6.0) + sum(range(size)))
            if collective == "all_gather":
                np.testing.assert_array_equal(got, np.arange(6.0) + np.arange(size)[:, None])
            if collective == "reduce_scatter":
                want = size * (np.arange(3.0) + 3 * comm.rank) + sum(range(size))
                np.testing.assert_array_equal(got, want)
            peers[collective] = {e["peer"] for e in comm.trace_events()[before:]
                                 if e.get("kind") in ("send", "recv")}
        return peers

    results = run_local(size, body, timeout=10, trace=True)
    leaders = {min(r for r in range(size) if node_of[r] == n) for n in set(node_of)}
    for rank, peers in enumerate(results):
        for collective, mine in peers.items():
            outside = {p for p in mine if node_of[p] != node_of[rank]}
            heads = leaders if collective in ("all_reduce", "barrier", "all_gather",
                                              "reduce_scatter") else \
                {size - 1 if node_of[size - 1] == node_of[h] else h for h in leaders}
            if outside:
                assert rank in heads and outside <= heads, (collective, rank, mine)


def test_hierarchical_phase_options_are_checked():
    def body(comm):
        x = np.ones(4)
        got = comm.all_reduce(x, algorithm="hierarchical", intra="linear", inter="recursive_doubling")
        with pytest.raises(mpicoll.InvalidArgumentError, match="intra: expected one of"):
            comm.all_reduce(x, algorithm="hierarchical", intra="ring")
        with pytest.raises(mpicoll.InvalidArgumentError, match="inter: expected one of"):
            comm.barrier(algorithm="hierarchical", inter="hierarchical")
        return got[0]

    assert run_local(3, body, timeout=10) == [3.0] * 3


def test_ranks_per_node_malformed_or_on_some_ranks_only_raises_everywhere(monkeypatch):
    monkeypatch.setenv("MPICOLL_RANKS_PER_NODE", "zero")
    with pytest.raises(mpicoll.ConfigError, match="MPICOLL_RANKS_PER_NODE"):
        run_local(2, lambda comm: None, timeout=10)
