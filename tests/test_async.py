"""async_op=True on every collective, and the Bucketer: results equal the blocking calls',
several handles outstanding and waited in any order, progress while the caller computes,
errors raised from wait() on every rank."""

from __future__ import annotations

import time

import numpy as np
import pytest
from reference import check_late_barrier, check_late_barrier_local

import mpicoll
from mpicoll.local import run_local


def _calls(comm):
    """One call of every collective: (name, blocking thunk, async thunk)."""
    p, r = comm.size, comm.rank
    x = np.arange(6, dtype=np.float64) + r
    rows = np.arange(p * 3, dtype=np.int32).reshape(p, 3) * (r + 1)
    mine = np.arange(r + 1, dtype=np.float32)
    calls = {
        "broadcast": lambda **k: comm.broadcast(x if r == 0 else None, 0, **k),
        "scatter": lambda **k: comm.scatter(rows if r == 0 else None, 0, **k),
        "gather": lambda **k: comm.gather(x, 0, **k),
        "all_gather": lambda **k: comm.all_gather(x, **k),
        "reduce": lambda **k: comm.reduce(x, "sum", 0, **k),
        "all_reduce": lambda **k: comm.all_reduce(x, "max", **k),
        "reduce_scatter": lambda **k: comm.reduce_scatter(rows, "sum", **k),
        "all_to_all": lambda **k: comm.all_to_all(rows, **k),
        "all_gather_v": lambda **k: comm.all_gather_v(mine, **k),
        "scan": lambda **k: comm.scan(x, "sum", **k),
        "exscan": lambda **k: comm.exscan(rows, "prod", **k),
        "barrier": lambda **k: comm.barrier(**k),
    }
    assert set(mpicoll.COLLECTIVES) <= set(calls)
    return calls


def _same(a, b):
    if isinstance(a, tuple):
        return all(_same(u, v) for u, v in zip(a, b, strict=True))
    if a is None or b is None:
        return a is None and b is None
    return np.array_equal(np.asarray(a), np.asarray(b))


def _every_collective_async(comm):
    calls = _calls(comm)
    expected = {name: call() for name, call in calls.items()}
    works = {name: call(async_op=True) for name, call in calls.items()}  # all outstanding
    order = list(works)[::-1] if comm.rank % 2 else list(works)  # waited in other orders
    for name in order:
        work = works[name]
        assert _same(work.wait(), expected[name]), name
        assert work.done and work.test()


@pytest.mark.parametrize("size", [2, 3, 5])
@pytest.mark.parametrize("algorithm", ["linear", "dissemination"])
def test_local_async_barrier_waits_for_a_late_rank(size, algorithm):
    """A barrier's Work is done only once every rank has entered (the late one last)."""
    check_late_barrier_local(size, algorithm, {"async_op": True})


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_local_every_collective_async(size):
    run_local(size, _every_collective_async, timeout=20)


def _polled_until_done(done, cap=10 ** 6):
    """How many times ``done()`` answered False before True (at most ``cap``)."""
    polls = 0
    while not done():
        polls += 1
        if polls == cap:
            break
    return polls


def test_polling_test_in_a_loop_lets_the_progress_thread_run():
    """A caller that polls work.test() in a tight loop (torch's is_completed()) gives the
    progress thread the GIL: with Python's switch interval at 1 s, a poll that held it
    would keep the call from starting for 1 s (a million polls first, some 0.2 s)."""
    import sys

    interval = sys.getswitchinterval()
    try:
        sys.setswitchinterval(1.0)
        results = run_local(2, _polling_rank, timeout=60)
    finally:
        sys.setswitchinterval(interval)
    for polls_async, polls_p2p in results:
        assert polls_async < 10 ** 6 and polls_p2p < 10 ** 6


def _polling_rank(comm):
    x = np.arange(1 << 12, dtype=np.float64)
    work = comm.all_reduce(x, algorithm="ring", async_op=True)
    polls_async = _polled_until_done(work.test)
    assert np.array_equal(work.wait(), x * comm.size)
    got = np.empty(3)
    if comm.rank == 0:
        request = comm.irecv(got, 1, 5)
        polls_p2p = _polled_until_done(request.test)
        request.wait()
        assert np.array_equal(got, [1.0, 2.0, 3.0])
    else:  # (sent once rank 0 polls: this thread then needs the GIL back to send)
        time.sleep(0.05)
        comm.send(np.array([1.0, 2.0, 3.0]), 0, 5)
        polls_p2p = 0
    return polls_async, polls_p2p


