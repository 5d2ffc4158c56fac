"""Sub-communicators (split, new_group) and point-to-point messages under mpiexec, with
one rank wrong and then the next call right."""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

import mpicoll

pytestmark = pytest.mark.mpi


def _next_call_is_right(comm) -> None:
    got = comm.all_reduce(np.full(3, comm.rank + 1.0), algorithm="ring")
    np.testing.assert_array_equal(got, np.full(3, comm.size * (comm.size + 1) / 2))


@pytest.mark.parametrize("width", [1, 2, 3])
def test_split_by_color_orders_by_key_then_rank(world, width):
    color = world.rank // width
    key = -world.rank  # reversed order inside each group
    sub = world.split(color, key)
    members = [r for r in range(world.size) if r // width == color]
    assert sub.size == len(members)
    assert sub.rank == sorted(members, reverse=True).index(world.rank)
    got = sub.all_gather(np.array([world.rank]))
    np.testing.assert_array_equal(got[:, 0], sorted(members, reverse=True))
    assert sub.all_reduce(np.array([1]))[0] == len(members)
    sub.free()
    _next_call_is_right(world)


def test_split_with_none_gives_none_and_the_others_a_group(world):
    sub = world.split(None if world.rank == 0 else 1)
    if world.rank == 0:
        assert sub is None
    else:
        assert sub.size == world.size - 1 and sub.rank == world.rank - 1
        _next_call_is_right(sub)
        sub.free()
    _next_call_is_right(world)


def test_a_bad_color_on_one_rank_raises_on_every_rank(world):
    color = "red" if world.rank == world.size - 1 else 0
    with pytest.raises(mpicoll.InvalidArgumentError, match=rf"rank\(s\) {world.size - 1}: color"):
        world.split(color)
    _next_call_is_right(world)


def test_new_group_in_the_given_order_and_none_outside(world):
    ranks = list(range(world.size))[::-2]  # every other rank, from the last down
    group = world.new_group(ranks)
    if world.rank in ranks:
        assert group.rank == ranks.index(world.rank) and group.size == len(ranks)
        got = group.all_gather(np.array([world.rank]))[:, 0]
        np.testing.assert_array_equal(got, ranks)
        group.free()
    else:
        assert group is None
    _next_call_is_right(world)


def test_new_group_with_ranks_that_differ_raises_everywhere(world):
    if world.size < 2:
        pytest.skip("needs two ranks")
    ranks = [0, 1] if world.rank != 1 else [1, 0]
    with pytest.raises(mpicoll.MismatchError, match=r"rank\(s\) 1 give other ranks than rank\(s\) 0"):
        world.new_group(ranks)
    if world.size > 2:  # the odd one out named, not the rest: rank 0 alone differs
        others = ", ".join(map(str, range(1, world.size)))
        with pytest.raises(mpicoll.MismatchError,
                           match=rf"rank\(s\) 0 give other ranks than rank\(s\) {others};"):
            world.new_group([1, 0] if world.rank == 0 else [0, 1])
    with pytest.raises(mpicoll.InvalidArgumentError, match="ranks: expected distinct"):
        world.new_group([0, 0])
    _next_call_is_right(world)


def test_groups_nest_and_keep_their_own_calls(world):
    half = world.split(world.rank % 2)
    quarter = half.split(half.rank % 2)
    total = quarter.all_reduce(np.array([world.rank]))[0]
    members = [r for r in range(world.size) if r % 2 == world.rank % 2]
    members = [m for i, m in enumerate(members) if i % 2 == members.index(world.rank) % 2]
    assert total == sum(members)
    quarter.free()
    half.free()
    _next_call_is_right(world)


# -- point-to-point ------------------------------------------------------------------------


def test_ranks_making_different_grouping_calls_raise_everywhere(world):
    """One rank makes another of split, new_group and mesh than the others: every rank
    raises, naming the ranks that differ, before any group; then the next call is right."""
    if world.size < 2:
        pytest.skip("needs two ranks")
    last = world.size - 1
    with pytest.raises(mpicoll.MismatchError,
                       match=rf"rank\(s\) {last} make another call than rank\(s\) 0"):
        if world.rank == last:
            world.new_group(list(range(world.size)))
        else:
            world.split(0)
    _next_call_is_right(world)


def test_running_out_of_mpi_communicators_is_said_on_every_rank(world):
    """A program that makes communicators and never frees them (here raw MPI_Comm_dups,
    as fast as MPI makes them): once MPI has none left, a split, a dup and a new
    Communicator raise mpicoll's error on every rank, saying what to free (not MPI's raw
    exception); the parent still works, and groups are made again once freed."""
    from mpi4py import MPI

    held = []
    try:
        while len(held) < 100000:
            try:
                held.append(MPI.COMM_WORLD.Dup())
            except MPI.Exception:
                break
        for make in (lambda: world.split(0), world.dup, mpicoll.Communicator):
            with pytest.raises(mpicoll.CollectiveError, match="free the Communicators"):
                make()
            _next_call_is_right(world)
    finally:
        for comm in held:
            comm.Free()
    again = world.split(0)
    _next_call_is_right(again)
    again.free()
    _next_call_is_right(world)


@pytest.mark.mpi(min_size=2)
def test_a_group_keeps_its_parents_tuning_and_a_setting_its_ranks_alone_read_fails_everywhere(
        monkeypatch, tmp_path):
    """Ranks 1.. see a corrupt tuning file and an unwritable MPICOLL_TRACE after the
    parent was made (rank 0's are fine). The group of ranks 1.. re-read the files on its
    own rank 0 (rank 1): a ConfigError on its ranks alone, while rank 0 went on (a mesh
    then waited until the watchdog). Now a group keeps the parent's tables, and a group
    whose own settings fail raises on every rank of the parent; the next call runs."""
    from mpi4py import MPI

    world = mpicoll.Communicator(MPI.COMM_WORLD)
    if world.rank > 0:
        corrupt = tmp_path / "corrupt.json"
        corrupt.write_text("{ not json")
        monkeypatch.setenv("MPICOLL_TUNING", str(corrupt))
    sub = world.split(0 if world.rank == 0 else 1)  # (it raised on ranks 1.. alone)
    assert sub.size == (1 if world.rank == 0 else world.size - 1)
    assert sub.all_reduce(np.ones(2))[0] == sub.size
    sub.free()
    monkeypatch.setenv("MPICOLL_TRACE", str(tmp_path / "t.json") if world.rank == 0
                       else "/no/such/folder/t.json")
    for make in (lambda: world.split(0 if world.rank == 0 else 1),
                 lambda: world.mesh((1, world.size), ("a", "b"))):
        with pytest.raises(mpicoll.ConfigError, match=r"failed on rank\(s\) 1.* of this "
                           r"Communicator .*MPICOLL_TRACE: cannot write the trace"):
            make()
    monkeypatch.delenv("MPICOLL_TRACE")
    _next_call_is_right(world)
    world.free()


@pytest.mark.mpi(min_size=2)
def test_messages_pending_when_their_communicator_is_freed_complete(world):
    """An isend and irecv of 1.6 MB (MPI's rendezvous: pending until both wait) across
    comm.free(): as MPI_Comm_free leaves them, they complete at their wait. The wait
    refused them as a new call ("make calls on a live one"), on some ranks and some
    runs, and a receive matched before the free lost its data."""
    sub = world.dup()
    big = np.arange(200_000.0)
    got = np.zeros_like(big)
    right, left = (world.rank + 1) % world.size, (world.rank - 1) % world.size
    requests = [sub.irecv(got, left, tag=3), sub.isend(big, right, tag=3)]
    sub.free()
    assert requests[0].wait(timeout=30) == left and requests[1].wait() is None
    np.testing.assert_array_equal(got, big)
    with pytest.raises(mpicoll.InvalidArgumentError, match="was freed"):
        sub.irecv(np.zeros(2), left, tag=9)  # (a new message on it: refused)
    _next_call_is_right(world)


def test_a_ring_of_sends_and_receives_with_tags(world):
    if world.size < 2:
        pytest.skip("needs a peer")
    right, left = (world.rank + 1) % world.size, (world.rank - 1) % world.size
    x = np.arange(5, dtype=np.float32) + world.rank
    out = np.empty(5, np.float32)
    if world.rank % 2 == 0:
        world.send(x, right, tag=3)
        source = world.recv(out, left, tag=3)
    else:
        source = world.recv(out, left, tag=3)
        world.send(x, right, tag=3)
    assert source == left
    np.testing.assert_array_equal(out, np.arange(5, dtype=np.float32) + left)
    _next_call_is_right(world)


def test_recv_from_any_rank_reports_who_sent(world):
    if world.size < 2:
        pytest.skip("needs a peer")
    if world.rank == 0:
        seen = set()
        out = np.empty(1, np.int64)
        for _ in range(world.size - 1):
            source = world.recv(out, mpicoll.ANY, tag=9)
            assert out[0] == 100 + source
            seen.add(source)
        assert seen == set(range(1, world.size))
    else:
        world.send(np.array([100 + world.rank]), 0, tag=9)
    _next_call_is_right(world)


def test_status_probe_and_any_tag(world):
    """A receive's status says who sent, with which tag, and how many bytes (a shorter
    message leaves the rest of out as it was); probe sizes a buffer before the receive;
    iprobe is None when nothing has come; ANY takes any tag; a staged request too."""
    if world.size < 2:
        pytest.skip("needs a peer")
    r, last = world.rank, world.size - 1
    if r == 0:
        assert world.iprobe(last, 4) is None  # (rank `last` sends only after the barrier)
    world.barrier()
    if r == last:
        world.send(np.arange(3.0), 0, tag=4)
        world.send(np.arange(5, dtype=np.int32), 0, tag=6)
        world.send(np.full(2, 7.0), 0, tag=8)
    elif r == 0:
        status = world.probe(mpicoll.ANY, 4)
        assert (status.source, status.tag, status.nbytes, status.count(np.float64)) == \
            (last, 4, 24, 3)
        out = np.full(10, -1.0)
        got = mpicoll.Status()
        assert world.recv(out, status.source, status.tag, status=got) == last
        assert (got.source, got.tag, got.count(np.float64)) == (last, 4, 3)
        assert out.tolist() == [0.0, 1.0, 2.0] + [-1.0] * 7  # the rest as it was
        ints, any_tag = np.zeros(8, np.int32), mpicoll.Status()
        request = world.irecv(ints, last, mpicoll.ANY)
        assert request.wait(any_tag) == last and (any_tag.tag, any_tag.count(np.int32)) == (6, 5)
        assert ints[:5].tolist() == list(range(5))
        polled = None
        while polled is None:
            polled = world.iprobe(tag=mpicoll.ANY)
        assert (polled.source, polled.tag, polled.nbytes) == (last, 8, 16)
        with pytest.raises(mpicoll.InvalidArgumentError, match="status: expected"):
            world.recv(np.empty(2), tag=mpicoll.ANY, status="status")  # before it takes it
        assert world.recv(np.empty(2), tag=mpicoll.ANY) == last
    with pytest.raises(mpicoll.InvalidArgumentError, match="tag: expected an int"):
        world.send(np.ones(1), (r + 1) % world.size, tag=mpicoll.ANY)  # (a send names its tag)
    with pytest.raises(mpicoll.InvalidArgumentError, match="status: expected"):
        world.sendrecv(np.ones(1), r, np.empty(1), r, status="status")
    _next_call_is_right(world)


def test_tags_are_matched_not_just_order(world):
    if world.size < 2:
        pytest.skip("needs a peer")
    if world.rank == 0:
        first = world.isend(np.array([1.0]), 1, tag=1)
        second = world.isend(np.array([2.0]), 1, tag=2)
        first.wait()
        second.wait()
    elif world.rank == 1:
        two, one = np.empty(1), np.empty(1)
        r2 = world.irecv(two, 0, tag=2)  # posted first, matches the second message
        r1 = world.irecv(one, 0, tag=1)
        assert r2.wait() == 0 and r1.wait() == 0
        assert (one[0], two[0]) == (1.0, 2.0)
    _next_call_is_right(world)


def test_sendrecv_and_batch_exchange_with_both_neighbours(world):
    right, left = (world.rank + 1) % world.size, (world.rank - 1) % world.size
    got = np.empty(2)
    if world.size > 1:
        assert world.sendrecv(np.full(2, float(world.rank)), right, got, left) == left
        np.testing.assert_array_equal(got, np.full(2, left))
    from_left, from_right = np.empty(3), np.empty(3)
    requests = world.batch_isend_irecv([
        mpicoll.P2POp("isend", np.full(3, float(world.rank)), right, 4),
        mpicoll.P2POp("isend", np.full(3, float(world.rank)), left, 5),
        mpicoll.P2POp(world.irecv, from_left, left, 4),
        mpicoll.P2POp(world.irecv, from_right, right, 5)])
    for request in requests:
        request.wait()
    assert all(r.test() for r in requests)
    np.testing.assert_array_equal(from_left, np.full(3, left))
    np.testing.assert_array_equal(from_right, np.full(3, right))
    _next_call_is_right(world)


def test_strided_receive_buffers_get_the_message_and_keep_the_rest(world):
    """A column as ``out`` (recv, sendrecv, irecv, a batch's irecv) gets the message, as a
    contiguous one would, and its other elements stay as they were; the next messages
    of the same tag then pair right (nothing was left queued by a refusal)."""
    if world.size < 2:
        pytest.skip("needs a peer")
    right, left = (world.rank + 1) % world.size, (world.rank - 1) % world.size
    sent = np.arange(4.0) + 10 * world.rank
    grid = np.full((4, 3), -1.0)
    if world.rank % 2 == 0:
        world.send(sent, right, tag=6)
        assert world.recv(grid[:, 1], left, tag=6) == left
    else:
        assert world.recv(grid[:, 1], left, tag=6) == left
        world.send(sent, right, tag=6)
    expected = np.full((4, 3), -1.0)
    expected[:, 1] = np.arange(4.0) + 10 * left
    np.testing.assert_array_equal(grid, expected)
    status = mpicoll.Status()  # a shorter message: the column's rest kept
    assert world.sendrecv(sent[:2], right, grid[:, 2], left, status=status) == left
    assert status.count(np.float64) == 2
    np.testing.assert_array_equal(grid[:, 2], [10 * left, 10 * left + 1, -1, -1])
    grid[:] = -1
    request = world.irecv(grid.T[0], left, tag=7)  # a row of the transpose: strided
    world.isend(sent, right, tag=7).wait()
    assert request.wait() == left
    np.testing.assert_array_equal(grid[:, 0], np.arange(4.0) + 10 * left)
    grid[:] = -1
    requests = world.batch_isend_irecv([mpicoll.P2POp("irecv", grid[:, 2], left, 8),
                                        mpicoll.P2POp("isend", sent * 2, right, 8)])
    while not requests[0].test():  # (test() that sees it done copies it, as wait())
        time.sleep(1e-4)
    np.testing.assert_array_equal(grid[:, 2], (np.arange(4.0) + 10 * left) * 2)
    requests[1].wait()
    assert requests[0].wait() == left
    _next_call_is_right(world)


def test_a_refused_batch_sends_nothing(world):
    """A batch whose second op is refused (a bad tag) starts none of its messages: the
    peer's receives get the next batch's, not the refused one's first send."""
    if world.size < 2:
        pytest.skip("needs a peer")
    if world.rank == 0:
        with pytest.raises(mpicoll.InvalidArgumentError, match=r"ops\[1\]\.tag: expected"):
            world.batch_isend_irecv([mpicoll.P2POp("isend", np.full(4, 9.0), 1),
                                     mpicoll.P2POp("isend", np.full(4, 9.0), 1, tag=-1)])
        for request in world.batch_isend_irecv([mpicoll.P2POp("isend", np.ones(4), 1),
                                                mpicoll.P2POp("isend", np.full(4, 2.0), 1)]):
            request.wait()
    elif world.rank == 1:
        a, b = np.empty(4), np.empty(4)
        for request in world.batch_isend_irecv([mpicoll.P2POp("irecv", a, 0),
                                                mpicoll.P2POp("irecv", b, 0)]):
            request.wait()
        np.testing.assert_array_equal(a, np.ones(4))
        np.testing.assert_array_equal(b, np.full(4, 2.0))
    _next_call_is_right(world)


def test_point_to_point_never_meets_a_collective(world):
    """A user message on the tag a collective would use next stays for its receive."""
    if world.size < 2:
        pytest.skip("needs a peer")
    tag = world.transport.tag + 1
    if world.rank == 0:
        request = world.isend(np.array([42.0]), 1, tag=tag % 1000)
    _next_call_is_right(world)
    if world.rank == 1:
        out = np.empty(1)
        assert world.recv(out, 0, tag=tag % 1000) == 0 and out[0] == 42.0
    if world.rank == 0:
        request.wait()
    _next_call_is_right(world)


def test_bad_peers_and_buffers_are_refused_before_any_message(world):
    with pytest.raises(mpicoll.InvalidArgumentError, match="dest: .* out of range"):
        world.send(np.ones(2), world.size)
    with pytest.raises(mpicoll.InvalidArgumentError, match="this rank itself"):
        world.send(np.ones(2), world.rank)
    with pytest.raises(mpicoll.InvalidArgumentError, match="tag: expected"):
        world.isend(np.ones(2), 0, tag=-3)
    read_only = np.ones(2)
    read_only.flags.writeable = False
    with pytest.raises(mpicoll.InvalidArgumentError, match="must be writeable"):
        world.irecv(read_only, 0)
    with pytest.raises(mpicoll.InvalidArgumentError, match="expected 'isend' or 'irecv'"):
        world.batch_isend_irecv([mpicoll.P2POp("send", np.ones(1), 0)])
    _next_call_is_right(world)


def test_a_mesh_gives_each_dimension_its_group(world):
    if world.size % 2:
        shape, names = (world.size,), ("dp",)
    else:
        shape, names = (world.size // 2, 2), ("dp", "tp")
    mesh = world.mesh(shape, names)
    assert mesh.coordinates == tuple(int(c) for c in np.unravel_index(world.rank, shape))
    for d, name in enumerate(names):
        group = mesh[name]
        assert group.size == shape[d] and group.rank == mesh.coordinates[d]
        ranks = group.all_gather(np.array([world.rank]))[:, 0].tolist()
        stride = int(np.prod(shape[d + 1:]))
        first = world.rank - mesh.coordinates[d] * stride
        assert ranks == [first + k * stride for k in range(shape[d])]
    with pytest.raises(mpicoll.InvalidArgumentError, match="mesh: refused .*shape"):
        world.mesh((world.size + 1,))
    # a product past int64, (2**64 + 1) * size, which NumPy's wraps round to the ranks
    with pytest.raises(mpicoll.InvalidArgumentError, match="mesh: refused .*shape"):
        world.mesh((274177, 67280421310721, world.size))
    for name in (["dp"], np.array(["dp"]), {"dp"}, 0, None):  # a dimension is named by a str
        with pytest.raises(mpicoll.InvalidArgumentError, match="mesh: no dimension"):
            mesh[name]
    mesh.free()
    _next_call_is_right(world)


def test_a_mesh_one_rank_gives_wrong_or_other_raises_on_every_rank(world):
    """The first split agrees the shape and names: one rank's bad shape, or a shape or
    names that differ from the others', raise on every rank before any group; then the
    next call is right."""
    last = world.rank == world.size - 1
    with pytest.raises(mpicoll.InvalidArgumentError, match=rf"mesh: refused on rank\(s\) {world.size - 1}"):
        world.mesh((world.size + 1,) if last else (world.size,))
    _next_call_is_right(world)
    if world.size > 1:
        with pytest.raises(mpicoll.MismatchError, match=rf"mesh: rank\(s\) {world.size - 1} give"):
            world.mesh((1, world.size) if last else (world.size, 1))
        _next_call_is_right(world)
        with pytest.raises(mpicoll.MismatchError, match="shape and names"):
            world.mesh((world.size,), ("b",) if last else ("a",))
        _next_call_is_right(world)


def _failing_iterable(first):
    """The caller's own iterable that raises part-way (not a TypeError)."""
    yield first
    raise RuntimeError("the caller's iterable failed")


def test_an_iterable_that_raises_on_one_rank_is_refused_on_every_rank(world):
    """new_group's ranks, a mesh's shape or names, that raise on one rank as they are
    read (anything, not just a TypeError) are that rank's fault, agreed like a bad value:
    every rank raises before any group, and the next call is right."""
    last = world.rank == world.size - 1
    faulty = rf"refused on rank\(s\) {world.size - 1}"
    with pytest.raises(mpicoll.InvalidArgumentError, match=faulty):
        world.new_group(_failing_iterable(0) if last else range(world.size))
    _next_call_is_right(world)
    with pytest.raises(mpicoll.InvalidArgumentError, match=faulty):
        world.mesh(_failing_iterable(world.size) if last else (world.size,))
    _next_call_is_right(world)
    with pytest.raises(mpicoll.InvalidArgumentError, match=faulty):
        world.mesh((world.size,), _failing_iterable("a") if last else ("a",))
    _next_call_is_right(world)


def test_nodes_are_agreed_and_follow_ranks_per_node(world):
    import os
    import zlib

    nodes = world.nodes
    assert sorted(r for node in nodes for r in node) == list(range(world.size))
    assert world.rank in nodes[world.node]
    k = os.environ.get("MPICOLL_RANKS_PER_NODE")
    if k:  # blocks of k ranks of the job (here the job is this Communicator's ranks)
        k = int(k)
        assert nodes == tuple(tuple(range(s, min(s + k, world.size)))
                              for s in range(0, world.size, k))
    mine = np.array([zlib.crc32(repr(nodes).encode())])
    assert (world.all_gather(mine) == mine).all(), "every rank sees the same nodes"


def test_a_message_longer_than_the_receive_buffer_is_said_so(world):
    """A receive (by rank or from ANY, recv, sendrecv, irecv) whose message is longer than its
    buffer: MPI cuts it short; mpicoll's error says so (who sent, its tag, the buffer's
    bytes), not MPI's error text; the next calls are right."""
    if world.size < 2:
        pytest.skip("needs two ranks")
    if world.rank == 0:
        world.send(np.ones(4), 1, tag=3)
        world.send(np.ones(4), 1, tag=4)
        world.sendrecv(np.ones(4), 1, np.zeros(4), 1, send_tag=5, recv_tag=5)
        world.send(np.ones(4), 1, tag=6)
        world.send(np.ones(4), 1, tag=7)
        for tag in (8, 9, 10):
            world.send(np.arange(1.0, 5.0), 1, tag=tag)
    elif world.rank == 1:
        for source, tag in ((0, 3), (mpicoll.ANY, 4)):  # (from ANY, the sender is the
            # status's, which MPI need not fill in on an error: then "the sender")
            named = r"from rank 0 \(tag 3\)" if source == 0 else \
                r"from (rank 0|the sender) \(tag 4\)"
            with pytest.raises(mpicoll.CollectiveError,
                               match=rf"{named} is longer than the 16 bytes"):
                world.recv(np.zeros(2), source, tag=tag)
        with pytest.raises(mpicoll.CollectiveError, match="is longer than the 16 bytes"):
            world.sendrecv(np.ones(4), 0, np.zeros(2), 0, send_tag=5, recv_tag=5)
        for tag in (6, 7):  # (an irecv's wait and its test tell it too)
            request = world.irecv(np.zeros(2), 0, tag=tag)
            with pytest.raises(mpicoll.CollectiveError, match="is longer than the 16 bytes"):
                if tag == 6:
                    request.wait()
                else:
                    while not request.test():
                        pass
        # a strided out (a column) holds the first bytes too, as MPI leaves them (recv, and
        # an irecv's wait and test): its landing copy was dropped with the error
        for tag in (8, 9, 10):
            grid = np.zeros((2, 2))
            with pytest.raises(mpicoll.CollectiveError, match="may hold its first bytes"):
                if tag == 8:
                    world.recv(grid[:, 0], 0, tag=tag)
                else:
                    request = world.irecv(grid[:, 0], 0, tag=tag)
                    while tag == 10 and not request.test():
                        pass
                    request.wait()
            np.testing.assert_array_equal(grid, [[1.0, 0.0], [2.0, 0.0]])
    np.testing.assert_array_equal(world.all_reduce(np.ones(2)), np.full(2, float(world.size)))


def test_a_request_cut_short_says_so_at_every_wait(world):
    """A receive's error is the request's: its second wait raises it again (not a
    status of the message it did not take)."""
    if world.size < 2:
        pytest.skip("needs two ranks")
    if world.rank == 0:
        world.send(np.arange(4.0), 1, tag=8)
    elif world.rank == 1:
        request = world.irecv(np.zeros(2), 0, tag=8)
        for _ in range(2):
            with pytest.raises(mpicoll.CollectiveError, match="is longer than the 16 bytes"):
                request.wait()
    _next_call_is_right(world)


def test_a_dropped_request_keeps_its_copy_until_the_message_is_done(world):
    """An isend of a strided array sends a contiguous copy of it: dropped unwaited, the
    request (and the copy MPI still reads) lives on until the message is done, so the
    receiver gets x's values, whatever this rank allocates meanwhile."""
    import gc

    if world.size < 2:
        pytest.skip("needs two ranks")
    n = 1 << 15
    for _ in range(2):
        if world.rank == 0:
            whole = np.arange(2.0 * n)
            request = world.isend(whole[::2], 1, tag=9)
            del request, whole
            gc.collect()
            junk = [np.full(n, -1.0) for _ in range(8)]  # (memory the copy may have had)
            world.barrier()
            del junk
        elif world.rank == 1:
            world.barrier()  # (rank 0 dropped its request and reused memory by now)
            out = np.zeros(n)
            world.recv(out, 0, tag=9)
            np.testing.assert_array_equal(out, np.arange(0.0, 2.0 * n, 2.0))
        else:
            world.barrier()
    world.barrier()
    if world.rank == 0:
        world.send(np.ones(1), 1, tag=10)  # (the next message reaps the dropped ones)
        assert not world._backend.peers._orphans
    elif world.rank == 1:
        world.recv(np.zeros(1), 0, tag=10)


def test_test_while_another_thread_waits_on_the_request(world):
    """test() while another thread is in wait() on the same request: one thread at a
    time touches MPI's request (test says not done yet meanwhile); the wait gives the
    sender and the data."""
    import threading

    if world.size < 2:
        pytest.skip("needs two ranks")
    for step in range(20):
        if world.rank == 1:
            world.barrier()  # (rank 0's message comes once both threads poll and wait)
        if world.rank == 0:
            world.barrier()
            time.sleep(0.002)
            world.send(np.full(4, step + 1.0), 1, tag=11)
        elif world.rank == 1:
            out = np.zeros(4)
            request = world.irecv(out, 0, tag=11)
            stop = threading.Event()

            def poll(request=request, stop=stop):
                while not stop.is_set() and not request.test():
                    pass

            poller = threading.Thread(target=poll)
            if step % 2:  # (the poller first, then the wait; or the other way round)
                poller.start()
                assert request.wait() == 0  # never ConcurrentCallError for a poll
            else:
                got = []
                waiter = threading.Thread(target=lambda r=request, g=got: g.append(r.wait()))
                waiter.start()
                poller.start()
                waiter.join(60)
                assert got == [0]
            stop.set()
            poller.join(60)
            np.testing.assert_array_equal(out, step + 1.0)
        else:
            world.barrier()
    _next_call_is_right(world)


def test_bad_batches_and_tags_are_mpicolls_errors(world):
    with pytest.raises(mpicoll.InvalidArgumentError, match="ops:"):
        world.batch_isend_irecv(5)
    for tag in (np.array([1, 2]), -1.0, 3.0):
        with pytest.raises(mpicoll.InvalidArgumentError, match="tag:"):
            world.irecv(np.zeros(2), mpicoll.ANY, tag=tag)
    with pytest.raises(mpicoll.InvalidArgumentError, match=r"ops\[0\]\.tag:"):
        world.batch_isend_irecv([mpicoll.P2POp("irecv", np.zeros(2), 0, tag=-5)])
    with pytest.raises(mpicoll.InvalidArgumentError, match="recv_tag:"):
        world.sendrecv(np.ones(2), 0, np.zeros(2), 0, recv_tag=1.5)
    with pytest.raises(mpicoll.InvalidArgumentError, match="send_tag:"):
        world.sendrecv(np.ones(2), 0, np.zeros(2), 0, send_tag=mpicoll.ANY)
    _next_call_is_right(world)


def test_a_finished_request_gives_its_sender_after_free(world):
    """A receive that finished (test() said so) gives its sender at wait() even after
    its Communicator was freed: nothing is left to wait for."""
    if world.size < 2:
        pytest.skip("needs two ranks")
    comm = world.dup()
    request = None
    if world.rank == 1:
        out = np.zeros(3)
        request = comm.irecv(out, 0, tag=12)
    if world.rank == 0:
        comm.send(np.arange(3.0), 1, tag=12)
    if request is not None:
        while not request.test():
            pass
    comm.free()
    if request is not None:
        assert request.wait() == 0
        np.testing.assert_array_equal(out, np.arange(3.0))
    _next_call_is_right(world)


def test_sendrecv_in_place_sends_what_was_there(world):
    """sendrecv(x, right, x, left), or overlapping halves (MPI_Sendrecv_replace): each rank
    sends x as it was and gets its left neighbour's; MPI's own call would abort on the
    overlap."""
    right, left = (world.rank + 1) % world.size, (world.rank - 1) % world.size
    x = np.full(4, float(world.rank))
    assert world.sendrecv(x, right, x, left) == left
    np.testing.assert_array_equal(x, np.full(4, float(left)))
    y = np.arange(12.0) + 100 * world.rank
    world.sendrecv(y[:8], right, y[4:], left)
    np.testing.assert_array_equal(y[4:], np.arange(8.0) + 100 * left)
    _next_call_is_right(world)


def test_receives_that_overlap_are_refused_before_any_message(world):
    """A batch whose receive overlaps another message's memory (a send's, or another
    receive's), or a receive into memory whose elements share one place (a stride of 0):
    refused on the rank that gives it, before any message; the next messages are right."""
    from numpy.lib.stride_tricks import as_strided

    right, left = (world.rank + 1) % world.size, (world.rank - 1) % world.size
    x = np.zeros(6)
    for ops in ([mpicoll.P2POp("irecv", x, left), mpicoll.P2POp("isend", x, right)],
                [mpicoll.P2POp("irecv", x[:4], left), mpicoll.P2POp("irecv", x[2:], left)],
                [mpicoll.P2POp("irecv", x[::2], left), mpicoll.P2POp("irecv", x[:3], left)]):
        with pytest.raises(mpicoll.InvalidArgumentError, match=r"overlaps ops\[1\]"):
            world.batch_isend_irecv(ops)
    same = as_strided(np.zeros(1), (4,), (0,), writeable=True)
    with pytest.raises(mpicoll.InvalidArgumentError, match="stride of 0"):
        world.irecv(same, left)
    with pytest.raises(mpicoll.InvalidArgumentError, match="stride of 0"):
        world.recv(same, left)
    other = mpicoll.Communicator(world.control_comm)
    with pytest.raises(mpicoll.InvalidArgumentError, match="another Communicator"):
        world.batch_isend_irecv([mpicoll.P2POp(other.isend, x, right)])
    other.free()
    got = np.empty(6)  # (nothing was sent: the next receive gets the next message)
    world.batch_isend_irecv([mpicoll.P2POp("isend", np.full(6, 1.0 + world.rank), right),
                             mpicoll.P2POp("irecv", got, left)])[1].wait()
    np.testing.assert_array_equal(got, np.full(6, 1.0 + left))
    # receives into memory that shares no byte, its bounds overlapping (a matrix's
    # columns, its even and odd rows): taken, each column or row set its own message
    grid = np.zeros((3, 2))
    for parts in ((grid[:, 0], grid[:, 1]), (grid.reshape(-1)[0::2], grid.reshape(-1)[1::2])):
        requests = world.batch_isend_irecv(
            [mpicoll.P2POp("isend", np.full(3, 10.0 * world.rank + k), right) for k in (0, 1)]
            + [mpicoll.P2POp("irecv", part, left) for part in parts])
        for request in requests:
            request.wait()
        for k, part in enumerate(parts):
            np.testing.assert_array_equal(part, np.full(3, 10.0 * left + k))
    _next_call_is_right(world)


def test_a_blocking_receive_of_a_message_this_rank_sent_itself(world):
    """recv (and probe) from this rank itself: taken where an isend to itself came first
    (a valid MPI program); refused where none did (it would wait forever)."""
    sent = world.isend(np.arange(3.0), world.rank, tag=21)
    assert world.probe(world.rank, 21).count(np.float64) == 3
    out = np.zeros(3)
    assert world.recv(out, world.rank, tag=21) == world.rank
    sent.wait()
    np.testing.assert_array_equal(out, np.arange(3.0))
    with pytest.raises(mpicoll.InvalidArgumentError, match="no such message was sent"):
        world.recv(out, world.rank, tag=22)
    with pytest.raises(mpicoll.InvalidArgumentError, match="no such message was sent"):
        world.probe(world.rank, 22)
    _next_call_is_right(world)


@pytest.mark.parametrize("source", ["self", "any"])
def test_a_blocking_send_to_this_rank_itself_after_its_irecv_was_posted(world, source):
    """The all-to-all of the textbook: an irecv from every rank, this one too, then a
    blocking send to every rank: a valid MPI program (the send to itself finds its receive
    posted), at a size past MPI's eager limit too. A send to itself that no posted receive
    takes (another tag) is still refused, and the next call is right."""
    n = 1 << 17  # 1 MiB of float64
    outs = [np.zeros(n) for _ in range(world.size)]
    # (source=ANY: with a tag of its own, which only this rank's message to itself has)
    own = (world.rank, 5) if source == "self" else (mpicoll.ANY, 9)
    requests = [world.irecv(outs[p], *(own if p == world.rank else (p, 5)))
                for p in range(world.size)]
    for p in range(world.size):
        world.send(np.full(n, 100.0 * world.rank + p), p, tag=own[1] if p == world.rank else 5)
    for request in requests:
        request.wait()
    for p in range(world.size):
        assert outs[p][0] == outs[p][-1] == 100.0 * p + world.rank
    with pytest.raises(mpicoll.InvalidArgumentError, match="no irecv of it posted"):
        world.send(np.ones(2), world.rank, tag=6)
    _next_call_is_right(world)


def test_status_counts_whole_elements_only():
    status = mpicoll.Status(0, 0, 10)
    assert status.count(np.int16) == 5 and status.count() == 10
    for dtype, said in ((np.float64, "not a whole number"), ((np.float64, -1), "not a dtype"),
                        (object, "Python objects"), ("nonsense", "not a dtype")):
        with pytest.raises(mpicoll.InvalidArgumentError, match=said):
            status.count(dtype)


def test_mesh_names_given_as_one_string_are_refused_on_every_rank(world):
    with pytest.raises(mpicoll.InvalidArgumentError, match="names"):
        world.mesh((world.size,), "d")
    _next_call_is_right(world)


def test_dropped_receives_no_message_matches_cost_later_calls_nothing_per_call(world,
                                                                                monkeypatch):
    """Receives dropped unfinished stay posted (as MPI's), kept with their buffers until
    a message matches them: each later point-to-point call tests the two oldest, and one
    more for each dropped since, so it costs the same however many are kept (each call
    tested all: 200 dropped made every call 200 tests, 8000 made a ping-pong 11 ms); and
    once their messages come, they are let go."""
    if world.size < 2:
        pytest.skip("needs two ranks")
    from mpicoll.transport.mpi import PeerRequest

    tested = [0]
    done_quietly = PeerRequest.done_quietly

    def counted(self):
        tested[0] += 1
        return done_quietly(self)

    monkeypatch.setattr(PeerRequest, "done_quietly", counted)
    peers = world._backend.peers
    if world.rank == 0:
        for _ in range(200):
            world.irecv(np.empty(1), 1, tag=77)  # (dropped at once, no message yet)
        gc.collect()
        assert tested[0] <= 3 * 200, tested[0]  # (each irecv tested those before it)
        tested[0] = 0
    x, got = np.ones(1), np.empty(1)
    if world.rank < 2:
        for _ in range(50):
            world.sendrecv(x, 1 - world.rank, got, 1 - world.rank, send_tag=5, recv_tag=5)
    if world.rank == 0:
        assert len(peers._orphans) == 200
        assert tested[0] <= 2 + 2 * 50, tested[0]  # (each call tested all: 10000)
    world.barrier()
    if world.rank == 1:
        for _ in range(200):
            world.send(x, 0, tag=77)
    world.barrier()
    if world.rank < 2:
        for _ in range(120):  # (two a call: every one tested within 100 calls)
            world.sendrecv(x, 1 - world.rank, got, 1 - world.rank, send_tag=5, recv_tag=5)
    if world.rank == 0:
        assert not peers._orphans, len(peers._orphans)
    world.barrier()
