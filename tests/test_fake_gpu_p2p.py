"""Point-to-point messages on the nccl backend, run on the stand-in for CuPy and NCCL
(tests/fake_cupy.py): two-rank NCCL communicators per pair of ranks and tag, made at the
pair's first message, queued on the current stream.

The stand-in's NCCL matches a peer's messages in the order they are issued, without
tags, and refuses a receive that is not exactly as long as its send, as real NCCL
cannot tell one; its non-grouped send waits until the peer has posted the receive, so
every case here posts in an order NCCL's kernels on one stream would complete.
"""

from __future__ import annotations

import numpy as np
import pytest
from fake_cupy import installed

import mpicoll

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module", autouse=True)
def fake_cupy():
    with installed() as cupy:
        yield cupy


@pytest.fixture(scope="module")
def comm(fake_cupy):
    from mpi4py import MPI

    comm = mpicoll.Communicator(MPI.COMM_WORLD, backend="nccl")  # rank k: device k
    yield comm
    comm.free()


def _values(rank: int, n: int = 5, dtype: str = "f8") -> np.ndarray:
    return (np.arange(n) + 100 * rank).astype(dtype)


def _next_call_is_right(comm, fake_cupy) -> None:
    """A collective after the case: every rank is in it, and no message was left over."""
    for algorithm in ("ring", "native"):
        got = comm.all_reduce(fake_cupy.asarray(np.full(3, comm.rank + 1.0)), algorithm=algorithm)
        np.testing.assert_array_equal(got.get(), np.full(3, comm.size * (comm.size + 1) / 2))


def _two_ranks(comm) -> None:
    if comm.size < 2:
        pytest.skip("needs two ranks")


@pytest.mark.parametrize("dtype", ["f4", "c16", "i2"])
def test_send_and_recv_both_directions(comm, fake_cupy, dtype):
    _two_ranks(comm)
    if comm.rank < 2:
        peer = 1 - comm.rank
        out = fake_cupy.zeros(5, dtype)
        for sender in (0, 1):
            if comm.rank == sender:
                assert comm.send(fake_cupy.asarray(_values(comm.rank, dtype=dtype)), peer,
                                 tag=4) is None
            else:
                assert comm.recv(out, peer, tag=4) == peer
                np.testing.assert_array_equal(out.get(), _values(peer, dtype=dtype))
        # a strided array goes as its values
        rows = fake_cupy.asarray(np.arange(20.0).reshape(4, 5) + comm.rank)
        got = fake_cupy.zeros(4)
        if comm.rank == 0:
            comm.send(rows[:, 1], 1)
        else:
            comm.recv(got, 0)
            np.testing.assert_array_equal(got.get(), np.arange(20.0).reshape(4, 5)[:, 1])
        # and lands in a strided one (a contiguous copy, copied back), the rest kept
        grid = fake_cupy.asarray(np.full((4, 3), -1.0))
        if comm.rank == 0:
            comm.send(rows[:, 2], 1, tag=5)
        else:
            assert comm.recv(grid[:, 1], 0, tag=5) == 0
            expected = np.full((4, 3), -1.0)
            expected[:, 1] = np.arange(20.0).reshape(4, 5)[:, 2]
            np.testing.assert_array_equal(grid.get(), expected)
    _next_call_is_right(comm, fake_cupy)


def test_isend_and_irecv_wait_and_test(comm, fake_cupy):
    _two_ranks(comm)
    if comm.rank < 2:
        peer = 1 - comm.rank
        out = fake_cupy.zeros(5)
        if comm.rank == 0:  # the receive is posted first: the stand-in's send waits for it
            request = comm.irecv(out, 1, tag=3)
        else:
            request = comm.isend(fake_cupy.asarray(_values(1)), 0, tag=3)
        for _ in range(1000):
            if request.test():
                break
        assert request.test() and request.is_completed()
        assert request.wait() == (1 if comm.rank == 0 else None)
        assert request.wait() == (1 if comm.rank == 0 else None)  # again: the same
        if comm.rank == 0:
            np.testing.assert_array_equal(out.get(), _values(1))
        # a wait without a test first
        if comm.rank == 0:
            request = comm.isend(fake_cupy.asarray(_values(0)), peer)
        else:
            request = comm.irecv(out, peer)
        assert request.wait() == (None if comm.rank == 0 else 0)
        if comm.rank == 1:
            np.testing.assert_array_equal(out.get(), _values(0))
    _next_call_is_right(comm, fake_cupy)