def _errors_from_wait(comm):
    bad = comm.all_reduce(np.ones(3), algorithm="no_such_algorithm", async_op=True)
    with pytest.raises(mpicoll.InvalidArgumentError, match="no_such_algorithm"):
        bad.wait()
    assert bad.done
    # a disagreement between ranks surfaces from wait() on every rank, and the
    # communicator goes on working afterwards
    checked = mpicoll.Communicator(comm.control_comm, check=True) \
        if comm.backend == "mpi" else comm
    if comm.backend == "mpi" and comm.size > 1:
        x = np.ones(4, np.float32 if comm.rank == 0 else np.float64)
        mismatch = checked.all_reduce(x, async_op=True)
        with pytest.raises(mpicoll.MismatchError):
            mismatch.wait()
    good = comm.all_reduce(np.ones(3), async_op=True)
    assert np.array_equal(good.wait(), np.full(3, comm.size))


def test_local_errors_from_wait():
    run_local(3, _errors_from_wait, timeout=20)


def _done_callbacks(comm):
    import threading

    ran, seen = threading.Event(), []
    work = comm.all_reduce(np.ones(3), async_op=True)
    work.add_done_callback(lambda w: (seen.append(w.host_result().tolist()), ran.set()))
    assert np.array_equal(work.wait(), np.full(3, comm.size))
    assert ran.wait(20) and seen == [[comm.size] * 3]
    late = []  # added once it has finished: called at once, in this thread
    work.add_done_callback(lambda w: late.append(threading.current_thread()))
    assert late == [threading.current_thread()]
    failed = comm.all_reduce(np.ones(3), algorithm="no_such_algorithm", async_op=True)
    with pytest.raises(mpicoll.InvalidArgumentError):
        failed.wait()
    with pytest.raises(mpicoll.InvalidArgumentError, match="no_such_algorithm"):
        failed.host_result()
    with pytest.warns(RuntimeWarning, match="done callback of all_reduce raised ZeroDivision"):
        failed.add_done_callback(lambda w: 1 / 0)  # (reported, never raised)


def test_local_done_callbacks_run_once_the_call_ends():
    """``Work.add_done_callback``: called with the Work in the thread that ends the call,
    or at once where it has ended; a callback's error is a warning."""
    run_local(2, _done_callbacks, timeout=20)


def test_a_done_callback_raising_systemexit_never_replaces_the_result():
    def body(comm):
        if comm.rank == 1:
            time.sleep(0.3)  # (rank 0's call is pending while it adds its callbacks)
        work = comm.all_reduce(np.ones(2), async_op=True)
        seen = []
        if comm.rank == 0:  # run by the progress thread, which ends the call: a warning
            work.add_done_callback(lambda w: (_ for _ in ()).throw(SystemExit("in a callback")))
            work.add_done_callback(lambda w: seen.append("ran"))
        got = work.wait()[0]
        time.sleep(0.1)  # (the callbacks run once the call has ended)
        return got, seen, comm.all_reduce(np.ones(2), async_op=True).wait()[0]

    assert run_local(2, body, timeout=20) == [(2.0, ["ran"], 2.0), (2.0, [], 2.0)]


@pytest.mark.filterwarnings("error")
def test_a_done_callback_raising_under_warnings_as_errors_leaves_the_progress_thread_on(capfd):
    """python -W error: a done callback's error (whose warning is then an error) is
    reported on stderr, and the progress thread runs the next calls: not killed, with
    every later wait() hanging."""
    def body(comm):
        if comm.rank == 1:
            time.sleep(0.3)  # (rank 0's call is pending while it adds its callback)
        work = comm.all_reduce(np.ones(2), async_op=True)
        if comm.rank == 0:  # run by the progress thread, which ends the call
            work.add_done_callback(lambda w: 1 / 0)
        first = work.wait()[0]
        return first, comm.all_reduce(np.ones(2), async_op=True).wait(timeout=20)[0]

    assert run_local(2, body, timeout=20) == [(2.0, 2.0)] * 2
    assert "a done callback of all_reduce raised ZeroDivisionError" in capfd.readouterr().err


