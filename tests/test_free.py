"""Freeing a Communicator: pending asynchronous calls finish first, then its MPI
communicators (and its NCCL communicator) are released, once."""

from __future__ import annotations

import numpy as np
import pytest

import mpicoll


@pytest.mark.mpi
def test_free_with_a_pending_async_call_finishes_it_first():
    from mpi4py import MPI

    comm = mpicoll.Communicator(MPI.COMM_WORLD)
    x = np.full(1 << 16, comm.rank + 1.0)
    works = [comm.all_reduce(x, algorithm=a, async_op=True) for a in ("ring", "native")]
    comm.free()  # while the calls may still run on the progress thread
    total = comm.size * (comm.size + 1) / 2
    for work in works:
        assert work.done and np.all(work.wait() == total)
    assert comm.transport.comm == MPI.COMM_NULL  # the private duplicate is released


@pytest.mark.mpi
def test_a_freed_communicator_still_referenced_holds_no_workspace():
    """free() gives the transport's host workspace back: a freed Communicator a program
    still references (a group destroyed, kept in a list) does not hold its scratch."""
    from mpi4py import MPI

    comm = mpicoll.Communicator(MPI.COMM_WORLD)
    comm.all_reduce(np.ones(1 << 16, np.float32), algorithm="ring")
    comm.transport.take(1 << 16, np.float32)  # (as an algorithm stages blocks in it)
    assert comm.transport._arenas
    comm.free()
    assert not comm.transport._arenas


@pytest.mark.mpi
def test_free_twice_is_harmless():
    from mpi4py import MPI

    comm = mpicoll.Communicator(MPI.COMM_WORLD)
    comm.all_reduce(np.ones(2))
    comm.free()
    comm.free()


@pytest.mark.mpi
def test_every_call_on_a_freed_communicator_refuses_on_every_rank():
    """free() is collective, so every rank refuses each later call at once, before any
    message, naming the free (not MPI's "invalid communicator"): a kept decision's call,
    a new call, an async call, point-to-point, a split and a plan."""
    from mpi4py import MPI

    comm = mpicoll.Communicator(MPI.COMM_WORLD)
    x = np.ones(2)
    for _ in range(2):
        comm.all_reduce(x)
        comm.broadcast(x, 0)
    plan = comm.all_reduce_init(x)
    comm.free()
    calls = [lambda: comm.all_reduce(x), lambda: comm.broadcast(x, 0),
             lambda: comm.all_gather(np.ones(3)), lambda: comm.barrier(),
             lambda: comm.all_reduce(x, async_op=True), lambda: comm.split(0),
             comm.dup, lambda: comm.new_group([0]), lambda: comm.mesh((comm.size,)),
             comm.start_progress,
             lambda: comm.send(x, comm.rank), plan, lambda: comm.all_reduce_init(x),
             lambda: comm.broadcast_init(x, 0)]
    for call in calls:
        with pytest.raises(mpicoll.InvalidArgumentError, match="freed"):
            call()


@pytest.mark.mpi
def test_write_trace_on_a_freed_communicator_refuses(tmp_path):
    """write_trace() after free(): mpicoll's refusal naming the free, not MPI's
    "Invalid communicator" from the released duplicate."""
    from mpi4py import MPI

    comm = mpicoll.Communicator(MPI.COMM_WORLD, trace=True)
    comm.all_reduce(np.ones(2))
    comm.free()
    with pytest.raises(mpicoll.InvalidArgumentError, match="write_trace: this Communicator was freed"):
        comm.write_trace(str(tmp_path / "trace.json"))


@pytest.mark.mpi
def test_a_bucketer_dropped_unfreed_goes_with_its_communicator():
    """A Bucketer works on a duplicate of its Communicator: dropped without free(), the
    duplicate (and its progress thread) is freed with that Communicator, not kept to the
    end of the job; one freed first is not freed again, nor kept by the Communicator."""
    import gc
    import threading

    from mpi4py import MPI

    parent = mpicoll.Communicator(MPI.COMM_WORLD)
    threads = threading.active_count()
    for _ in range(3):
        sub = parent.dup()
        buckets = mpicoll.Bucketer(sub, [np.ones(2)])
        buckets.add(0, np.ones(2))
        np.testing.assert_array_equal(buckets.wait()[0], np.full(2, float(parent.size)))
        private = buckets.comm
        del buckets
        gc.collect()
        sub.free()
        assert private.freed and not sub._private
    assert threading.active_count() == threads
    kept = mpicoll.Bucketer(parent, [np.ones(2)])
    kept.free()
    assert kept.comm.freed and not parent._private
    # its own free(), the Communicator alive: refused as the Bucketer's, before anything
    # is copied, not as an all_reduce on a freed Communicator the user never freed
    for what, call in (("add", lambda: kept.add(0, np.full(2, 7.0))), ("wait", kept.wait)):
        with pytest.raises(mpicoll.InvalidArgumentError,
                           match=f"Bucketer.{what}: this Bucketer was freed"):
            call()
    assert not any(kept._filled)
    assert parent.all_reduce(np.ones(1))[0] == parent.size
    left = mpicoll.Bucketer(parent, [np.ones(2)])
    parent.free()
    assert left.comm.freed
    with pytest.raises(mpicoll.InvalidArgumentError, match="Bucketer.add: the Communicator "
                       "this Bucketer was made on was freed"):
        left.add(0, np.ones(2))


@pytest.mark.mpi
def test_a_message_done_before_the_free_is_waited_for_after_it():
    """An irecv and an isend that ended before free(), never tested since: their wait()
    after the free gives their result (the source), as MPI's request does, not the
    refusal of a call on a freed Communicator."""
    import time

    from mpi4py import MPI

    comm = mpicoll.Communicator(MPI.COMM_WORLD)
    got = np.zeros(2)
    receive = comm.irecv(got, comm.rank, tag=1)
    send = comm.isend(np.full(2, 7.0), comm.rank, tag=1)
    time.sleep(0.05)
    comm.free()
    assert receive.wait() == comm.rank and send.wait() is None
    np.testing.assert_array_equal(got, np.full(2, 7.0))


def test_an_async_call_meeting_a_free_made_since_its_first_check_is_refused(monkeypatch):
    """Another thread's free() landing between an async call's first look at the
    Communicator and its submission: the call refuses as every call on a freed one
    does (it went on: made a new progress thread and its duplicate on the freed
    Communicator, which stayed running; over MPI, a COMM_NULL message)."""
    import mpicoll.communicator
    import mpicoll.work
    from mpicoll.local import run_local

    submit = mpicoll.communicator.submit

    def freed_meanwhile(comm, *args, **kwargs):  # (the other thread's free(), made certain)
        comm.free()
        return submit(comm, *args, **kwargs)

    monkeypatch.setattr(mpicoll.communicator, "submit", freed_meanwhile)

    def body(comm):
        mine = comm.dup()
        with pytest.raises(mpicoll.InvalidArgumentError, match="this Communicator was freed"):
            mine.all_reduce(np.ones(3), async_op=True)
        return mine._progress is None

    running = {id(p) for p in mpicoll.work._RUNNING if p._thread.is_alive()}  # (others')
    assert run_local(2, body, timeout=10) == [True, True]
    assert not [p for p in mpicoll.work._RUNNING
                if p._thread.is_alive() and id(p) not in running]  # (none made for it)
