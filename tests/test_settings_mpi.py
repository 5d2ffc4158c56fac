"""Settings agreed when a Communicator is made, trace files, and what a failed
constructor or a failed call leaves behind, under mpiexec.

Run as ``mpiexec -n N python -m mpi4py -m pytest --with-mpi -m mpi``. Every rank reads its
own environment; a test sets a variable on one rank only through ``monkeypatch`` and
expects the same error on every rank. MPICOLL_TIMEOUT bounds any wait a regression would
leave open (the watchdog then ends the job).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

import mpicoll
from mpicoll import tracefile
from mpicoll.observe.watchdog import watchdog

WAIT = "60"  # MPICOLL_TIMEOUT of these tests: a hang ends the job with a report


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _raises_alike(kind, match, make):
    """``make()`` raises ``kind`` matching ``match`` on every rank, with one message."""
    with pytest.raises(kind, match=match) as caught:
        make()
    messages = _world().allgather(f"{type(caught.value).__name__}: {caught.value}")
    assert len(set(messages)) == 1, messages
    return caught.value


@pytest.fixture
def shared_dir(tmp_path_factory):
    return _world().bcast(str(tmp_path_factory.mktemp("settings")))


# -- item 13: a malformed setting on one rank raises on every rank -------------------------


@pytest.mark.mpi
@pytest.mark.parametrize("variable, value", [
    ("MPICOLL_TIMEOUT", "soon"), ("MPICOLL_TIMEOUT", "-1"), ("MPICOLL_FLIGHT_RECORDER", "0"),
    ("MPICOLL_FLIGHT_RECORDER", "many"), ("MPICOLL_FLIGHT_RECORDER", "99999999999999999999"),
    ("MPICOLL_FLIGHT_RECORDER", "\u00b2"), ("MPICOLL_CHECK", "maybe"),
    ("MPICOLL_CUDA_AWARE", "maybe"), ("MPICOLL_DUMP_DIR", "{file}/dumps"),
    # (a folder no one can make, root too, whom permissions let write anywhere: it was
    # judged by /proc's permissions and passed, and the dumps were lost at exit)
    ("MPICOLL_DUMP_DIR", "/proc/mpicoll-dumps"),
])
def test_a_malformed_setting_on_one_rank_raises_on_every_rank(monkeypatch, shared_dir,
                                                               variable, value):
    world = _world()
    last = world.Get_size() - 1
    monkeypatch.setenv("MPICOLL_TIMEOUT", WAIT)
    if world.Get_rank() == last:
        path = os.path.join(shared_dir, "a-file")
        with open(path, "w") as f:
            f.write("not a directory\n")
        monkeypatch.setenv(variable, value.format(file=path))
    error = _raises_alike(mpicoll.ConfigError, rf"{variable}.*\(rank\(s\) {last}\)",
                          mpicoll.Communicator)
    assert variable in str(error)
    if variable != "MPICOLL_TIMEOUT":
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("MPICOLL_TIMEOUT", WAIT)
    mpicoll.Communicator().free()  # and MPI goes on


@pytest.mark.mpi
def test_malformed_settings_on_several_ranks_are_named_together(monkeypatch):
    world = _world()
    monkeypatch.setenv("MPICOLL_TIMEOUT", WAIT)
    monkeypatch.setenv("MPICOLL_FLIGHT_RECORDER", "zero")
    if world.Get_rank() == 0:
        monkeypatch.setenv("MPICOLL_CHECK", "perhaps")
    error = _raises_alike(mpicoll.ConfigError, "MPICOLL_FLIGHT_RECORDER", mpicoll.Communicator)
    assert "MPICOLL_CHECK" in str(error) and "rank(s) 0" in str(error)
    if world.Get_size() > 2:
        assert f"rank(s) 1-{world.Get_size() - 1}" in str(error)


@pytest.mark.mpi
def test_a_bad_timeout_or_check_argument_on_one_rank_raises_on_every_rank():
    world = _world()
    last = world.Get_size() - 1
    mine = world.Get_rank() == last
    _raises_alike(mpicoll.ConfigError, rf"timeout: .*-1.*\(rank\(s\) {last}\)",
                  lambda: mpicoll.Communicator(timeout=-1 if mine else float(WAIT)))
    _raises_alike(mpicoll.ConfigError, rf"timeout: .*'soon'.*\(rank\(s\) {last}\)",
                  lambda: mpicoll.Communicator(timeout="soon" if mine else float(WAIT)))
    _raises_alike(mpicoll.InvalidArgumentError, rf"check: .*'yes'.*\(rank\(s\) {last}\)",
                  lambda: mpicoll.Communicator(check="yes" if mine else False,
                                               timeout=float(WAIT)))


@pytest.mark.mpi
def test_the_timeout_may_differ_per_rank():
    world = _world()
    comm = mpicoll.Communicator(timeout=30.0 + world.Get_rank())
    assert comm.timeout == 30.0 + world.Get_rank() and comm._watch.timeout == comm.timeout
    got = comm.all_reduce(np.ones(3), algorithm="ring")
    np.testing.assert_array_equal(got, np.full(3, float(comm.size)))
    comm.free()


@pytest.mark.mpi
def test_check_mode_on_one_rank_only_is_refused_on_every_rank(monkeypatch):
    world = _world()
    if world.Get_size() < 2:
        pytest.skip("needs two ranks")
    monkeypatch.setenv("MPICOLL_TIMEOUT", WAIT)
    monkeypatch.setenv("MPICOLL_CHECK", "1" if world.Get_rank() == 0 else "0")
    _raises_alike(mpicoll.MismatchError, "check mode is on for rank", mpicoll.Communicator)


@pytest.mark.mpi
@pytest.mark.parametrize("value, expected", [("1", True), ("yes", True), ("0", False),
                                             ("off", False), ("", None)])
def test_mpicoll_cuda_aware_is_read_when_the_communicator_is_made(monkeypatch, value, expected):
    """Read and checked at creation and handed to the transport, not parsed at the
    first device message."""
    monkeypatch.setenv("MPICOLL_TIMEOUT", WAIT)
    monkeypatch.setenv("MPICOLL_CUDA_AWARE", value)
    comm = mpicoll.Communicator()
    assert comm.transport.cuda_aware is expected
    comm.free()


# -- item 8: trace files -------------------------------------------------------------------


@pytest.mark.mpi
def test_mpicoll_trace_on_rank_0_only_raises_on_every_rank(monkeypatch, shared_dir):
    world = _world()
    if world.Get_size() < 2:
        pytest.skip("needs two ranks")
    monkeypatch.setenv("MPICOLL_TIMEOUT", WAIT)
    if world.Get_rank() == 0:
        monkeypatch.setenv("MPICOLL_TRACE", os.path.join(shared_dir, "t.json"))
    error = _raises_alike(mpicoll.ConfigError, "trace: tracing must be the same on every rank",
                          mpicoll.Communicator)
    assert "on with a trace file on rank(s) 0" in str(error)
    # an explicit trace= that differs is the program's mismatch
    _raises_alike(mpicoll.MismatchError, "trace: tracing must be the same",
                  lambda: mpicoll.Communicator(trace=world.Get_rank() == 0))


@pytest.mark.mpi
@pytest.mark.parametrize("where", ["missing directory", "a directory", "read-only file"])
def test_an_unwritable_trace_path_raises_on_every_rank_when_made(monkeypatch, shared_dir, where):
    world = _world()
    if where == "read-only file" and os.geteuid() == 0:
        pytest.skip("root writes read-only files")
    path = {"missing directory": os.path.join(shared_dir, "no", "such", "t.json"),
            "a directory": shared_dir,
            "read-only file": os.path.join(shared_dir, "ro.json")}[where]
    if where == "read-only file" and world.Get_rank() == 0:
        with open(path, "w"):
            pass
        os.chmod(path, 0o444)
    world.Barrier()
    monkeypatch.setenv("MPICOLL_TIMEOUT", WAIT)
    monkeypatch.setenv("MPICOLL_TRACE", path)
    _raises_alike(mpicoll.ConfigError, r"MPICOLL_TRACE: cannot write the trace .*\(rank\(s\) 0\)",
                  mpicoll.Communicator)
    _raises_alike(mpicoll.InvalidArgumentError, r"trace: cannot write the trace",
                  lambda: mpicoll.Communicator(trace=path))


@pytest.mark.mpi
def test_free_writes_the_merged_trace_and_nothing_is_written_after(monkeypatch, shared_dir):
    monkeypatch.setenv("MPICOLL_TIMEOUT", WAIT)
    monkeypatch.setenv("MPICOLL_TRACE", os.path.join(shared_dir, "t.json"))
    comm = mpicoll.Communicator()
    path = comm._trace_file.path  # t.json, t.2.json, ...: the process's traced count
    comm.all_reduce(np.ones(40), algorithm="ring")
    comm.free()
    comm.free()  # harmless, and writes nothing again
    assert comm._trace_file.path is None
    if comm.rank == 0:
        events = tracefile.load(path)
        assert {e["rank"] for e in events} == set(range(comm.size))
        assert [r["collective"] for r in tracefile.summarize(events)] == ["all_reduce"]


@pytest.mark.mpi
def test_each_half_of_a_split_writes_its_own_trace_file(monkeypatch, shared_dir):
    """MPICOLL_TRACE with a split: each half's rank 0 writes the half's trace to a name
    no other half's takes (path.N.rank<its world rank>.json, where that is not rank 0),
    every call of the half there."""
    if _world().Get_size() < 2:
        pytest.skip("a split in two halves needs 2 ranks")
    monkeypatch.setenv("MPICOLL_TIMEOUT", WAIT)
    monkeypatch.setenv("MPICOLL_TRACE", os.path.join(shared_dir, "split.json"))
    world = mpicoll.Communicator()
    half = world.split(world.rank % 2)  # {0, 2, ...} and {1, 3, ...}
    for _ in range(2 + world.rank % 2):  # the halves make 2 and 3 calls
        half.all_reduce(np.ones(4), algorithm="ring")
    path, leads = half._trace_file.path, half.rank == 0
    half.free()
    writers = [p for p, lead in _world().allgather((path, leads)) if lead]
    world.free()
    assert len(set(writers)) == 2 and writers[1].endswith(".rank1.json"), writers
    if leads:
        calls = tracefile.summarize(tracefile.load(path))
        assert [(r["collective"], r["ranks"]) for r in calls] == \
            [("all_reduce", half.size)] * (2 + world.rank % 2)


@pytest.mark.mpi
def test_the_trace_merge_matches_no_message_of_any_call(shared_dir):
    """The clocks' ping-pongs take a tag no call used: receives posted for every tag this
    communicator's calls used (and 77, 78: those of calls #75, #76 of a process's first
    communicator) stay unmatched."""
    world = _world()
    comm = mpicoll.Communicator(trace=True, timeout=float(WAIT))
    t = comm.transport
    first = t.tag + 1
    for _ in range(80):
        comm.barrier(algorithm="native")
    tags = sorted({*range(first, t.tag + 1), 77, 78})
    data = t.comm
    posted = [data.Irecv(np.empty(4, np.float64), peer, tag)
              for peer in range(comm.size) if peer != comm.rank for tag in tags]
    path = os.path.join(shared_dir, "merged.json")
    comm.write_trace(path)
    matched = [r.Test() for r in posted]
    for r in posted:
        r.Cancel()
    from mpi4py import MPI

    MPI.Request.Waitall(posted)
    assert not any(matched)
    world.Barrier()
    assert comm.all_reduce(np.ones(2), algorithm="ring").tolist() == [comm.size] * 2
    if comm.rank == 0:
        assert {e["rank"] for e in tracefile.load(path)} == set(range(comm.size))
    comm.free()


@pytest.mark.mpi
def test_write_trace_to_an_unwritable_path_raises_on_every_rank(shared_dir):
    comm = mpicoll.Communicator(trace=True, timeout=float(WAIT))
    comm.all_reduce(np.ones(3), algorithm="ring")
    _raises_alike(mpicoll.InvalidArgumentError, "rank 0 cannot write the trace",
                  lambda: comm.write_trace(os.path.join(shared_dir, "missing", "t.json")))
    assert comm.all_reduce(np.ones(2), algorithm="ring").tolist() == [comm.size] * 2
    comm.free()


def test_trace_files_at_free_and_at_exit_in_one_job(tmp_path):
    """A job: one traced communicator freed before exit (written at free, nothing at
    exit), another never freed (written at exit), then a clean exit."""
    from test_examples import MPIEXEC, mpiexec

    if MPIEXEC is None:
        pytest.skip("no mpiexec")
    script = tmp_path / "traced.py"
    script.write_text(
        "import numpy as np, mpicoll\n"
        "c = mpicoll.Communicator()\n"
        "c.all_reduce(np.ones(30), algorithm='ring')\n"
        "c.free()\n"
        "d = mpicoll.Communicator()\n"
        "d.all_gather(np.ones(3), algorithm='ring')\n")
    path = tmp_path / "trace.json"
    saved = {k: os.environ.get(k) for k in ("MPICOLL_TRACE", "MPICOLL_TIMEOUT")}
    os.environ.update(MPICOLL_TRACE=str(path), MPICOLL_TIMEOUT=WAIT)
    try:
        done = mpiexec(3, "-m", "mpi4py", str(script), timeout=120)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    first = tracefile.summarize(tracefile.load(str(path)))
    second = tracefile.summarize(tracefile.load(str(tmp_path / "trace.2.json")))
    assert [(r["collective"], r["ranks"]) for r in first] == [("all_reduce", 3)]
    assert [(r["collective"], r["ranks"]) for r in second] == [("all_gather", 3)]


# -- item 14: resource hygiene ---------------------------------------------------------------


@pytest.mark.mpi
def test_failed_constructors_leak_no_communicator_and_no_watch(monkeypatch, shared_dir):
    from mpi4py import MPI

    import mpicoll.communicator as module

    world = _world()
    last = world.Get_size() - 1
    monkeypatch.setenv("MPICOLL_TIMEOUT", WAIT)
    made = []
    real = module.make_backend
    monkeypatch.setattr(module, "make_backend", lambda *a: made.append(real(*a)) or made[-1])
    watches = len(watchdog().watches)
    bad_tuning = os.path.join(shared_dir, "tuning.json")
    if world.Get_rank() == 0:
        with open(bad_tuning, "w") as f:
            json.dump({"mpicoll_tuning": 1, "tables": {"2": {"all_reduce": [{"algorithm": "ring"}]}}}, f)
    world.Barrier()
    for i in range(40):
        with monkeypatch.context() as m:
            if i % 3 == 0 and world.Get_rank() == last:  # refused in the settings
                m.setenv("MPICOLL_FLIGHT_RECORDER", "none")
            if i % 3 == 1:  # refused in the tables, after the settings
                m.setenv("MPICOLL_TUNING", bad_tuning)
            bad = i % 3 == 2 and world.Get_rank() == last
            with pytest.raises(mpicoll.ConfigError):
                mpicoll.Communicator(timeout=-1 if bad else float(WAIT))
    assert len(made) == 40
    assert all(b.transport.comm == MPI.COMM_NULL for b in made)  # the duplicates were freed
    assert len(watchdog().watches) == watches
    comm = mpicoll.Communicator(timeout=float(WAIT))
    assert comm.all_reduce(np.ones(2), algorithm="ring").tolist() == [comm.size] * 2
    comm.free()


@pytest.mark.mpi
def test_a_failed_calls_staged_receives_are_dropped_by_the_next_call(monkeypatch):
    """A staged receive (device buffer, pinned landing) that a failed call posted and
    never waited for is cancelled at the next call's begin(), not kept forever."""
    sys.path.insert(0, os.path.dirname(__file__))
    from fake_cupy import installed
    from mpi4py import MPI

    monkeypatch.setenv("MPICOLL_TIMEOUT", WAIT)
    monkeypatch.setenv("MPICOLL_CUDA_AWARE", "0")  # staged
    with installed() as cupy:
        comm = mpicoll.Communicator()
        t = comm.transport
        t.begin()  # a call, on every rank alike, whose receive is never sent nor waited
        request = t.irecv(cupy.zeros(4), (comm.rank + 1) % comm.size)
        assert len(t._copies) == 1
        comm.barrier(algorithm="native")
        assert t._copies == [] and request == MPI.REQUEST_NULL
        got = comm.all_reduce(cupy.asarray(np.ones(4)), algorithm="ring")
        assert got.get().tolist() == [comm.size] * 4
        comm.free()