def test_a_done_callback_that_waits_frees_or_dups_is_refused_not_deadlocked():
    """In a done callback on the progress thread: wait() for a later call (which that
    thread would run after the callback: it would wait forever), free() (it would join
    the thread it runs on) and dup() (a collective racing the caller's) raise
    ConcurrentCallError there; the calls end and the Communicator goes on."""
    def body(comm):
        if comm.rank == 1:
            time.sleep(0.3)  # (rank 0's first call is pending while it adds its callback)
        first = comm.all_reduce(np.ones(2), async_op=True)
        second = comm.all_reduce(np.full(2, 2.0), async_op=True)
        seen = []

        def misuse(work):
            for attempt in (second.wait, comm.free, comm.dup):
                try:
                    attempt()
                except mpicoll.ConcurrentCallError as exc:
                    seen.append(str(exc).split(":")[0])

        if comm.rank == 0:
            first.add_done_callback(misuse)
        results = first.wait()[0], second.wait()[0], comm.all_reduce(np.ones(1))[0]
        return results, seen, comm.freed

    assert run_local(2, body, timeout=20) == [
        ((2.0, 4.0, 2.0), ["all_reduce wait()", "free", "dup"], False),
        ((2.0, 4.0, 2.0), [], False)]


def test_a_collective_in_a_done_callback_is_refused_wherever_the_callback_runs():
    """A callback added once the call had finished runs at once in the caller's thread
    (rank 0 here), one added before on the progress thread (rank 1, whose call waits for
    rank 0's): which of the two is timing, so a collective made in it is refused in both
    (it was run on rank 0 alone, pairing with rank 1's next call), and the next calls
    are right."""
    def body(comm):
        seen = []

        def collective(work):
            try:
                comm.all_reduce(np.full(2, 10.0))
            except mpicoll.ConcurrentCallError as exc:
                seen.append("done callback" in str(exc))

        if comm.rank == 0:
            time.sleep(0.3)  # (rank 1 adds its callback while its call waits for this one)
        work = comm.all_reduce(np.ones(2), async_op=True)
        if comm.rank == 0:
            work.wait()  # finished: the callback runs at once, here
        work.add_done_callback(collective)
        work.wait()
        return seen, comm.all_reduce(np.full(3, 1.0 + comm.rank)).tolist()

    assert run_local(2, body, timeout=20) == [([True], [3.0] * 3)] * 2


def test_the_default_wait_counts_from_the_calls_start_not_from_the_wait(monkeypatch):
    """Four barriers queued at once, rank 1 late to each by 0.6 s (under the timeout of
    1 s): rank 0's wait for the last, made at once, must not count the time the three
    before it ran as the last one's."""
    monkeypatch.setattr(mpicoll.Work, "GRACE", 0.0)

    def body(comm):
        works = []
        for _ in range(4):
            if comm.rank == 1:
                time.sleep(0.6)
            works.append(comm.barrier(async_op=True))
        works[-1].wait()
        return comm.all_reduce(np.ones(2))[0]

    assert run_local(2, body, timeout=1) == [2.0, 2.0]


@pytest.mark.parametrize("timeout", [1e10, float("inf"), __import__("datetime").timedelta.max])
def test_a_wait_longer_than_threading_can_wait_means_no_limit(timeout):
    def body(comm):
        if comm.rank == 1:
            time.sleep(0.2)  # (so rank 0's wait finds the call pending)
        return comm.all_reduce(np.ones(2), async_op=True).wait(timeout)[0]

    assert run_local(2, body, timeout=20) == [2.0, 2.0]


@pytest.mark.parametrize("wrong", ["array", "cap_bytes", "layout", "dtype", "op",
                                   "bad_op", "op_for_dtype", "algorithm", "keyword"])
