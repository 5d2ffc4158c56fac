"""Persistent collectives (``comm.<collective>_init``) under mpiexec: every collective's
plan against NumPy references with the bound input refilled between starts, over every
algorithm in the registry, started both ways (``plan()`` and ``start()``/``wait()``);
misuse raises; in check mode a plan is agreed across ranks."""

from __future__ import annotations

import time

import numpy as np
import pytest

import mpicoll
import mpicoll.pipeline.decided
import mpicoll.plan
from mpicoll.algorithms import REGISTRY

pytestmark = pytest.mark.mpi

CASES = [(c, a) for c in mpicoll.COLLECTIVES for a in [*REGISTRY[c], "native", "auto"]]
# the plans whose later starts run as the first decided (mpicoll.pipeline.decided)
DECIDED = mpicoll.pipeline.decided.DECIDED
PERSISTS = mpicoll.plan._PERSISTS


def _fill(x: np.ndarray, rank: int, step: int) -> None:
    x[...] = np.arange(x.size).reshape(x.shape) % 7 + 10 * rank + 100 * step


def _expected(collective: str, p: int, r: int, step: int, shape: tuple[int, ...]) -> np.ndarray:
    ins = []
    for k in range(p):
        x = np.empty(shape)
        _fill(x, k, step)
        ins.append(x)
    if collective == "broadcast":
        return ins[0]
    if collective == "scatter":
        return ins[0][r]
    if collective in ("gather", "all_gather"):
        return np.stack(ins)
    if collective in ("reduce", "all_reduce"):
        return np.sum(ins, axis=0)
    if collective == "reduce_scatter":
        return np.sum(ins, axis=0)[r]
    if collective == "all_to_all":
        return np.stack([ins[k][r] for k in range(p)])
    if collective in ("scan", "exscan"):
        return np.sum(ins[:r + 1 if collective == "scan" else r], axis=0)
    raise AssertionError(collective)


@pytest.mark.parametrize("form", ["call", "start", "call on 0-d"])
@pytest.mark.parametrize(("collective", "algorithm"), CASES)
def test_a_plan_started_again_and_again_on_refilled_input(world, collective, algorithm, form):
    """(0-d: an x of one value, or rows of one value each, where a row is x[i] of a result
    or an input: a plan's views of them must be views, not values)"""
    p, r = world.size, world.rank
    spec = mpicoll.spec.SPECS[collective]
    zero_d, form = form.endswith("0-d"), form.split()[0]
    shape = ((p,) if zero_d else (p, 3)) if spec.input_rows else (() if zero_d else (5,))
    x = np.zeros(shape)
    if collective == "barrier":
        plan = world.barrier_init(algorithm=algorithm)
    elif collective == "broadcast":
        plan = world.broadcast_init(x, 0, algorithm=algorithm)
    elif collective in ("scatter", "gather"):
        plan = getattr(world, f"{collective}_init")(x, 0, algorithm=algorithm)
    elif collective == "reduce":
        plan = world.reduce_init(x, "sum", 0, algorithm=algorithm)
    elif spec.reduces:
        plan = getattr(world, f"{collective}_init")(x, "sum", algorithm=algorithm)
    else:
        plan = getattr(world, f"{collective}_init")(x, algorithm=algorithm)
    results = []
    with plan:
        for step in range(3):
            _fill(x, r, step)
            if form == "call":
                got = plan()
            else:
                plan.start()
                got = plan.wait()
                assert plan.test()
            if collective == "barrier":
                assert got is None
                continue
            if (spec.result_at_root_only and r != 0) or (collective == "exscan" and r == 0):
                assert got is None
                continue
            np.testing.assert_array_equal(got, _expected(collective, p, r, step, shape))
            results.append(got)
        if form == "call" and collective in DECIDED:  # starts 2 and 3 ran as decided
            assert plan._bound is not None
        # a native plan is MPI's persistent request where MPI has one: made with the plan
        # (every start() its MPI_Start), or, where a receiver learns the shape at its first
        # start (broadcast's, scatter's), voted at the second plan()
        if algorithm != "auto":  # (auto: as it picks)
            persists = algorithm == "native" and collective in PERSISTS and (
                form == "call" or collective not in ("broadcast", "scatter"))
            assert (plan._request is not None) == persists
            if form == "start" and persists and getattr(plan._bound, "persistent", None):
                assert plan._start_request is not None
    assert plan.starts == 3
    if results and collective not in ("broadcast", "scatter") or \
            (collective == "scatter" and r == 0):
        assert all(res is results[0] for res in results), "the plan's result is bound once"


@pytest.mark.parametrize("algorithm", [*REGISTRY["all_gather"], "native"])
def test_v_variant_plans(world, algorithm):
    rows = world.rank % 3
    x = np.zeros((rows, 2))
    with world.all_gather_v_init(x, algorithm=algorithm) as plan:
        for step in range(2):
            x[...] = world.rank + 10 * step
            got, counts = plan()
            assert counts == [k % 3 for k in range(world.size)]
            want = np.concatenate([np.full((k % 3, 2), k + 10.0 * step) for k in range(world.size)])
            np.testing.assert_array_equal(got, want)


def _uneven_case(collective: str, p: int, r: int, step: int, root: int):
    """(the plan's args, the rows each rank sends, the result this rank should get) of a
    v-variant with uneven rows (0 too) whose values say where they came from."""
    rows = [(k + 1) % 3 for k in range(p)]
    if collective == "gather_v":
        x = np.full((rows[r], 2), r + 10.0 * step)
        want = np.concatenate([np.full((rows[k], 2), k + 10.0 * step) for k in range(p)]) \
            if r == root else None
        return (x, root), x, want
    if collective == "scatter_v":
        data = np.concatenate([np.full((rows[k], 2), 100.0 * k + step) for k in range(p)])
        return (data if r == root else None, rows, root), data, np.full((rows[r], 2),
                                                                       100.0 * r + step)
    # all_to_all_v: rank r sends (r + j) % 3 rows to rank j, each 1000 r + j + step
    sends = [(r + j) % 3 for j in range(p)]
    x = np.concatenate([np.full((sends[j], 2), 1000.0 * r + j + step) for j in range(p)])
    want = np.concatenate([np.full(((k + r) % 3, 2), 1000.0 * k + r + step) for k in range(p)])
    return (x, sends), x, want


@pytest.mark.parametrize("form", ["call", "start"])
@pytest.mark.parametrize(("collective", "algorithm"),
                         [(v, a) for v, base in (("gather_v", "gather"), ("scatter_v", "scatter"),
                                                 ("all_to_all_v", "all_to_all"))
                          for a in [*(n for n, r in REGISTRY[base].items()
                                      if not r.even_only), "native"]])
def test_every_v_variant_plan_on_refilled_input(world, collective, algorithm, form):
    """gather_v, scatter_v and all_to_all_v plans, every algorithm of their collective
    that takes uneven blocks (not ``even_only``): uneven rows (0 too), the bound input
    refilled in place between starts, each start right, as plan() and start()/wait()."""
    p, r, root = world.size, world.rank, world.size - 1
    args, buf, _ = _uneven_case(collective, p, r, 0, root)
    with getattr(world, f"{collective}_init")(*args, algorithm=algorithm) as plan:
        for step in range(3):
            _, fresh, want = _uneven_case(collective, p, r, step, root)
            buf[...] = fresh
            if form == "call":
                got = plan()
            else:
                plan.start()
                got = plan.wait()
            got = got[0] if collective in ("gather_v", "all_to_all_v") else got
            if want is None:
                assert got is None
            else:
                np.testing.assert_array_equal(got, want)


