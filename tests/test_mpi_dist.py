"""mpicoll.dist: the tutorials' torch.distributed code with one changed import, on NumPy
arrays, under mpiexec (torch's semantics: in place, global src/dst, groups, async Work)."""

from __future__ import annotations

import datetime
import threading
import time

import numpy as np
import pytest

import mpicoll
import mpicoll.dist as dist

pytestmark = pytest.mark.mpi


def test_a_wrong_rank_on_one_rank_raises_on_every_rank():
    """init_process_group(rank=...) that is off on the last rank only: every rank raises,
    naming it (none goes on to wait in a call the other never makes); then it works."""
    from mpi4py import MPI

    size, me = MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()
    wrong = size if me == size - 1 else me
    with pytest.raises(mpicoll.InvalidArgumentError, match=rf"rank\(s\) {size - 1}[;:, ]"):
        dist.init_process_group("gloo", rank=wrong, world_size=size)
    assert not dist.is_initialized()
    dist.init_process_group("gloo", rank=me, world_size=size)
    assert dist.get_rank() == me
    dist.destroy_process_group()


def test_destroy_process_group_frees_every_group_made():
    """destroy_process_group() frees the groups new_group and init_device_mesh made, as
    torch's: a later call on one refuses on every rank, naming the free."""
    dist.init_process_group("mpi")
    size = dist.get_world_size()
    group = dist.new_group(list(range(size)))
    mesh = dist.init_device_mesh("cpu", (size,), mesh_dim_names=("dp",))
    with pytest.raises(mpicoll.InvalidArgumentError, match="expected a process group"):
        dist.destroy_process_group("dp")  # (no group: nothing freed, every rank told)
    dist.destroy_process_group(dist.new_group([0]) if size > 1 else
                               dist.GroupMember.NON_GROUP_MEMBER)  # (outside it: nothing)
    dist.destroy_process_group()
    for g in (group, mesh.get_group("dp")):
        with pytest.raises(mpicoll.InvalidArgumentError, match="freed"):
            dist.all_reduce(np.ones(1), group=g)
    assert not dist.is_initialized()


def test_destroying_the_default_group_destroys_every_group_as_torchs():
    """destroy_process_group(dist.group.WORLD) is destroy_process_group(), as torch's: it
    freed the world's Communicator alone, left every other group alive and the default
    group registered, dead (init_process_group then said 'already initialized'). A group
    destroyed already is refused, as torch's "Invalid process group specified"."""
    dist.init_process_group("mpi")
    size = dist.get_world_size()
    group = dist.new_group(list(range(size)))
    dist.destroy_process_group(dist.group.WORLD)
    assert not dist.is_initialized() and group.comm.freed
    with pytest.raises(mpicoll.InvalidArgumentError, match="destroyed already"):
        dist.destroy_process_group(group)
    dist.init_process_group("mpi")  # (again, as after destroy_process_group())
    t = np.ones(1)
    dist.all_reduce(t)
    assert t[0] == size
    dist.destroy_process_group()


def test_a_one_value_step_of_another_call_is_a_refusal_not_a_backend():
    """A rank's value in new_group's backend step that is no backend's code (another
    call's step of one value, its digest about 2.4e9) counts as that rank's refusal:
    np.bincount of it tried to allocate 18 GiB (a raw MemoryError)."""
    from mpicoll.dist import groups

    dist.init_process_group("mpi")
    try:
        real = groups.agreed_rows

        def one_rank_elsewhere(comm, values, frame, what):
            rows = real(comm, values, frame, what)
            rows[-1, 0] = 2**62  # (a digest as another call's step sends: a DeviceMesh's
            # was 2_445_192_090, which np.bincount took for 18 GiB to allocate)
            return rows

        groups.agreed_rows = one_rank_elsewhere
        last = dist.get_world_size() - 1
        with pytest.raises(mpicoll.InvalidArgumentError, match=rf"refused on rank\(s\) {last}[;: ]"):
            dist.new_group([0])
    finally:
        groups.agreed_rows = real
        dist.destroy_process_group()


def test_a_mesh_made_first_makes_the_default_group_as_torchs():
    """The DeviceMesh tutorial's first line, init_device_mesh with no init_process_group
    before it (torchrun's scripts): the default group is made first, as torch's DeviceMesh
    makes it, then the mesh over it; the same with torch's DeviceMesh constructor."""
    from mpicoll.dist.device_mesh import DeviceMesh

    assert not dist.is_initialized()
    from mpi4py import MPI

    size, rank = MPI.COMM_WORLD.Get_size(), None
    shape = (2, size // 2) if size % 2 == 0 else (size, 1)
    mesh = dist.init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
    try:
        assert dist.is_initialized() and dist.get_world_size() == size
        rank = dist.get_rank()
        t = np.full(2, float(rank))
        dist.all_reduce(t, group=mesh.get_group("tp"))
        assert t.tolist() == [float(sum(mesh["tp"].mesh.tolist()))] * 2
        # one mesh however often it is sliced, as torch's (they compared unequal)
        assert mesh["tp"] == mesh["tp"] and len({mesh["tp"], mesh["tp"]}) == 1
        assert mesh["tp"] != mesh["dp"]
        with pytest.raises(ValueError, match="complex"):  # (as torch's: a ValueError too)
            dist.all_reduce(np.ones(2, np.complex64), op=dist.ReduceOp.MAX)
    finally:
        dist.destroy_process_group()
    grid = np.arange(size).reshape(shape)
    mesh = DeviceMesh("cpu", grid, mesh_dim_names=("dp", "tp"))
    try:
        assert dist.is_initialized() and mesh.get_local_rank("dp") == rank // shape[1]
    finally:
        dist.destroy_process_group()


def test_new_group_against_another_call_in_check_mode_raises_on_every_rank(monkeypatch):
    """Check mode: new_group on one rank while the others make a collective (its backend
    agreed in a numbered step, which check mode fingerprints): MismatchError on every rank,
    not MPI's "Message truncated" abort; the next call is right."""
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() < 2:
        pytest.skip("a rank making another call needs another rank")
    monkeypatch.setenv("MPICOLL_CHECK", "1")
    dist.init_process_group("mpi")
    try:
        rank, size = dist.get_rank(), dist.get_world_size()
        # (call #1: the default group's progress thread, made with it)
        with pytest.raises(mpicoll.MismatchError, match="new_group call #2"):
            if rank == 0:
                dist.new_group([0])
            else:
                dist.all_reduce(np.ones(4))
        t = np.ones(2)
        dist.all_reduce(t)
        assert t.tolist() == [size, size]
    finally:
        dist.destroy_process_group()


@pytest.fixture
def debug_level(monkeypatch):
    """TORCH_DISTRIBUTED_DEBUG as each test sets it, read afresh (not a level kept before)."""
    monkeypatch.setattr(dist.groups, "_DEBUG", [])
    return monkeypatch


def test_torch_debug_detail_makes_every_group_in_check_mode(debug_level):
    """TORCH_DISTRIBUTED_DEBUG=DETAIL (torch's collective desync checks) is mpicoll's check
    mode, in the default group and the groups made from it: one rank's call of another
    shape raises MismatchError on every rank before any message; the next call is right."""
    debug_level.setenv("TORCH_DISTRIBUTED_DEBUG", "detail")
    dist.init_process_group("gloo")
    try:
        assert dist.get_debug_level() is dist.DebugLevel.DETAIL
        rank, size = dist.get_rank(), dist.get_world_size()
        group = dist.new_group(list(range(size)))
        assert dist.group.WORLD.comm.check and group.comm.check
        if size > 1:
            for g in (None, group):
                with pytest.raises(mpicoll.MismatchError):
                    dist.all_reduce(np.ones(3 if rank == size - 1 else 2), group=g)
        t = np.ones(2)
        dist.all_reduce(t, group=group)
        assert t.tolist() == [size, size]
    finally:
        dist.destroy_process_group()
    dist.set_debug_level(dist.DebugLevel.OFF)  # (read at init: the next group is not checked)
    dist.init_process_group("mpi")
    try:
        assert not dist.group.WORLD.comm.check
    finally:
        dist.destroy_process_group()


def test_a_dist_calls_site_is_the_programs_line(debug_level):
    """The site a call's reports name (check mode's MismatchError; the watchdog's report,
    from the flight recorder) is the program's line that called mpicoll.dist, never a
    line of mpicoll.dist's own: on the first call, an object collective, and a repeated
    call that runs its kept decision."""
    debug_level.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    here = f"{__file__}:"
    try:
        calls = (lambda t: dist.all_reduce(t),
                 lambda t: dist.all_reduce(t, op=dist.ReduceOp.MAX, algorithm="ring"),
                 lambda t: dist.broadcast(t, src=0),
                 lambda t: dist.all_gather_into_tensor(np.zeros(size * t.size), t),
                 lambda t: dist.all_reduce(t, async_op=True).wait())
        for call in calls if size > 1 else ():
            with pytest.raises(mpicoll.MismatchError) as raised:
                call(np.ones(3 if rank == size - 1 else 2))
            assert here in str(raised.value) and "mpicoll/dist" not in str(raised.value), \
                str(raised.value)
    finally:
        dist.destroy_process_group()
    debug_level.delenv("TORCH_DISTRIBUTED_DEBUG")
    dist.init_process_group("gloo")
    try:
        watch = dist.group.WORLD.comm._watch
        t = np.ones(2)
        for call in (lambda: dist.all_reduce(t), lambda: dist.broadcast(t, src=0),
                     lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX),
                     lambda: dist.all_gather_object([None] * size, rank),
                     lambda: dist.broadcast_object_list([rank], src=0)):
            for _ in range(3):  # (the second and third: the kept decision's prepared call)
                call()
                assert watch.current.call.site.startswith(here), watch.current.call.site
    finally:
        dist.destroy_process_group()


def test_a_bad_debug_level_on_one_rank_raises_on_every_rank(debug_level):
    """TORCH_DISTRIBUTED_DEBUG that names no level on the last rank only: init_process_group
    raises on every rank, naming it (none waits in a group the other never makes)."""
    from mpi4py import MPI

    size, me = MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()
    if me == size - 1:
        debug_level.setenv("TORCH_DISTRIBUTED_DEBUG", "LOUD")
    with pytest.raises(mpicoll.InvalidArgumentError, match=rf"rank\(s\) {size - 1}[;:, ]"):
        dist.init_process_group("mpi")
    assert not dist.is_initialized()
    if me == size - 1:  # DETAIL there alone: check mode on one rank, refused on every rank
        debug_level.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
        debug_level.setattr(dist.groups, "_DEBUG", [])
    if size > 1:
        with pytest.raises(mpicoll.SettingMismatchError, match="TORCH_DISTRIBUTED_DEBUG"):
            dist.init_process_group("mpi")
        assert not dist.is_initialized()
    debug_level.delenv("TORCH_DISTRIBUTED_DEBUG", raising=False)
    debug_level.setattr(dist.groups, "_DEBUG", [])
    dist.init_process_group("mpi")
    assert dist.get_debug_level() is dist.DebugLevel.OFF
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def initialized():
    dist.init_process_group("gloo")
    yield
    dist.destroy_process_group()


