"""Trust, round two, under mpiexec: a user op that raises on one rank, user ops that come
and go, dtypes without a header code, strided out=, async calls from several threads and
check mode's async and v-variant cases. Each test ends with a call that must be right.

Run as ``mpiexec -n N python -m mpi4py -m pytest --with-mpi -m mpi`` with MPICOLL_TIMEOUT
set (the test command sets it): a hang ends with a report, not a silent wait.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref

import numpy as np
import pytest

import mpicoll
from mpicoll.algorithms import REGISTRY

pytestmark = pytest.mark.mpi

REDUCING = [(c, a) for c in ("all_reduce", "reduce", "reduce_scatter", "scan", "exscan")
            for a in [*REGISTRY[c], "native", "auto"]]


def _next_call_is_right(comm) -> None:
    got = comm.all_reduce(np.full(5, comm.rank + 1.0), algorithm="ring")
    np.testing.assert_array_equal(got, np.full(5, comm.size * (comm.size + 1) / 2))


def _reduce(comm, collective, x, op, algorithm):
    if collective == "all_reduce":
        return comm.all_reduce(x, op, algorithm=algorithm)
    if collective == "reduce":
        return comm.reduce(x, op, root=0, algorithm=algorithm)
    if collective in ("scan", "exscan"):
        return getattr(comm, collective)(x, op, algorithm=algorithm)
    return comm.reduce_scatter(x, op, algorithm=algorithm)


# -- 1. a user op that raises on one rank ------------------------------------------------


@pytest.mark.parametrize(("collective", "algorithm"), REDUCING)
@pytest.mark.parametrize("commutative", [True, False])
def test_a_user_op_raising_on_one_rank_raises_op_error_on_every_rank(world, collective,
                                                                     algorithm, commutative):
    if not commutative and REGISTRY[collective].get(algorithm) is not None \
            and REGISTRY[collective][algorithm].commutative_only:
        pytest.skip("refused for a non-commutative op")
    calls = []
    # the last rank: it combines in every algorithm but linear reduce and exscan
    failing = world.size - 1

    def flaky(a, b, out):
        calls.append(a.size)
        if world.rank == failing:
            raise ZeroDivisionError("flaky op")
        np.add(a, b, out=out)

    op = mpicoll.Op(flaky, commutative=commutative, name="flaky")
    x = np.ones((world.size, 6), np.float64)
    raised_here = None
    try:
        _reduce(world, collective, x, op, algorithm)
    except mpicoll.OpError as exc:
        raised_here = exc
    # every rank raises, or none does (the failing rank's op never ran with data)
    flags = np.zeros(world.size, np.int64)
    flags[world.rank] = raised_here is not None
    flags = world.all_reduce(flags, algorithm="native")
    ran_on_failing = world.all_reduce(np.array([len(calls) if world.rank == failing else 0]),
                                      algorithm="native")[0]
    if ran_on_failing:
        assert flags.tolist() == [1] * world.size
        assert "'flaky'" in str(raised_here) and f"rank {failing}" in str(raised_here)
        if world.rank == failing:
            assert isinstance(raised_here.__cause__, ZeroDivisionError)
    else:
        assert flags.tolist() == [0] * world.size
    _next_call_is_right(world)


def test_a_user_op_raising_on_every_rank_with_native_does_not_abort(world):
    def broken(a, b, out):
        raise ValueError("never")

    if world.size == 1:  # one rank combines nothing: the op never runs
        np.testing.assert_array_equal(
            world.all_reduce(np.ones(4), mpicoll.Op(broken), algorithm="native"), np.ones(4))
    else:
        with pytest.raises(mpicoll.OpError, match="op 'broken' raised on rank"):
            world.all_reduce(np.ones(4), mpicoll.Op(broken), algorithm="native")
    _next_call_is_right(world)


# -- 2. user ops that come and go ----------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["native", "auto", "recursive_doubling"])
def test_a_fresh_op_per_call_never_runs_out_of_mpi_user_ops(world, algorithm):
    for step in range(80):  # MPICH has room for a few dozen user ops at once
        op = mpicoll.Op(lambda a, b, out: np.add(a, b, out=out), name=f"step{step}")
        got = world.all_reduce(np.full(3, step, np.int64), op, algorithm=algorithm)
        np.testing.assert_array_equal(got, np.full(3, step * world.size))
    _next_call_is_right(world)


@pytest.mark.parametrize(("collective", "algorithm"), REDUCING)
def test_no_call_keeps_a_user_op_alive(world, collective, algorithm):
    op = mpicoll.Op(lambda a, b, out: np.add(a, b, out=out))
    _reduce(world, collective, np.ones((world.size, 2)), op, algorithm)
    world.all_reduce(np.ones((world.size, 2)), op, async_op=True).wait()
    gone = weakref.ref(op)
    del op
    if gone() is not None:  # a reference cycle: the collector's to find (slow at 8 ranks)
        gc.collect()
    assert gone() is None, "a cache, record or callback still holds the user's Op"


# -- 3 and 12. any NumPy dtype travels to ranks that pass None; out= must match it -------

DTYPES = [">f4", "<U7", "|S5", "<M8[ns]", "<m8[s]", ">c16",
          [("id", "<i4"), ("pos", ">f8", (2,))],
          {"names": ["a", "b"], "formats": ["u1", "<f8"], "offsets": [0, 8], "itemsize": 24}]


def _values(dtype: np.dtype, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Distinct bytes for any dtype: its raw memory filled with a pattern."""
    raw = (np.arange(int(np.prod(shape)) * dtype.itemsize) * 7 + seed) % 251
    return raw.astype(np.uint8).view(dtype).reshape(shape)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bytes, field by field (a copy need not keep a struct's padding bytes)."""
    if a.dtype.names:
        return all(_same(a[n], b[n]) for n in a.dtype.names)
    return a.tobytes() == b.tobytes()


def _ids(d):
    return str(np.dtype(d))


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("algorithm", [*REGISTRY["broadcast"], "native", "auto"])
@pytest.mark.parametrize("shape", [(3,), (700, 2)])  # in the header's packet, and after it
def test_broadcast_of_any_dtype_to_ranks_that_pass_none(world, dtype, algorithm, shape):
    dtype = np.dtype(dtype)
    root = world.size - 1
    sent = _values(dtype, shape, 3)
    got = world.broadcast(sent if world.rank == root else None, root=root, algorithm=algorithm)
    assert got.dtype == dtype and got.shape == shape
    assert _same(got, sent)
    _next_call_is_right(world)


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("algorithm", [*REGISTRY["scatter"], "native", "auto"])
def test_scatter_and_scatter_v_of_any_dtype_to_ranks_that_pass_none(world, dtype, algorithm):
    dtype = np.dtype(dtype)
    sent = _values(dtype, (world.size, 5), 11)
    got = world.scatter(sent if world.rank == 0 else None, root=0, algorithm=algorithm)
    assert got.dtype == dtype and _same(got, sent[world.rank])
    counts = [r % 3 for r in range(world.size)]
    rows = _values(dtype, (sum(counts), 2), 5)
    mine = world.scatter_v(rows if world.rank == 0 else None, counts if world.rank == 0 else None,
                           root=0, algorithm=algorithm)
    start = sum(counts[:world.rank])
    assert mine.dtype == dtype and _same(mine, rows[start:start + counts[world.rank]])
    _next_call_is_right(world)


@pytest.mark.parametrize("collective", ["broadcast", "scatter", "scatter_v"])
def test_a_dtype_that_cannot_be_described_raises_on_every_rank(world, collective):
    too_long = np.dtype([(f"field_number_{i}", "<f8") for i in range(40)])
    x = np.zeros((world.size, 2), too_long) if world.rank == 0 else None
    with pytest.raises(mpicoll.MpicollError, match="cannot be described"):
        if collective == "broadcast":
            world.broadcast(x, root=0)
        elif collective == "scatter":
            world.scatter(x, root=0)
        else:
            world.scatter_v(x, [world.size] + [0] * (world.size - 1), root=0)
    _next_call_is_right(world)


@pytest.mark.parametrize("algorithm", [*REGISTRY["scatter"], "native"])
@pytest.mark.parametrize("theirs", [">i8", ">i2", "<i4"])
def test_scatter_into_an_out_of_another_dtype_is_refused_there_only(world, algorithm, theirs):
    """The root sends >i4 (no header code); rank 1 gives out= of another dtype."""
    if world.size < 2:
        pytest.skip("needs a receiving rank")
    x = np.arange(world.size * 4, dtype=">i4").reshape(world.size, 4)
    if world.rank == 1:
        with pytest.raises(mpicoll.InvalidArgumentError, match="out: expected shape"):
            world.scatter(None, root=0, out=np.zeros(4, theirs), algorithm=algorithm)
    else:
        got = world.scatter(x if world.rank == 0 else None, root=0, algorithm=algorithm)
        np.testing.assert_array_equal(got, x[world.rank])
    _next_call_is_right(world)


@pytest.mark.parametrize("algorithm", [*REGISTRY["broadcast"], "native"])
def test_broadcast_into_a_buffer_of_another_dtype_is_refused_there_only(world, algorithm):
    if world.size < 2:
        pytest.skip("needs a receiving rank")
    x = np.arange(3000, dtype=">i4")
    if world.rank == 1:
        with pytest.raises(mpicoll.InvalidArgumentError, match="the root sends shape"):
            world.broadcast(np.zeros(3000, ">i8"), root=0, algorithm=algorithm)
    else:
        got = world.broadcast(x if world.rank == 0 else np.zeros(3000, ">i4"), root=0,
                              algorithm=algorithm)
        np.testing.assert_array_equal(got, x)
    _next_call_is_right(world)


# -- 4. strided out= ------------------------------------------------------------------------


def _strided(shape, dtype=np.float64):
    """(a view of ``shape`` that is every other column of a bigger array, the array)."""
    whole = np.full((*shape, 2), -7, dtype)
    return whole[..., 0], whole


OUT_CASES = [(c, a) for c in ("scatter", "gather", "all_gather", "reduce", "all_reduce",
                              "reduce_scatter", "all_to_all")
             for a in [*REGISTRY[c], "native"]]


@pytest.mark.parametrize(("collective", "algorithm"), OUT_CASES)
def test_a_strided_out_gets_the_result_and_nothing_else(world, collective, algorithm):
    p, r = world.size, world.rank
    x = np.arange(p * 6, dtype=np.float64).reshape(p, 6) + 100 * r
    stacked = np.stack([np.arange(p * 6, dtype=np.float64).reshape(p, 6) + 100 * k
                        for k in range(p)])
    if collective == "scatter":
        want, shape = stacked[0][r], (6,)
        call = lambda out: world.scatter(x if r == 0 else None, root=0, out=out,  # noqa: E731
                                         algorithm=algorithm)
    elif collective == "gather":
        want, shape = (stacked if r == 0 else None), (p, p, 6)
        call = lambda out: world.gather(x, root=0, out=out if r == 0 else None,  # noqa: E731
                                        algorithm=algorithm)
    elif collective == "all_gather":
        want, shape = stacked, (p, p, 6)
        call = lambda out: world.all_gather(x, out=out, algorithm=algorithm)  # noqa: E731
    elif collective == "reduce":
        want, shape = (stacked.sum(0) if r == 0 else None), (p, 6)
        call = lambda out: world.reduce(x, root=0, out=out if r == 0 else None,  # noqa: E731
                                        algorithm=algorithm)
    elif collective == "all_reduce":
        want, shape = stacked.sum(0), (p, 6)
        call = lambda out: world.all_reduce(x, out=out, algorithm=algorithm)  # noqa: E731
    elif collective == "reduce_scatter":
        want, shape = stacked.sum(0)[r], (6,)
        call = lambda out: world.reduce_scatter(x, out=out, algorithm=algorithm)  # noqa: E731
    else:
        want, shape = stacked[:, r], (p, 6)
        call = lambda out: world.all_to_all(x, out=out, algorithm=algorithm)  # noqa: E731
    out, whole = _strided(shape)
    got = call(out)
    if want is None:
        assert got is None
    else:
        assert got is out
        np.testing.assert_array_equal(out, want)
        assert (whole[..., 1] == -7).all(), "the strided out's neighbours were written"
    _next_call_is_right(world)


@pytest.mark.parametrize("algorithm", [*REGISTRY["all_reduce"], "native"])
def test_a_strided_in_place_all_reduce(world, algorithm):
    x, whole = _strided((5,))
    x[...] = np.arange(5) + world.rank
    got = world.all_reduce(x, out=x, algorithm=algorithm)
    assert got is x
    np.testing.assert_array_equal(x, world.size * np.arange(5) + sum(range(world.size)))
    assert (whole[:, 1] == -7).all()


# -- 5, 6, 11. asynchronous calls: threads, check mode, refusals at submission -------------


def _slow_sum(a, b, out):
    time.sleep(0.5)  # every rank combines in a ring: the call stays pending a while
    np.add(a, b, out=out)


SLOW = mpicoll.Op(_slow_sum, name="slow_sum")


def test_an_async_call_from_a_second_thread_while_the_first_has_calls_pending_is_refused(world):
    if world.size < 2:
        pytest.skip("one rank combines nothing: no call stays pending")
    comm = world.dup()
    pending = comm.all_reduce(np.ones(4), SLOW, algorithm="ring", async_op=True)
    refused = []

    def second_thread():
        try:
            comm.all_reduce(np.full(4, 5.0), async_op=True)
        except mpicoll.ConcurrentCallError as exc:
            refused.append(exc)

    thread = threading.Thread(target=second_thread)
    thread.start()
    thread.join()
    assert len(refused) == 1 and "another thread's asynchronous calls" in str(refused[0])
    np.testing.assert_array_equal(pending.wait(), np.full(4, float(world.size)))
    # the refused call was numbered: the next calls pair with the other ranks' next ones
    got = comm.all_reduce(np.full(3, world.rank + 1.0), async_op=True).wait()
    np.testing.assert_array_equal(got, np.full(3, world.size * (world.size + 1) / 2))
    _next_call_is_right(comm)
    comm.free()


def test_threads_that_take_turns_may_share_async_calls(world):
    """The rule is about pending calls: a thread may submit once the other's are done."""
    comm = world.dup()
    results = []

    def turn(value):
        results.append(comm.all_reduce(np.full(2, value), async_op=True).wait())

    for value in (1.0, 2.0, 3.0):
        thread = threading.Thread(target=turn, args=(value,))
        thread.start()
        thread.join()
    assert [r[0] for r in results] == [world.size * v for v in (1.0, 2.0, 3.0)]
    comm.free()


def test_a_thread_may_call_once_the_others_wait_returned_while_its_callbacks_run(world):
    """wait() returns once the call is done: the thread it hands the Communicator to may
    call at once, while the finished call's done callbacks still run (a slow one on
    rank 0 here), not be refused on that rank alone (the others then waited for it)."""
    import time

    comm = world.dup()
    first = comm.all_reduce(np.ones(2), async_op=True)
    if comm.rank == 0:
        first.add_done_callback(lambda _: time.sleep(0.5))
    first.wait()
    results = []

    def other():
        results.append(comm.all_reduce(np.full(2, 2.0), async_op=True).wait())

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert [r.tolist() for r in results] == [[2.0 * world.size] * 2]
    comm.free()


def test_check_mode_one_rank_async_the_others_blocking_raises_everywhere():
    if mpicoll.Communicator().size < 2:
        pytest.skip("needs two ranks")
    comm = mpicoll.Communicator(check=True)
    with pytest.raises(mpicoll.MismatchError, match=r"all_reduce\(async_op=True\)"):
        if comm.rank == 0:
            comm.all_reduce(np.ones(3), async_op=True).wait()
        else:
            comm.all_reduce(np.ones(3))
    _next_call_is_right(comm)
    got = comm.all_reduce(np.ones(3), async_op=True).wait()  # agreed: the progress comm is made
    np.testing.assert_array_equal(got, np.full(3, float(comm.size)))
    comm.free()


def test_check_mode_an_async_call_refused_at_submission_on_one_rank_raises_everywhere():
    comm = mpicoll.Communicator(check=True)
    comm.all_reduce(np.ones(2), async_op=True).wait()
    stream = "not a stream" if comm.rank == 0 else None
    with pytest.raises(mpicoll.MpicollError, match="stream: expected a cupy.cuda.Stream"):
        comm.all_reduce(np.full(2, 10.0), stream=stream, async_op=True).wait()
    got = comm.all_reduce(np.full(2, 1.0), async_op=True).wait()
    np.testing.assert_array_equal(got, np.full(2, float(comm.size)))
    _next_call_is_right(comm)
    comm.free()


def test_check_mode_names_the_callers_line_of_an_async_call():
    comm = mpicoll.Communicator(check=True)
    work = comm.all_reduce(np.ones(2), async_op=True)
    work.wait()
    sites = {r.call.site for r in comm._progress.comm._watch.ring if r.start}
    assert any(site.endswith(f"test_mpi_trust.py:{_line_of('work = comm.all_reduce')}")
               for site in sites), sites
    comm.free()


def _line_of(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


# -- 7. check mode compares counts that several ranks give -------------------------------


@pytest.mark.parametrize("algorithm", [*REGISTRY["scatter"], "native"])
def test_check_mode_scatter_v_with_one_ranks_counts_different_raises_everywhere(algorithm):
    comm = mpicoll.Communicator(check=True)
    if comm.size < 2:
        comm.free()
        pytest.skip("needs a rank besides the root")
    counts = [1] * comm.size
    mine = [2, 0, *counts[2:]] if comm.rank == 1 else counts
    x = np.arange(comm.size, dtype=np.float64) if comm.rank == 0 else None
    with pytest.raises(mpicoll.MismatchError, match="counts"):
        comm.scatter_v(x, mine, root=0, algorithm=algorithm)
    got = comm.scatter_v(x, counts, root=0, algorithm=algorithm)  # the next call is right
    np.testing.assert_array_equal(got, [float(comm.rank)])
    comm.free()


@pytest.mark.parametrize("form", ["call", "plan"])
@pytest.mark.parametrize("algorithm", [*REGISTRY["reduce_scatter"], "native", "auto"])
def test_reduce_scatter_counts_into_each_ranks_own_block_of_x_even_an_empty_one(world,
                                                                               algorithm, form):
    """MPI's idiom: out= this rank's own block of x, rank 0's empty (count 0: a view at
    x's own address, which MPI refuses beside x as its send buffer, for 0 elements too):
    right on every rank, by the call and by a plan, never one rank's MPI error and the
    others left waiting."""
    p, r = world.size, world.rank
    counts = [0] + [2] * (p - 1)
    bounds = np.cumsum([0, *counts])
    x = np.arange(float(sum(counts))) + r
    out = x[bounds[r]:bounds[r + 1]]
    want = (np.arange(float(sum(counts))) * p + sum(range(p)))[bounds[r]:bounds[r + 1]]
    if form == "call":
        got = world.reduce_scatter(x, "sum", counts=counts, out=out, algorithm=algorithm)
    else:
        with world.reduce_scatter_init(x, "sum", counts=counts, out=out,
                                       algorithm=algorithm) as plan:
            got = plan()
    np.testing.assert_array_equal(got, want)
    _next_call_is_right(world)


@pytest.mark.parametrize("check", [False, True])  # (check mode: every call the whole path)
def test_ctrl_c_landing_anywhere_in_calls_never_leaves_the_communicator_taken(world, check):
    """KeyboardInterrupt (a SIGINT handler's) landing at any point of repeated calls
    (the decided path, MPI's own call, a persistent plan's start): the Communicator's turn
    is given back and a plan's request never stays started, so the next calls run (not
    'another thread is in a call' for good, nor MPI's 'Invalid MPI_Request'); a call it
    ended mid-way says so in the flight recorder (never "done": the others may wait in it)."""
    import os
    import signal

    if world.size > 1:
        pytest.skip("one process: an interrupt mid-call leaves the other ranks waiting")
    comm = world.dup(check=check)
    x, out = np.ones(4), np.zeros(4)
    plan = comm.all_reduce_init(x, out=out, algorithm="native")
    calls = [lambda: comm.all_reduce(x), lambda: comm.all_reduce(x, algorithm="ring"),
             lambda: comm.all_reduce(x, out=out), plan]
    inside, stop, interrupts, states = [False], threading.Event(), [0], set()

    def handler(signum, frame):
        if inside[0]:
            raise KeyboardInterrupt

    def ticker():
        while not stop.is_set():
            time.sleep(0.0002)
            os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, handler)
    thread = threading.Thread(target=ticker, daemon=True)
    thread.start()
    try:
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            for call in calls:
                try:
                    inside[0] = True
                    call()
                    inside[0] = False
                except KeyboardInterrupt:
                    inside[0] = False
                    interrupts[0] += 1
                    states.add(comm._watch.current.state.split(" (")[0])
    finally:
        inside[0] = False
        stop.set()
        thread.join()
        signal.signal(signal.SIGINT, previous)
    assert interrupts[0] > 0
    # (the call's own entry where it landed mid-call; the last call's, done, elsewhere)
    assert "failed: interrupted by KeyboardInterrupt on this rank" in states, states
    assert states <= {"failed: interrupted by KeyboardInterrupt on this rank", "done"}, states
    for call in calls:
        call()
    assert plan().tolist() == [1.0] * 4 and comm.all_reduce(x).tolist() == [1.0] * 4
    plan.free()
    comm.free()


@pytest.mark.parametrize("call", ["whole path", "decided", "plan"])
def test_a_ctrl_c_as_a_call_ends_leaves_it_done_and_untimed(world, monkeypatch, call):
    """A KeyboardInterrupt raised as the clock of a call's end returns (the call had
    ended): its entry says done, not running, and the watchdog no longer times it (it
    would end the job if the rank then did something else past its timeout)."""
    if world.size > 1:
        pytest.skip("one process: an interrupt mid-call leaves the other ranks waiting")
    import mpicoll.observe.recorder
    import mpicoll.pipeline.entry

    comm = world.dup()
    x = np.ones(4)
    plan = comm.all_reduce_init(x, algorithm="ring") if call == "plan" else None
    run = {"whole path": lambda: comm.all_reduce(x, algorithm="recursive_doubling"),
           "decided": lambda: comm.all_reduce(x), "plan": plan}[call]
    if call != "whole path":
        run()  # (decided since, or the plan settled)
        run()
    real, readings = time.monotonic, []

    def interrupting_clock() -> float:  # (a call reads it twice: its start, its end)
        readings.append(real())
        if len(readings) == 2:
            raise KeyboardInterrupt
        return readings[-1]

    for module in (mpicoll.observe.recorder, mpicoll.pipeline.entry):
        monkeypatch.setattr(module, "now", interrupting_clock)
    with pytest.raises(KeyboardInterrupt):
        run()
    monkeypatch.undo()
    assert len(readings) == 2
    assert comm._watch.started == 0.0
    assert comm._watch.current.state == "done", comm._watch.current.state
    np.testing.assert_array_equal(run(), x)
    if plan is not None:
        plan.free()
    comm.free()


@pytest.mark.parametrize("make", [
    lambda comm, x, out: comm.all_reduce_init(x, out=out, algorithm="native"),  # Start, Wait
    lambda comm, x, out: comm.all_reduce_init(x, "avg", out=out, algorithm="native"),  # done()
    lambda comm, x, out: comm.all_gather_init(x[:1], out=out[:comm.size].reshape(-1, 1),  # before()
                                              algorithm="native"),
], ids=["all_reduce", "all_reduce_avg", "all_gather"])
def test_a_start_ctrl_c_left_running_is_ended_by_the_next_start(world, make):
    """Ctrl-C landing after a plan's MPI_Start, then again in the wait that ends it (the
    case a SIGINT every 0.2 ms met once in CI), leaves MPI's persistent request running:
    the next start, plan() or start(), ends it first, never MPI's 'Persistent request ...
    is already active'. Every rank leaves it so here: the starts still pair up."""
    comm = world.dup()
    x, out = np.ones(8), np.zeros(8)
    plan = make(comm, x, out)
    want = plan().copy()  # (the first starts decide and make the persistent request)
    for _ in range(2):
        assert plan().tolist() == want.tolist()
    assert plan._request is not None, "no persistent request made"
    for form in ("plan()", "start()"):
        plan._request.Start()  # as the interrupted start left it: started, never waited
        plan._bound.pending[0] = True  # (its MPI_Start was made: the plan knows so)
        if form == "plan()":
            got = plan()
        else:
            plan.start()
            got = plan.wait()
        assert got.tolist() == want.tolist(), form
    assert plan().tolist() == want.tolist() and comm.all_reduce(np.ones(2)).tolist() == \
        [float(comm.size)] * 2
    plan.free()
    comm.free()


@pytest.mark.parametrize("count", [8, 4096])  # (in the header's packet, and by an algorithm)
def test_a_dtype_a_receiver_cannot_read_is_refused_there_after_taking_part(world, monkeypatch,
                                                                         count):
    """A receiver whose ml_dtypes lacks the root's type (an older version: its code is
    known, the type is not): broadcast, scatter and scatter_v with x=None refuse it there,
    after taking part, never another dtype of that code; the next calls are right."""
    import ml_dtypes

    import mpicoll.buffers as buffers

    if world.size < 2:
        pytest.skip("needs a receiver")
    int2 = np.dtype(ml_dtypes.int2)
    code = buffers.dtype_code(int2)
    if world.rank == 1:  # (this rank's ml_dtypes has no int2)
        table = list(buffers.DTYPE_TABLE)
        table[code] = None
        monkeypatch.setattr(buffers, "DTYPE_TABLE", tuple(table))
    x = np.arange(count).astype(int2) if world.rank == 0 else None
    rows = np.zeros((world.size, count), int2) if world.rank == 0 else None
    calls = {
        "broadcast": lambda: world.broadcast(x, 0),
        "scatter": lambda: world.scatter(rows, 0),
        "scatter_v": lambda: world.scatter_v(
            rows.reshape(-1) if rows is not None else None,
            [count] * world.size if world.rank == 0 else None, 0),
    }
    for name, call in calls.items():
        if world.rank == 1:
            with pytest.raises(mpicoll.UnsupportedDtypeError, match="ml_dtypes' int2"):
                call()
        else:
            got = call()
            assert got.dtype == int2, name
        np.testing.assert_array_equal(world.all_reduce(np.ones(2)), np.full(2, world.size))


def test_a_monitored_barrier_with_no_limit_on_rank_0_is_never_ended_by_another_ranks_watchdog():
    """Rank 0's Communicator has no timeout (0), the others 1 s; no timeout=: every rank
    waits as rank 0 does, without limit, so a rank 2.5 s late ends the barrier in time on
    every rank, and no rank's watchdog ends the job meanwhile."""
    import time

    from mpi4py import MPI

    if MPI.COMM_WORLD.size < 3:
        pytest.skip("needs a waiting rank besides rank 0 and the late one")
    rank = MPI.COMM_WORLD.rank
    comm = mpicoll.Communicator(MPI.COMM_WORLD, timeout=0 if rank == 0 else 1)
    if rank == comm.size - 1:
        time.sleep(2.5)
    comm.monitored_barrier()
    np.testing.assert_array_equal(comm.all_reduce(np.ones(2)), np.full(2, comm.size))
    comm.free()


def _unaligned(count: int, dtype: str, fill: float, aligned: bool = False) -> np.ndarray:
    """A writeable, contiguous array at an odd address (a memmap at an odd offset): NumPy
    gives its buffer the format '=d' (standard size, no alignment), which mpi4py maps to
    no MPI datatype. ``aligned``: an ordinary array instead."""
    dtype = np.dtype(dtype)
    x = np.empty(count, dtype) if aligned else \
        np.frombuffer(bytearray(count * dtype.itemsize + 1), dtype, count=count, offset=1)
    x[...] = fill
    return x


@pytest.mark.parametrize("collective", ["all_reduce", "reduce", "reduce_scatter", "scan",
                                        "exscan"])
@pytest.mark.parametrize("algorithm", ["native", "auto"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "int32", "int64", "complex64"])
def test_unaligned_arrays_are_reduced_by_the_mpi_library_too(world, collective, algorithm,
                                                             dtype):
    """MPI's own reductions name the datatype of every buffer, so an unaligned array is
    reduced as an aligned one (mpi4py read its buffer's format, '=d', and raised KeyError
    on every rank, or on the one rank whose array it was while the others waited: here
    rank 0's alone is unaligned, then every rank's), its out= too, and through a plan."""
    comm, size, rank = world, world.size, world.rank
    rows = size if collective == "reduce_scatter" else 1
    for only_rank_0 in (True, False):
        aligned = only_rank_0 and rank != 0
        x = _unaligned(rows * 3, dtype, rank + 1, aligned).reshape(rows, 3) \
            if collective == "reduce_scatter" else _unaligned(3, dtype, rank + 1, aligned)
        upto = rank if collective == "exscan" else rank + 1 if collective == "scan" else size
        want = np.full(3, sum(range(1, upto + 1)), dtype)
        got = _reduce(comm, collective, x, "sum", algorithm)
        if collective == "reduce" and rank != 0 or collective == "exscan" and rank == 0:
            assert got is None
        else:
            np.testing.assert_array_equal(got, want)
        if collective == "all_reduce":
            out = _unaligned(3, dtype, 0, aligned)
            assert comm.all_reduce(x, out=out, algorithm=algorithm) is out
            np.testing.assert_array_equal(out, want)
            with comm.all_reduce_init(x, algorithm=algorithm) as plan:
                np.testing.assert_array_equal(plan(), want)
                np.testing.assert_array_equal(plan(), want)
    _next_call_is_right(comm)


def test_a_message_longer_than_its_buffer_in_a_steps_waitall_names_its_sender(world):
    """A step that waits for several receives at once (binomial gather's children): one
    message longer than its buffer raises as a single receive's does, naming the sender
    and the buffer's bytes (it raised MPI's "See the MPI_ERROR field in MPI_Status")."""
    if world.size < 2:
        pytest.skip("needs two ranks")
    from mpicoll.transport.mpi import MPITransport

    comm = world.transport.comm.Dup()
    try:
        t = MPITransport(comm)
        t.begin()
        if world.rank == 1:
            t.send(np.zeros(8), 0)
            t.send(np.zeros(2), 0)
        elif world.rank == 0:
            first, second = np.zeros(4), np.zeros(4)
            requests = [t.irecv(first, 1), t.irecv(second, 1)]
            with pytest.raises(mpicoll.CollectiveError,
                               match="message from rank 1 is longer than the 32 bytes"):
                t.waitall(requests)
            requests[1].Wait()  # (the second message, into its buffer)
        comm.Barrier()
    finally:
        comm.Free()