def test_misuse_raises_on_the_rank_that_does_it(world):
    plan = world.all_reduce_init(np.ones(3))
    plan.start()
    with pytest.raises(mpicoll.InvalidArgumentError, match="already started"):
        plan.start()
    with pytest.raises(mpicoll.InvalidArgumentError, match="already started"):
        plan()
    np.testing.assert_array_equal(plan.wait(), np.full(3, float(world.size)))
    with pytest.raises(mpicoll.InvalidArgumentError, match="not started"):
        plan.wait()
    plan.free()
    with pytest.raises(mpicoll.InvalidArgumentError, match="was freed"):
        plan.start()
    with pytest.raises(mpicoll.InvalidArgumentError, match="was freed"):
        plan()
    comm = world.dup()
    orphan = comm.all_reduce_init(np.ones(3))
    comm.free()
    with pytest.raises(mpicoll.InvalidArgumentError, match="Communicator of this"):
        orphan.start()
    with pytest.raises(mpicoll.InvalidArgumentError, match="unknown all_reduce algorithm"):
        world.all_reduce_init(np.ones(3), algorithm="nope")
    # a named algorithm's options, as the first start would refuse them (v-variants: their
    # collective's algorithms; native: none)
    with pytest.raises(mpicoll.InvalidArgumentError, match="intra: expected one of"):
        world.all_reduce_init(np.ones(3), algorithm="hierarchical", intra="bogus")
    with pytest.raises(mpicoll.InvalidArgumentError, match="takes no option 'radix'"):
        world.all_reduce_init(np.ones(3), algorithm="ring", radix=4)
    with pytest.raises(mpicoll.InvalidArgumentError, match="radix: expected an int >= 2"):
        world.broadcast_init(np.ones(3), 0, algorithm="knomial", radix=1)
    with pytest.raises(mpicoll.InvalidArgumentError, match="'native' takes no tuning options"):
        world.all_reduce_init(np.ones(3), algorithm="native", radix=4)
    with pytest.raises(mpicoll.InvalidArgumentError, match="takes no option 'intra'"):
        world.all_gather_v_init(np.ones(3), algorithm="ring", intra="ring")
    with world.broadcast_init(np.ones(3), 0, algorithm="knomial", radix=4) as plan:
        plan()  # (a right option still makes a plan)
    with pytest.raises(mpicoll.InvalidArgumentError, match="takes no out="):
        # (out= where broadcast has none: refused at init, as the start would refuse it)
        world.broadcast_init(np.ones(3), 0, algorithm="binomial", out=np.ones(3))
    with pytest.raises(mpicoll.InvalidArgumentError, match="async_op"):
        world.all_reduce_init(np.ones(3), async_op=True)


def test_check_mode_ranks_making_different_plans_raise_everywhere():
    comm = mpicoll.Communicator(check=True)
    if comm.size < 2:
        comm.free()
        pytest.skip("needs two ranks")
    with pytest.raises(mpicoll.MismatchError, match="_init"):
        if comm.rank == 0:
            comm.all_reduce_init(np.ones(3))
        else:
            comm.all_gather_init(np.ones(3))
    bad = "nope" if comm.rank == 1 else "ring"
    with pytest.raises(mpicoll.MpicollError, match="unknown all_reduce algorithm"):
        comm.all_reduce_init(np.ones(3), algorithm=bad)
    # a bad option of a named algorithm on one rank: refused when the plans are made, on
    # every rank (the others told by a RemoteError naming it), and the next plan is right
    intra = "bogus" if comm.rank == 1 else "binomial"
    with pytest.raises(mpicoll.MpicollError, match="intra: expected one of"):
        comm.all_reduce_init(np.ones(3), algorithm="hierarchical", intra=intra)
    with comm.all_reduce_init(np.ones(3), algorithm="ring") as plan:
        np.testing.assert_array_equal(plan(), np.full(3, float(comm.size)))
        plan.start()
        np.testing.assert_array_equal(plan.wait(), np.full(3, float(comm.size)))
    comm.free()


@pytest.mark.parametrize(("collective", "mine", "theirs"), [
    ("all_reduce", {"algorithm": "ring"}, {"algorithm": "recursive_doubling"}),
    ("all_reduce", {"op": "max"}, {}),
    ("reduce", {"root": 1}, {"root": 0}),
    ("broadcast", {"root": 1}, {}),
    ("all_reduce", {"algorithm": "ring_pipelined", "segment_bytes": 64},
     {"algorithm": "ring_pipelined"}),
    ("scan", {"op": "prod"}, {"op": "sum"}),
])
def test_check_mode_plans_made_with_other_arguments_raise_everywhere_at_init(collective, mine,
                                                                           theirs):
    """Making a plan is agreed as a call is: one rank's other algorithm, options, op or
    root raises on every rank when the plans are made (not only at their first start),
    naming what differs; the next plan is right."""
    comm = mpicoll.Communicator(check=True)
    if comm.size < 2:
        comm.free()
        pytest.skip("needs two ranks")
    init = getattr(comm, f"{collective}_init")
    with pytest.raises(mpicoll.MismatchError, match=f"{collective}_init.* differs in"):
        init(np.ones(3), **(mine if comm.rank == 1 else theirs))
    with init(np.ones(3), **theirs) as plan:
        plan()
    with comm.all_reduce_init(np.ones(3)) as plan:
        np.testing.assert_array_equal(plan(), np.full(3, float(comm.size)))
    comm.free()


@pytest.mark.parametrize("bad", [2**64, -1, "zero", 1.0])
def test_check_mode_a_root_that_is_no_rank_on_one_rank_raises_everywhere(bad):
    """A plan's root that is no rank (even past int64) on one rank: every rank raises
    at its first start (the call's own refusal), none waits for it; the next plan is
    right."""
    comm = mpicoll.Communicator(check=True)
    if comm.size < 2:
        comm.free()
        pytest.skip("needs two ranks")
    with pytest.raises(mpicoll.MpicollError):
        plan = comm.reduce_init(np.ones(3), "sum", bad if comm.rank == 1 else 0)
        plan()
    with comm.reduce_init(np.ones(3), "sum", 0) as plan:
        got = plan()
    if comm.rank == 0:
        np.testing.assert_array_equal(got, np.full(3, float(comm.size)))
    comm.free()


def test_check_mode_an_option_that_is_no_option_is_refused_not_compared():
    """broadcast_init(x, 0, out=y): out= is none of broadcast's (an option, refused):
    every rank gets that refusal, whatever each y holds, never a mismatch of y's data."""
    comm = mpicoll.Communicator(check=True)
    with pytest.raises(mpicoll.InvalidArgumentError, match="no out="):
        plan = comm.broadcast_init(np.ones(3), 0, out=np.full(3, float(comm.rank)))
        plan()
    with comm.broadcast_init(np.full(3, 7.0) if comm.rank == 0 else np.empty(3)) as plan:
        np.testing.assert_array_equal(plan(), np.full(3, 7.0))
    comm.free()


def test_check_mode_a_plan_started_on_one_rank_and_called_on_another_raises():
    comm = mpicoll.Communicator(check=True)
    if comm.size < 2:
        comm.free()
        pytest.skip("needs two ranks")
    plan = comm.all_reduce_init(np.ones(2))
    with pytest.raises(mpicoll.MismatchError):
        if comm.rank == 0:
            plan.start()
            plan.wait()
        else:
            plan()
    np.testing.assert_array_equal(plan(), np.full(2, float(comm.size)))
    comm.free()


@pytest.mark.parametrize("how", ["call", "start"])
def test_check_mode_alike_plans_started_in_different_orders_raise_everywhere(how):
    """Two plans of the same collective on buffers alike, started in one order on rank 0
    and the other order elsewhere: each start's fingerprint matches (collective, shape,
    dtype), so without the plan's own identity the ranks would pair one plan's buffers
    with the other's, a silent wrong result. Check mode raises on every rank before the
    start's messages, and starts in the same order then give the right results."""
    comm = mpicoll.Communicator(check=True)
    if comm.size < 2:
        comm.free()
        pytest.skip("needs two ranks")
    p, r = comm.size, comm.rank
    x, y = np.full(4, 1.0 + r), np.full(4, 100.0 * (1 + r))
    a = comm.all_reduce_init(x, algorithm="ring")
    b = comm.all_reduce_init(y, algorithm="ring")
    first, second = (a, b) if r == 0 else (b, a)

    def go(plan):
        if how == "call":
            return plan()
        plan.start()
        return plan.wait()

    with pytest.raises(mpicoll.MismatchError, match="plan start"):
        go(first)
    want_a, want_b = p * (p + 1) / 2, 100.0 * p * (p + 1) / 2
    for _ in range(2):
        np.testing.assert_array_equal(go(a), np.full(4, want_a))
        np.testing.assert_array_equal(go(b), np.full(4, want_b))
    a.free()
    b.free()
    comm.free()


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "native"])
@pytest.mark.parametrize("settled", [False, True])
def test_check_mode_turned_on_tells_alike_plans_made_before_it_apart(algorithm, settled):
    """Plans made outside check mode (no numbered call between them: they share the call
    that made them), check mode turned on, then started in different orders: each start
    names its plan by its number among the Communicator's plans, so the ranks raise
    MismatchError on every rank; they gave each other's sums (ring) or waited in MPI's
    own all_reduce (native) until the timeout."""
    comm = mpicoll.Communicator()
    if comm.size < 2:
        comm.free()
        pytest.skip("needs two ranks")
    p, r = comm.size, comm.rank
    x, y = np.full(2, 1.0 + r), np.full(2, 100.0 * (1 + r))
    a = comm.all_reduce_init(x, algorithm=algorithm)
    b = comm.all_reduce_init(y, algorithm=algorithm)
    want_a, want_b = np.full(2, p * (p + 1) / 2), np.full(2, 100.0 * p * (p + 1) / 2)
    for _ in range(2 if settled else 0):  # (settled: each start's decision made)
        np.testing.assert_array_equal(a(), want_a)
        np.testing.assert_array_equal(b(), want_b)
    comm.check = True
    with pytest.raises(mpicoll.MismatchError, match="plan start"):
        (a if r == 0 else b)()
    np.testing.assert_array_equal(a(), want_a)
    np.testing.assert_array_equal(b(), want_b)
    comm.free()