def test_a_group_destroyed_is_let_go(initialized):
    """new_group and destroy_process_group(group) in a loop: the freed groups (and their
    Communicators' workspace) are not kept to the end of the job."""
    from mpicoll.dist.groups import _STATE

    before = len(_STATE["groups"])
    for _ in range(5):
        group = dist.new_group(list(range(dist.get_world_size())))
        dist.all_reduce(np.ones(4), group=group)
        dist.destroy_process_group(group)
    assert len(_STATE["groups"]) == before


def test_the_tutorials_point_to_point_and_all_reduce(initialized):
    rank, size = dist.get_rank(), dist.get_world_size()
    # "Point-to-point communication": rank 0 sends a tensor to rank 1
    tensor = np.zeros(1)
    if size > 1:
        if rank == 0:
            tensor += 1
            dist.send(tensor=tensor, dst=1)
        elif rank == 1:
            assert dist.recv(tensor=tensor, src=0) == 0
            assert tensor[0] == 1
    # "All-reduce" in a group, in place
    group = dist.new_group(list(range(size)))
    tensor = np.ones(1)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    assert tensor[0] == size
    work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, async_op=True)
    work.wait()
    assert tensor[0] == size


@pytest.mark.parametrize("where", ["world", "new_group", "mesh"])
def test_a_groups_first_async_call_returns_at_once(initialized, where):
    """Rank 0's first async call, then a send that rank 1 receives before its own first
    async call: torch's async call returns at once, and so does this one (its progress
    thread is made with the group: made at the first async call, its communicator's
    duplicate, a collective, waited for rank 1's, which waited for the send)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if size < 2:
        pytest.skip("needs a peer")
    group = None if where == "world" else dist.new_group(list(range(size))) \
        if where == "new_group" else dist.init_device_mesh("cpu", (size,), ("dp",)).get_group("dp")
    tensor, note = np.ones(2), np.zeros(1)
    if rank == 0:
        started = time.monotonic()
        work = dist.all_reduce(tensor, group=group, async_op=True)
        assert time.monotonic() - started < 5
        dist.send(np.ones(1), dst=1)
        work.wait()
    else:
        if rank == 1:
            dist.recv(note, src=0)
        dist.all_reduce(tensor, group=group, async_op=True).wait()
    np.testing.assert_array_equal(tensor, np.full(2, float(size)))


@pytest.mark.parametrize("timeout", [datetime.timedelta(0), 0, None,
                                     datetime.timedelta(seconds=30)])
def test_work_wait_takes_torchs_timeouts(initialized, timeout):
    """torch's Work.wait(timeout=timedelta(0)) (its default) waits with no limit: a late
    rank's call still completes on every rank (mpicoll.Work's own 0 asks instead)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if rank == size - 1:
        time.sleep(0.3)  # the others wait for it
    tensor = np.ones(2)
    assert dist.all_reduce(tensor, async_op=True).wait(timeout) is True
    np.testing.assert_array_equal(tensor, np.full(2, float(size)))


def test_collectives_with_torch_names_and_semantics(initialized):
    rank, size = dist.get_rank(), dist.get_world_size()
    t = np.full(3, float(rank))
    dist.broadcast(t, src=size - 1)
    assert (t == size - 1).all()
    t = np.full(3, float(rank + 1))
    dist.reduce(t, dst=0, op=dist.ReduceOp.PRODUCT)
    if rank == 0:
        assert t[0] == np.prod(np.arange(1, size + 1))
    gathered = [np.zeros(2) for _ in range(size)]
    dist.all_gather(gathered, np.full(2, float(rank)))
    assert [g[0] for g in gathered] == list(range(size))
    out = np.zeros(size * 2)
    dist.all_gather_into_tensor(out, np.full(2, float(rank)))
    np.testing.assert_array_equal(out, np.repeat(np.arange(size, dtype=float), 2))
    mine = np.zeros(2)
    dist.reduce_scatter(mine, [np.full(2, float(j + rank)) for j in range(size)])
    np.testing.assert_array_equal(mine, np.full(2, sum(rank_ + rank for rank_ in range(size))))
    flat = np.arange(size * 2, dtype=float) + rank
    dist.reduce_scatter_tensor(mine, flat)
    np.testing.assert_array_equal(mine, [sum(2 * rank + r for r in range(size)),
                                         sum(2 * rank + 1 + r for r in range(size))])
    single = np.zeros(size)
    dist.all_to_all_single(single, np.arange(size, dtype=float) + 10 * rank)
    np.testing.assert_array_equal(single, [rank + 10 * r for r in range(size)])
    outs = [np.zeros(1) for _ in range(size)]
    dist.all_to_all(outs, [np.array([100.0 * rank + j]) for j in range(size)])
    assert [o[0] for o in outs] == [100.0 * r + rank for r in range(size)]
    got = np.zeros(2)
    dist.scatter(got, [np.full(2, float(j)) for j in range(size)] if rank == 0 else None, src=0)
    assert (got == rank).all()
    bucket = [np.zeros(1) for _ in range(size)] if rank == 0 else None
    dist.gather(np.array([float(rank)]), bucket, dst=0)
    if rank == 0:
        assert [b[0] for b in bucket] == list(range(size))
    dist.barrier()


def test_groups_translate_global_ranks_and_mark_non_members(initialized):
    rank, size = dist.get_rank(), dist.get_world_size()
    upper = list(range(size // 2, size))
    group = dist.new_group(upper)
    if rank in upper:
        assert dist.get_rank(group) == upper.index(rank)
        t = np.full(1, float(rank))
        dist.broadcast(t, src=upper[-1], group=group)  # a global rank, as torch's
        assert t[0] == upper[-1]
    else:
        assert group is dist.GroupMember.NON_GROUP_MEMBER and dist.get_rank(group) == -1
    with pytest.raises(mpicoll.InvalidArgumentError, match="src: expected a rank .int., got "
                       "float 0.0"):  # (it said "rank 0.0 is not in this group")
        dist.broadcast(np.zeros(1), src=0.0)
    last = dist.new_group([size - 1])  # every rank makes it
    if size > 1 and rank == size - 1:
        with pytest.raises(mpicoll.InvalidArgumentError, match="not in this group"):
            dist.broadcast(np.zeros(1), src=0, group=last)  # refused before any message
    if rank != size - 1:
        assert last is dist.GroupMember.NON_GROUP_MEMBER
    dist.barrier()


def test_a_device_mesh_and_batched_point_to_point(initialized):
    rank, size = dist.get_rank(), dist.get_world_size()
    shape = (size // 2, 2) if size % 2 == 0 else (size, 1)
    mesh = dist.init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
    tp = mesh.get_group("tp")
    t = np.ones(1)
    dist.all_reduce(t, group=tp)
    assert t[0] == shape[1]
    right, left = (rank + 1) % size, (rank - 1) % size
    got = np.zeros(1)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, np.array([float(rank)]), right),
                                    dist.P2POp(dist.irecv, got, left)])
    for w in works:
        w.wait()
    assert got[0] == left


