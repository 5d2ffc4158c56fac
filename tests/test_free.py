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
def test_free_twice_is_harmless():
    from mpi4py import MPI

    comm = mpicoll.Communicator(MPI.COMM_WORLD)
    comm.all_reduce(np.ones(2))
    comm.free()
    comm.free()