def test_a_bucketer_one_rank_makes_wrong_raises_on_every_rank_and_the_next_call_runs(wrong):
    """Making a Bucketer is collective: one rank's refused arguments, or its other layout
    of the buckets (which would pair its buckets' messages with the others' other
    buckets), raise on every rank once the duplicate is made; the next call runs."""
    def body(comm):
        odd = comm.rank == comm.size - 1
        arrays, cap = [np.ones(3), np.ones(5)], 64
        if odd and wrong == "array":
            arrays[1] = "not an array"
        elif odd and wrong == "cap_bytes":
            cap = "64"
        elif odd and wrong == "layout":
            cap = 16  # one array per bucket, where the others hold both in one
        elif wrong == "dtype":  # (as many bytes, another dtype)
            arrays = [np.zeros(2, np.int64 if odd else np.float64)]
        elif odd and wrong == "op_for_dtype":  # (an op it cannot reduce them with)
            arrays = [np.ones(3, np.int32), np.ones(5, np.int32)]
        op = ("max" if wrong == "op" else "no such op" if wrong == "bad_op" else
              "avg" if wrong == "op_for_dtype" else "sum") if odd else "sum"
        algorithm = "no_such" if odd and wrong == "algorithm" else "ring"
        error = mpicoll.MismatchError if wrong in ("layout", "dtype", "op") else \
            mpicoll.UnsupportedDtypeError if odd and wrong == "op_for_dtype" else \
            mpicoll.InvalidArgumentError
        extra = {"bucket_cap_mb": 25} if odd and wrong == "keyword" else {}  # (DDP's name)
        with pytest.raises(error, match="arrays|cap_bytes|op|avg|algorithm|bucket_cap_mb"):
            mpicoll.Bucketer(comm, arrays, cap_bytes=cap, op=op, algorithm=algorithm, **extra)
        return comm.all_reduce(np.ones(2))[0]

    assert run_local(3, body, timeout=20) == [3.0] * 3


def test_a_bucketer_in_check_mode_lets_ranks_add_in_any_order_around_other_calls():
    """Rank 0 fills bucket 0 first and starts it; rank 1 fills bucket 1 first (which
    waits for bucket 0), then both meet in a barrier on another Communicator: the
    start of bucket 0 must not wait for rank 1 (a check-mode step would)."""
    def body(comm):
        other = comm.dup()
        buckets = mpicoll.Bucketer(comm, [np.ones(2), np.ones(2)], cap_bytes=16)
        order = [0, 1] if comm.rank == 0 else [1, 0]
        buckets.add(order[0], np.full(2, comm.rank + 1.0))
        other.barrier()
        buckets.add(order[1], np.full(2, comm.rank + 1.0))
        return [a.tolist() for a in buckets.wait()]

    assert run_local(2, body, timeout=10, check=True) == [[[3.0, 3.0], [3.0, 3.0]]] * 2


def test_a_bucketer_refuses_indices_that_are_not_ints_and_ends_a_round_whose_bucket_was_refused():
    def body(comm):
        buckets = mpicoll.Bucketer(comm, [np.ones(2), np.ones(3)], cap_bytes=16)
        for index in (1.0, "0", True, None, 2, -1):
            with pytest.raises(mpicoll.InvalidArgumentError, match="index: expected an int"):
                buckets.add(index, np.ones(2))
        calls = buckets.comm.all_reduce

        def refused(*args, **kwargs):  # as a submission refused on every rank
            raise mpicoll.ConcurrentCallError("refused at submission")

        buckets.comm.all_reduce = refused
        buckets.add(1, np.ones(3))  # (bucket 1 is full: it starts after bucket 0)
        with pytest.raises(mpicoll.ConcurrentCallError):
            buckets.add(0, np.full(2, comm.rank + 1.0))
        with pytest.raises(mpicoll.InvalidArgumentError, match="bucket 0 was never started"):
            buckets.wait()  # the round ends: the next may begin
        buckets.comm.all_reduce = calls
        buckets.add(np.int64(1), np.ones(3))
        buckets.add(0, np.full(2, comm.rank + 1.0))
        got = buckets.wait()
        buckets.free()
        return got[0].tolist(), got[1].tolist()

    assert run_local(2, body, timeout=20) == [([3.0, 3.0], [2.0, 2.0, 2.0])] * 2