@pytest.mark.parametrize("algorithm", ["ring", "auto", "native"])
@pytest.mark.parametrize("change", ["x.shape", "x.dtype", "out.shape"])
@pytest.mark.parametrize("form", ["call", "start"])
def test_a_plans_arrays_changed_in_place_on_one_rank_stay_the_bound_ones(world, algorithm,
                                                                         change, form):
    """x and out are bound at init, their memory in their shape and dtype then (MPI's
    rule): the last rank's ``x.shape = ...``, ``x.dtype = ...`` or ``out.shape = ...`` in
    place later leaves every start right on every rank, the caller's out given back, by
    ``plan()`` and by ``start()``/``wait()`` alike. start() ran the whole path on the
    arrays as they were then: that rank refused them while the others went on, or,
    x's dtype changed, the others got sums of its bytes read as float32."""
    p, r = world.size, world.rank
    x, out = np.full(4, r + 1.0), np.empty(4)
    with world.all_reduce_init(x, algorithm=algorithm, out=out) as plan:
        for start in range(3):
            if r == p - 1 and start == 1:
                if change == "x.shape":
                    x.shape = (2, 2)
                elif change == "x.dtype":
                    x.dtype = np.float32
                else:
                    out.shape = (2, 2)
            if form == "call":
                got = plan()
            else:
                plan.start()
                got = plan.wait()
            assert got is out
            np.testing.assert_array_equal(out.reshape(-1), np.full(4, p * (p + 1) / 2))
    np.testing.assert_array_equal(world.all_reduce(np.ones(1)), [float(p)])


