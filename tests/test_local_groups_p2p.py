"""Sub-communicators and point-to-point messages on the local backend (thread-ranks)."""

from __future__ import annotations

import time

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


@pytest.mark.parametrize("ranks", [[0, 0, 1], [0, 3], [0, 1.0]])
def test_bad_ranks_of_new_group_on_one_thread_rank_raise_everywhere_naming_the_range(ranks):
    def body(comm):
        with pytest.raises(mpicoll.InvalidArgumentError,
                           match=r"rank\(s\) 2: ranks: expected distinct ranks .* in 0\.\.2$"):
            comm.new_group(ranks if comm.rank == 2 else [0, 1])
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
        small = np.zeros(1)
        if r == 1:  # (longer than the receive: as MPI, taken, cut short and said so; the
            comm.send(np.arange(1.0, 4.0), 0, tag=2)  # next message is the next one)
            comm.send(np.full(1, 42.0), 0, tag=2)
        if r == 0:
            with pytest.raises(mpicoll.CollectiveError,
                               match="from rank 1 .tag 2. is longer than the 8 bytes"):
                comm.recv(small, 1, tag=2)
            assert small[0] == 1.0
            comm.recv(small, 1, tag=2)
            assert small[0] == 42.0
        return True

    assert run_local(3, body, timeout=10) == [True] * 3


def test_status_probe_and_any_tag_on_thread_ranks():
    def body(comm):
        r, last = comm.rank, comm.size - 1
        if r == 0:
            assert comm.iprobe(last, 4) is None
        comm.barrier()
        if r == last:
            comm.send(np.arange(3.0), 0, tag=4)
            comm.send(np.arange(5, dtype=np.int32), 0, tag=6)
        elif r == 0:
            status = comm.probe(tag=mpicoll.ANY)
            assert (status.source, status.tag, status.count(np.float64)) == (last, 4, 3)
            out, got = np.full(5, -1.0), mpicoll.Status()
            assert comm.recv(out, mpicoll.ANY, mpicoll.ANY, status=got) == last
            assert got.nbytes == 24 and out.tolist() == [0.0, 1.0, 2.0, -1.0, -1.0]
            ints, any_tag = np.zeros(8, np.int32), mpicoll.Status()
            assert comm.irecv(ints, last, mpicoll.ANY).wait(any_tag) == last
            assert (any_tag.tag, any_tag.count(np.int32)) == (6, 5)
        comm.barrier()
        if r == last:  # two messages of one tag: a posted receive takes the first
            comm.send(np.arange(3.0), 0, tag=9)
            comm.send(np.arange(5.0), 0, tag=9)
        elif r == 0:
            first = comm.irecv(np.empty(3), last, 9)
            assert comm.probe(last, 9).count(np.float64) == 5  # (MPI's: what is left)
            first.wait()
            comm.recv(np.empty(5), last, 9)
        return True

    assert run_local(3, body, timeout=10) == [True] * 3


@pytest.mark.parametrize("how", ["recv", "irecv"])
def test_a_receive_that_never_comes_times_out_on_thread_ranks(how):
    """The timeout names the step (recv, or the irecv whose wait it is), where the
    program made it, and what it waits for, as the watchdog does over MPI."""
    def body(comm):
        if comm.rank == 0:
            with pytest.raises(mpicoll.CollectiveTimeoutError) as raised:
                if how == "recv":
                    comm.recv(np.empty(1), 1, tag=5)
                else:
                    comm.irecv(np.empty(1), 1, tag=5).wait()
            said = str(raised.value)
            assert f"rank 0: {how} (" in said and "test_local_groups_p2p.py:" in said, said
            assert "waiting to receive from rank 1 (point-to-point, tag 5)" in said, said
            assert "no message from rank 1" in said, said
        return True

    with pytest.raises(mpicoll.AbortedError):  # rank 1 is told its world gave up
        run_local(2, lambda comm: body(comm) and comm.barrier(), timeout=0.5)