def test_a_bucketer_wait_refused_before_its_exchange_keeps_the_rounds_refused_add():
    """A wait refused in its exchange (made in a done callback) leaves the round open with
    the refused add still known: the wait retried raises on every rank (it returned
    the sums with that rank's array as zeros, silently)."""
    def body(comm):
        buckets = mpicoll.Bucketer(comm, [np.zeros(4)], op="sum")
        if comm.rank == 1:
            with pytest.raises(mpicoll.InvalidArgumentError, match="shape"):
                buckets.add(0, np.ones(5))
        else:
            buckets.add(0, np.ones(4))
        said = []

        def waits(work):
            try:
                buckets.wait()
            except mpicoll.MpicollError as exc:
                said.append(type(exc))

        work = comm.barrier(async_op=True)
        work.add_done_callback(waits)
        work.wait()
        deadline = time.monotonic() + 10  # (the callback runs in the thread that ends the
        while not said and time.monotonic() < deadline:  # call: it may end after wait()
            time.sleep(0.005)  # returns, on a loaded machine)
        assert said == [mpicoll.ConcurrentCallError]
        with pytest.raises(mpicoll.InvalidArgumentError if comm.rank == 1 else
                           mpicoll.RemoteError, match="shape|rank.s. 1"):
            buckets.wait()
        buckets.add(0, np.ones(4))
        return buckets.wait()[0].tolist()

    assert run_local(3, body, timeout=20) == [[3.0] * 4] * 3


@pytest.mark.parametrize("check", [False, True])
def test_a_bucketer_add_refused_on_one_rank_raises_at_every_ranks_wait(check):
    """One rank's add gets an array of the wrong shape (or no array): it raises there at
    once, but its slot goes as zeros so every bucket still starts; wait() then raises on
    every rank (that rank its own error, the others RemoteError: their sums lack its part),
    in check mode too, and the next round is right."""
    def body(comm):
        buckets = mpicoll.Bucketer(comm, [np.ones(2), np.ones(3), np.ones(4)], cap_bytes=40)
        last = comm.rank == comm.size - 1
        # (None: never added on that rank, as an array with no gradient this step: array
        # 0's holds back every bucket there, which wait() then starts)
        for wrong, bad in ((1, np.ones(5)), (1, "not an array"), (1, None), (0, None)):
            for i, n in enumerate((2, 3, 4)):
                if last and i == wrong:
                    if bad is not None:
                        with pytest.raises(mpicoll.InvalidArgumentError, match="array 1"):
                            buckets.add(i, bad)
                else:
                    buckets.add(i, np.full(n, comm.rank + 1.0))
            with pytest.raises(mpicoll.InvalidArgumentError if last else mpicoll.RemoteError,
                               match=rf"array {wrong}|arrays \[{wrong}\] were never added"
                               if last else "add refused an array on rank"):
                buckets.wait()
        for i, n in enumerate((2, 3, 4)):
            buckets.add(i, np.full(n, comm.rank + 1.0))
        got = [a.tolist() for a in buckets.wait()]
        buckets.free()
        return got

    total = 6.0  # ranks 1 + 2 + 3
    assert run_local(3, body, timeout=20, check=check) == \
        [[[total] * 2, [total] * 3, [total] * 4]] * 3


def test_a_bucketer_of_what_is_not_a_communicator_is_refused():
    """An mpi4py communicator (an MPI user's easy slip) or None: mpicoll's error."""
    from mpi4py import MPI

    for comm in (MPI.COMM_WORLD, None):
        with pytest.raises(mpicoll.InvalidArgumentError, match="expected an mpicoll "
                                                               "Communicator"):
            mpicoll.Bucketer(comm, [np.zeros(2)])


def test_bucketer_local():
    def body(comm):
        rng = np.random.default_rng(7)
        shapes = [(3, 4), (100,), (7,), (2, 2, 2), (1000,), (1,)]
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        buckets = mpicoll.Bucketer(comm, grads, cap_bytes=512, op="sum")
        assert len(buckets.buffers) >= 3  # (1000,) is over the cap: a bucket of its own
        assert 4000 in buckets.bucket_bytes
        for round_ in range(2):
            order = np.random.default_rng(comm.rank + 10 * round_).permutation(len(grads))
            for i in order:  # every rank adds in its own order
                buckets.add(int(i), grads[i] * (comm.rank + 1))
            got = buckets.wait()
            factor = comm.size * (comm.size + 1) / 2
            for g, want in zip(got, grads, strict=True):
                np.testing.assert_allclose(g, want * factor, rtol=1e-6)
        buckets.add(0, grads[0])
        with pytest.raises(mpicoll.InvalidArgumentError, match="never added"):
            buckets.wait()  # (every rank left the same arrays out: each raises its own)
        buckets.add(0, grads[0])  # (that round ended: a new one)
        with pytest.raises(mpicoll.InvalidArgumentError, match="already added"):
            buckets.add(0, grads[0])
        with pytest.raises(mpicoll.InvalidArgumentError, match="shape"):
            buckets.add(1, grads[0])

    for size in (1, 2, 3):
        run_local(size, body, timeout=20)