@pytest.mark.parametrize("algorithm", [*REGISTRY["broadcast"], "native", "auto"])
def test_a_broadcast_plans_buffer_reshaped_in_place_is_still_the_bound_one(world, algorithm):
    """A broadcast plan's x is bound at init (MPI's rule: its memory, in its shape and
    dtype then): the root's or a receiver's ``x.shape = ...`` in place later leaves the
    starts right, the caller's x given back. The root's start of a small message put x
    into the header packet in x's new shape and raised NumPy's ValueError before sending
    it, while the receivers waited for it until the timeout."""
    p, r = world.size, world.rank
    for n in (4, 1000):  # (in the header packet, and after it)
        for reshaping in {0, p - 1}:
            x = np.arange(float(n)) if r == 0 else np.zeros(n)
            with world.broadcast_init(x, 0, algorithm=algorithm) as plan:
                for start in range(4):
                    if r == reshaping and start == 2:
                        x.shape = (2, n // 2)
                    assert plan() is x
                    np.testing.assert_array_equal(x.reshape(-1), np.arange(float(n)))
                    if r:
                        x[...] = 0
    np.testing.assert_array_equal(world.all_reduce(np.ones(1)), [float(p)])


@pytest.mark.parametrize("algorithm", [*REGISTRY["all_reduce"], "native", "auto"])
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_a_decided_plan_start_is_recorded_and_right_like_the_first(world, algorithm, op):
    """plan() runs the first start through the whole pipeline and later ones as it
    decided: the same results, each start numbered, its algorithm and bytes recorded."""
    x = np.zeros(6)
    ref = {"sum": np.sum, "avg": np.mean, "max": np.max}[op]
    with world.all_reduce_init(x, op, algorithm=algorithm) as plan:
        for step in range(4):
            x[...] = np.arange(6) + world.rank + step
            seq = world.calls
            got = plan()
            assert world.calls == seq + 1
            want = ref([np.arange(6) + k + step for k in range(world.size)], axis=0)
            np.testing.assert_allclose(got, want)
            rec = world._watch.current
            assert rec.call.seq == seq + 1 and rec.nbytes == x.nbytes
            assert rec.algorithm == (algorithm if algorithm != "auto" else
                                     world.auto_algorithm("all_reduce", x.nbytes, op, x.dtype))
            assert rec.call.site.endswith(f"test_mpi_plans.py:{_line_of('with world.all_reduce_init(x, op')}")


def test_a_decided_plan_with_a_raising_user_op_raises_everywhere(world):
    if world.size < 2:
        pytest.skip("one rank combines nothing")
    flaky = {"on": False}

    def fn(a, b, out):
        if flaky["on"] and world.rank == world.size - 1:
            raise ValueError("flaky")
        np.add(a, b, out=out)

    x = np.ones(4)
    with world.all_reduce_init(x, mpicoll.Op(fn, name="flaky"), algorithm="ring") as plan:
        np.testing.assert_array_equal(plan(), np.full(4, float(world.size)))
        flaky["on"] = True
        with pytest.raises(mpicoll.OpError, match="'flaky' raised on rank"):
            plan()
        flaky["on"] = False
        np.testing.assert_array_equal(plan(), np.full(4, float(world.size)))


@pytest.mark.parametrize("starts_before", [1, 2, 3])
def test_a_plan_start_after_a_refusal_alone_resyncs_first(world, starts_before):
    """A rank that refused a call alone owes a resync: its next plan start resyncs first
    and then runs as the other ranks do (the whole path, the decided run or, from the
    second start, MPI's persistent request), so every rank still pairs its starts right."""
    x = np.ones(3)
    with world.all_reduce_init(x, algorithm="native") as plan:
        for _ in range(starts_before):
            np.testing.assert_array_equal(plan(), np.full(3, float(world.size)))
        if world.rank == 0:
            with pytest.raises(mpicoll.InvalidArgumentError):
                world.all_reduce("not an array")
        else:
            with pytest.raises(mpicoll.InvalidArgumentError):
                world.all_reduce("not an array either")
        np.testing.assert_array_equal(plan(), np.full(3, float(world.size)))


def _line_of(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


@pytest.mark.parametrize("algorithm", [*REGISTRY["all_reduce"], "native"])
def test_one_rank_on_the_whole_path_meets_the_others_decided_starts(world, algorithm):
    """Whether a rank runs its starts as decided is its own (here rank 0's strided
    input keeps it on the whole path): the messages must be the same either way."""
    x = np.zeros(8)[::2] if world.rank == 0 else np.zeros(4)
    with world.all_reduce_init(x, algorithm=algorithm) as plan:
        for step in range(3):
            if world.rank != 0:
                x[...] = step + 1.0
            want = (world.size - 1) * (step + 1.0)
            np.testing.assert_array_equal(plan(), np.full(4, want))
        assert (plan._bound is None) == (world.rank == 0)
        assert plan._request is None  # rank 0 voted against MPI's persistent request


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_a_native_plan_runs_the_libraries_persistent_request(world, op, inplace):
    """A native all_reduce plan whose buffers every rank binds as they are is MPI's
    persistent Allreduce (MPI_Allreduce_init), made with the plan: right on refilled
    input from the first start, in place too, and freed with the plan."""
    x = np.zeros(5)
    ref = {"sum": np.sum, "avg": np.mean, "max": np.max}[op]
    t = world._backend.transport
    plan = world.all_reduce_init(x, op, algorithm="native", out=x if inplace else None)
    for step in range(4):
        x[...] = np.arange(5) + world.rank + step
        got = plan()
        np.testing.assert_allclose(got, ref([np.arange(5) + k + step
                                             for k in range(world.size)], axis=0))
        assert (got is x) == inplace
        assert plan._request is not None
    assert any(r is plan._request for r in t._persistent)
    plan.free()
    assert plan._request is None and not t._persistent
    np.testing.assert_allclose(world.all_reduce(np.ones(2)), np.full(2, world.size))


@pytest.mark.parametrize(("collective", "theirs"), [
    ("all_reduce", {"dtype": np.float32}), ("reduce", {"size": 5}), ("gather", {"size": 3}),
    ("scan", {"dtype": np.float32}), ("exscan", {"op": "max"}), ("all_to_all", {"size": 8}),
    ("all_gather", {"dtype": np.int64}), ("reduce_scatter", {"algorithm": "ring"}),
    ("reduce", {"root": 1}), ("all_reduce", {"algorithm": "recursive_doubling"})])
def test_plans_one_rank_makes_of_another_call_raise_everywhere_without_check_mode(
        world, collective, theirs):
    """The persistent request's vote holds every rank's call: one rank's other dtype,
    element count, op, root or algorithm raises MismatchError on every rank as the plans
    are made (they ran on: reduce_init's float32 against float64 gave a wrong result,
    all_reduce_init's MPI's abort); the same elements in another shape are one call; the
    next plan is right."""
    if world.size < 2:
        pytest.skip("needs two ranks")
    from mpi4py import MPI

    if MPI.Get_version() < (4, 0):
        pytest.skip("the MPI library has no persistent collectives")
    size = theirs.get("size", 4) if world.rank == 1 else 4
    x = np.arange(size * world.size, dtype=theirs.get("dtype", np.float64)
                  if world.rank == 1 else np.float64).reshape(world.size, size)
    kwargs = {k: v for k, v in theirs.items() if k not in ("size", "dtype")} \
        if world.rank == 1 else {}
    init = getattr(world, f"{collective}_init")
    with pytest.raises(mpicoll.MismatchError, match=f"{collective}_init: the ranks' plans "
                       "are not the same call.*rank 1 another"):
        init(x, **kwargs)
    # the same elements, another shape on one rank: one call (MPI's counts)
    y = np.arange(6.0).reshape((2, 3) if world.rank == 0 else (6,))
    with world.all_reduce_init(y) as plan:
        np.testing.assert_array_equal(plan().ravel(), np.arange(6.0) * world.size)
    np.testing.assert_array_equal(world.all_reduce(np.ones(2)), np.full(2, world.size))


@pytest.mark.parametrize(("collective", "mine", "theirs"), [
    ("all_reduce", {"op": "sum"}, {"op": mpicoll.ReduceOp.SUM}),
    ("all_reduce", {"op": "max"}, {"op": mpicoll.ReduceOp.MAX, "algorithm": "auto"}),
    ("reduce", {"root": 1}, {"root": np.int64(1)}),
    ("all_reduce", {"algorithm": "ring_pipelined", "segment_bytes": 64},
     {"algorithm": "ring_pipelined", "segment_bytes": np.int64(64)})])
def test_plans_of_one_call_spelled_another_way_on_one_rank_are_one_call(world, collective,
                                                                         mine, theirs):
    """One call spelled two ways (an op by its name or as ReduceOp, a root or an option
    as Python's int or NumPy's): one plan, right on every rank, as check mode takes it."""
    if world.size < 2:
        pytest.skip("needs two ranks")
    root = 1 % world.size
    x = np.full(4, world.rank + 1.0)
    init = getattr(world, f"{collective}_init")
    with init(x, **(theirs if world.rank == 1 else mine)) as plan:
        got = plan()
    if collective == "all_reduce" or world.rank == root:
        ranks = np.arange(1.0, world.size + 1)
        want = ranks.max() if (mine.get("op") == "max") else ranks.sum()
        np.testing.assert_array_equal(got, np.full(4, want))


def test_a_persistent_plan_dropped_without_free_lets_its_request_go(world):
    import gc

    t = world._backend.transport
    x = np.ones(2)
    for _ in range(2):  # a plan made per step and never freed: at most one left behind
        plan = world.all_reduce_init(x, algorithm="native")
        for _ in range(3):
            plan()
        assert plan._request is not None and len(t._persistent) <= 2
        del plan
        gc.collect()
        assert len(t._retired) == 1
    np.testing.assert_array_equal(world.all_reduce(x), np.full(2, float(world.size)))


def test_a_persistent_plan_left_unfreed_goes_with_its_communicator(world):
    comm = world.dup()
    x = np.ones(2)
    plan = comm.all_reduce_init(x, algorithm="native")
    for _ in range(3):
        np.testing.assert_array_equal(plan(), np.full(2, float(world.size)))
    assert plan._request is not None
    comm.free()  # frees the request before the communicator (MPI would warn at exit)
    assert not comm._backend.transport._persistent
    with pytest.raises(mpicoll.InvalidArgumentError, match="Communicator of this all_reduce"):
        plan()


@pytest.mark.parametrize("collective", ["scan", "exscan"])
@pytest.mark.parametrize("algorithm", [*REGISTRY["scan"], "native"])
def test_decided_scan_plans_average_by_the_ranks_combined(world, collective, algorithm):
    x = np.zeros(3)
    init = getattr(world, f"{collective}_init")
    with init(x, "avg", algorithm=algorithm) as plan:
        for step in range(3):
            x[...] = world.rank + step
            got = plan()
            upto = world.rank + 1 if collective == "scan" else world.rank
            if upto == 0:
                assert got is None
            else:
                np.testing.assert_allclose(got, np.full(3, np.mean(np.arange(upto)) + step))


def _started(plan, form):
    """A plan's start and its result: ``plan()``, or ``start()`` then ``wait()``."""
    if form == "call":
        return plan()
    plan.start()
    return plan.wait()


@pytest.mark.parametrize("form", ["call", "start"])
@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("collective", ["all_reduce", "reduce", "scan", "exscan"])
@pytest.mark.parametrize("in_place", [True, False])
def test_native_plans_run_right_on_mpis_persistent_request(world, collective, op, in_place,
                                                           form):
    """A native plan's starts stay right whether MPI's persistent request runs them or
    (exscan's rank 0 votes against writing into its x) not, in place (out=x) or not, by
    plan() or start() and wait(): avg's root and exscan's rank 0 (no division there)
    start MPI's request as the other ranks do, not a call the others' never meet."""
    p, r = world.size, world.rank
    x = np.zeros(4)
    args = (x, op, 0) if collective == "reduce" else (x, op)
    out = None if collective == "reduce" and r != 0 else x if in_place else np.zeros(4)
    plan = getattr(world, f"{collective}_init")(*args, algorithm="native", out=out)
    with plan:
        for step in range(4):
            x[...] = np.arange(4) + r + step
            got = _started(plan, form)
            ranks = {"all_reduce": range(p), "reduce": range(p), "scan": range(r + 1),
                     "exscan": range(r)}[collective]
            if (collective == "reduce" and r != 0) or (collective == "exscan" and r == 0):
                assert got is None
                continue
            want = [np.arange(4) + k + step for k in ranks]
            np.testing.assert_allclose(got, np.mean(want, 0) if op == "avg" else np.sum(want, 0))
            assert got is out
        if collective == "exscan" and p > 1 and in_place:
            assert plan._request is None  # rank 0 voted no
        elif p > 1 or collective != "exscan":
            assert plan._request is not None


@pytest.mark.parametrize("form", ["call", "start"])
@pytest.mark.parametrize("in_place", [True, False, "rank 0"])
def test_an_all_gather_plan_is_mpis_in_place_persistent_request(world, in_place, form):
    """As the whole path does, x goes into its own row and MPI gathers in place (every
    rank alike, as MPI requires of MPI_IN_PLACE): x refilled is gathered at every start,
    where x is its row on every rank, on none, or on rank 0 only (which copies nothing)."""
    out = np.zeros((world.size, 3))
    own = in_place is True or in_place == "rank 0" and world.rank == 0
    x = out[world.rank] if own else np.zeros(3)
    with world.all_gather_init(x, algorithm="native", out=out) as plan:
        for step in range(4):
            x[...] = world.rank + step
            np.testing.assert_array_equal(
                _started(plan, form), np.repeat(np.arange(world.size)[:, None] + step, 3, axis=1))
        assert plan._request is not None


@pytest.mark.parametrize("form", ["call", "start"])
@pytest.mark.parametrize("strided", [False, True])
def test_an_all_gather_plans_x_reshaped_in_place_on_one_rank_is_still_its_memory(
        world, strided, form):
    """The bound x's shape set in place on one rank between starts (its memory the same):
    each start copies that memory into x's row as MPI's own request reads it. It was
    copied by its shape, refused on that rank alone before MPI_Start, and the others
    waited in theirs until the timeout."""
    p, r = world.size, world.rank
    x = np.zeros((6, 2))[:, 0] if strided else np.zeros(6)
    with world.all_gather_init(x) as plan:
        for step in range(4):
            x.reshape(-1)[...] = np.arange(6) + 10 * r + step
            if step == 1 and r == p - 1 and not strided:
                x.shape = (2, 3)
            got = _started(plan, form)
            want = np.stack([np.arange(6) + 10 * k + step for k in range(p)])
            np.testing.assert_array_equal(got.reshape(p, 6), want, err_msg=f"start {step}")


@pytest.mark.parametrize("algorithm", ["auto", "native"])
@pytest.mark.parametrize("collective", ["broadcast", "scatter"])
def test_rooted_plans_whose_receivers_pass_none_settle_on_one_result(world, collective,
                                                                      algorithm):
    """A broadcast or scatter plan whose receivers pass None: each start right; from the
    vote on (every rank knows the shape since the first start), the data alone goes as
    MPI's persistent request, into one result array per rank."""
    p, r = world.size, world.rank
    x = np.zeros((p, 3) if collective == "scatter" else (5,))
    init = getattr(world, f"{collective}_init")
    with init(x if r == 0 else None, 0, algorithm=algorithm) as plan:
        results = []
        for step in range(4):
            if r == 0:
                _fill(x, 0, step)
            got = plan()
            np.testing.assert_array_equal(got, _expected(collective, p, r, step, x.shape))
            results.append(got)
        assert plan._request is not None
        if r != 0:  # the first start's result, bound: every start fills that array
            assert all(res is results[0] for res in results)
        assert world._watch.current.algorithm == "native"


def test_a_rank_that_cannot_make_the_persistent_request_keeps_every_rank_off_it(world,
                                                                                monkeypatch):
    """Every rank voted yes, but making MPI's request failed on the last rank: they all
    learn it (a second small all-reduce) and run as decided, right, with nothing leaked;
    and no later plan of that Communicator makes one (MPI counts the persistent
    collectives each rank made on its communicator: theirs now differ)."""
    comm = world.dup()
    t = comm._backend.transport
    if comm.rank == comm.size - 1:
        def refuse(*args):
            raise RuntimeError("no persistent collectives here")

        monkeypatch.setattr(t, "persistent", refuse)
    x = np.zeros(3)
    for _ in range(2):
        with comm.all_reduce_init(x, algorithm="native") as plan:
            for step in range(4):
                x[...] = comm.rank + step
                np.testing.assert_array_equal(
                    plan(), np.full(3, sum(k + step for k in range(comm.size)), float))
            assert plan._request is None and plan._bound is not None
        assert not t._persistent and not t.persists
    comm.free()


def test_a_receive_buffer_made_read_only_under_a_plan_is_refused_after_taking_part(world):
    p, r = world.size, world.rank
    x = np.zeros(4)
    with world.broadcast_init(x, 0, algorithm="linear") as plan:
        for step in range(3):
            if r == 0:
                x[...] = step
            np.testing.assert_array_equal(plan(), np.full(4, float(step)))
        if r == p - 1 and p > 1:
            x.flags.writeable = False
            with pytest.raises(mpicoll.InvalidArgumentError, match="made read-only"):
                plan()
            x.flags.writeable = True
        else:
            if r == 0:
                x[...] = 7.0
            np.testing.assert_array_equal(plan(), np.full(4, 7.0))
        if r == 0:
            x[...] = 8.0
        np.testing.assert_array_equal(plan(), np.full(4, 8.0))


READ_ONLY_CASES = [(c, a) for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                     "scan", "reduce", "gather", "scatter", "broadcast")
                   for a in ("auto", "native", next(iter(REGISTRY[c])))]


@pytest.mark.parametrize("form", ["call", "start"])
@pytest.mark.parametrize(("collective", "algorithm"), READ_ONLY_CASES)
def test_a_result_array_made_read_only_under_a_settled_plan_is_refused_after_taking_part(
        world, collective, algorithm, form):
    """The last rank makes the array its plan's starts write into (out=, bound at init or
    at the first start; a broadcast receiver's x) read-only after three starts: its next
    start takes part (the others get their results), leaves the array as it was and
    raises there, as a call would refuse it; writeable again, the plan goes on. Whether
    the plan is MPI's persistent request (auto, native) or mpicoll's algorithm."""
    p, r = world.size, world.rank
    spec = mpicoll.spec.SPECS[collective]
    shape = (p, 3) if spec.input_rows else (5,)
    x = np.zeros(shape)
    args = (x, 0) if collective in ("broadcast", "scatter", "gather") else \
        (x, "sum", 0) if collective == "reduce" else (x, "sum") if spec.reduces else (x,)
    writes = r != 0 if collective == "broadcast" else r == 0 if spec.result_at_root_only \
        else collective != "exscan"

    def start():
        if form == "call":
            return plan()
        plan.start()
        while not plan.test():  # (a refusal found by test() is wait()'s to raise)
            pass
        return plan.wait()

    with getattr(world, f"{collective}_init")(*args, algorithm=algorithm) as plan:
        for step in range(3):
            _fill(x, r, step)
            got = start()
        result = x if collective == "broadcast" else got
        # the culprit: a rank that writes (a reduce's or gather's root); a scatter
        # receiver's start() makes its result each time (nothing bound)
        culprit = r == (0 if spec.result_at_root_only else p - 1) and writes and p > 1 and \
            not (collective == "scatter" and form == "start")
        _fill(x, r, 3)
        if culprit:
            before = result.copy()
            # read-only, its base too where it has one (a view of the caller's buffer)
            bases = [result] if result.base is None else [result, result.base]
            for a in bases:
                a.flags.writeable = False
            with pytest.raises(mpicoll.InvalidArgumentError, match="read-only since|writeable"):
                start()
            np.testing.assert_array_equal(result, before)
            for a in reversed(bases):
                a.flags.writeable = True
        else:
            got = start()
            if writes:
                np.testing.assert_array_equal(got, _expected(collective, p, r, 3, shape))
        _fill(x, r, 4)
        got = start()
        if writes:
            np.testing.assert_array_equal(got, _expected(collective, p, r, 4, shape))


def test_a_receiver_with_a_strided_out_keeps_a_scatter_plan_off_the_persistent_request(world):
    p, r = world.size, world.rank
    x = np.zeros((p, 3))
    out = np.zeros(6)[::2] if r == p - 1 else np.zeros(3)
    with world.scatter_init(x if r == 0 else None, 0, out=out, algorithm="native") as plan:
        for step in range(3):
            if r == 0:
                _fill(x, 0, step)
            np.testing.assert_array_equal(plan(), _expected("scatter", p, r, step, x.shape))
        assert plan._request is None or p == 1


@pytest.mark.parametrize("collective", ["all_reduce", "scan"])
def test_ranks_in_place_and_not_keep_a_plan_off_the_persistent_request(world, collective):
    """MPI asks MPI_IN_PLACE of every rank or none: where only rank 0 plans in place,
    every rank votes its plan off MPI's persistent request (and stays right)."""
    p, r = world.size, world.rank
    x = np.zeros(3)
    init = getattr(world, f"{collective}_init")
    with init(x, "sum", algorithm="native", out=x if r == 0 else None) as plan:
        for step in range(3):
            x[...] = r + step
            want = sum(k + step for k in range(p if collective == "all_reduce" else r + 1))
            np.testing.assert_array_equal(plan(), np.full(3, float(want)))
        assert (plan._request is None) == (p > 1)


def test_plans_and_async_calls_of_two_communicators_started_in_other_orders(world):
    """Each communicator sees its calls in one order, but rank 0 starts A's before B's and
    the others B's before A's (legal in MPI: nonblocking collectives of two communicators
    do not wait for each other). The progress threads' duplicates are made where every
    rank is: when a plan is made, or by start_progress(), never at a first start."""
    first, second = world.dup(), world.dup()
    x, y = np.full(2, 1.0), np.full(2, 2.0)
    plans = {"a": first.all_reduce_init(x), "b": second.all_reduce_init(y)}
    order = "ab" if world.rank == 0 else "ba"
    for name in order:
        plans[name].start()
    np.testing.assert_array_equal(plans["a"].wait(), np.full(2, world.size * 1.0))
    np.testing.assert_array_equal(plans["b"].wait(), np.full(2, world.size * 2.0))
    third, fourth = world.dup(), world.dup()
    third.start_progress()
    fourth.start_progress()
    comms = {"a": third, "b": fourth}
    works = {name: comms[name].all_reduce(x, async_op=True) for name in order}
    np.testing.assert_array_equal(works["a"].wait(), np.full(2, world.size * 1.0))
    np.testing.assert_array_equal(works["b"].wait(), np.full(2, world.size * 1.0))
    for comm in (first, second, third, fourth):
        comm.free()


def test_a_persistent_start_returns_while_the_request_runs(world):
    """A native plan's start() is MPI_Start: it returns at once, before a late rank has
    started (its wait() is where the rank waits), test() says whether it ended, and the
    start is a numbered call in the flight recorder, done once waited for."""
    import time

    x = np.ones(3)
    with world.all_reduce_init(x, algorithm="native") as plan:
        assert plan._start_request is not None  # made with the plan, on every rank
        for _ in range(2):
            late = world.size > 1 and world.rank == world.size - 1
            if late:
                time.sleep(0.3)
            began = time.monotonic()
            plan.start()
            assert time.monotonic() - began < 0.25  # (the others: before the late rank came)
            entry = world._watch.current
            assert entry.call.collective == "all_reduce" and entry.state == "running"
            while not plan.test():
                pass
            np.testing.assert_array_equal(plan.wait(), np.full(3, float(world.size)))
            assert entry.state == "done" and entry.algorithm == "native"
            world.barrier()


def _persistent(world) -> bool:
    """Whether this library makes MPI-4's persistent collectives (every rank alike)."""
    from mpi4py import MPI

    return MPI.Get_version() >= (4, 0)


def test_a_persistent_plan_dropped_while_its_start_runs_is_waited_for_then_freed(world):
    """MPI forbids freeing an active collective request: a plan dropped after start()
    without wait() leaves its request to the next call's begin, which waits for it (every
    rank started it) before freeing it, and the calls after it run right."""
    import gc

    comm = world.dup()
    t = comm._backend.transport
    x = np.full(1 << 12, comm.rank + 1.0)
    plan = comm.all_reduce_init(x, algorithm="native")
    persistent = plan._request is not None
    assert persistent == _persistent(world)
    plan.start()
    del plan
    gc.collect()
    for _ in range(3):
        np.testing.assert_array_equal(comm.all_reduce(np.ones(3), algorithm="ring"),
                                      np.full(3, float(comm.size)))
    assert not t._retired and not t._persistent
    comm.free()


def test_a_communicator_freed_under_a_running_start_lets_it_end_right(world):
    """free() waits for a plan's running start before freeing its request: the plan's
    wait() then gives the start's result, never the input it was started on."""
    comm = world.dup()
    x = np.full(3, comm.rank + 1.0)
    plan = comm.all_reduce_init(x, algorithm="native")
    plan.start()
    comm.free()
    want = np.full(3, comm.size * (comm.size + 1) / 2)
    np.testing.assert_array_equal(plan.wait(), want)
    with pytest.raises(mpicoll.InvalidArgumentError, match="Communicator of this all_reduce"):
        plan.start()


@pytest.mark.parametrize("collective", ["all_reduce", "scan", "broadcast", "all_gather"])
@pytest.mark.parametrize("form", ["call", "start"])
def test_x_given_by_name_is_the_plans_input(world, collective, form):
    """``all_reduce_init(x=a, out=b)``: x by name is bound as x by position is (never
    read as MPI_IN_PLACE, never None in the packet), start after start on refilled input."""
    p, r = world.size, world.rank
    a = np.zeros(4)
    b = np.empty((p, 4)) if collective == "all_gather" else np.empty(4)
    kwargs = {} if collective == "broadcast" else {"out": b}
    plan = getattr(world, f"{collective}_init")(x=a, **kwargs)
    for step in range(4):
        a[...] = r + 1.0 + step
        if form == "call":
            got = plan()
        else:
            plan.start()
            got = plan.wait()
        if collective == "all_reduce":
            want = np.full(4, sum(q + 1.0 + step for q in range(p)))
        elif collective == "scan":
            want = np.full(4, sum(q + 1.0 + step for q in range(r + 1)))
        elif collective == "broadcast":
            want = np.full(4, 1.0 + step)
        else:
            want = np.repeat(np.arange(1.0, p + 1) + step, 4).reshape(p, 4)
        np.testing.assert_array_equal(got, want, err_msg=f"start {step}")
    plan.free()


@pytest.mark.parametrize("counts", ["short", "negative", "text"])
def test_counts_that_fit_no_rank_are_refused_alike_on_every_rank(world, counts):
    """A reduce_scatter plan's counts that fit no rank (too few, a negative one, not
    numbers): never refused at init on some ranks and at the first start on others, which
    left the ranks a call apart; every rank is refused alike, and the next call runs."""
    p = world.size
    given = {"short": [3] * (p - 1) if p > 1 else [], "negative": [-1] + [3] * (p - 1),
             "text": ["a"] * p}[counts]
    x = np.ones(3 * p)
    try:
        plan = world.reduce_scatter_init(x, counts=given)
        plan()
    except mpicoll.MpicollError:
        pass
    else:
        pytest.fail("counts that fit no rank were not refused")
    np.testing.assert_array_equal(world.all_reduce(np.ones(2), algorithm="ring"),
                                  np.full(2, float(p)))


def test_async_op_at_init_on_one_rank_takes_part_and_raises(world):
    """``async_op=True`` at init is refused on the rank that gives it after taking part in
    what every rank does at init (the progress duplicate, the verdicts' exchange), and
    every other rank raises a RemoteError naming it (a plan made on some ranks only would
    pair one rank's next call with the others' first start)."""
    r = world.rank
    x = np.ones(2)
    if r == world.size - 1:
        with pytest.raises(mpicoll.InvalidArgumentError, match="takes no async_op"):
            world.all_reduce_init(x, async_op=True)
    else:
        with pytest.raises(mpicoll.RemoteError, match=f"refused on rank.s. {world.size - 1}"):
            world.all_reduce_init(x)
    np.testing.assert_array_equal(world.all_reduce(x, algorithm="ring"),
                                  np.full(2, float(world.size)))


@pytest.mark.parametrize("collective, bad, words", [
    ("broadcast", {"root": 99}, "root: 99 is out of range"),
    ("gather", {"root": -1}, "root: -1 is out of range"),
    ("reduce", {"root": True}, "root: expected an int"),
    ("broadcast", {"stream": 5}, "stream: expected a cupy.cuda.Stream"),
    ("all_reduce", {"stream": "s"}, "stream: expected a cupy.cuda.Stream"),
    ("broadcast", {"bogus": 1}, "bogus= is no keyword of broadcast nor a tuning option"),
    ("all_reduce", {"algoritm": "ring"}, r"algoritm= is no keyword .*did you mean algorithm="),
    ("all_gather", {"radix": 2}, "radix= is no keyword of all_gather nor a tuning option"),
    # (a keyword of other collectives: no "did you mean root=?" of itself)
    ("all_reduce", {"root": 0}, r"root= is no keyword of all_reduce nor a tuning option"),
    ("all_reduce", {"segment_bytes": 64}, "segment_bytes= is a tuning option of all_reduce "
                                          "ring_pipelined, double_binary_tree: give algorithm="),
    ("all_reduce", {"algorithm": "ring", "radix": 2}, "takes no option 'radix'"),
    ("scan", {"bogus": 1, "algorithm": "native"}, "'native' takes no tuning options"),
    ("reduce", {"op": "summ"}, "unknown reduction op 'summ'"),
    ("all_reduce", {"op": "band"}, "op 'band' cannot reduce dtype float64"),
    ("exscan", {"x": "not an array"}, "x: expected a NumPy or CuPy array"),
    ("gather", {"x": None}, "x: expected an array, got None"),
    # (the v-variants' x: refused at init too, where each start refused it)
    ("all_gather_v", {"x": None}, "x: expected an array, got None"),
    ("gather_v", {"x": "rows"}, "x: expected a NumPy or CuPy array"),
    ("all_gather", {"x": np.array([object()])}, "dtype object"),
    # what the algorithm refuses of the op, refused at init (every start refused it)
    ("all_reduce", {"op": mpicoll.Op(np.add, commutative=False, name="ordered"),
                    "algorithm": "ring"}, "'ring' needs a commutative op"),
    ("reduce", {"op": mpicoll.Op(np.add, commutative=False, name="ordered"),
                "algorithm": "rabenseifner"}, "'rabenseifner' needs a commutative op"),
    ("scan", {"op": "land", "algorithm": "native"}, "MPI defines 'land'"),
])
def test_parameters_one_rank_gives_are_refused_at_init_and_named_elsewhere(
        world, collective, bad, words):
    """What the first start would refuse of the parameters alone (a root that is no
    rank, a stream that is none, options auto or the algorithm does not take), given on
    one rank only: refused at init there, a RemoteError naming it on the others, so no
    rank's start meets another's next call; then a good plan and the next call are right."""
    p, r = world.size, world.rank
    x = np.full(2, r + 1.0)
    make = getattr(world, f"{collective}_init")
    if r == p - 1:
        bad = dict(bad)
        with pytest.raises(mpicoll.MpicollError, match=words):
            make(bad.pop("x", x), **bad)
    else:
        with pytest.raises(mpicoll.RemoteError, match=f"refused on rank.s. {p - 1}"):
            make(x)
    with make(x) as plan:
        got = plan()
    if collective == "broadcast":
        np.testing.assert_array_equal(got, np.ones(2))
    np.testing.assert_array_equal(world.all_reduce(np.ones(2)), np.full(2, float(p)))


def test_a_v_form_on_an_algorithm_of_equal_blocks_runs_where_every_block_is_alike(world):
    """all_to_all_v on bruck (equal blocks only): a plan runs where every rank's blocks
    are alike, each start learning so in its counts' exchange; a plan of blocks unlike is
    refused at its start on every rank, and one rank that names bruck where the others
    name another algorithm raises MismatchError on every rank (it waited until the
    timeout), the next plan running."""
    p, r = world.size, world.rank
    x = np.arange(float(p))
    with world.all_to_all_v_init(x, [1] * p, algorithm="bruck") as plan:
        for _ in range(2):
            rows, counts = plan()
            assert counts == [1] * p
            np.testing.assert_array_equal(rows, np.full(p, float(r)))
    if p > 1:
        with world.all_to_all_v_init(x, [0] * (p - 1) + [p], algorithm="bruck") as plan, \
                pytest.raises(mpicoll.InvalidArgumentError, match="'bruck' needs equal blocks"):
            plan()
        with world.all_to_all_v_init(x, [1] * p, algorithm="bruck" if r == p - 1 else "pairwise") \
                as plan, pytest.raises(mpicoll.MismatchError, match="disagree on the algorithm"):
            plan()
    with world.all_to_all_v_init(x, [1] * p) as plan:
        rows, counts = plan()
    assert counts == [1] * p
    np.testing.assert_array_equal(rows, np.full(p, float(r)))


@pytest.mark.parametrize("collective, form, words", [
    ("reduce_scatter", "rows", "one row per rank"),
    ("all_to_all", "rows", "one row per rank"),
    ("reduce_scatter", "sum", "they add up to"),
    ("reduce_scatter", "short", "one per rank"),
    ("reduce_scatter", "negative", "non-negative ints"),
])
def test_an_x_cut_wrong_on_one_rank_is_refused_at_init_and_named_elsewhere(
        world, collective, form, words):
    """An x without one row per rank, or reduce_scatter's counts that do not cut it, on
    one rank only: refused at init there (the first start refused it there alone, and
    left the others waiting in it until the timeout), a RemoteError naming it on the
    others; then a good plan and the next call are right."""
    p, r = world.size, world.rank
    good, counts = np.ones((p, 2)), None
    if form != "rows":
        good, counts = np.ones(2 * p), [2] * p
    x, given = good, counts
    if r == p - 1:
        x, given = {"rows": (np.ones((p + 1, 2)), None), "sum": (np.ones(2 * p + 1), counts),
                    "short": (good, [2] * (p - 1)),
                    "negative": (good, [-1, 2 * p + 1] + [0] * (p - 2) if p > 1 else [-1])
                    }[form]
    make = getattr(world, f"{collective}_init")
    extra = {} if given is None else {"counts": given}
    if r == p - 1:
        with pytest.raises(mpicoll.InvalidArgumentError, match=words):
            make(x, **extra)
    else:
        with pytest.raises(mpicoll.RemoteError, match=f"refused on rank.s. {p - 1}"):
            make(x, **extra)
    with make(good, **({} if counts is None else {"counts": counts})) as plan:
        got = plan()
    want = np.full(2, float(p)) if collective == "reduce_scatter" else np.ones((p, 2))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(world.all_reduce(np.ones(2)), np.full(2, float(p)))


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather", "scan"])
def test_a_bad_out_at_init_on_one_rank_is_refused_there_and_named_elsewhere(world, collective):
    """An ``out=`` of another shape or dtype, a read-only one or no array on one rank is
    refused at init (checked against the result this rank will get), where the others
    raise a RemoteError naming it; a good ``out=`` is bound as it is; the next call is right."""
    p, r = world.size, world.rank
    x = np.ones((p, 2)) if collective == "reduce_scatter" else np.ones(2)
    shape = (p, 2) if collective == "all_gather" else (2,)
    read_only = np.empty(shape)
    read_only.flags.writeable = False
    for bad in (np.empty((3,) + shape), np.empty(shape, np.float32), read_only, [1.0, 2.0]):
        if r == p - 1:
            with pytest.raises(mpicoll.InvalidArgumentError, match="out"):
                getattr(world, f"{collective}_init")(x, out=bad)
        else:
            with pytest.raises(mpicoll.RemoteError, match=f"refused on rank.s. {p - 1}"):
                getattr(world, f"{collective}_init")(x, out=np.empty(shape))
        np.testing.assert_array_equal(world.all_reduce(np.ones(2)), np.full(2, float(p)))
    out = np.empty(shape)
    with getattr(world, f"{collective}_init")(x, out=out) as plan:
        assert plan() is out


@pytest.mark.parametrize("root", [-1, 99])
def test_a_bad_root_never_reaches_the_librarys_init(world, root):
    """A root that is no rank is refused at init (on every rank), never by
    MPI_Reduce_init: MPI's failure there would keep every later plan of the
    Communicator off the persistent requests."""
    comm = world.dup()
    x = np.ones(2)
    with pytest.raises(mpicoll.MpicollError, match="root"):
        comm.reduce_init(x, "sum", root, algorithm="native")
    assert comm._backend.transport.persists
    later = comm.all_reduce_init(x, algorithm="native")
    assert (later._request is not None) == _persistent(world)
    np.testing.assert_array_equal(later(), np.full(2, float(comm.size)))
    later.free()
    comm.free()


def test_a_test_refused_as_busy_keeps_the_start(world):
    """plan.test() and plan.free() refused because another thread is in a call of the
    Communicator (a ConcurrentCallError) forget nothing: the start stays (nothing freed),
    and wait() gives its result."""
    x = np.full(4, 1.0)
    plan = world.all_reduce_init(x, algorithm="native")
    plan.start()
    if plan._in_flight is not None:
        turn = world._entry
        turn.take()  # (as another thread's call holds it)
        try:
            with pytest.raises(mpicoll.ConcurrentCallError):
                while not plan.test():
                    pass
        finally:
            turn.release()
    if plan._in_flight is not None:  # free() refused as busy frees nothing: the start runs on
        turn = world._entry
        turn.take()
        try:
            with pytest.raises(mpicoll.ConcurrentCallError):
                plan.free()
        finally:
            turn.release()
        assert plan._request is not None and plan._in_flight is not None
    np.testing.assert_array_equal(plan.wait(), np.full(4, float(world.size)))
    with pytest.raises(mpicoll.InvalidArgumentError, match="freed"):
        plan.free() or plan.test()


def test_wait_with_a_timeout_on_a_persistent_start(world):
    """plan.wait(timeout) on MPI's persistent request, as Work.wait(timeout): a start
    not ended by then raises CollectiveTimeoutError and stays started; the next wait
    gives the result."""
    x = np.full(2, 1.0)
    plan = world.all_reduce_init(x, algorithm="native")
    last = world.rank == world.size - 1
    if last and world.size > 1:
        time.sleep(0.5)  # the others' starts cannot end before this rank's
    plan.start()
    if not last and plan._in_flight is not None:
        with pytest.raises(mpicoll.CollectiveTimeoutError):
            plan.wait(timeout=0.01)
    np.testing.assert_array_equal(plan.wait(timeout=30), np.full(2, float(world.size)))
    plan.free()


def test_a_plan_every_rank_refuses_leaves_the_next_calls_right(world):
    """Without check mode, a plan refused on every rank (an unknown algorithm) raises on
    each; the next calls (each first checks that every rank refused it) are right."""
    comm = world.dup(check=False)
    x = np.full(4, comm.rank + 1.0)
    for _ in range(2):
        with pytest.raises(mpicoll.InvalidArgumentError):
            comm.all_reduce_init(x, "sum", algorithm="no_such_algorithm")
    for _ in range(2):
        np.testing.assert_array_equal(comm.all_reduce(x), comm.size * (comm.size + 1) / 2)
    plan = comm.all_reduce_init(x, "sum")
    np.testing.assert_array_equal(plan(), comm.size * (comm.size + 1) / 2)
    plan.free()
    comm.free()


def test_a_start_overlapped_or_dropped_past_the_timeout_is_not_a_hang(world):
    """A plan.start() on MPI's persistent request is watched while something waits for
    it, not from start to wait: calls made meanwhile for longer than the timeout, or a
    plan dropped after its start, never end a healthy job."""
    from mpi4py import MPI

    comm = mpicoll.Communicator(MPI.COMM_WORLD, timeout=2)
    # (as many calls on every rank, sleeping past the timeout: a loop until each rank's
    # own deadline made one rank's last call one the others never made)
    calls = 110  # x 20 ms > 2 s
    x = np.ones(4)
    plan = comm.all_reduce_init(x, algorithm="native")
    plan.start()
    for _ in range(calls):  # (other calls, past the timeout)
        comm.all_reduce(x, algorithm="ring")
        time.sleep(0.02)
    np.testing.assert_array_equal(plan.wait(), float(comm.size))
    plan.start()
    del plan  # (dropped while started: the transport lets its request go)
    for _ in range(calls):
        np.testing.assert_array_equal(comm.all_reduce(x, algorithm="ring"), float(comm.size))
        time.sleep(0.02)
    comm.free()


def test_a_start_refused_as_busy_is_not_counted(world):
    """plan.start() while another thread holds the Communicator: ConcurrentCallError, and
    the start was not made (``starts`` unchanged, as plan()'s), on every path."""
    plan = world.all_reduce_init(np.ones(2), algorithm="ring")
    world._entry.take()  # (as another thread's call would: IndexError if one had it)
    try:
        with pytest.raises(mpicoll.ConcurrentCallError):
            plan.start()
    finally:
        world._entry.release()
    assert plan.starts == 0
    np.testing.assert_array_equal(plan(), np.full(2, float(world.size)))
    assert plan.starts == 1
    plan.free()


@pytest.mark.parametrize("algorithm", ["pairwise", "linear", "native"])
def test_a_start_on_an_out_made_read_only_on_one_rank_then_writeable_again(world, algorithm):
    """plan.start() of a settled plan whose out= the last rank made read-only: that rank
    takes part and raises, the others get theirs; once writeable again, every start is
    right on every rank (the plan's own view of it stayed read-only: the next start
    failed on that rank alone, mid-call, the others waiting)."""
    p, r = world.size, world.rank
    x, out = np.zeros(p), np.zeros(p)
    plan = world.all_to_all_init(x, algorithm=algorithm, out=out)
    for step in range(4):
        x[...] = np.arange(p) + 10 * r + 100 * step
        want = np.arange(p) * 10 + r + 100 * step
        if step == 1 and r == p - 1:  # (every rank starts it, as every start)
            out.flags.writeable = False
            with pytest.raises(mpicoll.InvalidArgumentError, match="writeable|read-only"):
                plan.start()
                plan.wait()
            out.flags.writeable = True
            continue
        if step in (1, 3):
            plan.start()
            got = plan.wait()
        else:
            got = plan()
        np.testing.assert_array_equal(got, want)
        assert got is out
    plan.free()


@pytest.mark.parametrize("collective", ["exscan", "reduce"])
def test_check_mode_turned_on_over_plans_settled_on_some_ranks_only(world, collective):
    """A plan settled (decided) on some ranks only (another's strided out= keeps it on the
    whole path): with check mode turned on since, every start takes the whole path and
    is compared (the settled ranks ran theirs uncompared; the others waited)."""
    p, r = world.size, world.rank
    x = np.arange(4.0) + r
    strided = r == p - 1 and (collective == "exscan" and r != 0 or
                              collective == "reduce" and r == 0)
    out = np.zeros((4, 2))[:, 0] if strided else None
    given = {} if out is None else {"out": out}
    plan = world.exscan_init(x, "sum", algorithm="binomial", **given) if collective == "exscan" \
        else world.reduce_init(x, "sum", 0, algorithm="binomial", **given)
    plan()
    world.check = True
    try:
        for _ in range(2):
            got = plan()
            if collective == "exscan":
                want = None if r == 0 else sum(np.arange(4.0) + k for k in range(r))
            else:
                want = sum(np.arange(4.0) + k for k in range(p)) if r == 0 else None
            if want is None:
                assert got is None
            else:
                np.testing.assert_array_equal(got, want)
    finally:
        world.check = False
    plan.free()


def test_a_wait_whose_timeout_meets_the_end_of_the_start_keeps_it(world, monkeypatch):
    """plan.wait(timeout=) that raises as the start ends: the start stays the plan's, and
    the next wait() gives its result (it was lost: "this plan is not started")."""
    plan = world.all_reduce_init(np.ones(2), algorithm="ring")
    plan.start()
    work = plan._work
    real = work.wait

    def finished_as_it_timed_out(timeout=None):
        real()
        raise mpicoll.CollectiveTimeoutError("all_reduce: not finished after 0 s")

    monkeypatch.setattr(work, "wait", finished_as_it_timed_out)
    with pytest.raises(mpicoll.CollectiveTimeoutError):
        plan.wait(timeout=0)
    monkeypatch.setattr(work, "wait", real)
    np.testing.assert_array_equal(plan.wait(), np.full(2, float(world.size)))
    plan.free()


@pytest.mark.parametrize("turned", ["on", "off"])
def test_check_mode_turned_on_or_off_reaches_the_async_calls(world, turned):
    """comm.check set after the progress thread's duplicate was made reaches it, between
    the calls queued before and after: on, an async call whose op differs on one rank
    raises MismatchError on every rank (it returned a mix, silently); off, one rank's
    read-only out= is that rank's refusal alone (the others raised)."""
    from mpi4py import MPI

    comm = mpicoll.Communicator(MPI.COMM_WORLD, check=turned == "off")
    comm.start_progress()
    comm.check = turned == "on"
    p, r = comm.size, comm.rank
    x = np.arange(4.0) + r
    if turned == "on":
        op = "max" if r == p - 1 else "sum"
        if p == 1:
            np.testing.assert_array_equal(comm.all_reduce(x, op, async_op=True).wait(), x)
        else:
            with pytest.raises(mpicoll.MismatchError, match="differs in op"):
                comm.all_reduce(x, op, algorithm="ring", async_op=True).wait()
    else:
        out = np.zeros(4)
        out.flags.writeable = r != p - 1
        work = comm.all_reduce(x, algorithm="ring", out=out, async_op=True)
        if r == p - 1:
            with pytest.raises(mpicoll.InvalidArgumentError, match="writeable"):
                work.wait()
        else:
            np.testing.assert_array_equal(work.wait(), sum(np.arange(4.0) + k for k in range(p)))
    np.testing.assert_array_equal(comm.all_reduce(np.ones(1), async_op=True).wait(), [p])
    comm.free()


def test_a_broadcast_plans_root_gets_its_own_read_only_x_back_from_the_whole_path(world):
    """A root's x made read-only (it is only read): a start that takes the whole path
    (start(), or any start in check mode) gives back x itself, as every start does (it
    gave a view of it, the whole path's read-only view of its own)."""
    r = world.rank
    x = np.arange(4.0) if r == 0 else np.zeros(4)
    plan = world.broadcast_init(x, root=0)
    plan()
    if r == 0:
        x.flags.writeable = False
    plan.start()
    assert plan.wait() is x
    world.check = True
    try:
        assert plan() is x
    finally:
        world.check = False
    np.testing.assert_array_equal(x, np.arange(4.0))
    plan.free()


def test_a_busy_persistent_plans_refusal_names_the_call_it_refuses(world):
    """A plan on MPI's persistent request refused as busy says which of its calls was:
    plan.start() (it said plan() for both)."""
    plan = world.all_reduce_init(np.ones(2), algorithm="native")
    assert plan._start_request is not None  # (MPI_Start on its request)
    world._entry.take()
    try:
        with pytest.raises(mpicoll.ConcurrentCallError, match=r"all_reduce plan\.start\(\)"):
            plan.start()
    finally:
        world._entry.release()
    np.testing.assert_array_equal(plan(), np.full(2, float(world.size)))
    plan.free()


def test_a_plans_arrays_cannot_be_resized_and_a_stray_out_is_refused_at_init(world):
    """The arrays a plan binds (and their bases) cannot be resized in place while it lives
    (the memory its starts use would be freed: stale or corrupt results); out= given to a
    collective that takes none, on one rank, is refused at init on every rank (it raised
    at the first start on that rank alone, the others waiting for it)."""
    base = np.zeros(8)
    x, y = base[:4], np.zeros(4)
    plan = world.all_reduce_init(x, "sum", out=y)
    plan()
    for array in (base, y):
        with pytest.raises(ValueError, match="cannot resize"):
            array.resize(64, refcheck=False)
    x[:] = 1
    np.testing.assert_array_equal(plan(), np.full(4, world.size))
    assert "inactive" in repr(plan)
    plan.free()
    y.resize(2, refcheck=False)  # (freed: the plan let go of its arrays)
    last = world.rank == world.size - 1
    kwargs = {"out": np.zeros(1)} if last else {}
    with pytest.raises(mpicoll.InvalidArgumentError if last else mpicoll.RemoteError,
                       match="takes no out=" if last else rf"rank\(s\) {world.size - 1}"):
        world.barrier_init(**kwargs)
    with world.barrier_init() as barrier:
        barrier()
    np.testing.assert_array_equal(world.all_reduce(np.ones(2)), np.full(2, world.size))
