"""Agreement by construction under mpiexec: the issue's reproducers and their classes,
with the MPI library's own collectives ("native") among the algorithms.

Run as ``mpiexec -n N python -m mpi4py -m pytest --with-mpi -m mpi``; a hang here is
ended by the test command's timeout (and a failing rank aborts the job).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import mpicoll
from mpicoll.algorithms import REGISTRY

pytestmark = pytest.mark.mpi

CASES = [(c, a) for c in mpicoll.COLLECTIVES if c != "barrier"
         for a in [*REGISTRY[c], "native", "auto"]]


def _next_call_is_right(comm) -> None:
    got = comm.all_reduce(np.full(5, comm.rank + 1.0), algorithm="ring")
    np.testing.assert_array_equal(got, np.full(5, comm.size * (comm.size + 1) / 2))


def test_all_to_all_v_auto_decides_from_the_global_total(world):
    """Reproducer 1: rank 0 sends nothing, the others one 32 KiB row to every rank."""
    rows = 0 if world.rank == 0 else 1
    x = np.full((rows * world.size, 4096), float(world.rank))
    got, received = world.all_to_all_v(x, [rows] * world.size)
    assert received == [0] + [1] * (world.size - 1)
    np.testing.assert_array_equal(got[:, 0], np.arange(1, world.size, dtype=float))


@pytest.mark.parametrize("algorithm", [*REGISTRY["gather"], "native", "auto"])
def test_gather_v_ranks_that_disagree_on_the_root_raise_on_every_rank(world, algorithm):
    """Outside check mode: the rows' exchange carries each rank's root (the last rank
    names rank 0 while the others name rank 1; where no rank took the root's part, every
    rank only sent and returned None, silently)."""
    if world.size < 3:
        pytest.skip("a root most ranks name and one apart: 3 ranks")
    root = 0 if world.rank == world.size - 1 else 1
    with pytest.raises(mpicoll.MismatchError, match="disagree on the root: "
                       rf"rank\(s\) {world.size - 1} \(root 0\) apart from the others' root 1"):
        world.gather_v(np.ones((2, 2)), root=root, algorithm=algorithm)
    _next_call_is_right(world)


@pytest.mark.parametrize("algorithm", [*REGISTRY["reduce"], "native", "auto"])
def test_reduce_with_a_bad_out_at_the_root_then_a_correct_reduce(world, algorithm):
    """Reproducer 2: the next reduce gets its own data, not the previous call's."""
    if world.rank == 0:
        with pytest.raises(mpicoll.InvalidArgumentError):
            world.reduce(np.full(3, 1.0), root=0, out=np.empty(3, np.float32), algorithm=algorithm)
    else:
        assert world.reduce(np.full(3, 1.0), root=0, algorithm=algorithm) is None
    got = world.reduce(np.full(3, 100.0), root=0, algorithm=algorithm)
    if world.rank == 0:
        np.testing.assert_array_equal(got, np.full(3, 100.0 * world.size))


@pytest.mark.parametrize("algorithm", [*REGISTRY["broadcast"], "native", "auto"])
def test_broadcast_of_a_dict_everywhere_then_a_ring_all_reduce(world, algorithm):
    """Reproducer 3."""
    with pytest.raises(mpicoll.MpicollError):
        world.broadcast({"a": 1}, root=0, algorithm=algorithm)
    _next_call_is_right(world)