def test_bucketer_apart_from_the_callers_own_async_calls():
    """Ranks add in different orders with an async call of their own in between: on rank
    0 it comes after bucket 0 started, elsewhere before. The Bucketer's calls run on its
    own duplicate, so they never pair with the caller's."""
    def body(comm):
        buckets = mpicoll.Bucketer(comm, [np.zeros(4), np.zeros(4)], cap_bytes=32, op="sum")
        first, second = np.full(4, 1.0), np.full(4, 10.0)
        for _ in range(2):
            if comm.rank == 0:
                buckets.add(0, first)
                mine = comm.all_reduce(np.full(4, 1000.0), async_op=True)
                buckets.add(1, second)
            else:
                buckets.add(1, second)
                mine = comm.all_reduce(np.full(4, 1000.0), async_op=True)
                buckets.add(0, first)
            got = buckets.wait()
            np.testing.assert_array_equal(got[0], np.full(4, comm.size * 1.0))
            np.testing.assert_array_equal(got[1], np.full(4, comm.size * 10.0))
            np.testing.assert_array_equal(mine.wait(), np.full(4, comm.size * 1000.0))
        buckets.free()

    for size in (2, 3):
        run_local(size, body, timeout=20)


# ---- under mpiexec ----------------------------------------------------------------------


@pytest.mark.mpi
def test_mpi_every_collective_async():
    _every_collective_async(mpicoll.Communicator())


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["dissemination", "native"])
def test_mpi_async_barrier_waits_for_a_late_rank(algorithm):
    check_late_barrier(mpicoll.Communicator(), algorithm, {"async_op": True}, delay=0.1)


@pytest.mark.mpi
def test_mpi_errors_from_wait():
    _errors_from_wait(mpicoll.Communicator())


@pytest.mark.mpi
def test_mpi_collective_progresses_while_the_caller_computes():
    """The all_reduce finishes while this rank only computes (no MPI call, no wait):
    test() turns True before wait() is ever called."""
    comm = mpicoll.Communicator()
    x = np.ones(1 << 18, np.float32)
    work = comm.all_reduce(x, algorithm="ring", async_op=True)
    deadline = time.monotonic() + 60
    a = np.ones((64, 64))
    computed = 0
    while not work.test():
        a = np.tanh(a @ a / 64)  # the caller's own work
        computed += 1
        assert time.monotonic() < deadline, "the collective made no progress on its own"
    assert work.finished_at > work.started_at
    assert np.array_equal(work.wait(), np.full(x.size, comm.size, np.float32))


@pytest.mark.mpi
def test_mpi_bucketer_overlaps_and_sums():
    comm = mpicoll.Communicator()
    grads = [np.full(s, comm.rank + 1.0, np.float64) for s in (10, 5000, 3, 20000, 7)]
    buckets = mpicoll.Bucketer(comm, grads, cap_bytes=64 * 1024, op="avg")
    for i in reversed(range(len(grads))):  # as a backward pass produces them
        buckets.add(i, grads[i])
    mean = (comm.size + 1) / 2
    for got, g in zip(buckets.wait(), grads, strict=True):
        np.testing.assert_allclose(got, np.full(g.shape, mean))


def test_a_nested_done_callback_leaves_the_outer_one_marked():
    """A done callback that runs another (adding one to a finished Work) is still in a
    done callback once the inner one returns: its calls are still refused."""
    from mpicoll.pipeline import state

    assert not state.in_done_callback()
    state.entering_done_callback()
    state.entering_done_callback()
    state.leaving_done_callback()
    try:
        assert state.in_done_callback()
    finally:
        state.leaving_done_callback()
    assert not state.in_done_callback() and state.CALLBACK_THREADS == {}


