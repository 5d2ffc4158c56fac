"""Agreement by construction, on the local backend (ranks as threads), for every algorithm.

One rank wrong, then the next call: a rank that refuses where it receives takes part
with workspace (the others' results are right) and raises; a refusal every rank sees
raises everywhere before any message; in check mode a refusal anywhere raises on every
rank. After each, the next call on the same Communicator is right. Read-only inputs and
the in-place forms work on every algorithm.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import mpicoll
from mpicoll.algorithms import REGISTRY
from mpicoll.local import run_local

CASES = [(c, a) for c in mpicoll.COLLECTIVES if c != "barrier" for a in REGISTRY[c]]
SIZE = 4


def _next_call_is_right(comm) -> None:
    got = comm.all_reduce(np.full(5, comm.rank + 1.0), algorithm="ring")
    np.testing.assert_array_equal(got, np.full(5, comm.size * (comm.size + 1) / 2))


def _bad_out(shape, dtype=np.float64):
    """An out= of the wrong dtype (same shape): only this rank can see the fault."""
    return np.empty(shape, np.float32 if dtype == np.float64 else np.float64)


def _call(comm, collective, algorithm, x, out, root):
    if collective == "broadcast":
        return comm.broadcast(x, root, algorithm=algorithm)
    if collective in ("scatter", "gather", "reduce"):
        return getattr(comm, collective)(x, root=root, algorithm=algorithm, out=out)
    return getattr(comm, collective)(x, algorithm=algorithm, out=out)


def _case(collective, rank, size):
    """(x for this rank, the expected result on this rank, the result's shape)."""
    rows = np.arange(size * 6.0).reshape(size, 6) + 100 * rank
    flat = np.arange(6.0) + 10 * rank
    if collective == "broadcast":
        return np.arange(7.0) * 3, np.arange(7.0) * 3, (7,)
    if collective == "scatter":
        return rows if rank == 0 else None, np.arange(6.0) + 6 * rank, (6,)
    if collective == "gather":
        return flat, np.stack([np.arange(6.0) + 10 * r for r in range(size)]), (size, 6)
    if collective == "all_gather":
        return flat, np.stack([np.arange(6.0) + 10 * r for r in range(size)]), (size, 6)
    if collective == "reduce":
        return flat, sum(np.arange(6.0) + 10 * r for r in range(size)), (6,)
    if collective == "all_reduce":
        return flat, sum(np.arange(6.0) + 10 * r for r in range(size)), (6,)
    if collective == "reduce_scatter":
        total = sum(np.arange(size * 6.0).reshape(size, 6) + 100 * r for r in range(size))
        return rows, total[rank], (6,)
    if collective == "all_to_all":
        return rows, np.stack([np.arange(size * 6.0).reshape(size, 6)[rank] + 100 * r
                               for r in range(size)]), (size, 6)
    if collective in ("scan", "exscan"):  # exscan's rank 0: None
        upto = rank + 1 if collective == "scan" else rank
        return flat, sum(np.arange(6.0) + 10 * r for r in range(upto)) if upto else None, (6,)
    raise AssertionError(collective)


@pytest.mark.parametrize(("collective", "algorithm"), CASES)
def test_one_rank_refusing_where_it_receives_then_the_next_call(collective, algorithm):
    """The refusing rank (the root where only the root receives) takes part with
    workspace: the others' results are right, it raises, and the next call is right."""
    receives_at_root = collective in ("gather", "reduce")
    refuser = 0 if receives_at_root else 2

    def body(comm):
        x, expected, shape = _case(collective, comm.rank, comm.size)
        if comm.rank == refuser:
            bad = _bad_out(shape)
            with pytest.raises(mpicoll.InvalidArgumentError):
                if collective == "broadcast":  # a non-root's receive buffer of another shape
                    comm.broadcast(np.empty(3), 0, algorithm=algorithm)
                else:
                    _call(comm, collective, algorithm, x, bad, 0)
        else:
            got = _call(comm, collective, algorithm, x, None, 0)
            if receives_at_root:
                assert got is None
            else:
                np.testing.assert_array_equal(got, expected)
        _next_call_is_right(comm)
        return True

    assert run_local(SIZE, body, timeout=10) == [True] * SIZE


@pytest.mark.parametrize(("collective", "algorithm"), CASES)
def test_read_only_inputs(collective, algorithm):
    def body(comm):
        x, expected, _ = _case(collective, comm.rank, comm.size)
        if collective == "broadcast" and comm.rank != 0:
            x = None  # a receive buffer: read-only is refused there
        if x is not None:
            x = np.frombuffer(x.tobytes(), x.dtype).reshape(x.shape)  # read-only memory
            assert not x.flags.writeable
        before = None if x is None else x.copy()
        got = _call(comm, collective, algorithm, x, None, 0)
        if got is not None:
            np.testing.assert_array_equal(got, expected)
        if x is not None:
            np.testing.assert_array_equal(x, before)
        return True

    assert run_local(SIZE, body, timeout=10) == [True] * SIZE


@pytest.mark.parametrize("algorithm", list(REGISTRY["scatter"]))
@pytest.mark.parametrize("root", [0, 2])
def test_scatter_in_place_at_the_root(algorithm, root):
    def body(comm):
        x = np.arange(comm.size * 5.0).reshape(comm.size, 5) if comm.rank == root else None
        out = x[root] if comm.rank == root else None
        got = comm.scatter(x, root, algorithm=algorithm, out=out)
        np.testing.assert_array_equal(got, np.arange(5.0) + 5 * comm.rank)
        if comm.rank == root:
            assert got is out
        # an out that overlaps x by one element, not x's own row
        y = np.arange(comm.size * 5.0 + 1) if comm.rank == root else None
        rows = y[:-1].reshape(comm.size, 5) if comm.rank == root else None
        out = y[4:9] if comm.rank == root else None
        got = comm.scatter(rows, root, algorithm=algorithm, out=out)
        np.testing.assert_array_equal(got, np.arange(5.0) + 5 * comm.rank)
        return True

    assert run_local(SIZE, body, timeout=10) == [True] * SIZE


@pytest.mark.parametrize("collective", ["broadcast", "all_reduce", "all_gather", "gather",
                                        "all_to_all", "reduce_scatter", "all_gather_v"])
def test_the_same_bad_input_everywhere_raises_everywhere_then_the_next_call(collective):
    def body(comm):
        with pytest.raises(mpicoll.MpicollError):
            if collective == "broadcast":
                comm.broadcast({"a": 1}, root=0)
            else:
                getattr(comm, collective)({"a": 1})
        _next_call_is_right(comm)
        return True

    assert run_local(SIZE, body, timeout=10) == [True] * SIZE


CHECKED = {
    "broadcast": lambda c, bad: c.broadcast([1, 2] if bad else (np.ones(3) if c.rank == 0 else None)),
    "scatter": lambda c, bad: c.scatter(np.ones((c.size, 2)) if c.rank == 0 else None,
                                        out=np.empty(5) if bad else None),
    "gather": lambda c, bad: c.gather(np.ones(2) if not bad else "x"),
    "all_gather": lambda c, bad: c.all_gather(np.ones(2), out=np.empty(3) if bad else None),
    "reduce": lambda c, bad: c.reduce(np.ones(2), op="bogus" if bad else "sum"),
    "all_reduce": lambda c, bad: c.all_reduce(np.ones(2), out=np.empty(2, "f4") if bad else None),
    "reduce_scatter": lambda c, bad: c.reduce_scatter(np.ones((c.size + bad, 2))),
    "all_to_all": lambda c, bad: c.all_to_all(np.ones((c.size, 2)), algorithm="rnig" if bad else "auto"),
    "barrier": lambda c, bad: c.barrier(algorithm="rnig" if bad else "auto"),
    "all_gather_v": lambda c, bad: c.all_gather_v(np.float64(1) if bad else np.ones((2, 2))),
    "gather_v": lambda c, bad: c.gather_v(np.ones((2, 2)), root=99 if bad else 0),
    "scatter_v": lambda c, bad: c.scatter_v(np.ones((c.size, 2)) if c.rank == 0 else None,
                                            [1] * c.size if not bad else [1], root=0),
    "all_to_all_v": lambda c, bad: c.all_to_all_v(np.ones((c.size, 2)), [1] * (c.size - bad)),
    "scan": lambda c, bad: c.scan(np.ones(2), out=np.empty(3) if bad else None),
    "exscan": lambda c, bad: c.exscan(np.ones(2), op=mpicoll.Op(np.add) if bad else "sum"),
}


@pytest.mark.parametrize("collective", sorted(CHECKED))
def test_check_mode_one_rank_refusing_raises_on_every_rank(collective):
    """The fingerprint exchange comes before any check that can raise: a refusal on rank
    1 alone raises on every rank (rank 1 its own error, the others a RemoteError naming
    rank 1 and its call site), and the next call is right."""
    def body(comm):
        bad = comm.rank == 1
        with pytest.raises(mpicoll.MpicollError) as caught:
            CHECKED[collective](comm, bad)
        if not bad:
            assert isinstance(caught.value, (mpicoll.RemoteError, mpicoll.MismatchError)), caught.value
            assert "rank 1" in str(caught.value) and "test_agreement.py" in str(caught.value)
        _next_call_is_right(comm)
        return True

    assert run_local(SIZE, body, timeout=10, check=True) == [True] * SIZE


def test_check_mode_names_both_collectives_and_sites_of_a_mismatch():
    def body(comm):
        with pytest.raises(mpicoll.MismatchError) as caught:
            if comm.rank == 2:
                comm.all_gather(np.ones(3))
            else:
                comm.all_reduce(np.ones(3))
        text = str(caught.value)
        assert "rank 2 differs in collective" in text and "all_gather" in text
        assert "all_reduce" in text and "test_agreement.py" in text
        _next_call_is_right(comm)
        return True

    assert run_local(3, body, timeout=10, check=True) == [True] * 3


def test_gather_of_too_many_dimensions_raises_everywhere():
    def body(comm):
        with pytest.raises(mpicoll.InvalidArgumentError, match="dimensions"):
            comm.gather(np.ones((1,) * 64), root=0)
        _next_call_is_right(comm)
        return True

    assert run_local(SIZE, body, timeout=10) == [True] * SIZE


def test_reduce_with_a_bad_out_at_the_root_then_a_correct_reduce():
    """Reproducer 2: the previous call's data never reaches the next call."""
    def body(comm):
        x = np.full(3, 100.0)
        if comm.rank == 0:
            with pytest.raises(mpicoll.InvalidArgumentError):
                comm.reduce(x, root=0, out=np.empty(3, np.float32))
        else:
            comm.reduce(x, root=0)
        got = comm.reduce(np.full(3, 100.0), root=0)
        if comm.rank == 0:
            np.testing.assert_array_equal(got, np.full(3, 100.0 * comm.size))
        return True

    assert run_local(SIZE, body, timeout=10) == [True] * SIZE


def test_a_lone_input_refusal_makes_the_next_call_agree_first():
    """A rank that refuses its input alone raises at once; its next call first checks
    that the others refused the same call: here they did not (they wait in that call),
    so the local world's timeout ends it on every rank, never a mismatched result."""
    def body(comm):
        if comm.rank == 1:
            with pytest.raises(mpicoll.InvalidArgumentError):
                comm.all_reduce("not an array")
            comm.all_reduce(np.ones(2))  # waits for the others: ends in the timeout
        else:
            comm.all_reduce(np.ones(2))
        return True

    with pytest.raises(mpicoll.AbortedError):
        run_local(3, body, timeout=2)


def _refusals_while_a_call_runs(comm, attempt):
    """Run a ring all_reduce whose op waits until another thread has tried ``attempt()``
    on ``comm``; return (the all_reduce's result, the ConcurrentCallError messages)."""
    inside, release, refused = threading.Event(), threading.Event(), []
    slow = mpicoll.Op(lambda a, b, out: (inside.set(), release.wait(5), np.add(a, b, out)),
                      name="slow")

    def other():
        inside.wait(5)
        try:
            attempt()
        except mpicoll.ConcurrentCallError as exc:
            refused.append(str(exc))
        finally:
            release.set()

    thread = threading.Thread(target=other)
    thread.start()
    got = comm.all_reduce(np.ones(2), op=slow, algorithm="ring")  # every rank reduces
    thread.join()
    return got, refused


def test_two_threads_on_one_communicator_raise_and_dup_gives_each_its_own():
    def body(comm):
        got, errors = _refusals_while_a_call_runs(comm, lambda: comm.all_reduce(np.ones(2)))
        np.testing.assert_array_equal(got, [comm.size] * 2)
        if comm.size > 1:
            assert errors and "all_reduce (call #1)" in errors[0] and "comm.dup()" in errors[0]
        # dup: a thread of its own per Communicator, both at once
        other = comm.dup()
        results = {}
        worker = threading.Thread(target=lambda: results.update(
            b=other.all_gather(np.full(2, comm.rank), algorithm="ring")))
        worker.start()
        results["a"] = comm.all_reduce(np.ones(3), algorithm="ring")
        worker.join()
        np.testing.assert_array_equal(results["a"], [comm.size] * 3)
        np.testing.assert_array_equal(results["b"], np.repeat(np.arange(comm.size), 2).reshape(-1, 2))
        return True

    assert run_local(3, body, timeout=10) == [True] * 3


@pytest.mark.parametrize("value, expected", [("1", True), ("TRUE", True), ("yes", True),
                                             ("On", True), ("0", False), ("false", False),
                                             ("NO", False), ("off", False)])
def test_mpicoll_check_values(monkeypatch, value, expected):
    monkeypatch.setenv("MPICOLL_CHECK", value)
    assert run_local(2, lambda comm: comm.check) == [expected] * 2


def test_mpicoll_check_malformed_is_refused_on_every_rank(monkeypatch):
    monkeypatch.setenv("MPICOLL_CHECK", "maybe")
    with pytest.raises(mpicoll.ConfigError, match="MPICOLL_CHECK"):
        run_local(2, lambda comm: comm.check)


def test_check_mode_on_one_rank_only_is_refused_on_every_rank():
    """A setting of the whole job on some ranks only: a ConfigError and a MismatchError
    both (SettingMismatchError), whichever the caller's except clause names."""
    def body(comm):
        with pytest.raises(mpicoll.SettingMismatchError, match="check mode is on for rank") \
                as raised:
            mpicoll.Communicator(comm.transport.duplicate(), "local", check=comm.rank == 0)
        assert isinstance(raised.value, mpicoll.ConfigError)
        assert isinstance(raised.value, mpicoll.MismatchError)
        return True

    assert run_local(3, body, timeout=10) == [True] * 3


@pytest.mark.parametrize("text, fault", [
    ("{not json", "tuning file"),
    ('{"mpicoll_tuning": 1, "tables": {"4": {"all_reduce": [{"below": 8, "algorithm": "rnig"}]}}}',
     "unknown algorithm 'rnig'"),
    ('{"mpicoll_tuning": 1, "tables": {"4": {"all_reduce": "ring"}}}', "expected a list"),
    ('{"mpicoll_tuning": 2, "tables": {}}', "version 1"),
])
def test_a_corrupt_tuning_file_is_refused_on_every_rank(tmp_path, monkeypatch, text, fault):
    path = tmp_path / "tuning.json"
    path.write_text(text)
    monkeypatch.setenv("MPICOLL_TUNING", str(path))
    with pytest.raises(mpicoll.ConfigError, match=fault) as caught:
        run_local(3, lambda comm: comm.size)
    assert str(path) in str(caught.value)


def test_a_corrupt_model_file_is_refused_and_a_missing_one_falls_back(tmp_path, monkeypatch):
    path = tmp_path / "model.json"
    path.write_text('{"alpha": "fast", "beta": 1e-9, "gamma": 1e-9}')
    monkeypatch.setenv("MPICOLL_MODEL", str(path))
    with pytest.raises(mpicoll.ConfigError, match="model file .*alpha"):
        run_local(2, lambda comm: comm.size)
    monkeypatch.setenv("MPICOLL_MODEL", str(tmp_path / "missing.json"))
    assert run_local(2, lambda comm: comm.auto_algorithm("all_reduce", 8)) == ["recursive_doubling"] * 2


def test_workspace_scopes_never_overlap_and_are_reused():
    from mpicoll.transport.local import LocalWorld

    t = LocalWorld(1).endpoint(0)
    t.begin()
    call_level = t.take(10, np.float64)  # the pipeline's: valid for the whole call
    call_level[...] = 7
    with t.workspace() as ws:
        a = ws.take(100, np.float64)
        with t.workspace() as inner:  # an algorithm called by another
            b = inner.take(50, np.int32)
            assert not np.shares_memory(a, b) and not np.shares_memory(b, call_level)
        with t.workspace() as inner:  # the next scope reuses the memory b had
            c = inner.take(50, np.int32)
            assert np.shares_memory(b, c) and not np.shares_memory(a, c)
    np.testing.assert_array_equal(call_level, 7)
    arena = t._arenas[False]
    t.begin()  # a new call: all free, and the same memory again (no allocation once warm)
    with t.workspace() as ws:
        again = ws.take(10, np.float64)
    assert t._arenas[False] is arena and np.shares_memory(again, call_level)


def test_check_mode_compares_tuning_options_too():
    def body(comm):
        with pytest.raises(mpicoll.MismatchError, match="rank 1 differs in algorithm"):
            comm.broadcast(np.ones(4) if comm.rank == 0 else None, 0, algorithm="knomial",
                           radix=3 if comm.rank == 1 else 2)
        _next_call_is_right(comm)
        return True

    assert run_local(3, body, timeout=10, check=True) == [True] * 3


@pytest.mark.parametrize("algorithm", list(REGISTRY["broadcast"]))
@pytest.mark.parametrize("dtype", ["f8", [("a", "f4"), ("b", "u1")]])  # a 5-byte item: no code
def test_broadcast_refusing_receiver_takes_part_in_the_roots_items(algorithm, dtype):
    """A non-root refusing its receive buffer takes part with workspace counted in the
    root's items, so segments and blocks cut by items match the others' (a byte-counted
    stand-in would cut 1025 items into other pieces than the others)."""
    dtype = np.dtype(dtype)
    options = {"segment_bytes": 100} if algorithm == "pipelined_chain" else {}

    def body(comm):
        data = np.zeros(1025, dtype)
        data.view(np.uint8)[...] = np.arange(data.nbytes) % 251
        if comm.rank == 2:
            with pytest.raises(mpicoll.InvalidArgumentError, match="receive buffer"):
                comm.broadcast(np.empty(1025, np.float32), 0, algorithm=algorithm, **options)
        else:
            x = data if comm.rank == 0 else np.empty_like(data)
            got = comm.broadcast(x, 0, algorithm=algorithm, **options)
            assert got.tobytes() == data.tobytes()
        _next_call_is_right(comm)
        return True

    assert run_local(4, body, timeout=10) == [True] * 4


def test_unhashable_algorithm_is_a_clear_refusal_everywhere():
    def body(comm):
        with pytest.raises(mpicoll.InvalidArgumentError, match="algorithm: expected a name"):
            comm.all_reduce(np.ones(2), algorithm=["ring"])
        _next_call_is_right(comm)
        return True

    assert run_local(3, body, timeout=10) == [True] * 3


def test_dup_while_another_thread_is_in_a_call_is_refused():
    def body(comm):
        _, refused = _refusals_while_a_call_runs(comm, comm.dup)
        assert refused and "dup" in refused[0]
        _next_call_is_right(comm)
        return True

    assert run_local(3, body, timeout=10) == [True] * 3


def test_check_mode_a_bad_stream_on_one_rank_raises_everywhere():
    def body(comm):
        with pytest.raises(mpicoll.MpicollError) as caught:
            comm.all_reduce(np.ones(2), stream="not a stream" if comm.rank == 1 else None)
        if comm.rank != 1:
            assert "rank 1" in str(caught.value) and "stream" in str(caught.value)
        _next_call_is_right(comm)
        return True

    assert run_local(3, body, timeout=10, check=True) == [True] * 3


@pytest.mark.parametrize("call", [
    lambda comm: comm.auto_algorithm("all_reduce", "8"),
    lambda comm: comm.auto_algorithm("all_reduce", -1),
    lambda comm: comm.auto_algorithm("all_reduce", 8.0),
    lambda comm: comm.auto_algorithm("all_reduce", True),
    lambda comm: comm.auto_algorithm("all_reduce", 8, "sum", "not a dtype"),
    lambda comm: comm.native_serves("sum", "zz"),
])
def test_the_tools_questions_refuse_what_is_not_a_size_or_a_dtype(call):
    def body(comm):
        with pytest.raises(mpicoll.InvalidArgumentError, match="nbytes|dtype"):
            call(comm)
        return comm.auto_algorithm("all_reduce", np.int64(8), "sum", "f4")

    assert run_local(1, body) == ["recursive_doubling"]


@pytest.mark.parametrize("op", ["min", "max"])
def test_auto_never_lets_the_size_decide_whether_a_nan_survives_min_or_max(op):
    """MPI's MPI_MIN/MPI_MAX keep or drop a NaN by the order of their operands; NumPy's
    keep it. "auto" leaves floating min and max to mpicoll's algorithms, so the result
    of a NaN is the same at every size; native stays for other ops and dtypes."""
    from mpicoll.ops import resolve_op
    from mpicoll.pipeline.choose import _drops_nan

    assert _drops_nan(resolve_op(op, np.dtype("f8")), np.dtype("f8"))
    assert not _drops_nan(resolve_op(op, np.dtype("i8")), np.dtype("i8"))
    assert not _drops_nan(resolve_op("sum", np.dtype("f8")), np.dtype("f8"))

    def body(comm):
        x = np.array([np.nan if comm.rank == 0 else 1.0, 2.0])
        small = comm.all_reduce(x, op)
        large = comm.all_reduce(np.resize(x, 1 << 18), op)[:2]
        return small.tolist(), large.tolist()

    for small, large in run_local(3, body):
        assert np.isnan(small[0]) and np.isnan(large[0]) and small[1] == large[1] == 2.0