@pytest.mark.parametrize("algorithm", [*REGISTRY["broadcast"], "native", "auto"])
@pytest.mark.parametrize("nbytes", [64, 1 << 20])
def test_broadcast_of_a_read_only_root_buffer(world, algorithm, nbytes, tmp_path_factory):
    """Reproducer 4: np.frombuffer and np.load(mmap_mode="r") at the root."""
    data = np.arange(nbytes // 8, dtype=np.float64)
    if world.rank == 0:
        path = tmp_path_factory.mktemp("ro") / "x.npy"
        np.save(path, data)
        for x in (np.frombuffer(data.tobytes(), np.float64), np.load(path, mmap_mode="r")):
            assert not x.flags.writeable
            got = world.broadcast(x, 0, algorithm=algorithm)
            np.testing.assert_array_equal(got, data)
    else:
        for _ in range(2):
            np.testing.assert_array_equal(world.broadcast(None, 0, algorithm=algorithm), data)
    _next_call_is_right(world)


def test_check_mode_root_of_broadcast_passes_a_list(world):
    """Reproducer 5: raises on every rank, naming the root."""
    checked = world.dup()
    checked.check = True
    x = [1, 2, 3] if world.rank == 0 else None
    with pytest.raises(mpicoll.MpicollError) as caught:
        checked.broadcast(x, 0)
    if world.rank != 0:
        assert "rank 0" in str(caught.value)
    _next_call_is_right(checked)
    checked.free()


def test_a_left_over_message_on_a_freed_communicator_never_reaches_a_new_one(world):
    """Reproducer 6: MPICH gives a freed communicator's context id to the next one; a
    message an erroneous call left behind must not match the new one's calls."""
    from mpi4py import MPI

    if world.size < 2:
        pytest.skip("needs two ranks")
    old = mpicoll.Communicator(MPI.COMM_WORLD)
    old.all_reduce(np.ones(1), algorithm="ring")
    t = old.transport
    t.begin()  # the next call's tag, on which rank 0 sends what no rank receives
    if world.rank == 0:
        t.comm.Isend([np.full(5, 666.0), MPI.BYTE], 1, t.tag + 1)
        t.comm.Isend([np.full(5, 666.0), MPI.BYTE], 1, t.tag + 2)
    old.free()
    new = mpicoll.Communicator(MPI.COMM_WORLD)
    for _ in range(3):
        _next_call_is_right(new)
    new.free()


@pytest.mark.parametrize("algorithm", [*REGISTRY["scatter"], "native", "auto"])
def test_scatter_in_place_at_the_root(world, algorithm):
    """Reproducer 7: out=x[root] at the root (MPI_IN_PLACE for native), and an out that
    overlaps x by one element (never handed to MPI as overlapping buffers)."""
    for root in range(world.size):
        x = np.arange(world.size * 4.0).reshape(world.size, 4) if world.rank == root else None
        got = world.scatter(x, root, algorithm=algorithm, out=x[root] if world.rank == root else None)
        np.testing.assert_array_equal(got, np.arange(4.0) + 4 * world.rank)
        n = world.size * 4
        y = np.arange(n + 3.0) if world.rank == root else None
        rows = y[:n].reshape(world.size, 4) if world.rank == root else None
        got = world.scatter(rows, root, algorithm=algorithm,  # out shares x's last element
                            out=y[n - 1:n + 3] if world.rank == root else None)
        np.testing.assert_array_equal(got, np.arange(4.0) + 4 * world.rank)


def test_gather_of_64_dimensions_raises_on_every_rank(world):
    """Reproducer 8."""
    with pytest.raises(mpicoll.InvalidArgumentError, match="dimensions"):
        world.gather(np.ones((1,) * 64), root=0)
    _next_call_is_right(world)


@pytest.mark.parametrize(("collective", "algorithm"), CASES)
def test_one_rank_refusing_where_it_receives_then_the_next_call(world, collective, algorithm):
    """For every collective and algorithm (native too): the last rank (the root where
    only the root receives) gives an out= it cannot take; it takes part with workspace,
    the others' results are right, and the next call is right."""
    p, rank = world.size, world.rank
    root = 0
    refuser = root if collective in ("gather", "reduce") else p - 1
    flat = np.arange(6.0) + 10 * rank
    rows = np.arange(p * 6.0).reshape(p, 6) + 100 * rank
    x = {"broadcast": np.arange(5.0) if rank == root else None,
         "scatter": rows if rank == root else None, "gather": flat, "all_gather": flat,
         "reduce": flat, "all_reduce": flat, "reduce_scatter": rows, "all_to_all": rows,
         "scan": flat, "exscan": flat}[collective]
    kwargs = {"algorithm": algorithm}
    if collective in ("broadcast", "scatter", "gather", "reduce"):
        kwargs["root"] = root
    if rank == refuser and (collective != "broadcast" or rank != root):
        with pytest.raises(mpicoll.InvalidArgumentError):
            if collective == "broadcast":
                world.broadcast(np.empty(2), **kwargs)
            else:
                getattr(world, collective)(x, out=np.empty(999, np.float32), **kwargs)
    else:
        got = getattr(world, collective)(x, **kwargs)
        if collective == "all_reduce":
            np.testing.assert_array_equal(got, sum(np.arange(6.0) + 10 * r for r in range(p)))
        elif collective == "all_gather":
            np.testing.assert_array_equal(got[:, 0], 10.0 * np.arange(p))
        elif collective == "scatter":
            np.testing.assert_array_equal(got, np.arange(6.0) + 6 * rank)
        elif collective == "broadcast":
            np.testing.assert_array_equal(got, np.arange(5.0))
        elif collective in ("scan", "exscan"):
            upto = rank + 1 if collective == "scan" else rank
            if upto:
                np.testing.assert_array_equal(got, sum(np.arange(6.0) + 10 * r
                                                       for r in range(upto)))
            else:
                assert got is None
    _next_call_is_right(world)


def test_per_rank_tuning_files_give_every_rank_rank_0s_choice(world, tmp_path_factory, monkeypatch):
    """Each rank points MPICOLL_TUNING at a file of its own naming another algorithm
    (rank 1's file is corrupt): the Communicator reads rank 0's, so every rank picks the
    same algorithm and the call completes."""
    names = ["ring", "rabenseifner", "recursive_doubling", "allgather_reduce"]
    path = tmp_path_factory.mktemp(f"rank{world.rank}") / "tuning.json"
    if world.rank == 1:
        path.write_text("{corrupt")
    else:
        table = {"mpicoll_tuning": 1, "tables": {"1": {"all_reduce": [
            {"below": None, "algorithm": names[world.rank % len(names)]}]}}}
        import json

        path.write_text(json.dumps(table))
    monkeypatch.setenv("MPICOLL_TUNING", str(path))
    comm = mpicoll.Communicator()
    picked = comm.auto_algorithm("all_reduce", 1 << 20)
    assert picked == "ring"
    chosen = np.array([names.index(picked)], np.int64)
    everywhere = np.empty(world.size, np.int64)
    comm.control_comm.Allgather(chosen, everywhere)
    assert (everywhere == everywhere[0]).all()
    _next_call_is_right(comm)
    comm.free()


def test_a_corrupt_tuning_file_on_rank_0_is_refused_on_every_rank(world, tmp_path_factory,
                                                                   monkeypatch):
    path = tmp_path_factory.mktemp(f"corrupt{world.rank}") / "tuning.json"
    path.write_text("{corrupt" if world.rank == 0 else "{}")
    monkeypatch.setenv("MPICOLL_TUNING", str(path))
    with pytest.raises(mpicoll.ConfigError, match="tuning file"):
        mpicoll.Communicator()
    monkeypatch.setenv("MPICOLL_TUNING", os.devnull + ".none")
    _next_call_is_right(world)


@pytest.mark.parametrize("algorithm", [*REGISTRY["broadcast"], "native", "auto"])
def test_broadcast_of_8_kib_with_a_refusing_receiver(world, algorithm):
    """Past the header's packet (1 KiB) the data goes by the algorithm: a non-root refusing
    its receive buffer takes part in the root's items, so every other rank gets the data."""
    data = np.arange(1025.0)
    refuser = world.size - 1
    if world.rank == refuser and world.rank != 0:
        with pytest.raises(mpicoll.InvalidArgumentError, match="receive buffer"):
            world.broadcast(np.empty(1025, np.float32), 0, algorithm=algorithm)
    else:
        got = world.broadcast(data if world.rank == 0 else None, 0, algorithm=algorithm)
        np.testing.assert_array_equal(got, data)
    _next_call_is_right(world)


_DEFAULT_OPTIONS = [(c, name, option, default)
                    for c, algorithms in REGISTRY.items() for name, a in algorithms.items()
                    for option, default in a.option_defaults.items()]


@pytest.mark.parametrize(("collective", "algorithm", "option", "default"), _DEFAULT_OPTIONS)
def test_check_mode_an_option_given_as_its_default_is_the_call_without_it(collective, algorithm,
                                                                         option, default):
    """``intra="binomial"`` on one rank and nothing on another send the same messages:
    check mode passes them (it refused them as a mismatch); another value still differs,
    on every rank, and the next call is right."""
    comm = mpicoll.Communicator(check=True)
    if comm.size < 2:
        comm.free()
        pytest.skip("needs two ranks")
    method = getattr(comm, collective)
    x = np.ones((comm.size, 2) if mpicoll.spec.SPECS[collective].input_rows else (4,))
    args = () if collective == "barrier" else \
        (None,) if collective == "scatter" and comm.rank != 0 else (x,)
    method(*args, algorithm=algorithm, **({option: default} if comm.rank == 1 else {}))
    other = {option: _another(algorithm, collective, option, default)} if comm.rank == 1 else {}
    with pytest.raises(mpicoll.MismatchError, match="algorithm"):
        method(*args, algorithm=algorithm, **other)
    method(*args, algorithm=algorithm)
    comm.free()


def _another(algorithm: str, collective: str, option: str, default):
    """A value of ``option`` that is not its default (and that the call takes)."""
    if isinstance(default, str):  # the algorithm of a phase
        phases = dict(REGISTRY[collective][algorithm].phases)[option]
        return next(a for a in REGISTRY[phases[0]] if a not in (algorithm, default)
                    and all(a in REGISTRY[c] for c in phases))
    return default * 2


def test_check_mode_an_option_as_a_numpy_int_is_the_same_option():
    """segment_bytes=np.int64(1024) on one rank and 1024 on another: the call takes
    int(value), the same messages: no mismatch (another value still is one)."""
    comm = mpicoll.Communicator(check=True)
    x = np.ones(4)
    given = np.int64(1024) if comm.rank == 1 else 1024
    np.testing.assert_array_equal(comm.all_reduce(x, algorithm="ring_pipelined",
                                                  segment_bytes=given), np.full(4, comm.size))
    if comm.size > 1:
        with pytest.raises(mpicoll.MismatchError, match="algorithm"):
            comm.all_reduce(x, algorithm="ring_pipelined",
                            segment_bytes=2048 if comm.rank == 1 else 1024)
    comm.free()


@pytest.mark.parametrize("op", ["min", "max"])
def test_a_nan_survives_min_and_max_at_every_size_and_in_every_form(world, op):
    """MPI's own MPI_MIN/MPI_MAX keep or drop a NaN by the order of their operands;
    "auto" (the default call, its kept decision and a plan) leaves floating min and max to
    mpicoll's algorithms, so a NaN on one rank is NaN in every result, at every size."""
    x = np.array([np.nan if world.rank == 0 else 1.0, 2.0, -1.0])
    for n in (3, 1 << 17):
        y = np.resize(x, n)
        for got in (world.all_reduce(y, op), world.all_reduce(y, op),  # kept the second time
                    world.all_reduce_init(y, op)(), world.scan(y, op),
                    world.reduce(y, op, world.size - 1)):
            if got is not None:
                assert np.isnan(got[0]) and got[1] == 2.0 and got[2] == -1.0, (n, got[:3])


@pytest.mark.parametrize("wrong", ["read-only", "a list"])
@pytest.mark.parametrize("form", ["call", "async", "plan"])
def test_check_mode_a_scatter_receivers_out_that_cannot_be_written_raises_everywhere(wrong,
                                                                                    form):
    """Check mode: a receiver's out= that is no array it can write (read-only, a list) is
    refused before the call's exchange, so every rank raises (the others RemoteError),
    blocking, async or as a plan; the next call is right."""
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() == 1:
        pytest.skip("needs two ranks")
    comm = mpicoll.Communicator(check=True)
    p, r = comm.size, comm.rank
    last = r == p - 1
    out = np.zeros(2)
    if last:
        if wrong == "read-only":
            out.flags.writeable = False
        else:
            out = [0.0, 0.0]
    x = np.arange(2.0 * p).reshape(p, 2) if r == 0 else None
    try:
        with pytest.raises(mpicoll.MpicollError) as raised:
            if form == "call":
                comm.scatter(x, 0, out=out)
            elif form == "async":
                comm.scatter(x, 0, out=out, async_op=True).wait()
            else:
                comm.scatter_init(x, 0, out=out)()
        assert isinstance(raised.value, mpicoll.InvalidArgumentError if last
                          else mpicoll.RemoteError), raised.value
        np.testing.assert_array_equal(comm.all_reduce(np.ones(2), algorithm="ring"),
                                      np.full(2, float(p)))
    finally:
        comm.free()