def test_sendrecv_around_a_ring(comm, fake_cupy):
    """Every rank sends right and receives from the left at once: one NCCL group each,
    and the pairs' communicators made in one order everywhere (no cycle at the first
    messages); at one rank, a message to itself."""
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    for tags in ((0, 0), (6, 6)):
        out = fake_cupy.zeros(5)
        got = comm.sendrecv(fake_cupy.asarray(_values(comm.rank)), right, out, left, *tags)
        assert got == left
        np.testing.assert_array_equal(out.get(), _values(left))
    _next_call_is_right(comm, fake_cupy)


def test_batch_isend_irecv_with_both_neighbours(comm, fake_cupy):
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    from_left, from_right = fake_cupy.zeros(5), fake_cupy.zeros(5)
    requests = comm.batch_isend_irecv([
        mpicoll.P2POp("isend", fake_cupy.asarray(_values(comm.rank)), right, tag=1),
        mpicoll.P2POp(comm.isend, fake_cupy.asarray(_values(comm.rank)), left, tag=2),
        mpicoll.P2POp("irecv", from_left, left, tag=1),
        mpicoll.P2POp(comm.irecv, from_right, right, tag=2),
    ])
    assert [r.wait() for r in requests] == [None, None, left, right]
    np.testing.assert_array_equal(from_left.get(), _values(left))
    np.testing.assert_array_equal(from_right.get(), _values(right))
    assert comm.batch_isend_irecv([]) == []
    _next_call_is_right(comm, fake_cupy)


def test_tags_are_kept_apart(comm, fake_cupy):
    """Tag 1 and tag 2 sent in that order, received in the other: each lands in its own
    buffer (one NCCL communicator per tag: NCCL itself would pair them in order, and
    refuse the sizes)."""
    _two_ranks(comm)
    if comm.rank == 0:
        requests = comm.batch_isend_irecv([
            mpicoll.P2POp("isend", fake_cupy.asarray(_values(0, 3)), 1, tag=1),
            mpicoll.P2POp("isend", fake_cupy.asarray(_values(7, 4)), 1, tag=2)])
        assert [r.wait() for r in requests] == [None, None]
    elif comm.rank == 1:
        one, two = fake_cupy.zeros(3), fake_cupy.zeros(4)
        requests = comm.batch_isend_irecv([mpicoll.P2POp("irecv", two, 0, tag=2),
                                           mpicoll.P2POp("irecv", one, 0, tag=1)])
        assert [r.wait() for r in requests] == [0, 0]
        np.testing.assert_array_equal(one.get(), _values(0, 3))
        np.testing.assert_array_equal(two.get(), _values(7, 4))
    if comm.rank < 2:
        pairs = comm._backend.peers.pairs
        assert {(1 - comm.rank, 1), (1 - comm.rank, 2)} <= set(pairs)
        assert pairs[1 - comm.rank, 1] is not pairs[1 - comm.rank, 2]
    _next_call_is_right(comm, fake_cupy)


def test_a_collective_between_p2p_messages_is_not_disturbed(comm, fake_cupy):
    """Messages started before collectives and waited for after them: the collectives'
    messages (ring: over the backend's own NCCL communicator) never take them."""
    _two_ranks(comm)
    out = fake_cupy.zeros(5)
    request = None
    if comm.rank == 1:  # posted first: the stand-in's send waits for it
        request = comm.irecv(out, 0)
    elif comm.rank == 0:
        request = comm.isend(fake_cupy.asarray(_values(0)), 1)
    _next_call_is_right(comm, fake_cupy)
    x = fake_cupy.asarray(np.full(5, float(comm.rank)))
    got = comm.all_gather(x, algorithm="ring")
    np.testing.assert_array_equal(got.get()[:, 0], np.arange(comm.size))
    if request is not None:
        assert request.wait() == (0 if comm.rank == 1 else None)
    if comm.rank == 1:
        np.testing.assert_array_equal(out.get(), _values(0))
    _next_call_is_right(comm, fake_cupy)