# -- nodes and hierarchical algorithms ----------------------------------------------------


def test_a_groups_nodes_are_its_parents_for_its_members(monkeypatch):
    """A split's or new_group's nodes are its parent's for its members, in the group's
    rank order: never another layout its members alone would read (ranks of two merged
    MPI worlds, whose job ranks repeat; stood in for here by each Communicator taking its
    own ranks for job ranks), and agreed on every member."""
    from mpicoll.pipeline import agree

    monkeypatch.setenv("MPICOLL_RANKS_PER_NODE", "2")
    monkeypatch.setattr(agree, "_job_rank", lambda backend: backend.transport.rank)

    def body(comm):
        assert comm.nodes == ((0, 1), (2, 3))
        group = comm.new_group([1, 2])
        split = comm.split(comm.rank % 2, key=-comm.rank)  # members [2, 0] and [3, 1]
        grid = comm.mesh((2, 2), names=("dp", "tp"))
        return (None if group is None else group.nodes, split.nodes, split.node,
                grid["tp"].nodes, grid["dp"].nodes)

    got = run_local(4, body)
    assert got[1][0] == got[2][0] == ((0,), (1,)) and got[0][0] is None
    assert all(r[1] == ((0,), (1,)) for r in got)  # two ranks of two nodes, in any split
    assert [r[2] for r in got] == [1, 1, 0, 0]  # rank 2 is the split's rank 0, node 0
    assert all(r[3] == ((0, 1),) and r[4] == ((0,), (1,)) for r in got)  # tp in a node


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


def _between_nodes_by_place_only(outside: list[set], node_of: list[int]) -> None:
    """Each rank's peers in other nodes (``outside[rank]``) are the ranks of its own place
    in theirs, and only for places the smallest node has (a rank past them: none)."""
    members = [[r for r in range(len(node_of)) if node_of[r] == n] for n in sorted(set(node_of))]
    shards = min(len(m) for m in members)
    for rank, peers in enumerate(outside):
        place = members[node_of[rank]].index(rank)
        if place >= shards:
            assert not peers, (rank, peers)
        else:
            assert peers <= {m[place] for m in members}, (rank, peers)
            assert peers or len(members) == 1


