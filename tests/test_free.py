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