def test_what_nccl_cannot_do_is_refused_before_any_message(comm, fake_cupy):
    x, out = fake_cupy.ones(2), fake_cupy.zeros(2)
    any_rank = "source: mpicoll.ANY .any rank. is not on the nccl backend"
    with pytest.raises(mpicoll.InvalidArgumentError, match=any_rank):
        comm.recv(out)
    with pytest.raises(mpicoll.InvalidArgumentError, match=any_rank):
        comm.irecv(out, mpicoll.ANY)
    with pytest.raises(mpicoll.InvalidArgumentError, match=any_rank):
        comm.sendrecv(x, comm.rank, out)
    with pytest.raises(mpicoll.InvalidArgumentError, match="tag: mpicoll.ANY .any tag. is not"):
        comm.recv(out, comm.rank, mpicoll.ANY)
    for probe in (comm.probe, comm.iprobe):
        with pytest.raises(mpicoll.InvalidArgumentError, match="not on the nccl backend"):
            probe(comm.rank, 0)
    with pytest.raises(mpicoll.InvalidArgumentError, match=r"ops\[1\].peer: mpicoll.ANY"):
        comm.batch_isend_irecv([mpicoll.P2POp("isend", x, comm.rank),
                                mpicoll.P2POp("irecv", out, mpicoll.ANY)])
    with pytest.raises(mpicoll.InvalidArgumentError, match="x: backend 'nccl' moves GPU arrays"):
        comm.isend(np.ones(2), comm.rank)
    with pytest.raises(mpicoll.InvalidArgumentError, match="out: backend 'nccl' moves GPU"):
        comm.sendrecv(x, comm.rank, np.zeros(2), comm.rank)
    # a message to this rank needs its receive in the same NCCL group
    with pytest.raises(mpicoll.InvalidArgumentError, match="to this rank itself"):
        comm.isend(x, comm.rank)
    with pytest.raises(mpicoll.InvalidArgumentError, match="to this rank itself"):
        comm.batch_isend_irecv([mpicoll.P2POp("isend", x, comm.rank),
                                mpicoll.P2POp("irecv", fake_cupy.zeros(3), comm.rank)])
    requests = comm.batch_isend_irecv([mpicoll.P2POp("isend", x + 1, comm.rank),
                                       mpicoll.P2POp("irecv", out, comm.rank)])
    status = mpicoll.Status()
    assert requests[1].wait(status) == comm.rank and out.get().tolist() == [2.0, 2.0]
    assert (status.source, status.tag, status.nbytes) == (comm.rank, 0, out.nbytes)
    _next_call_is_right(comm, fake_cupy)


@pytest.mark.parametrize("received", [3, 7])
def test_a_receive_not_as_long_as_its_send_raises_mpicoll_error(comm, fake_cupy, received):
    """NCCL cannot tell a shorter message; the stand-in does, and mpicoll raises it as
    its own error (nothing raw) on the receiving rank."""
    _two_ranks(comm)
    if comm.rank == 0:
        comm.send(fake_cupy.ones(5), 1, tag=11)
    elif comm.rank == 1:
        with pytest.raises(mpicoll.CollectiveError, match="recv on rank 1: NcclError"):
            comm.recv(fake_cupy.zeros(received), 0, tag=11)
    _next_call_is_right(comm, fake_cupy)