@pytest.mark.mpi
@pytest.mark.parametrize("launch", ["srun", "mpiexec inside a batch job", "no slurm"])
def test_nodes_from_srun_and_else_the_shared_memory_node(monkeypatch, launch):
    """A rank reads SLURM's node only where srun started it (its SLURM_PROCID is its rank
    in the job); where some ranks cannot (mpiexec inside a batch job: every rank inherits
    the batch step's SLURM_PROCID 0 and its node's name), every rank takes its
    shared-memory node (MPI_COMM_TYPE_SHARED: here, one machine, so one node)."""
    w = _world()
    rank, size = w.Get_rank(), w.Get_size()
    monkeypatch.delenv("MPICOLL_RANKS_PER_NODE", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    if launch == "srun":  # two virtual nodes: ranks 0.. and the rest
        monkeypatch.setenv("SLURM_PROCID", str(rank))
        monkeypatch.setenv("SLURMD_NODENAME", f"node{int(rank >= (size + 1) // 2)}")
    elif launch == "mpiexec inside a batch job":  # (the names are not read: they may be
        monkeypatch.setenv("SLURM_PROCID", "0")      # the batch node's, or a proxy's)
        monkeypatch.setenv("SLURMD_NODENAME", f"host{rank}")
    comm = mpicoll.Communicator()
    try:
        if launch == "srun" and size > 1:
            half = (size + 1) // 2
            assert comm.nodes == (tuple(range(half)), tuple(range(half, size)))
        else:
            assert comm.nodes == (tuple(range(size)),)
    finally:
        comm.free()