def test_a_device_mesh_made_by_torchs_constructor_from_a_grid_of_ranks(initialized):
    """``DeviceMesh("cpu", grid, mesh_dim_names=...)`` as torch's constructor (older
    tensor-parallel tutorials): the grid's lines along each dimension are its groups, in
    any order of ranks; ``dist.device_mesh`` is the module, as torch's. A grid that is no
    grid of the job's ranks, or another grid, on one rank raises on every rank before any
    group is made; then the next call is right."""
    rank, size = dist.get_rank(), dist.get_world_size()
    assert dist.device_mesh.DeviceMesh is dist.DeviceMesh
    shape = (2, size // 2) if size % 2 == 0 else (1, size)
    grid = np.arange(size)[::-1].reshape(shape).T  # (columns of reversed ranks: no order)
    mesh = dist.DeviceMesh("cpu", grid.tolist(), mesh_dim_names=("tp", "dp"))
    at = tuple(int(c) for c in np.argwhere(grid == rank)[0])
    assert mesh.get_coordinate() == tuple(at) and mesh.mesh.tolist() == grid.tolist()
    for d, name in enumerate(("tp", "dp")):
        line = sorted(np.moveaxis(grid, d, -1)[at[1 - d]].tolist())
        assert dist.get_process_group_ranks(mesh.get_group(name)) == line
        t = np.full(1, float(rank))
        dist.all_reduce(t, group=mesh.get_group(name))
        assert t[0] == sum(line)
    flat = dist.DeviceMesh("cpu", np.arange(size))  # (a tensor's tolist() as an array's)
    assert flat.mesh_dim_names is None and flat.size() == size
    assert dist.get_world_size(flat.get_group()) == size
    bad = {0: [list(range(size))] * 2, 1: [0] * size}.get(rank % 3, list(range(size))[::-1])
    if size == 1:
        bad = [[0, 0]]
    if size > 1 and rank != size - 1:
        bad = list(range(size))
    with pytest.raises(mpicoll.InvalidArgumentError, match=rf"refused on rank\(s\) {size - 1}[;: ]"):
        dist.DeviceMesh("cpu", bad)
    with pytest.raises(mpicoll.InvalidArgumentError, match="same grid"):
        dist.DeviceMesh("cpu", np.arange(size), mesh_dim_names=("a", "b") if rank == 0 else ("a",))
    t = np.ones(1)
    dist.all_reduce(t)
    assert t[0] == size


def test_a_device_mesh_from_groups_already_made(initialized):
    """``DeviceMesh.from_group`` as torch's (FSDP2 and DTensor code): one group is a 1-D
    mesh of its ranks; a list of groups with ``mesh=`` is an n-D mesh whose dimension d is
    the d-th group; a group that is not the mesh's line through this rank, a list without
    a mesh, or no group, raises on the rank that gives it (no message is sent)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    half = 2 if size % 2 == 0 else 1
    shape = (size // half, half)  # (dp, tp): tp inside consecutive ranks
    grid = np.arange(size).reshape(shape)
    dp_index, tp_index = divmod(rank, half)
    made = dist.init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
    dp, tp = made.get_group("dp"), made.get_group("tp")
    flat = dist.DeviceMesh.from_group(tp, "cpu")
    assert flat.mesh.tolist() == grid[dp_index].tolist() and flat.mesh_dim_names is None
    assert flat.get_group() is tp and flat.get_coordinate() == (tp_index,)
    named = dist.DeviceMesh.from_group([dp, tp], "cpu", mesh=grid, mesh_dim_names=("dp", "tp"))
    assert named.get_coordinate() == (dp_index, tp_index) and named.shape == shape
    assert named.get_group("dp") is dp and named.get_local_rank("tp") == tp_index
    t = np.full(1, float(rank))
    dist.all_reduce(t, group=named.get_group("tp"))
    assert t[0] == sum(grid[dp_index].tolist())
    with pytest.raises(mpicoll.InvalidArgumentError, match="needs mesh="):
        dist.DeviceMesh.from_group([dp, tp], "cpu")
    if size > 1:
        with pytest.raises(mpicoll.InvalidArgumentError, match="line through rank"):
            dist.DeviceMesh.from_group([tp, dp], "cpu", mesh=grid)  # (the two swapped)
    with pytest.raises(mpicoll.InvalidArgumentError, match="process group this rank is in"):
        dist.DeviceMesh.from_group(None, "cpu")
    with pytest.raises(mpicoll.InvalidArgumentError, match="empty list"):
        dist.DeviceMesh.from_group([], "cpu", mesh=[rank])
    with pytest.raises(mpicoll.InvalidArgumentError, match="mesh_dim_names"):
        dist.DeviceMesh.from_group(tp, "cpu", mesh_dim_names=("a", "b"))
    t = np.ones(1)
    dist.all_reduce(t)
    assert t[0] == size


def test_p2pops_of_the_default_group_by_none_or_by_name_go_in_one_batch(initialized):
    """``P2POp(..., group=None)`` and ``group=dist.group.WORLD`` are one group (torch
    resolves None to the default group); ``peer`` and ``group_peer`` are both set from
    the one given, as torch's; a Work's ``synchronize()`` is its ``wait()``."""
    rank, size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    got = np.zeros(1)
    send = dist.P2POp(dist.isend, np.array([float(rank)]), right, group=dist.group.WORLD)
    receive = dist.P2POp(dist.irecv, got, group_peer=left)
    assert (send.peer, send.group_peer, receive.peer, receive.group_peer) == \
        (right, right, left, left)
    assert receive.group is dist.group.WORLD
    for work in dist.batch_isend_irecv([send, receive]):
        work.synchronize()
    assert got[0] == left
    t = np.ones(1)
    dist.all_reduce(t, async_op=True).synchronize()
    assert t[0] == size


def test_a_device_mesh_as_torch_tutorials_use_it(initialized):
    """The tensor-parallel tutorials' uses: ``mesh["tp"]`` is a 1-D DeviceMesh (its
    ``get_group()``, ``get_local_rank()``, ``size()``), ``get_coordinate``,
    ``get_local_rank("dp")``, ``ndim``, ``shape``, ``mesh`` (the ranks in the grid), and a
    2-D mesh refuses ``get_group()`` without a dimension, as torch's."""
    rank, size = dist.get_rank(), dist.get_world_size()
    shape = (size // 2, 2) if size % 2 == 0 else (size, 1)
    mesh = dist.init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
    dp_index, tp_index = divmod(rank, shape[1])
    assert (mesh.ndim, mesh.shape, mesh.size(), mesh.get_rank()) == (2, shape, size, rank)
    assert mesh.mesh.tolist() == np.arange(size).reshape(shape).tolist()
    assert mesh.get_coordinate() == (dp_index, tp_index)
    assert (mesh.get_local_rank("dp"), mesh.get_local_rank(1)) == (dp_index, tp_index)
    with pytest.raises(mpicoll.InvalidArgumentError, match="name the one"):
        mesh.get_group()
    with pytest.raises(mpicoll.InvalidArgumentError, match="no 'pp'"):
        mesh.get_local_rank("pp")
    tp_mesh, dp_mesh = mesh["tp"], mesh["dp"]
    assert isinstance(tp_mesh, dist.DeviceMesh) and tp_mesh.ndim == 1
    assert tp_mesh.mesh.tolist() == [dp_index * shape[1] + k for k in range(shape[1])]
    assert dp_mesh.mesh.tolist() == [k * shape[1] + tp_index for k in range(shape[0])]
    assert (tp_mesh.get_local_rank(), tp_mesh.size(), dp_mesh.get_local_rank()) == \
        (tp_index, shape[1], dp_index)
    assert tp_mesh.get_group() is mesh.get_group("tp")
    assert dist.get_rank(tp_mesh.get_group()) == tp_index
    assert mesh["dp", "tp"].mesh.tolist() == mesh.mesh.tolist()
    for wrong in (("tp", "dp"), 0, None, ("tp", 1)):  # (not names, or not in order)
        with pytest.raises(mpicoll.InvalidArgumentError, match="mesh's order"):
            mesh[wrong]
    t = np.full(1, float(rank))
    dist.all_reduce(t, group=tp_mesh.get_group())
    assert t[0] == sum(tp_mesh.mesh.tolist())
    # made without names: none, as torch's; its dimensions by index
    unnamed = dist.init_device_mesh("cpu", shape)
    assert unnamed.mesh_dim_names is None and "mesh_dim_names=None" in repr(unnamed)
    assert dist.get_process_group_ranks(unnamed.get_group(1)) == tp_mesh.mesh.tolist()
    assert unnamed.get_local_rank(0) == dp_index
    with pytest.raises(mpicoll.InvalidArgumentError, match="made without mesh_dim_names"):
        unnamed["dim1"]
    line = dist.init_device_mesh("cpu", (size,))
    assert line.get_group() is line.get_all_groups()[0] and line.get_local_rank() == rank


def test_a_device_mesh_not_in_rank_order_gives_each_rank_its_place_in_the_groups(initialized):
    """In a grid not in rank order (the ranks reversed), ``get_local_rank(dim)`` is the
    rank's place in that dimension's group, which holds its ranks sorted (torch's rule),
    so the chunk of a group collective it picks is its own; ``get_coordinate()`` stays
    its place in the grid."""
    rank, size = dist.get_rank(), dist.get_world_size()
    shape = (size // 2, 2) if size % 2 == 0 else (size, 1)
    grid = np.arange(size)[::-1].reshape(shape)
    mesh = dist.DeviceMesh("cpu", grid.tolist(), mesh_dim_names=("dp", "tp"))
    assert mesh.get_coordinate() == tuple(int(i) for i in np.argwhere(grid == rank)[0])
    for d, name in enumerate(("dp", "tp")):
        group = mesh.get_group(name)
        assert mesh.get_local_rank(name) == mesh.get_local_rank(d) == dist.get_rank(group)
        assert mesh[name].get_local_rank() == dist.get_rank(group)
        out = np.zeros(mesh.size(d))
        dist.all_gather_into_tensor(out, np.array([float(rank)]), group=group)
        assert out[mesh.get_local_rank(name)] == rank
    again = dist.DeviceMesh.from_group([mesh.get_group("dp"), mesh.get_group("tp")], "cpu",
                                       mesh=grid.tolist(), mesh_dim_names=("dp", "tp"))
    assert [again.get_local_rank(d) for d in (0, 1)] == \
        [dist.get_rank(mesh.get_group(d)) for d in (0, 1)]


class _Unpicklable:
    def __reduce__(self):
        raise TypeError("not today")


def test_object_collectives_as_torch(initialized):
    """all_gather_object, gather_object, broadcast_object_list, scatter_object_list: any
    picklable object, its size unknown to the others; a wrong list on one rank raises
    there after it took part, and an unpicklable object raises, every rank going on."""
    rank, size = dist.get_rank(), dist.get_world_size()
    mine = {"rank": rank, "text": "x" * rank, "array": np.arange(rank)}
    everyone: list = [None] * size
    dist.all_gather_object(everyone, mine)
    assert [o["rank"] for o in everyone] == list(range(size))
    assert [len(o["text"]) for o in everyone] == list(range(size))
    np.testing.assert_array_equal(everyone[-1]["array"], np.arange(size - 1))
    last = size - 1
    gathered = [None] * size if rank == last else None
    dist.gather_object(("hello", rank), gathered, dst=last)
    if rank == last:
        assert gathered == [("hello", r) for r in range(size)]
    gathered = [None] * size if rank == last else []  # ([] on the others: torch's "not
    dist.gather_object(rank, gathered, dst=last)  # given" too)
    if rank == last:
        assert gathered == list(range(size))
    kept = {3: 4}
    objects = [1, "two", kept] if rank == 0 else [None, None, None]
    dist.broadcast_object_list(objects, src=0)
    assert objects == [1, "two", {3: 4}]
    assert (objects[2] is kept) == (rank == 0)  # the source keeps its own objects
    objects = (1, "two") if rank == 0 else [None, None]  # a tuple the source only reads
    dist.broadcast_object_list(objects, src=0)
    assert list(objects) == [1, "two"]
    out: list = [None]
    dist.scatter_object_list(out, [f"for {r}" * (r + 1) for r in range(size)] if rank == 0
                             else None, src=0)
    assert out[0] == f"for {rank}" * (rank + 1)
    short: list = [None] * (size - 1 if rank == last else size)
    if rank == last:  # it took part (the others got theirs), then raises
        with pytest.raises(mpicoll.InvalidArgumentError, match="object_list"):
            dist.all_gather_object(short, rank)
    else:
        dist.all_gather_object(short, rank)
        assert short == list(range(size))
    with pytest.raises(mpicoll.InvalidArgumentError, match=f"obj on rank {last} cannot be"):
        dist.all_gather_object(everyone, _Unpicklable() if rank == last else rank)
    with pytest.raises(mpicoll.InvalidArgumentError, match="object_list on rank 0 cannot be"):
        dist.broadcast_object_list([_Unpicklable()] if rank == 0 else [None], src=0)
    with pytest.raises(mpicoll.InvalidArgumentError, match="the source.: expected a list, got int"):
        dist.broadcast_object_list(5 if rank == 0 else [None], src=0)  # every rank raises
    with pytest.raises(mpicoll.InvalidArgumentError, match="expected a list of"):
        dist.scatter_object_list(out, [1] * (size + 1) if rank == 0 else None, src=0)
    with pytest.raises(mpicoll.InvalidArgumentError, match="on rank 0 cannot be pickled"):
        dist.scatter_object_list(out, [1] * (size - 1) + [_Unpicklable()] if rank == 0
                                 else None, src=0)  # every rank raises, the source too
    if rank in (0, last):  # the rank whose object failed and the destination raise
        with pytest.raises(mpicoll.InvalidArgumentError, match=f"on rank {last} cannot be"):
            dist.gather_object(_Unpicklable() if rank == last else rank,
                               [None] * size if rank == 0 else None, dst=0)
    else:
        dist.gather_object(rank, None, dst=0)
    dist.all_gather_object(everyone, rank * 10)  # the next call: every rank in step
    assert everyone == [r * 10 for r in range(size)]


def test_torch_names_tutorials_reach_for(initialized):
    rank, size = dist.get_rank(), dist.get_world_size()
    assert dist.group.WORLD is dist.GroupMember.WORLD is not None
    assert dist.get_process_group_ranks(dist.group.WORLD) == list(range(size))
    assert dist.is_mpi_available() and dist.is_gloo_available()
    assert isinstance(dist.is_nccl_available(), bool)
    assert dist.Backend("GLOO") == dist.Backend.GLOO == "gloo"
    world = mpicoll.Communicator()
    assert dist.get_node_local_rank() == world.nodes[world.node].index(rank)
    world.free()
    mine, groups = dist.new_subgroups(1)
    assert len(groups) == size and dist.get_process_group_ranks(mine) == [rank]
    t = np.ones(1)
    dist.all_reduce(t, group=mine)
    assert t[0] == 1.0


@pytest.mark.parametrize("async_op", [False, True])
def test_a_bad_list_on_one_rank_raises_without_leaving_the_others_waiting(initialized, async_op):
    """(The source names its list, as torch's argument, async too: it said the core
    call's "x: expected an array, got None" from wait().)"""
    rank, size = dist.get_rank(), dist.get_world_size()
    got = np.zeros(2)
    raised = mpicoll.InvalidArgumentError if rank == 0 else mpicoll.MpicollError
    with pytest.raises(raised, match="^scatter_list: expected" if rank == 0 else None):
        work = dist.scatter(got, [np.zeros(2)] * (size + 1) if rank == 0 else None, src=0,
                            async_op=async_op)  # (the source's list travels in its header)
        if async_op:
            work.wait()
    short = [np.zeros(2) for _ in range(size - 1 if rank == size - 1 else size)]
    if rank == size - 1:  # it takes part, then refuses its own list
        with pytest.raises(mpicoll.InvalidArgumentError, match="tensor_list"):
            dist.all_gather(short, np.full(2, float(rank)))
    else:
        dist.all_gather(short, np.full(2, float(rank)))
        assert [s[0] for s in short] == list(range(size))
    dist.barrier()


def test_outputs_that_are_not_contiguous_get_the_result(initialized):
    rank, size = dist.get_rank(), dist.get_world_size()
    whole = np.zeros((size, 4))
    out = whole[:, :2]  # a strided view: its reshape would be a copy
    dist.all_to_all_single(out, np.arange(size * 2, dtype=float) + 100 * rank)
    np.testing.assert_array_equal(out, [[100 * r + 2 * rank, 100 * r + 2 * rank + 1]
                                        for r in range(size)])
    assert (whole[:, 2:] == 0).all()
    gathered = np.zeros((size, 3))[:, ::2]
    dist.all_gather_into_tensor(gathered, np.full(2, float(rank)))
    np.testing.assert_array_equal(gathered, np.repeat(np.arange(size, dtype=float)[:, None], 2, 1))


def test_a_rank_outside_a_group_does_nothing_as_torch(initialized):
    """torch's GroupMember.NON_GROUP_MEMBER: every rank calls the collective with the
    group; outside it the call returns None with torch's warning, inside it runs."""
    rank = dist.get_rank()
    first = dist.new_group([0])
    t = np.full(2, float(rank + 1))
    if rank == 0:
        assert dist.all_reduce(t, group=first) is None and (t == 1).all()
    else:
        assert first is dist.GroupMember.NON_GROUP_MEMBER and first == -100  # (torch's value)
        assert dist.get_rank(-100) == dist.get_world_size(-100) == -1  # (as compared to it)
        for call in (lambda: dist.all_reduce(t, group=first),
                     lambda: dist.broadcast(t, src=0, group=first),
                     lambda: dist.all_gather([np.zeros(2)], t, group=first),
                     lambda: dist.barrier(group=first)):
            with pytest.warns(UserWarning, match="does not belong to the given group"):
                assert call() is None
        assert (t == rank + 1).all()
    dist.barrier()


def test_group_ranks_translate_both_ways_and_group_src_dst(initialized):
    rank, size = dist.get_rank(), dist.get_world_size()
    backwards = dist.new_group(list(range(size))[::-1], sort_ranks=False)  # order kept
    assert dist.get_rank(backwards) == size - 1 - rank
    assert dist.get_group_rank(backwards, 0) == size - 1
    assert dist.get_global_rank(backwards, 0) == size - 1
    with pytest.raises(mpicoll.InvalidArgumentError):
        dist.get_global_rank(backwards, size)
    t = np.full(1, float(rank))
    dist.broadcast(t, group=backwards, group_src=0)  # the group's rank 0: global size - 1
    assert t[0] == size - 1
    got = [np.zeros(1) for _ in range(size)] if rank == size - 1 else None
    dist.gather(np.full(1, float(rank)), got, group=backwards, group_dst=0)
    if got is not None:
        assert [g[0] for g in got] == list(range(size))[::-1]
    with pytest.raises(mpicoll.InvalidArgumentError, match="not both"):
        dist.broadcast(t, src=0, group_src=0)
    sorted_group = dist.new_group(list(range(size))[::-1])  # sorted, as torch's default
    assert dist.get_rank(sorted_group) == rank
    with pytest.raises(mpicoll.InvalidArgumentError, match="use_local_synchronization"):
        dist.new_group([0], use_local_synchronization=True)


@pytest.mark.parametrize("async_op", [False, True])
def test_an_output_of_none_on_one_rank_is_refused_after_taking_part(initialized, async_op):
    """torch writes scatter's and reduce_scatter's result into the output: None on the
    last rank raises there (the call made, the others get theirs), async too."""
    rank, size = dist.get_rank(), dist.get_world_size()
    calls = {
        "scatter": lambda out: dist.scatter(out, [np.ones(2)] * size if rank == 0 else None,
                                            src=0, async_op=async_op),
        "reduce_scatter": lambda out: dist.reduce_scatter(out, [np.ones(2)] * size,
                                                          async_op=async_op),
        "reduce_scatter_tensor": lambda out: dist.reduce_scatter_tensor(
            out, np.ones(2 * size), async_op=async_op),
    }
    for name, call in calls.items():
        if rank == size - 1:
            with pytest.raises(mpicoll.InvalidArgumentError, match="got None"):
                work = call(None)
                if async_op:
                    work.wait()
        else:
            out = np.zeros(2)
            work = call(out)
            if async_op:
                work.wait()
            np.testing.assert_array_equal(out, np.full(2, 1.0 if name == "scatter" else size))
        t = np.ones(1)
        dist.all_reduce(t)
        assert t[0] == size


@pytest.mark.parametrize("async_op", [False, True])
def test_an_output_of_another_dtype_on_one_rank_is_named_as_torch_names_it(initialized,
                                                                           async_op):
    """The last rank's output of another dtype than the input: it takes part, then raises
    naming the tensors as the caller named them (not the core call's out=, in a shape the
    caller never gave); the others get theirs, and the next call is right."""
    rank, size = dist.get_rank(), dist.get_world_size()
    calls = {
        "output_tensor": lambda dtype: dist.all_gather_into_tensor(
            np.zeros(2 * size, dtype), np.ones(2), async_op=async_op),
        "output": lambda dtype: dist.reduce_scatter_tensor(
            np.zeros(2, dtype), np.ones(2 * size), async_op=async_op),
        "output ": lambda dtype: dist.reduce_scatter(
            np.zeros(2, dtype), [np.ones(2)] * size, async_op=async_op),
    }
    for name, call in calls.items():
        if rank == size - 1:
            with pytest.raises(mpicoll.InvalidArgumentError,
                               match=f"^{name.strip()}: expected dtype float64 .*got float32"):
                work = call(np.float32)
                if async_op:
                    work.wait()
        else:
            work = call(np.float64)
            if async_op:
                work.wait()
        t = np.ones(1)
        dist.all_reduce(t)
        assert t[0] == size


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("bad", [[1, 2], [3], "ab", [-1, 3]], ids=str)
def test_bad_split_sizes_on_one_rank_raise_on_every_rank(initialized, bad, async_op):
    """all_to_all_single's input_split_sizes wrong on the last rank alone (their sum, their
    number, not ints, negative): the counts' own exchange refuses them on every rank (no
    rank waits for the others' messages), and the next call is right."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if size < 2:
        pytest.skip("needs two ranks")
    x, out = np.arange(2.0 * size), np.zeros(2 * size)
    sizes = ([2] * (size - 2) + bad if isinstance(bad, list) else bad) \
        if rank == size - 1 else [2] * size
    with pytest.raises(mpicoll.MpicollError, match="input_split_sizes" if rank == size - 1
                       else f"rank\\(s\\) {size - 1} refused"):
        work = dist.all_to_all_single(out, x, [2] * size, sizes, async_op=async_op)
        if async_op:
            work.wait()
    t = np.ones(1)
    dist.all_reduce(t)
    assert t[0] == size


@pytest.mark.parametrize("async_op", [False, True])
def test_all_to_all_lists_wrong_on_one_rank_raise_on_every_rank(initialized, async_op):
    """dist.all_to_all with the last rank's input list one short, or its input not a
    tensor in all_to_all_single with split sizes: all_to_all_v's counts exchange refuses
    it on every rank; the next call is right."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if size < 2:
        pytest.skip("needs two ranks")
    last = rank == size - 1
    outs = [np.zeros(2) for _ in range(size)]
    calls = [lambda: dist.all_to_all(outs, [np.ones(2)] * (size - 1 if last else size),
                                     async_op=async_op),
             lambda: dist.all_to_all_single(np.zeros(size), "x" if last else np.ones(size),
                                            [1] * size, [1] * size, async_op=async_op)]
    for call in calls:
        with pytest.raises(mpicoll.MpicollError, match="input" if last
                           else f"rank\\(s\\) {size - 1} refused"):
            work = call()
            if async_op:
                work.wait()
        t = np.ones(1)
        dist.all_reduce(t)
        assert t[0] == size


def test_new_group_refused_on_one_rank_raises_on_every_rank(initialized):
    """new_group / new_subgroups with arguments one rank alone gets wrong (not a list, a
    size that does not divide): every rank raises, naming it, before any group is made;
    the next calls are right."""
    rank, size = dist.get_rank(), dist.get_world_size()
    for culprit in sorted({size - 1, 0}):  # (the first rank too: it alone named)
        wrong = rank == culprit
        tries = [lambda wrong=wrong: dist.new_group(5 if wrong else [0]),
                 lambda wrong=wrong: dist.new_subgroups(size + 1 if wrong else 1)]
        for make in tries:
            with pytest.raises(mpicoll.InvalidArgumentError,
                               match=rf"refused on rank\(s\) {culprit}[;: ]"):
                make()
    group = dist.new_group([0])
    t = np.ones(1)
    dist.all_reduce(t)
    assert t[0] == size and (group is dist.GroupMember.NON_GROUP_MEMBER) == (rank != 0)


def test_a_then_callback_waiting_for_a_later_call_raises_instead_of_deadlocking(initialized):
    """A future's then() callback that waits for a later async call, run on the progress
    thread that would run that call after it (rank 0, whose call is pending when it adds
    the callback): ConcurrentCallError into the chained future, not two threads waiting
    forever; both calls end right."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if rank == 1:
        time.sleep(0.3)  # (rank 0's first call pending while it adds the callback)
    a, b = np.ones(3), np.full(3, 2.0)
    first = dist.all_reduce(a, async_op=True)
    second = dist.all_reduce(b, async_op=True)
    later = second.get_future()
    chained = first.get_future().then(lambda f: later.wait())
    if rank == 0:
        with pytest.raises(mpicoll.ConcurrentCallError, match="wait for itself"):
            chained.wait()
    second.wait()
    first.wait()
    assert (a.tolist(), b.tolist()) == ([size] * 3, [2.0 * size] * 3)


def test_split_sizes_as_small_numpy_ints_are_summed_as_ints(initialized):
    """all_to_all_single's split sizes as a uint8 array summing past 255: taken as the
    numbers they are (summed as uint8 they wrapped, and a right call was refused)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    sizes = np.full(size, 200, np.uint8)
    x = np.full((200 * size, 1), float(rank))
    out = np.zeros_like(x)
    dist.all_to_all_single(out, x, output_split_sizes=sizes, input_split_sizes=sizes)
    assert out[:, 0].tolist() == [float(r) for r in range(size) for _ in range(200)]


def test_an_async_work_as_torch(initialized):
    """wait() returns True; once is_completed() says so, the list holds the result."""
    rank, size = dist.get_rank(), dist.get_world_size()
    rows = [np.zeros(2) for _ in range(size)]
    work = dist.all_gather(rows, np.full(2, float(rank)), async_op=True)
    while not work.is_completed():
        pass
    assert [r[0] for r in rows] == list(range(size))
    assert work.wait() is True
    assert dist.all_reduce(np.ones(1), async_op=True).wait() is True


def test_async_outputs_hold_the_result_once_a_later_handle_is_waited_for(initialized):
    """An async call's outputs are filled once it has ended, waited for or not (as
    torch's): code that waits only for its last call's handle, or drops a handle, reads
    every earlier call's outputs filled (they were written at their own wait() alone, so
    they stayed zeros). The calls run in order, so the last one's end follows theirs."""
    rank, size = dist.get_rank(), dist.get_world_size()
    gathered = [np.zeros(2) for _ in range(size)]
    exchanged = [np.zeros(1) for _ in range(size)]
    at_root = [np.zeros(2) for _ in range(size)] if rank == 0 else None
    splits = [1 + (rank + j) % 2 for j in range(size)]  # uneven: rank j sends me (j + me) % 2 + 1
    received = [1 + (j + rank) % 2 for j in range(size)]
    single = np.zeros(sum(received))
    handles = [dist.all_gather(gathered, np.full(2, float(rank)), async_op=True),
               dist.all_to_all(exchanged, [np.full(1, 10.0 * rank + j) for j in range(size)],
                               async_op=True),
               dist.gather(np.full(2, float(rank)), at_root, dst=0, async_op=True)]
    dist.all_to_all_single(single, np.concatenate([np.full(n, 10.0 * rank + j)
                                                   for j, n in enumerate(splits)]),
                           output_split_sizes=received, input_split_sizes=splits,
                           async_op=True)  # (its handle dropped)
    del handles
    assert dist.all_reduce(np.ones(1), async_op=True).wait() is True
    assert [r.tolist() for r in gathered] == [[float(j)] * 2 for j in range(size)]
    assert [r[0] for r in exchanged] == [10.0 * j + rank for j in range(size)]
    if rank == 0:
        assert [r.tolist() for r in at_root] == [[float(j)] * 2 for j in range(size)]
    assert single.tolist() == [10.0 * j + rank for j, n in enumerate(received) for _ in range(n)]


def _every_rank_refuses(call, match):
    with pytest.raises(mpicoll.InvalidArgumentError, match=match):
        call()


def test_the_same_mistake_on_every_rank_raises_mpicoll_errors(initialized):
    """What torch refuses, refused with mpicoll's error (no raw NumPy error), on every
    rank; then the next call is right."""
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.full(3, float(rank))
    cases = [
        (lambda: dist.all_gather_into_tensor(np.zeros(3 * size - 1), x), "output_tensor"),
        (lambda: dist.all_gather_into_tensor(np.zeros(3 * size + 3), x), "output_tensor"),
        (lambda: dist.all_gather([np.zeros(4) for _ in range(size)], x),
         "tensor_list: this rank received"),
        (lambda: dist.all_gather([np.zeros((2, 3)) for _ in range(size)], x),
         r"its tensors hold \[6"),
        (lambda: dist.all_gather([np.zeros(3, int) for _ in range(size)], x), "float64"),
        (lambda: dist.all_gather([np.zeros(3)] * (size + 1), x), "tensor_list"),
        (lambda: dist.reduce_scatter_tensor(np.zeros(3), np.zeros(3 * size + 1)),
         "input" if size > 1 else "^output"),
        (lambda: dist.reduce_scatter(np.zeros(3), [np.zeros(3)] * (size + 1)), "input_list"),
        (lambda: dist.reduce_scatter(np.zeros(3), [np.zeros(2)] * size),
         "^output: expected shape"),
        (lambda: dist.reduce_scatter(np.zeros(2), [np.zeros(2)] * (size - 1) + [np.zeros(3)]),
         "input_list: tensors of one shape" if size > 1 else "^output: expected shape"),
        (lambda: dist.all_to_all_single(np.zeros(size * 2), np.zeros(size * 2 + 1)),
         "split evenly" if size > 1 else "elements"),
        (lambda: dist.all_to_all_single(np.zeros(size * 2), np.zeros(size * 2),
                                        output_split_sizes=[3] * size,
                                        input_split_sizes=[2] * size), "output_split_sizes"),
        (lambda: dist.all_to_all_single(np.zeros(size * 2), np.zeros(size * 2),
                                        input_split_sizes=[1] * size), "input_split_sizes"),
        (lambda: dist.all_to_all_single(np.zeros(size * 2), np.zeros(size * 2),
                                        input_split_sizes=dict.fromkeys(range(size), 2)),
         "input_split_sizes: expected .* in rank order"),
        (lambda: dist.all_to_all([np.zeros(1)] * (size + 1), [np.zeros(1)] * size),
         "output_tensor_list"),
        (lambda: dist.all_to_all([np.zeros(2) for _ in range(size)], [np.zeros(1)] * size),
         "received"),
        (lambda: dist.gather(x, [np.zeros(3)] * size, dst=0) if rank != 0 else
         dist.gather(x, None, dst=0), "gather_list"),
        (lambda: dist.broadcast(3.0, src=0), "tensor"),
        (lambda: dist.all_reduce(3.0), "^tensor: expected an array to write into"),
    ]
    for call, match in cases:
        _every_rank_refuses(call, match)
        got = np.full(2, 1.0)
        dist.all_reduce(got)
        assert (got == size).all(), match


def test_one_rank_s_wrong_output_takes_part_then_raises(initialized):
    """A wrong output list or tensor on one rank: that rank takes part, then raises; the
    others get their results and nothing is left waiting."""
    rank, size = dist.get_rank(), dist.get_world_size()
    last = rank == size - 1
    x = np.full(2, float(rank))
    out = np.zeros(2 * size - (1 if last else 0))
    if last:
        with pytest.raises(mpicoll.InvalidArgumentError, match="output_tensor"):
            dist.all_gather_into_tensor(out, x)
    else:
        dist.all_gather_into_tensor(out, x)
        assert out.tolist() == [float(r) for r in range(size) for _ in range(2)]
    rows = [np.zeros(2, int if last else float) for _ in range(size)]
    if last:
        with pytest.raises(mpicoll.InvalidArgumentError, match="tensor_list"):
            dist.all_gather(rows, x)
    else:
        dist.all_gather(rows, x)
        assert [r[0] for r in rows] == list(range(size))
    single = np.zeros(size + (1 if last else 0))
    if last:
        with pytest.raises(mpicoll.InvalidArgumentError, match="output"):
            dist.all_to_all_single(single, np.arange(size, dtype=float))
    else:
        dist.all_to_all_single(single, np.arange(size, dtype=float))
        assert single.tolist() == [float(rank)] * size
    t = np.ones(1)
    dist.all_reduce(t)
    assert t[0] == size


@pytest.mark.parametrize("wrong", ["number", "list", "read-only"])
@pytest.mark.parametrize("call", ["all_reduce", "reduce"])
def test_an_in_place_calls_refusal_names_its_tensor_as_torch(initialized, wrong, call):
    """all_reduce and reduce write into the one tensor they are given: a refusal of it
    (a number, a list, a read-only array) names it ``tensor``, torch's argument, not the
    core call's x or out=; the next call runs. (A reduce's read-only tensor is refused
    where it is written: at dst; a number on every rank, as torch's.)"""
    rank, size = dist.get_rank(), dist.get_world_size()
    given = {"number": 3.0, "list": [1.0, 2.0], "read-only": np.ones(2)}[wrong]
    if wrong == "read-only":
        given.setflags(write=False)
    if call == "reduce" and wrong == "read-only" and rank != size - 1:
        dist.reduce(given, dst=size - 1)
    else:
        with pytest.raises(mpicoll.InvalidArgumentError, match="^tensor: "):
            if call == "all_reduce":
                dist.all_reduce(given)
            else:
                dist.reduce(given, dst=size - 1)
    t = np.ones(1)
    dist.all_reduce(t)
    assert t[0] == size


@pytest.mark.parametrize("async_op", [False, True])
def test_all_to_all_forms_run_an_algorithm_of_equal_blocks(initialized, async_op):
    """all_to_all_single and all_to_all (all_to_all_v underneath, whatever the split
    sizes) run bruck, which needs equal blocks, where every block is alike."""
    rank, size = dist.get_rank(), dist.get_world_size()
    out = np.zeros(2 * size)
    work = dist.all_to_all_single(out, np.full(2 * size, float(rank)), algorithm="bruck",
                                  async_op=async_op)
    if async_op:
        work.wait()
    assert out.tolist() == [float(r) for r in range(size) for _ in range(2)]
    outs = [np.zeros(3) for _ in range(size)]
    work = dist.all_to_all(outs, [np.full(3, rank * 10.0 + j) for j in range(size)],
                           algorithm="bruck", async_op=async_op)
    if async_op:
        work.wait()
    assert [o.tolist() for o in outs] == [[r * 10.0 + rank] * 3 for r in range(size)]


def test_one_rank_s_wrong_output_with_async_and_an_algorithm(initialized):
    """The rank with the wrong output makes the call as the others do (async_op=True on
    the progress thread's communicator, the algorithm named), waits, then raises."""
    rank, size = dist.get_rank(), dist.get_world_size()
    last = rank == size - 1
    x = np.full(2, float(rank))
    rows = [np.zeros(2) for _ in range(size + (1 if last else 0))]
    if last:
        with pytest.raises(mpicoll.InvalidArgumentError, match="tensor_list"):
            dist.all_gather(rows, x, async_op=True)
    else:
        dist.all_gather(rows, x, async_op=True).wait()
        assert [r[0] for r in rows] == list(range(size))
    out = np.zeros(2 * size - (1 if last else 0))
    if last:
        with pytest.raises(mpicoll.InvalidArgumentError, match="output_tensor"):
            dist.all_gather_into_tensor(out, x, algorithm="ring")
    else:
        dist.all_gather_into_tensor(out, x, algorithm="ring")
        assert out.tolist() == [float(r) for r in range(size) for _ in range(2)]
    mine = np.zeros(3 if last else 2)  # reduce_scatter: a wrong output is received, too
    if last:
        with pytest.raises(mpicoll.InvalidArgumentError, match="out"):
            dist.reduce_scatter(mine, [np.ones(2) for _ in range(size)])
    else:
        dist.reduce_scatter(mine, [np.ones(2) for _ in range(size)])
        assert (mine == size).all()
    t = np.ones(1)
    dist.all_reduce(t)
    assert t[0] == size


def test_lists_and_roots_that_are_not_what_torch_takes(initialized):
    size = dist.get_world_size()
    with pytest.raises(mpicoll.InvalidArgumentError, match="gather_list"):
        dist.gather(np.ones(2), np.zeros((size, 2)), dst=0)  # an array, not a list
    with pytest.raises(mpicoll.InvalidArgumentError, match="src"):
        dist.broadcast(np.ones(1), src=size)  # on every rank: refused as a call
    for src in (True, 0.0):  # (they hash as ranks 1 and 0: torch takes ints alone)
        with pytest.raises(mpicoll.InvalidArgumentError, match="src"):
            dist.broadcast(np.ones(1), src=src)
    with pytest.raises(mpicoll.InvalidArgumentError, match="split_sizes"):
        dist.all_to_all_single(np.zeros(size), np.zeros(size), input_split_sizes=[True] * size)
    for op in (dist.send, dist.recv, "isend", None):  # refused as it is made, as torch's
        with pytest.raises(mpicoll.InvalidArgumentError, match="P2POp: op must be"):
            dist.P2POp(op, np.ones(1), 0)
    for ops in ([mpicoll.P2POp("isend", np.ones(1), 0)], [1], 5):
        with pytest.raises(mpicoll.InvalidArgumentError, match="batch_isend_irecv"):
            dist.batch_isend_irecv(ops)  # (torch's: a list of dist.P2POp)
    t = np.ones(1)
    dist.all_reduce(t)
    assert t[0] == size


def test_an_async_call_refused_for_what_it_gives(initialized):
    """A bad input list with async_op=True: the call is queued refused on the progress
    thread (numbered as the others'), and raises at once; then both an async and a
    blocking call are right."""
    size = dist.get_world_size()
    for _ in range(2):
        with pytest.raises(mpicoll.InvalidArgumentError, match="input_list"):
            dist.reduce_scatter(np.zeros(2), [np.zeros(2)] * (size + 1), async_op=True)
        if size > 1:  # (one rank takes any number of rows)
            with pytest.raises(mpicoll.InvalidArgumentError, match="split evenly"):
                dist.all_to_all_single(np.zeros(2 * size + 1), np.zeros(2 * size + 1),
                                       async_op=True)
        t = np.ones(2)
        dist.all_reduce(t, async_op=True).wait()
        u = np.ones(2)
        dist.all_reduce(u)
        assert (t == size).all() and (u == size).all()


def test_a_works_future_as_torch_comm_hooks_use_it(initialized):
    """``get_future()``: its value is the call's outputs in a list, set once the call has
    ended (the tensor holds the result by then); ``then`` chains a callback's value (a
    DDP comm hook's division), a callback's error becomes the chained future's; every
    collective's future gives its outputs."""
    rank, size = dist.get_rank(), dist.get_world_size()
    tensor = np.full(3, float(rank + 1))
    fut = dist.all_reduce(tensor, async_op=True).get_future()
    averaged = fut.then(lambda f: f.value()[0] / size)
    assert fut.wait()[0] is tensor
    np.testing.assert_array_equal(tensor, np.full(3, size * (size + 1) / 2))
    np.testing.assert_array_equal(averaged.wait(), np.full(3, (size + 1) / 2))
    assert fut.done() and averaged.done()
    failing = fut.then(lambda f: 1 / 0)  # (already done: runs at once, here)
    with pytest.raises(ZeroDivisionError):
        failing.wait()
    rows = [np.zeros(2) for _ in range(size)]
    value = dist.all_gather(rows, np.full(2, float(rank)), async_op=True).get_future().wait()
    # (a list of outputs: its tensors, flat, as gloo's and torch's MPI backend's)
    assert len(value) == size and all(v is r for v, r in zip(value, rows, strict=True))
    assert [r[0] for r in rows] == list(range(size))
    gathered = [np.zeros(1) for _ in range(size)] if rank == 0 else None
    value = dist.gather(np.full(1, float(rank)), gathered, dst=0,
                        async_op=True).get_future().wait()
    assert value == [] if rank else all(v is g for v, g in zip(value, gathered, strict=True))
    swapped = [np.zeros(1) for _ in range(size)]
    value = dist.all_to_all(swapped, [np.full(1, float(rank)) for _ in range(size)],
                            async_op=True).get_future().wait()
    assert len(value) == size and value[-1] is swapped[-1]
    assert [s[0] for s in swapped] == list(range(size))
    out = np.zeros(size)
    value = dist.all_gather_into_tensor(out, np.full(1, float(rank)),
                                        async_op=True).get_future().wait()
    assert value == [out] and out.tolist() == list(range(size))
    seen, called = [], threading.Event()
    work = dist.broadcast(tensor, 0, async_op=True)
    work.get_future().add_done_callback(
        lambda f: (seen.append(f.value()[0] is tensor), called.set()))
    work.wait()
    assert called.wait(30) and seen == [True]  # (in the thread that ended the call)
    assert dist.barrier(async_op=True).get_future().wait() == []


def test_a_failed_calls_future_raises_its_error(initialized):
    """A call that fails on this rank (a wrong output, found as the others take part):
    its future holds the error, which wait() raises, as the Work's wait()."""
    size = dist.get_world_size()
    rank = dist.get_rank()
    rows = [np.zeros(2) for _ in range(size)] if rank else [np.zeros(2)] * (size + 1)
    if rank == 0:
        with pytest.raises(mpicoll.InvalidArgumentError):
            dist.all_gather(rows, np.zeros(2), async_op=True)
    else:
        work = dist.all_gather(rows, np.zeros(2), async_op=True)
        assert work.get_future().wait()[0] is rows[0] and work.exception() is None
    tensor = np.ones(1)
    dist.all_reduce(tensor)
    assert tensor[0] == size


def test_an_irecv_work_waits_within_torchs_timeout(initialized):
    """``Work.wait(timeout)`` of an irecv whose message has not come: a
    CollectiveTimeoutError after the timeout, the receive still pending; once the
    sender sends, the next wait() gets it."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if size < 2:
        pytest.skip("needs two ranks")
    tensor = np.zeros(2)
    if rank == 1:
        work = dist.irecv(tensor, src=0, tag=7)
        with pytest.raises(mpicoll.InvalidArgumentError, match="timeout"):
            work.wait("soon")
        started = time.monotonic()
        with pytest.raises(mpicoll.CollectiveTimeoutError, match="not done after 0.2 s"):
            work.wait(datetime.timedelta(seconds=0.2))
        assert 0.2 <= time.monotonic() - started < 5
        dist.barrier()
        assert work.wait(timeout=5.0) is True and tensor.tolist() == [3.0, 3.0]
    else:
        dist.barrier()
        if rank == 0:
            dist.send(np.full(2, 3.0), dst=1, tag=7)
    dist.barrier()


def test_a_receive_shorter_than_its_tensor_raises_and_the_next_call_is_right(initialized):
    """torch's receives fill the whole tensor: a 4-element message into an 8-element
    tensor raises (recv, irecv's wait, a batch's irecv) rather than leave half of it as
    it was; a send's Work has no source()."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if size < 2:
        pytest.skip("needs two ranks")
    if rank == 0:
        for tag in (1, 2, 3):
            dist.send(np.arange(4.0), dst=1, tag=tag)
        work = dist.isend(np.ones(2), dst=1, tag=4)
        with pytest.raises(mpicoll.InvalidArgumentError, match="no source"):
            work.source()
        work.wait()
    elif rank == 1:
        tensor = np.full(8, -1.0)
        with pytest.raises(mpicoll.InvalidArgumentError, match="had 32 bytes, the tensor 64"):
            dist.recv(tensor, src=0, tag=1)
        with pytest.raises(mpicoll.InvalidArgumentError, match="had 32 bytes"):
            dist.irecv(tensor, src=0, tag=2).wait()
        (work,) = dist.batch_isend_irecv([dist.P2POp(dist.irecv, tensor, 0, tag=3)])
        with pytest.raises(mpicoll.InvalidArgumentError, match="had 32 bytes"):
            work.wait()
        whole = np.zeros(2)
        work = dist.irecv(whole, src=0, tag=4)
        assert work.wait() and work.source() == 0 and whole.tolist() == [1.0, 1.0]
    tensor = np.ones(1)
    dist.all_reduce(tensor)
    assert tensor[0] == size


def test_a_call_in_a_future_callback_is_refused_on_every_rank(initialized):
    """A then() callback runs on the progress thread that ended the call: a collective
    it makes (blocking, async, or a plan's) is refused before it takes a number, the same
    on every rank, as the chained future's error; the next calls are right."""
    size = dist.get_world_size()
    tensor = np.ones(2)
    inner = {
        "blocking": lambda f: dist.all_reduce(np.ones(1)),
        "async": lambda f: dist.all_reduce(np.ones(1), async_op=True),
        "decided": lambda f: dist.all_reduce(tensor),  # (a call decided before)
    }
    dist.all_reduce(tensor)
    for callback in inner.values():
        for ended in (False, True):  # (ended: then() runs it at once, in this thread)
            work = dist.all_reduce(np.ones(1), async_op=True)
            future = work.get_future()
            if ended:
                future.wait()
            chained = future.then(callback)
            with pytest.raises(mpicoll.ConcurrentCallError, match="done callback"):
                chained.wait()
            with pytest.raises(mpicoll.ConcurrentCallError, match="done callback"):
                future.then(lambda f: None).then(callback).wait()  # (what then() chains)
    mine = dist.Future()  # a future of the caller's own, ended in its thread: its
    mine.set_result(None)  # callbacks are its own code, as any (the same on every rank)
    assert mine.then(lambda f: dist.all_reduce(np.ones(1))).wait() is None
    after = np.ones(3)
    dist.all_reduce(after)
    assert after.tolist() == [size] * 3


def test_a_futures_failing_callback_leaves_the_others_running():
    """mpicoll.dist.Future: a callback that raises is reported as a warning; the later
    callbacks and the chained futures still end (as torch's)."""
    fut = dist.Future()
    ran = []
    fut.add_done_callback(lambda f: 1 / 0)
    chained = fut.then(lambda f: f.value() + 1)
    fut.add_done_callback(lambda f: ran.append(f.value()))
    with pytest.warns(RuntimeWarning, match="ZeroDivisionError"):
        fut.set_result(1)
    assert ran == [1] and chained.wait() == 2 and chained.done()
    with pytest.raises(mpicoll.InvalidArgumentError, match="set already"):
        fut.set_result(2)


def test_a_future_does_not_end_the_works_wait_for_the_gpu():
    """On NCCL a call's Work has ended once queued on its stream (its future is set at
    once, the copies into the caller's tensors queued), but ``wait()`` and
    ``is_completed()`` still wait for the GPU's event, with get_future() called or not;
    ``wait(timeout)`` past it raises and leaves it pending."""
    from mpicoll.work import Work

    class Event:  # a CUDA event the GPU has not reached
        done = False

    work = Work("all_reduce")
    work._event = Event()
    work._set(np.full(2, 5.0))
    tensor = np.zeros(2)
    finished = dist._Finished(work, lambda result: tensor.__setitem__(..., result), [tensor])
    fut = finished.get_future()
    assert fut.done() and fut.value()[0] is tensor and tensor.tolist() == [5.0, 5.0]
    assert not finished.is_completed()
    with pytest.raises(mpicoll.CollectiveTimeoutError):
        finished.wait(datetime.timedelta(seconds=0.01))
    assert not finished.is_completed()
    Event.done = True
    assert finished.is_completed() and finished.wait() is True


def test_all_to_all_single_takes_split_sizes_of_zero_d_int_arrays(initialized):
    """list(torch.tensor(sizes)) gives torch's 0-d tensors, which torch takes as split
    sizes: 0-d int arrays are taken too (float, bool or 1-d ones refused on every rank)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    sizes = list(np.arange(1, size + 1))  # rank j gets j + 1 rows from every rank
    x = np.repeat(np.arange(size, dtype=float), [j + 1 for j in range(size)]) + 10 * rank
    out = np.zeros((rank + 1) * size)
    dist.all_to_all_single(out, x, [np.array(rank + 1)] * size, [np.array(k) for k in sizes])
    np.testing.assert_array_equal(out, np.repeat(10.0 * np.arange(size) + rank, rank + 1))
    for bad in ([np.array(1.0)] * size, [np.array(True)] * size, [np.array([1])] * size):
        with pytest.raises(mpicoll.InvalidArgumentError, match="input_split_sizes: expected"):
            dist.all_to_all_single(np.zeros(size), np.zeros(size), None, bad)
    t = np.ones(1)
    dist.all_reduce(t)
    assert t[0] == size


def test_all_to_all_single_with_even_sizes_given_on_one_rank_meets_none_on_the_others(
        initialized):
    """torch: split sizes of None are even blocks, so a rank that gives even sizes makes
    the same call as those that give none; one collective serves both (its counts exchange
    agrees them), and the next call runs."""
    rank, size = dist.get_rank(), dist.get_world_size()
    out = np.zeros(2 * size)
    x = np.arange(2 * size, dtype=float) + 100 * rank
    sizes = [2] * size if rank == 0 else None
    dist.all_to_all_single(out, x, sizes, sizes)
    want = np.concatenate([np.arange(2 * rank, 2 * rank + 2) + 100 * r for r in range(size)])
    np.testing.assert_array_equal(out, want)
    y = np.ones(3)
    dist.all_reduce(y)
    np.testing.assert_array_equal(y, np.full(3, float(size)))


def test_all_gather_of_uneven_tensors_as_torch_documents(initialized):
    """torch's all_gather supports tensors of another size on each rank (tensor_list[i]
    has rank i's size): every rank gets every tensor; a list entry of the wrong size on
    one rank is refused there after taking part, and the next call runs."""
    rank, size = dist.get_rank(), dist.get_world_size()
    tensor = np.full((rank + 1, 2), float(rank))
    outs = [np.zeros((r + 1, 2)) for r in range(size)]
    dist.all_gather(outs, tensor)
    for r in range(size):
        np.testing.assert_array_equal(outs[r], np.full((r + 1, 2), float(r)))
    wrong = [np.zeros((r + 1, 2)) for r in range(size)]
    if rank == size - 1:
        wrong[0] = np.zeros((5, 2))
        with pytest.raises(mpicoll.InvalidArgumentError, match="tensor_list: this rank"):
            dist.all_gather(wrong, tensor)
    else:
        dist.all_gather(wrong, tensor)
    y = np.ones(3)
    dist.all_reduce(y)
    np.testing.assert_array_equal(y, np.full(3, float(size)))


@pytest.mark.parametrize("call", ["all_gather", "gather", "all_to_all", "all_to_all_single"])
def test_a_read_only_output_is_refused_after_taking_part(initialized, call):
    """An output tensor the call cannot write (a read-only array) on one rank: that rank
    raises mpicoll's error after taking part, writing none of its outputs; the others get
    their results and the next call runs."""
    rank, size = dist.get_rank(), dist.get_world_size()
    last = rank == size - 1
    x = np.full(2, float(rank))
    outs = [np.full(2, -1.0) for _ in range(size)]
    single = np.full(2 * size, -1.0)
    if last:
        for o in (*outs, single):
            o.flags.writeable = False

    def run():
        if call == "all_gather":
            dist.all_gather(outs, x)
        elif call == "gather":
            dist.gather(x, outs if last else None, dst=size - 1)
        elif call == "all_to_all":
            dist.all_to_all(outs, [x.copy() for _ in range(size)])
        else:
            dist.all_to_all_single(single, np.repeat(x, size), [2] * size, [2] * size)

    if last:
        with pytest.raises(mpicoll.InvalidArgumentError, match="writeable"):
            run()
        assert all((o == -1.0).all() for o in (*outs, single))
    else:
        run()
    y = np.ones(3)
    dist.all_reduce(y)
    np.testing.assert_array_equal(y, np.full(3, float(size)))


def test_a_failed_works_is_completed_does_not_raise(initialized):
    """torch's Work: is_completed() says whether the call ended, failed or not, without
    raising; is_success() is False and exception() gives the error; wait() raises it."""
    rank, size = dist.get_rank(), dist.get_world_size()
    out = np.zeros(size)
    expect = [1] * size if rank != size - 1 else [2] + [1] * (size - 2) + [0]
    if size == 1:
        expect = [2]
    work = dist.all_to_all_single(out, np.ones(size), expect if size > 1 else None,
                                  [1] * size, async_op=True)
    failed = rank == size - 1 and size > 1
    deadline = time.monotonic() + 30
    while not work.is_completed():
        assert time.monotonic() < deadline
    assert work.is_success() is not failed
    assert (work.exception() is not None) == failed
    if failed:
        with pytest.raises(mpicoll.InvalidArgumentError, match="output_split_sizes"):
            work.wait()
    else:
        assert work.wait()


def test_torchs_work_and_barrier_names(initialized):
    """What tutorials call on torch's Work and barrier: an irecv's ``source_rank()`` (the
    sender's rank in the group, as gloo's gives it), ``result()`` of point-to-point and collective Work (the
    output tensors), ``barrier(timeout=...)``, and ``get_backend()`` naming the backend
    asked for ("gloo", which runs over MPI here; "mpi" when that was asked)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "gloo"
    dist.barrier(timeout=datetime.timedelta(seconds=30))
    tensor = np.ones(3)
    work = dist.all_reduce(tensor, async_op=True)
    (got,) = work.result()
    assert got is tensor and tensor.tolist() == [size] * 3
    if size >= 2:
        if rank == 1:
            sent = np.full(2, 5.0)
            work = dist.isend(sent, dst=0, tag=9)
            assert work.result() == [sent]
        elif rank == 0:
            into = np.zeros(2)
            work = dist.irecv(into, src=None, tag=9)
            assert work.source_rank() == 1 and work.result() == [into]
            assert into.tolist() == [5.0, 5.0]
    if size >= 3:  # on a group: the sender's rank in it, as gloo's (new_group sorts
        group = dist.new_group([2, 1])  # [2, 1] to [1, 2]: rank 2 is its group rank 1)
        if rank == 2:
            dist.isend(np.full(1, 7.0), dst=1, group=group, tag=3).wait()
        elif rank == 1:
            into = np.zeros(1)
            work = dist.irecv(into, group=group, tag=3)
            assert work.source_rank() == 1 and into.tolist() == [7.0]
    assert dist.get_backend(dist.new_group(list(range(size)))) == "gloo"  # (as the world)
    assert dist.get_backend(dist.new_group(list(range(size)), backend="mpi")) == "mpi"
    dist.destroy_process_group()
    dist.init_process_group("mpi")
    assert dist.get_backend() == "mpi"
    assert dist.get_backend(dist.new_group(list(range(size)), backend="gloo")) == "gloo"
    dist.destroy_process_group()
    # torch's per-device form runs on MPI (which takes host and GPU arrays alike)
    dist.init_process_group("cpu:gloo,cuda:nccl")
    assert dist.get_backend() == "cpu:gloo,cuda:nccl"
    tensor = np.ones(2)
    dist.all_reduce(tensor)
    assert tensor.tolist() == [size] * 2
    with pytest.raises(mpicoll.InvalidArgumentError, match="per-device"):
        dist.new_group(list(range(size)), backend="cpu:ucc")


def test_objects_point_to_point_and_subgroups_by_enumeration(initialized):
    """torch's send_object_list/recv_object_list (from a given rank or any, the sender's
    rank returned; a list of another length takes part, then raises; an object that
    cannot be pickled raises on both ranks), new_subgroups_by_enumeration (a rank in two
    lists refused on every rank) and is_backend_available."""
    rank, size = dist.get_rank(), dist.get_world_size()
    assert dist.is_backend_available("gloo") and dist.is_backend_available("mpi")
    assert not dist.is_backend_available("ucc")
    if size >= 2:
        if rank == 0:
            dist.send_object_list([{"a": 1}, "two", [3.0]], dst=1)
            dist.send_object_list([None], dst=1, use_batch=True)  # (torch's keyword)
            dist.send_object_list([1, 2], dst=1)
            with pytest.raises(mpicoll.InvalidArgumentError, match="cannot be pickled"):
                dist.send_object_list([threading.Lock()], dst=1)
        elif rank == 1:
            got = [None] * 3
            assert dist.recv_object_list(got, src=0, use_batch=True) == 0
            assert got == [{"a": 1}, "two", [3.0]]
            one = ["x"]
            assert dist.recv_object_list(one) == 0 and one == [None]
            with pytest.raises(mpicoll.InvalidArgumentError, match="sent 2 objects"):
                dist.recv_object_list([None] * 3, src=0)
            with pytest.raises(mpicoll.InvalidArgumentError, match="cannot be pickled"):
                dist.recv_object_list([None], src=0)
    with pytest.raises(mpicoll.InvalidArgumentError, match="more than one subgroup"):
        dist.new_subgroups_by_enumeration([[0], [0]])
    # a list holding what no rank is (unhashable) on one rank: refused on every rank
    faulty = "ranks_per_subgroup_list" if rank == size - 1 else rf"refused on rank\(s\) {size - 1}[;: ]"
    with pytest.raises(mpicoll.InvalidArgumentError, match=faulty):
        dist.new_subgroups_by_enumeration([[[0]]] if rank == size - 1 else [[0]])
    halves = [list(range(0, size, 2)), list(range(1, size, 2))]
    mine, groups = dist.new_subgroups_by_enumeration([h for h in halves if h])
    assert mine is groups[rank % 2] and dist.get_process_group_ranks(mine) == halves[rank % 2]
    tensor = np.ones(1)
    dist.all_reduce(tensor, group=mine)
    assert tensor[0] == len(halves[rank % 2])


def test_a_groups_refusal_names_the_global_ranks_too(initialized):
    """On a group whose ranks are not the job's (torch's users name global ranks: src=3),
    a refusal's words say which global rank each group rank it names is."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if size < 4:
        pytest.skip("needs a group of other ranks than the job's first")
    group = dist.new_group([0, 2, 3])
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        return
    out = np.zeros(1)
    bad = [np.ones(1)] * 2 if rank == 3 else None  # (two tensors for three ranks, at src)
    with pytest.raises(mpicoll.MpicollError) as raised:
        dist.scatter(out, bad, src=3, group=group)
    if rank != 3:
        assert "root 2 refused" in str(raised.value), raised.value
        assert "as the job's ranks, 0: 0, 1: 2, 2: 3" in str(raised.value), raised.value
    t = np.ones(1)
    dist.all_reduce(t, group=group)
    assert t.tolist() == [3.0]


def test_split_group_as_torchs(initialized):
    """split_group: one split of the parent into the lists' groups (parent group ranks,
    each list sorted, as torch's), None where a rank is in no list; one rank's bad or
    different lists raise on every rank before any group, and the next split is right."""
    rank, size = dist.get_rank(), dist.get_world_size()
    # the evens, then the odds in reverse order (their group ranks in rank order: torch
    # sorts each list)
    evens, odds = list(range(0, size, 2)), list(range(size - 1 if size % 2 == 0 else
                                                      size - 2, 0, -2))
    mine = dist.split_group(split_ranks=[lists for lists in (evens, odds) if lists])
    listed = evens if rank % 2 == 0 else sorted(odds)
    assert dist.get_process_group_ranks(mine) == listed
    assert dist.get_rank(mine) == listed.index(rank)
    tensor = np.full(1, float(rank))
    dist.all_reduce(tensor, group=mine)
    assert tensor[0] == sum(listed)
    # a subgroup of that group: its ranks are the parent's group ranks (rank 0 alone)
    inner = dist.split_group(mine, [[0]])
    assert (inner is None) == (listed.index(rank) != 0)
    if inner is not None:
        assert dist.get_process_group_ranks(inner) == [listed[0]]
    # one rank wrong: every rank raises, then the next split is right
    wrong = [[0, 0]] if rank == size - 1 else [[0]]
    with pytest.raises(mpicoll.InvalidArgumentError, match="refused on rank"):
        dist.split_group(split_ranks=wrong)
    if size >= 2:
        other = [[0]] if rank == size - 1 else [[0, 1]]
        with pytest.raises(mpicoll.MismatchError, match="split_ranks"):
            dist.split_group(split_ranks=other)
        with pytest.raises(mpicoll.InvalidArgumentError, match="backend"):
            dist.split_group(split_ranks=[[0, 1]], backend="nccl" if rank == 0 else None)
        with pytest.raises(mpicoll.InvalidArgumentError, match="backend"):  # (unknown)
            dist.split_group(split_ranks=[[0, 1]], backend="ucc" if rank == 0 else None)
    # torch's per-device form names the parent's backend
    both = dist.split_group(split_ranks=[list(range(size))], backend="cpu:gloo,cuda:nccl")
    assert dist.get_process_group_ranks(both) == list(range(size))
    alone = dist.split_group(split_ranks=[[r] for r in range(size)])
    assert dist.get_process_group_ranks(alone) == [rank]
    tensor = np.ones(1)
    dist.all_reduce(tensor)
    assert tensor[0] == size


def test_torchs_other_names(initialized):
    """The names torch's callers use beside the collectives: the Work type of every
    async call, the errors their except clauses name, torch 2.13's single-tensor names,
    and the questions about backends and ops."""
    rank, size = dist.get_rank(), dist.get_world_size()
    work = dist.all_reduce(np.ones(1), async_op=True)
    assert isinstance(work, dist.Work)
    work.wait()
    if size >= 2 and rank < 2:
        received = np.zeros(1)
        p2p = dist.isend(np.ones(1), dst=1) if rank == 0 else dist.irecv(received, src=0)
        assert isinstance(p2p, dist.Work)
        p2p.wait()
    assert issubclass(mpicoll.CollectiveTimeoutError, dist.DistBackendError)
    assert issubclass(dist.DistBackendError, dist.DistError)
    assert issubclass(mpicoll.InvalidArgumentError, dist.DistError)
    assert issubclass(dist.DistError, RuntimeError)  # as torch's (and MPI.Exception)
    assert dist.default_pg_timeout.total_seconds() == 1800  # torch's, and the watchdog's
    try:  # torch's callers catch a refusal as a RuntimeError, as gloo's
        dist.broadcast(np.ones(1), src=size)
    except RuntimeError as exc:
        assert isinstance(exc, ValueError) and "src" in str(exc)
    else:
        raise AssertionError("a src out of range was not refused")
    if size >= 2 and rank < 2:  # a point-to-point Work's answers, as torch's
        received = np.zeros(2)
        p2p = dist.isend(np.ones(2), dst=1) if rank == 0 else dist.irecv(received, src=0)
        p2p.wait()
        assert p2p.is_success() and p2p.exception() is None and p2p.is_completed()
        with pytest.raises(RuntimeError, match="get_future"):
            p2p.get_future()
        # a message longer than the tensor: is_success() answers False, never raises
        if rank == 0:
            dist.send(np.ones(4), dst=1, tag=9)
        else:
            p2p = dist.irecv(np.zeros(2), src=0, tag=9)
            while True:
                try:
                    if p2p.is_completed():
                        break
                except mpicoll.MpicollError:
                    break
            assert p2p.is_success() is False and p2p.is_success() is False
            assert isinstance(p2p.exception(), mpicoll.MpicollError)
    gathered = np.zeros((size, 2))
    dist.all_gather_single(gathered, np.full(2, float(rank)))
    assert gathered[:, 0].tolist() == list(range(size))
    block = np.zeros(2)
    dist.reduce_scatter_single(block, np.ones(2 * size))
    assert block.tolist() == [size, size]
    assert dist.get_default_backend_for_device("cpu") == "gloo"
    assert dist.get_default_backend_for_device("cuda:0") == "nccl"
    with pytest.raises(mpicoll.InvalidArgumentError):
        dist.get_default_backend_for_device("tpu")
    assert dist.supports_complex(dist.ReduceOp.SUM) and not dist.supports_complex(
        dist.ReduceOp.MAX)
    z = np.full(2, 1j)  # (prod reduces complex values here, as supports_complex says)
    assert dist.supports_complex(dist.ReduceOp.PRODUCT)
    dist.all_reduce(z, op=dist.ReduceOp.PRODUCT)
    assert np.allclose(z, 1j ** size)
    mesh = dist.init_device_mesh("cpu", (size,), mesh_dim_names=("dp",),
                                 backend_override={"dp": "gloo"})  # (torch 2.13's keyword)
    assert dist.get_process_group_ranks(mesh.get_group("dp")) == list(range(size))
    assert not dist.is_torchelastic_launched()
    before = dist.get_pg_count()
    group = dist.new_group(list(range(size)))
    assert dist.get_pg_count() == before + 1
    dist.destroy_process_group(group)
    alone = dist.new_group([0])  # (non-members count it too, as torch's group_count)
    counts = np.zeros((size, 1), np.int64)
    dist.all_gather_into_tensor(counts, np.array([dist.get_pg_count()], np.int64))
    assert counts[:, 0].tolist() == [before + 2] * size
    if alone is not dist.GroupMember.NON_GROUP_MEMBER:
        dist.destroy_process_group(alone)
    assert dist.get_pg_count() == before + 2  # (destroying one does not lower it)


def test_torch_names_for_meshes_backends_and_debug(initialized):
    """torch.distributed.device_mesh's import, get_backend_config, the backends that do not
    exist here, and the deprecated reduce_op, as torch's."""
    from mpicoll.dist.device_mesh import DeviceMesh, init_device_mesh

    size = dist.get_world_size()
    mesh = init_device_mesh("cpu", (size,), mesh_dim_names=("dp",))
    assert isinstance(mesh, DeviceMesh) and mesh.size("dp") == size
    assert dist.get_backend_config(dist.new_group(list(range(size)), backend="mpi")) == \
        "cpu:mpi,cuda:mpi"
    assert dist.get_backend_config().startswith("cpu:gloo,cuda:")  # (as the test made it)
    assert not dist.is_ucc_available() and not dist.is_xccl_available()
    assert dist.reduce_op.SUM is dist.ReduceOp.SUM


@pytest.mark.parametrize("async_op", [False, True])
def test_coalesced_calls_give_each_tensor_its_result(initialized, async_op):
    """all_reduce_coalesced: every tensor of the list reduced in place (each shape its
    own, one call); all_gather_coalesced: rank r's list into output_tensor_lists[r]; with
    async_op, a Future of the tensors, as torch's."""
    rank, size = dist.get_rank(), dist.get_world_size()
    shapes = [(2, 3), (1,), (0,), (4,)]
    tensors = [np.arange(int(np.prod(s)), dtype=np.float32).reshape(s) + rank for s in shapes]
    future = dist.all_reduce_coalesced(tensors, op=dist.ReduceOp.MAX, async_op=async_op)
    if async_op:
        assert [t is u for t, u in zip(future.wait(), tensors, strict=True)] == [True] * 4
    for t, s in zip(tensors, shapes, strict=True):
        assert t.shape == s
        np.testing.assert_array_equal(
            t, np.arange(int(np.prod(s)), dtype=np.float32).reshape(s) + size - 1)
    one = np.full(3, rank + 1.0)
    future = dist.all_reduce_coalesced(one, async_op=async_op)
    assert (future is None) is not async_op
    if async_op:
        assert future.wait()[0] is one
    assert one.tolist() == [size * (size + 1) / 2] * 3
    inputs = [np.full((2, 2), rank, np.int64), np.full(3, 10 * rank, np.int64)]
    outputs = [[np.empty((2, 2), np.int64), np.empty(3, np.int64)] for _ in range(size)]
    future = dist.all_gather_coalesced(outputs, inputs, async_op=async_op)
    if async_op:  # (the output lists, as gloo's: the one list where there is one rank)
        value = future.wait()
        assert value == (outputs[0] if size == 1 else outputs)
        assert all(t is u for row, got in zip(outputs if size > 1 else [outputs[0]],
                                               value if size > 1 else [value], strict=True)
                   for t, u in zip(row, got, strict=True))
    for r in range(size):
        assert (outputs[r][0] == r).all() and (outputs[r][1] == 10 * r).all()
    assert dist.all_reduce_coalesced([]) is None  # (every rank's list empty: nothing sent)
    # a user's Op: agreed by its name, as check mode compares it (not by its address,
    # which differs per process)
    pair = [np.full(2, rank + 1.0), np.full((1, 3), rank + 1.0)]
    dist.all_reduce_coalesced(pair, op=mpicoll.Op(np.maximum, name="mymax"))
    assert all((t == size).all() for t in pair)


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("wrong", ["shapes", "dtype", "read-only", "number", "op", "output"])
def test_coalesced_lists_wrong_on_one_rank_raise_on_every_rank(initialized, async_op, wrong):
    """The last rank's list of other shapes (the same total: torch would combine the wrong
    elements, silently), of mixed dtypes, read-only, or a wrong output list: every rank
    raises, naming it, before any of the call's data moves; the next call is right."""
    rank, size = dist.get_rank(), dist.get_world_size()
    if wrong == "shapes" and size == 1:
        pytest.skip("other shapes than another rank's need another rank")
    last = rank == size - 1
    tensors = [np.ones(2, np.float32), np.ones(3, np.float32)]
    if last and wrong == "shapes":
        tensors = [np.ones(3, np.float32), np.ones(2, np.float32)]
    if last and wrong == "dtype":
        tensors[1] = np.ones(3, np.float64)
    if last and wrong == "read-only":
        tensors[0].flags.writeable = False
    if last and wrong == "number":  # (no tensor: its result would be lost, silently)
        tensors[0] = 2.0
    op = "bogus" if last and wrong == "op" else "sum"
    kind = mpicoll.MismatchError if wrong == "shapes" else mpicoll.InvalidArgumentError
    outputs = [[np.full(2, -7, np.float32), np.full(3, -7, np.float32)] for _ in range(size)]
    if wrong == "output":
        if last:
            outputs[0][1] = np.full(4, -7, np.float32)
        with pytest.raises(mpicoll.InvalidArgumentError,
                           match=r"output_tensor_lists\[0\]\[1\]" if last else
                           rf"rank\(s\) {size - 1}"):
            dist.all_gather_coalesced(outputs, tensors, async_op=async_op)
        assert all((o == -7).all() for row in outputs for o in row)  # (nothing written)
    else:
        own = {"dtype": "float64 among numpy float32", "read-only": "read-only",
               "number": "expected an array", "op": "unknown reduction op"}.get(wrong)
        with pytest.raises(kind, match=own if last and own else rf"rank\(s\) {size - 1}"):
            dist.all_reduce_coalesced(tensors, op, async_op=async_op)
        # nothing written (from 2 ranks on, the sum would show)
        assert all((t == 1).all() for t in tensors if isinstance(t, np.ndarray))
    good = [np.ones(2, np.float32), np.ones(3, np.float32)]
    dist.all_reduce_coalesced(good)
    assert all((t == size).all() for t in good)