@pytest.mark.parametrize(("size", "per_node"), [(4, 2), (4, 3), (5, 2), (3, 1), (6, 3), (7, 3)])
def test_sharded_hierarchical_all_reduce_sends_each_shard_between_its_holders_only(
        monkeypatch, size, per_node):
    """hierarchical_sharded: exact on even and uneven nodes (a node's ranks past the
    smallest node's size hold no shard), in place too, every dtype's sum bit for bit on
    every rank; between nodes, a rank talks only to the ranks of its own place in theirs,
    and only those places the smallest node has."""
    monkeypatch.setenv("MPICOLL_RANKS_PER_NODE", str(per_node))
    node_of = [r // per_node for r in range(size)]

    def body(comm):
        outside = set()
        for count in (0, 1, 5, 37):
            x = (np.arange(count) % 7 + comm.rank).astype(np.int64)
            want = size * (np.arange(count) % 7) + sum(range(size))
            before = len(comm.trace_events())
            got = comm.all_reduce(x, algorithm="hierarchical_sharded")
            np.testing.assert_array_equal(got, want)
            y = x.copy()
            assert comm.all_reduce(y, algorithm="hierarchical_sharded", out=y) is y
            np.testing.assert_array_equal(y, want)
            outside |= {e["peer"] for e in comm.trace_events()[before:]
                        if e.get("kind") in ("send", "recv") and
                        node_of[e["peer"]] != node_of[comm.rank]}
        f = np.linspace(0, 1, 11, dtype=np.float32) * (comm.rank + 1)
        got = comm.all_reduce(f, algorithm="hierarchical_sharded", intra="recursive_doubling",
                              inter="recursive_doubling")
        np.testing.assert_allclose(got, f / (comm.rank + 1) * sum(range(1, size + 1)),
                                   rtol=1e-6)
        return outside, got.tobytes()

    results = run_local(size, body, timeout=20, trace=True)
    assert len({bits for _, bits in results}) == 1  # the same bits on every rank
    _between_nodes_by_place_only([outside for outside, _ in results], node_of)


@pytest.mark.parametrize(("size", "per_node"), [(4, 2), (4, 3), (5, 2), (3, 1), (6, 3), (7, 3),
                                               (8, 4), (5, 3), (7, 4)])
def test_sharded_hierarchical_reduce_scatter_and_all_gather(monkeypatch, size, per_node):
    """reduce_scatter's and all_gather's hierarchical_sharded: exact on even and uneven
    nodes and blocks (the v-variants' counts, empty blocks too), with other phase
    algorithms; between nodes a rank talks only to the ranks of its column in the others
    (its place in its node), and a rank past the smallest node's size to none."""
    monkeypatch.setenv("MPICOLL_RANKS_PER_NODE", str(per_node))
    node_of = [r // per_node for r in range(size)]

    def body(comm):
        outside, r = set(), comm.rank
        phases = [{}, {"intra": "recursive_doubling", "inter": "recursive_halving"},
                  {"intra": "pairwise", "inter": "bine"}]
        gathers = [{}, {"intra": "bruck", "inter": "recursive_doubling"},
                   {"intra": "swing", "inter": "ring"}]
        for k, counts in enumerate([[0] * size, [1] * size, [3] * size,
                                    [(q * 5) % 4 for q in range(size)],
                                    [q + 1 for q in range(size)]]):
            rows = np.arange(sum(counts)) % 11
            x = (rows + r).astype(np.int64)
            before = len(comm.trace_events())
            options = phases[k % 3]
            got = comm.reduce_scatter(x, counts=counts, algorithm="hierarchical_sharded",
                                      **options)
            lo = sum(counts[:r])
            np.testing.assert_array_equal(got, size * rows[lo:lo + counts[r]] + sum(range(size)))
            outside |= {e["peer"] for e in comm.trace_events()[before:]
                        if e.get("kind") in ("send", "recv") and
                        node_of[e["peer"]] != node_of[r]}
            mine = (np.arange(counts[r]) + 100 * r).astype(np.float64)
            got, rows_of = comm.all_gather_v(mine, algorithm="hierarchical_sharded",
                                             **gathers[k % 3])
            assert list(rows_of) == counts
            want = np.concatenate([np.arange(c) + 100.0 * q for q, c in enumerate(counts)])
            np.testing.assert_array_equal(got, want)  # (its counts' exchange: every rank's)
        before = len(comm.trace_events())
        x = np.arange(size * 3.0).reshape(size, 3) + r
        got = comm.reduce_scatter(x, algorithm="hierarchical_sharded")
        np.testing.assert_array_equal(got, size * (np.arange(3.0) + 3 * r) + sum(range(size)))
        got = comm.all_gather(np.full(2, r, np.int32), algorithm="hierarchical_sharded")
        np.testing.assert_array_equal(got, np.repeat(np.arange(size), 2).reshape(size, 2))
        return outside | {e["peer"] for e in comm.trace_events()[before:]
                          if e.get("kind") in ("send", "recv") and
                          node_of[e["peer"]] != node_of[r]}

    results = run_local(size, body, timeout=20, trace=True)
    _between_nodes_by_place_only(results, node_of)


@pytest.mark.parametrize("node_of", [(0, 1, 0, 1, 0), (2, 0, 1, 2, 0, 1, 2), (1, 0, 1, 0, 1, 0),
                                     (0, 0, 1, 1, 1, 0, 2, 2)])
def test_sharded_hierarchical_on_nodes_whose_ranks_interleave(node_of):
    """Ranks dealt to nodes in turn (srun's cyclic distribution): reduce_scatter's,
    all_gather's and all_reduce's hierarchical_sharded are exact, and talk between nodes
    only by place (the nodes as the Communicator would have agreed them)."""
    size = len(node_of)

    def body(comm):
        comm._backend.transport.nodes = node_of  # (as agree.environment sets it)
        r, outside = comm.rank, set()
        before = len(comm.trace_events())
        counts = [(q * 3) % 4 for q in range(size)]
        x = (np.arange(sum(counts)) % 9 + r).astype(np.int32)
        got = comm.reduce_scatter(x, counts=counts, algorithm="hierarchical_sharded",
                                  intra="recursive_halving", inter="pairwise")
        lo = sum(counts[:r])
        np.testing.assert_array_equal(got, size * (np.arange(sum(counts)) % 9)[lo:lo + counts[r]]
                                      + sum(range(size)))
        got = comm.all_gather(np.full(3, r, np.int16), algorithm="hierarchical_sharded",
                              intra="bruck", inter="recursive_doubling")
        np.testing.assert_array_equal(got, np.repeat(np.arange(size), 3).reshape(size, 3))
        got = comm.all_reduce(np.arange(10) + r, algorithm="hierarchical_sharded")
        np.testing.assert_array_equal(got, size * np.arange(10) + sum(range(size)))
        return outside | {e["peer"] for e in comm.trace_events()[before:]
                          if e.get("kind") in ("send", "recv") and node_of[e["peer"]] != node_of[r]}

    _between_nodes_by_place_only(run_local(size, body, timeout=20, trace=True), list(node_of))


def test_hierarchical_phase_options_are_checked():
    def body(comm):
        x = np.ones(4)
        got = comm.all_reduce(x, algorithm="hierarchical", intra="linear", inter="recursive_doubling")
        with pytest.raises(mpicoll.InvalidArgumentError, match="intra: expected one of"):
            comm.all_reduce(x, algorithm="hierarchical", intra="ring")
        with pytest.raises(mpicoll.InvalidArgumentError, match="inter: expected one of"):
            comm.barrier(algorithm="hierarchical", inter="hierarchical")
        for phase in ("intra", "inter"):  # no phase runs an algorithm made of phases
            with pytest.raises(mpicoll.InvalidArgumentError, match=f"{phase}: expected one of"):
                comm.all_reduce(x, algorithm="hierarchical_sharded", **{phase: "hierarchical"})
            with pytest.raises(mpicoll.InvalidArgumentError, match=f"{phase}: expected one of"):
                comm.all_reduce(x, algorithm="hierarchical",
                                **{phase: "hierarchical_sharded" if phase == "inter"
                                   else "hierarchical"})
        return got[0]

    assert run_local(3, body, timeout=10) == [3.0] * 3


@pytest.mark.parametrize("value", [np.array(["ring"]), np.array(["binomial", "ring"]),
                                   ["ring"], b"ring", 1])
def test_a_phase_given_as_anything_but_a_name_is_refused_on_every_rank(monkeypatch, value):
    # on two nodes, where only the nodes' leaders run the inter phase: an array of one
    # name compares equal to the name, and reached the registry on the leaders alone
    monkeypatch.setenv("MPICOLL_RANKS_PER_NODE", "2")

    def body(comm):
        x = np.full(3, comm.rank + 1.0)
        for phase in ("intra", "inter"):
            with pytest.raises(mpicoll.InvalidArgumentError, match=f"{phase}: expected one of"):
                comm.all_reduce(x, algorithm="hierarchical", **{phase: value})
        return comm.all_reduce(x, algorithm="hierarchical", inter="ring")[0]  # the next call

    assert run_local(4, body, timeout=10) == [10.0] * 4


def test_ranks_per_node_malformed_or_on_some_ranks_only_raises_everywhere(monkeypatch):
    monkeypatch.setenv("MPICOLL_RANKS_PER_NODE", "zero")
    with pytest.raises(mpicoll.ConfigError, match="MPICOLL_RANKS_PER_NODE"):
        run_local(2, lambda comm: None, timeout=10)


# -- what a review found ----------------------------------------------------------------


@pytest.mark.parametrize("inter", ["linear", "binomial", "knomial"])
@pytest.mark.parametrize("nodes", [(0, 0, 1), (0, 1, 0, 1), (1, 0, 0, 1, 2)])
def test_hierarchical_reduce_with_the_root_on_a_later_node(nodes, inter):
    """Nodes that are not blocks of ranks, and an inter phase that writes its result
    before it has read its input (linear): the root's partial must not be its result."""
    size = len(nodes)

    def body(comm):
        comm._backend.transport.nodes = nodes  # as if agreed: the same on every rank
        out = []
        for root in range(size):
            got = comm.reduce(np.arange(4.0) + comm.rank, root=root, algorithm="hierarchical",
                              inter=inter)
            out.append(None if got is None else got.tolist())
        return out

    for rank, results in enumerate(run_local(size, body, timeout=10)):
        for root, got in enumerate(results):
            want = (size * np.arange(4.0) + sum(range(size))).tolist()
            assert got == (want if rank == root else None), (rank, root)


def test_a_plan_with_root_by_keyword_runs_as_decided():
    def body(comm):
        x = np.full(3, comm.rank + 1.0)
        with comm.reduce_init(x, op="sum", root=1) as plan, comm.gather_init(x, root=1) as g:
            for _ in range(3):
                got, rows = plan(), g()
        return None if got is None else (got.tolist(), rows.tolist())

    results = run_local(3, body, timeout=10)
    assert results[1] == ([6.0] * 3, [[1.0] * 3, [2.0] * 3, [3.0] * 3]) and results[0] is None


def test_split_colors_and_keys_beyond_a_c_int_raise_on_every_rank():
    def body(comm):
        with pytest.raises(mpicoll.InvalidArgumentError, match="color"):
            comm.split(2**40 if comm.rank == 0 else 0)
        with pytest.raises(mpicoll.InvalidArgumentError, match="key"):
            comm.split(0, key=2**70 if comm.rank == 1 else 0)
        return comm.all_reduce(np.ones(1))[0]

    assert run_local(2, body, timeout=10) == [2.0, 2.0]


def test_receives_match_in_the_order_they_were_posted():
    def body(comm):
        if comm.rank == 0:
            comm.send(np.array([1.0]), 1, tag=4)
            comm.send(np.array([2.0]), 1, tag=4)
            return None
        a, b = np.zeros(1), np.zeros(1)
        first, second = comm.irecv(a, 0, tag=4), comm.irecv(b, 0, tag=4)
        second.wait()  # waited first, posted second: gets the second message
        first.wait()
        return a[0], b[0]

    assert run_local(2, body, timeout=10)[1] == (1.0, 2.0)


@pytest.mark.parametrize("later", ["test", "wait", "recv"])
def test_a_message_sent_during_a_matching_pass_goes_to_the_earliest_irecv(monkeypatch, later):
    """Rank 0's two messages land just after rank 1's first irecv looked and found
    none, in the same pass as a later receive's look: that later receive took the first
    message, past the earlier irecv (MPI gives it the second). The pass now holds the
    board, so the messages wait for its end (rank 0 is held 0.3 s here at most)."""
    import threading

    from mpicoll.transport import local

    looked, sent = threading.Event(), threading.Event()
    first: list = []
    take = local.PeerBoard.take

    def take_then_let_rank_0_send(self, dest, source, tag, buf):
        got = take(self, dest, source, tag, buf)
        if got is None and buf is not None and first and np.shares_memory(buf, first[0]) and \
                not looked.is_set():
            looked.set()  # (the earliest irecv found none: rank 0 sends now, in the pass)
            sent.wait(0.3)
        return got

    monkeypatch.setattr(local.PeerBoard, "take", take_then_let_rank_0_send)

    def body(comm):
        if comm.rank == 0:
            looked.wait(10)
            comm.isend(np.array([1]), 1, 0).wait()
            comm.isend(np.array([2]), 1, 0).wait()
            sent.set()
            return None
        earlier, after = np.zeros(1, np.int64), np.zeros(1, np.int64)
        first.append(earlier)
        request = comm.irecv(earlier, 0, 0)
        if later == "recv":
            comm.recv(after, 0, 0)
        else:
            second = comm.irecv(after, 0, 0)
            if later == "test":
                while not second.test():
                    time.sleep(0.001)
            else:
                second.wait()
        request.wait()
        return int(earlier[0]), int(after[0])

    assert run_local(2, body, timeout=20)[1] == (1, 2)


def test_a_split_of_thread_ranks_keeps_their_job_nodes(monkeypatch):
    monkeypatch.setenv("MPICOLL_RANKS_PER_NODE", "2")

    def body(comm):
        sub = comm.split(comm.rank % 2)  # job ranks 0, 2 (nodes 0, 1) and 1, 3 (0, 1)
        return sub.nodes

    assert run_local(4, body, timeout=10) == [((0,), (1,))] * 4


def test_ranks_per_node_that_only_looks_like_a_number_is_a_config_error(monkeypatch):
    monkeypatch.setenv("MPICOLL_RANKS_PER_NODE", "\u00b2")
    with pytest.raises(mpicoll.ConfigError, match="MPICOLL_RANKS_PER_NODE"):
        run_local(2, lambda comm: None, timeout=10)


def test_a_refused_second_thread_does_not_take_the_first_threads_calls():
    import threading
    import time

    def body(comm):
        def slow(a, b, out):
            time.sleep(0.3)
            np.add(a, b, out=out)

        first = comm.all_reduce(np.ones(2), mpicoll.Op(slow), algorithm="ring", async_op=True)
        refused = []
        thread = threading.Thread(target=lambda: refused.append(
            pytest.raises(mpicoll.ConcurrentCallError, comm.all_reduce, np.ones(2),
                          async_op=True)))
        thread.start()
        thread.join()
        second = comm.all_reduce(np.full(2, 3.0), algorithm="ring", async_op=True)  # first's
        first.wait()
        return second.wait().tolist(), len(refused)

    results = run_local(2, body, timeout=10)
    assert all(r == ([6.0, 6.0], 1) for r in results), results


@pytest.mark.parametrize("make", ["split", "new_group", "mesh"])
def test_another_threads_call_during_a_split_is_refused(make):
    """A split holds its Communicator for the whole step (its agreement, the library's
    split, the new Communicator): another thread's call made meanwhile is refused, not
    let in among the split's messages."""
    import threading

    def body(comm):
        refused = []
        backend_split = comm._backend.split

        def split_while_another_thread_calls(*args):
            def other():
                try:
                    comm.all_reduce(np.ones(1))
                except mpicoll.ConcurrentCallError as exc:
                    refused.append(str(exc))

            thread = threading.Thread(target=other)
            thread.start()
            thread.join()
            return backend_split(*args)

        comm._backend.split = split_while_another_thread_calls
        try:
            if make == "split":
                comm.split(0)
            elif make == "new_group":
                comm.new_group(range(comm.size))
            else:
                comm.mesh((comm.size,))
        finally:
            comm._backend.split = backend_split
        return len(refused) > 0 and all(f"in {make}" in text or "split" in text
                                        for text in refused), comm.all_reduce(np.ones(1))[0]

    assert run_local(2, body, timeout=10) == [(True, 2.0)] * 2


def test_a_local_endpoint_and_a_status_refuse_what_they_cannot_take():
    from mpicoll.local import LocalWorld

    for rank in (5, -1, True, 1.0):
        with pytest.raises(mpicoll.InvalidArgumentError, match="rank"):
            LocalWorld(2).endpoint(rank)
    for dtype in ("zz", np.dtype([])):
        with pytest.raises(mpicoll.InvalidArgumentError, match="dtype"):
            mpicoll.Status(0, 0, 16).count(dtype)
    assert mpicoll.Status(0, 0, 16).count(np.float32) == 4


def test_sendrecv_in_place_and_overlapping_receives_on_thread_ranks():
    """As on MPI: sendrecv with out=x sends x as it was; a batch receive overlapping
    another message's memory, or a receive into a stride-0 view, is refused before any
    message; a blocking receive of this rank's own isend takes it."""
    from numpy.lib.stride_tricks import as_strided

    def body(comm):
        right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        x = np.full(3, float(comm.rank))
        assert comm.sendrecv(x, right, x, left) == left and (x == left).all()
        with pytest.raises(mpicoll.InvalidArgumentError, match=r"overlaps ops\[1\]"):
            comm.batch_isend_irecv([mpicoll.P2POp("irecv", x, left),
                                    mpicoll.P2POp("isend", x, right)])
        with pytest.raises(mpicoll.InvalidArgumentError, match="stride of 0"):
            comm.irecv(as_strided(np.zeros(1), (3,), (0,), writeable=True), left)
        sent = comm.isend(np.arange(2.0), comm.rank, tag=3)
        out = np.zeros(2)
        assert comm.recv(out, comm.rank, tag=3) == comm.rank and (out == [0, 1]).all()
        sent.wait()
        return True

    assert run_local(3, body, timeout=10) == [True] * 3


# -- groups' own steps, freeing what they made ---------------------------------------------


@pytest.mark.parametrize("grouping", ["split", "new_group", "mesh"])
def test_check_mode_a_rank_gathering_while_the_others_group_raises_on_every_rank(grouping):
    """A split's agreement is an all_gather of int64 rows numbered as the grouping call:
    check mode tells it from a program's all_gather of as many int64 values on another
    rank, which took the agreement's table for its result and returned; now every rank
    raises MismatchError, and the next call is right."""
    def body(comm):
        try:
            if comm.rank == 2:
                comm.all_gather(np.arange(5, dtype=np.int64))
            else:
                {"split": lambda: comm.split(0), "new_group": lambda: comm.new_group([0, 1, 2]),
                 "mesh": lambda: comm.mesh((3,))}[grouping]()
        except mpicoll.MismatchError as exc:
            said = str(exc)
        else:
            said = "returned"
        return said, comm.all_reduce(np.ones(2)).tolist()

    for said, after in run_local(3, body, timeout=10, check=True):
        assert "rank 2 differs in collective (all_gather call #1" in said, said
        assert f"rank 0: {grouping} call #1" in said, said
        assert after == [3.0, 3.0]


def test_a_timeout_in_a_groupings_agreement_names_the_grouping():
    """A rank that never makes the new_group: the others' report names the new_group
    (and where it was made), not the all_gather its agreement runs as."""
    def body(comm):
        if comm.rank == 2:
            return ""
        try:
            comm.new_group([0, 1, 2])
        except mpicoll.MpicollError as exc:
            return str(exc)
        return "returned"

    said = run_local(3, body, timeout=1)
    assert any("call #1 new_group (" in s and "test_local_groups_p2p.py:" in s
               for s in said), said


def test_a_mesh_whose_later_split_fails_frees_the_groups_it_made(monkeypatch):
    """The second dimension's split fails (on every rank, as MPI running out of
    communicators is said): the first dimension's group is freed, not kept."""
    from mpicoll.backends.local import LocalBackend

    made, freed, real_split, real_free = [], [], LocalBackend.split, LocalBackend.free

    def split(self, *args, **kwargs):
        if any(parent is self for parent, _ in made):
            raise mpicoll.CollectiveError("no communicator left (a stand-in)")
        sub = real_split(self, *args, **kwargs)
        made.append((self, sub))
        return sub

    def free(self):
        freed.append(self)
        return real_free(self)

    monkeypatch.setattr(LocalBackend, "split", split)
    monkeypatch.setattr(LocalBackend, "free", free)

    def body(comm):
        with pytest.raises(mpicoll.CollectiveError, match="stand-in"):
            comm.mesh((1, 2))
        return comm.all_reduce(np.ones(1)).tolist()

    assert run_local(2, body, timeout=10) == [[2.0]] * 2
    assert len(made) == 2 and all(any(f is sub for f in freed) for _, sub in made)


def _held_then_any(comm, later):
    """Rank 0 posts an irecv from rank 2 (which sends only once rank 0 has sent to it),
    then receives tag 7 from any rank by ``later``: rank 1's message is that one's."""
    if comm.rank == 1:
        comm.send(np.array([11.0]), 0, tag=7)
    elif comm.rank == 2:
        comm.recv(np.zeros(1), 0, tag=1)
        comm.send(np.array([22.0]), 0, tag=7)
    else:
        first, second = np.zeros(1), np.zeros(1)
        waiting = comm.irecv(first, source=2, tag=7)
        source = later(comm, second)
        comm.send(np.ones(1), 2, tag=1)
        waiting.wait()
        return source, first[0], second[0]


def _recv_any(comm, out):
    return comm.recv(out, source=mpicoll.ANY, tag=7)


def _irecv_any_tested(comm, out):
    request = comm.irecv(out, source=mpicoll.ANY, tag=7)
    deadline = time.monotonic() + 5
    while not request.test():
        assert time.monotonic() < deadline, "the later irecv never saw rank 1's message"
    return request.wait()


def _probe_any(comm, out):
    status = comm.probe(source=mpicoll.ANY, tag=7)
    return comm.recv(out, status.source, tag=7)


@pytest.mark.parametrize("later", [_recv_any, _irecv_any_tested, _probe_any])
def test_a_posted_receive_with_no_message_yet_does_not_hold_a_later_one_up(later):
    # (MPI's matching: a message goes to the first posted receive it matches; one that
    # only a later receive matches is that one's at once. Before, the thread ranks waited
    # for the earlier irecv first, and this program, right under MPI, timed out)
    assert run_local(3, _held_then_any, later, timeout=10)[0] == (1, 22.0, 11.0)


def test_a_posted_receive_cut_short_while_another_matches_raises_at_its_own_wait():
    def body(comm):
        if comm.rank == 0:
            comm.send(np.arange(3.0), 1, tag=5)  # longer than the irecv's one element
            comm.send(np.array([9.0]), 1, tag=6)
            return None
        short, other = np.zeros(1), np.zeros(1)
        request = comm.irecv(short, 0, tag=5)
        got = comm.recv(other, 0, tag=6)  # matching here lets the irecv take its message
        with pytest.raises(mpicoll.CollectiveError, match="longer than"):
            request.wait()
        with pytest.raises(mpicoll.CollectiveError, match="longer than"):
            request.wait()  # (again at every wait, as MPI's status)
        return got, other[0], short[0]

    assert run_local(2, body, timeout=10)[1] == (0, 9.0, 0.0)


def test_a_blocking_send_to_this_thread_rank_itself_after_its_irecv_was_posted():
    def body(comm):
        got = np.zeros(2)
        request = comm.irecv(got, mpicoll.ANY, tag=3)
        comm.send(np.array([comm.rank, 7.0]), comm.rank, tag=3)
        assert request.wait() == comm.rank
        with pytest.raises(mpicoll.InvalidArgumentError, match="no irecv of it posted"):
            comm.send(np.ones(2), comm.rank, tag=3)  # (that irecv is done)
        return got.tolist()

    assert run_local(2, body, timeout=10) == [[0.0, 7.0], [1.0, 7.0]]