def test_a_plan_start_in_a_done_callback_is_refused_before_any_message_in_check_mode():
    """Check mode agrees each plan start as a step of its own: made in a done callback (on
    one rank only), start() and plan() are refused there before that step's message, as
    every call is, so the ranks' numbering stays alike and the next calls are right."""
    def body(comm):
        plan = comm.all_reduce_init(np.ones(2), algorithm="ring")
        first = comm.all_reduce(np.ones(2), async_op=True)
        seen = []

        def misuse(work):
            for attempt in (plan.start, plan):
                try:
                    attempt()
                except mpicoll.ConcurrentCallError as exc:
                    seen.append(str(exc).split(":")[0])

        if comm.rank == 0:
            first.add_done_callback(misuse)
        first.wait()
        return seen, plan()[0], comm.all_reduce(np.ones(1))[0]

    assert run_local(2, body, timeout=20, check=True) == [
        (["all_reduce plan.start()", "all_reduce plan.__call__()"], 2.0, 2.0),
        ([], 2.0, 2.0)]


def test_a_bucketer_refuses_another_dtype_and_says_each_refused_add_itself():
    """An add of another dtype than the array declared is refused (cast into the bucket
    it could wrap: 2**40 + 5 as int32 is 5), as another shape is; a second refused add
    in a round raises its own error, not the first one's."""
    def body(comm):
        buckets = mpicoll.Bucketer(comm, [np.zeros(2, np.int32), np.zeros(2, np.int32)])
        with pytest.raises(mpicoll.InvalidArgumentError, match="array 0: .* of int64"):
            buckets.add(0, np.array([2**40 + 5, 1], np.int64))
        with pytest.raises(mpicoll.InvalidArgumentError, match="array 1"):
            buckets.add(1, np.zeros(5, np.int32))
        with pytest.raises(mpicoll.InvalidArgumentError, match="array 0"):
            buckets.wait()  # (every rank: its first refusal)
        buckets.add(0, np.full(2, 1, np.int32))
        buckets.add(1, np.full(2, 2, np.int32))
        got = [a.tolist() for a in buckets.wait()]
        buckets.free()
        return got

    assert run_local(2, body, timeout=20) == [[[2, 2], [4, 4]]] * 2


def test_a_bucketer_takes_adds_and_waits_from_other_threads():
    """Arrays added from worker threads (an autograd hook's, a pool's) and an array never
    added, whose bucket wait() starts from the main thread while the workers' buckets may
    still be pending: every rank raises that it was never added (no rank refuses a bucket
    as another thread's call, leaving the others waiting); the next round, added from
    threads in another order on each rank, sums right."""
    import threading

    def body(comm):
        n = 1 << 18
        buckets = mpicoll.Bucketer(comm, [np.zeros(n) for _ in range(3)], cap_bytes=8 * n)

        def add_from_threads(indices):
            threads = [threading.Thread(target=buckets.add, args=(i, np.full(n, i + 1.0)))
                       for i in indices]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        add_from_threads([0, 1])
        if comm.rank == 0:
            time.sleep(0.5)
        with pytest.raises(mpicoll.InvalidArgumentError, match=r"arrays \[2\] were never"):
            buckets.wait()
        add_from_threads([2, 1, 0] if comm.rank else [0, 1, 2])
        got = [float(a[0]) for a in buckets.wait()]
        buckets.free()
        return got

    assert run_local(2, body, timeout=30) == [[2.0, 4.0, 6.0]] * 2


@pytest.mark.parametrize("mistake", ["twice", "index"])
def test_a_bucketer_add_refused_on_one_rank_for_its_index_makes_every_rank_raise(mistake):
    """Rank 1 adds array 0 twice (the second add's data never counts), or adds to an index
    that is no array's: that add raises there, and the round's wait() raises on every
    rank, as for every refused add (it returned the first add's sums with no word); the
    next round is right."""
    def body(comm):
        buckets = mpicoll.Bucketer(comm, [np.zeros(2), np.zeros(3)], cap_bytes=16)
        buckets.add(0, np.full(2, 1.0))
        if comm.rank == 1:
            with pytest.raises(mpicoll.InvalidArgumentError,
                               match="already added" if mistake == "twice" else "index"):
                buckets.add(0 if mistake == "twice" else 5, np.full(2, 9.0))
        buckets.add(1, np.ones(3))
        with pytest.raises(mpicoll.InvalidArgumentError if comm.rank == 1
                           else mpicoll.RemoteError):
            buckets.wait()
        buckets.add(1, np.ones(3))
        buckets.add(0, np.ones(2))
        return [a.tolist() for a in buckets.wait()]

    assert run_local(3, body, timeout=20) == [[[3.0, 3.0], [3.0, 3.0, 3.0]]] * 3
