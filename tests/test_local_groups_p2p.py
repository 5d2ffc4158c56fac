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