def test_a_unique_id_the_lower_rank_cannot_make_fails_both_ranks(comm, fake_cupy,
                                                                monkeypatch):
    """The lower rank's failure travels in the message that carries the id: both ranks
    raise mpicoll's error, no NCCL communicator is made, and a later first message on
    the tag makes it."""
    _two_ranks(comm)

    def fails():
        raise fake_cupy.cuda.nccl.NcclError(2, "NCCL_ERROR_SYSTEM_ERROR: no network")

    x, out = fake_cupy.asarray(_values(comm.rank)), fake_cupy.zeros(5)
    monkeypatch.setattr(fake_cupy.cuda.nccl, "get_unique_id", fails)
    if comm.rank < 2:
        with pytest.raises(mpicoll.InvalidArgumentError, match=r"rank 0 could not create "
                           r"NCCL's unique id for ranks 0 and 1 \(tag 12\)"):
            if comm.rank == 0:
                comm.send(x, 1, tag=12)
            else:
                comm.recv(out, 0, tag=12)
        assert (1 - comm.rank, 12) not in comm._backend.peers.pairs
    monkeypatch.undo()
    if comm.rank == 0:
        comm.send(x, 1, tag=12)
    elif comm.rank == 1:
        assert comm.recv(out, 0, tag=12) == 0
        np.testing.assert_array_equal(out.get(), _values(0))
    _next_call_is_right(comm, fake_cupy)


def test_p2p_after_split_and_new_group(comm, fake_cupy):
    """Sub-communicators of an NCCL Communicator have point-to-point messages of their
    own: a ring in each half, then in a group in reversed order."""
    half = comm.split(comm.rank % 2)
    right, left = (half.rank + 1) % half.size, (half.rank - 1) % half.size
    out = fake_cupy.zeros(5)
    assert half.sendrecv(fake_cupy.asarray(_values(comm.rank)), right, out, left) == left
    members = [r for r in range(comm.size) if r % 2 == comm.rank % 2]
    np.testing.assert_array_equal(out.get(), _values(members[left]))
    # ranks p-1 .. 1, reversed: rank 0 is in no group (reordered groups of every rank:
    # test_a_reordered_group_keeps_every_rank_on_its_device)
    group = comm.new_group(list(range(1, comm.size))[::-1]) if comm.size > 1 else None
    assert (group is None) == (comm.rank == 0)
    peers = [half._backend.peers]
    if group is not None:
        assert group.rank == comm.size - 1 - comm.rank
        if group.size > 1 and group.rank < 2:  # group ranks 0, 1: world ranks p-1, p-2
            peer = 1 - group.rank
            if group.rank == 0:
                group.send(fake_cupy.asarray(_values(comm.rank)), peer, tag=9)
            else:
                assert group.recv(out, peer, tag=9) == peer
                np.testing.assert_array_equal(out.get(), _values(comm.size - 1))
        peers.append(group._backend.peers)
    made = [c for p in peers for c in p.pairs.values()]
    assert made
    half.free()
    if group is not None:
        group.free()
    assert all(not p.pairs for p in peers) and all(c._comm is None for c in made)  # destroyed
    _next_call_is_right(comm, fake_cupy)


def _reordered(comm, fake_cupy, how: str) -> tuple[object, list[int]]:
    """A sub-communicator (or duplicate) of ``comm`` in which ranks have other places
    than in ``comm``, and its members (``comm``'s ranks in its order)."""
    p = comm.size
    other = (comm.device + 1) % fake_cupy.cuda.runtime.getDeviceCount()
    if how == "new_group reversed":
        return comm.new_group(list(reversed(range(p)))), list(reversed(range(p)))
    if how == "split, keys reversed":
        return comm.split(0, key=p - comm.rank), list(reversed(range(p)))
    if how == "split in halves, keys reversed":
        return comm.split(comm.rank % 2, key=-comm.rank), \
            [r for r in reversed(range(p)) if r % 2 == comm.rank % 2]
    if how == "split while another device is current":
        with fake_cupy.cuda.Device(other):
            return comm.split(0, key=p - comm.rank), list(reversed(range(p)))
    if how == "dup while another device is current":
        with fake_cupy.cuda.Device(other):
            return comm.dup(), list(range(p))
    assert how == "new_group of a split, reversed again"
    half = comm.split(comm.rank % 2, key=-comm.rank)
    members = [r for r in reversed(range(p)) if r % 2 == comm.rank % 2]
    try:
        return half.new_group(list(reversed(range(half.size)))), members[::-1]
    finally:
        half.free()


@pytest.mark.parametrize("how", ["new_group reversed", "split, keys reversed",
                                 "split in halves, keys reversed",
                                 "split while another device is current",
                                 "dup while another device is current",
                                 "new_group of a split, reversed again"])
def test_a_reordered_group_keeps_every_rank_on_its_device(comm, fake_cupy, how):
    """Every rank of a sub-communicator stays on the GPU it runs on in its parent,
    whatever its place in the group and whichever device is current when the group is
    made: the group's NCCL starts (no rank moved onto another's GPU), its collectives and
    point-to-point messages are right, and the rank's device is its parent's."""
    device = comm.device
    assert fake_cupy.cuda.runtime.getDevice() == device
    group, members = _reordered(comm, fake_cupy, how)
    try:
        assert (group.rank, group.size) == (members.index(comm.rank), len(members))
        assert group.device == device and fake_cupy.cuda.runtime.getDevice() == device
        assert group._backend.transport.nccl.device == device
        for algorithm in ("native", "ring"):
            x = fake_cupy.asarray(np.full(3, comm.rank + 1.0))
            got = group.all_reduce(x, algorithm=algorithm)
            np.testing.assert_array_equal(got.get(), np.full(3, sum(members) + len(members)))
            got = group.all_gather(fake_cupy.asarray(np.array([comm.rank])), algorithm=algorithm)
            assert got.get().ravel().tolist() == members  # the group's order
        right, left = (group.rank + 1) % group.size, (group.rank - 1) % group.size
        out = fake_cupy.zeros(5)
        assert group.sendrecv(fake_cupy.asarray(_values(comm.rank)), right, out, left) == left
        np.testing.assert_array_equal(out.get(), _values(members[left]))
        assert {c.device for c in group._backend.peers.pairs.values()} == {device}
    finally:
        group.free()
    assert fake_cupy.cuda.runtime.getDevice() == device
    _next_call_is_right(comm, fake_cupy)


def test_a_timeout_aborts_the_pair_communicators_too(comm, fake_cupy, monkeypatch):
    """The watchdog's abort as a timed-out job ends (``abort_nccl``, before MPI_Abort)
    aborts every NCCL communicator of the backend: its collectives' and each pair's and
    tag's of the program's own messages; one abort failing stops none of the others and
    raises nothing."""
    from mpicoll import watchdog

    own = comm.dup()  # aborted alone: the module's Communicator goes on
    right, left = (own.rank + 1) % own.size, (own.rank - 1) % own.size
    for tag in (0, 5):
        own.sendrecv(fake_cupy.asarray(_values(own.rank)), right, fake_cupy.zeros(5), left,
                     tag, tag)
    pairs = list(own._backend.peers.pairs.values())
    assert len(pairs) >= 2
    everything = [own._backend.transport.nccl, *pairs]
    nccl = fake_cupy.cuda.nccl
    aborted = []

    def abort(self):
        aborted.append(self)
        if self is pairs[0]:
            raise nccl.NcclError(3, "NCCL_ERROR_INTERNAL_ERROR: internal error")
        real(self)

    real = nccl.NcclCommunicator.abort
    with monkeypatch.context() as m:
        m.setattr(nccl.NcclCommunicator, "abort", abort)
        m.setattr(watchdog.watchdog(), "watches", [own._watch])  # this Communicator's only
        watchdog.abort_nccl()
        assert sorted(map(id, aborted)) == sorted(map(id, everything))
        assert all(c._comm is None for c in everything if c is not pairs[0])
        aborted.clear()
        own._backend.peers.abort()  # directly: the failing one raises nothing either
        assert sorted(map(id, aborted)) == sorted(map(id, pairs))
    own.free()  # destroys the one left, and nothing twice
    assert all(c._comm is None for c in everything)
    _next_call_is_right(comm, fake_cupy)
