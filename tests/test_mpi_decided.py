"""The default call's kept decisions (``mpicoll.pipeline.decided``) under mpiexec.

A call that repeats an earlier call's values (collective, shape, dtype, op, root,
algorithm, options) runs what that call decided on its new buffers. It must send exactly
the messages the whole path sends (recorded here at the transport, call by call), give
the same results, and stay right when one rank takes the whole path while the others
run their decisions, when the root of a broadcast changes what it sends, when ``out=``
changes between calls, and when one rank refuses a call between decided ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest
from test_mpi_plans import _expected, _fill

import mpicoll
from mpicoll.algorithms import REGISTRY
from mpicoll.errors import MpicollError
from mpicoll.pipeline import decided

pytestmark = pytest.mark.mpi

CASES = [(c, a) for c in sorted(decided.DECIDED) for a in [*REGISTRY[c], "native", "auto"]]
_MESSAGES = ("send", "recv", "sendrecv", "isend", "irecv")


@contextlib.contextmanager
def recorded(comm: mpicoll.Communicator) -> Iterator[list]:
    """Every point-to-point message ``comm``'s transport moves: (kind, bytes and peers)."""
    t, log = comm._backend.transport, []

    def recording(kind: str, fn):
        def wrapped(*args):
            log.append((kind, *(getattr(a, "nbytes", a) for a in args)))
            return fn(*args)

        return wrapped

    for kind in _MESSAGES:
        setattr(t, kind, recording(kind, getattr(t, kind)))
    try:
        yield log
    finally:
        for kind in _MESSAGES:
            delattr(t, kind)


def _call(world, collective: str, algorithm: str, step: int, out_kind: str = "none"):
    """One default call of ``collective`` on a fresh input filled for ``step``:
    (what it returned, the key of its decision)."""
    p, r = world.size, world.rank
    spec = mpicoll.spec.SPECS[collective]
    shape = (p, 3) if spec.input_rows else (5,)
    x = np.empty(shape)
    _fill(x, r, step)
    args: tuple = (x,)
    kwargs: dict = {"algorithm": algorithm}
    if collective == "barrier":
        args = ()
    elif collective in ("broadcast", "scatter"):
        args = (x if r == 0 else None, 0)
    elif collective == "gather":
        args = (x, 0)
    elif collective == "reduce":
        args = (x, "sum", 0)
    elif spec.reduces:
        args = (x, "sum")
    if out_kind == "in_place" and collective in ("all_reduce", "scan", "all_to_all"):
        kwargs["out"] = x
    elif out_kind == "given" and collective in ("all_reduce", "scan", "all_gather", "scatter"):
        kwargs["out"] = np.full((p, 5) if collective == "all_gather" else
                                (3,) if collective == "scatter" else shape, -1.0)
    got = getattr(world, collective)(*args, **kwargs)
    return got, decided.key(collective, args, kwargs)


def _check(world, collective: str, step: int, got) -> None:
    p, r = world.size, world.rank
    spec = mpicoll.spec.SPECS[collective]
    if collective == "barrier":
        assert got is None
        return
    nothing = (spec.result_at_root_only and r != 0) or (collective == "exscan" and r == 0)
    if nothing:
        assert got is None
        return
    shape = (p, 3) if spec.input_rows else (5,)
    np.testing.assert_array_equal(got, _expected(collective, p, r, step, shape))


@pytest.mark.parametrize(("collective", "algorithm"), CASES)
def test_a_kept_decision_sends_the_messages_of_the_whole_path(world, collective, algorithm):
    world._decisions.clear()  # every rank alike: the first call below takes the whole path
    logs = []
    for step in range(3):
        with recorded(world) as log:
            got, key = _call(world, collective, algorithm, step)
        _check(world, collective, step, got)
        logs.append(log)
        decision = world._decisions.get(key)
        assert decision is not None and decision is not decided.DECLINED
    assert logs[1] == logs[0] and logs[2] == logs[0]


@pytest.mark.parametrize("collective", sorted(decided.DECIDED))
def test_the_bare_default_call_repeated_on_writeable_and_read_only_input(world, collective):
    """``comm.all_reduce(x)`` with no keyword (the entry's shortest path): the same
    messages and results call after call, x never written, read-only or not."""
    world._decisions.clear()
    p, r = world.size, world.rank
    spec = mpicoll.spec.SPECS[collective]
    shape = (p, 3) if spec.input_rows else (5,)
    logs = []
    for step, writeable in enumerate([True, True, False, True, False]):
        x = np.empty(shape)
        _fill(x, r, step)
        x.flags.writeable = writeable
        before = x.copy()
        args = {"barrier": (), "broadcast": (x if r == 0 else None, 0),
                "scatter": (x if r == 0 else None, 0), "gather": (x, 0),
                "reduce": (x, "sum", 0)}.get(collective, (x, "sum") if spec.reduces else (x,))
        with recorded(world) as log:
            got = getattr(world, collective)(*args)
        _check(world, collective, step, got)
        np.testing.assert_array_equal(x, before)
        logs.append(log)
    assert all(log == logs[0] for log in logs)


@pytest.mark.parametrize("out_kind", ["in_place", "given", "none"])
@pytest.mark.parametrize("collective", sorted(decided.DECIDED))
def test_out_may_change_between_decided_calls(world, collective, out_kind):
    world._decisions.clear()
    kinds = ["none", out_kind, "none", out_kind, out_kind]
    for step, kind in enumerate(kinds):
        got, _ = _call(world, collective, "auto", step, kind)
        _check(world, collective, step, got)


@pytest.mark.parametrize("collective", ["gather", "all_gather", "reduce_scatter", "all_to_all",
                                        "reduce", "scan"])
@pytest.mark.parametrize("algorithm", ["auto", "native"])
def test_out_x_of_another_shape_is_refused_after_a_kept_out_decision(world, collective,
                                                                     algorithm):
    """A decision kept for ``out=`` serves only an out= of the result's shape: ``out=x``
    where the result's shape is not x's (gather, all_gather, reduce_scatter) is refused
    on every rank, as the whole path refuses it, then the next call is right."""
    world._decisions.clear()
    p, r = world.size, world.rank
    spec = mpicoll.spec.SPECS[collective]
    shape = (p, 3) if spec.input_rows else (5,)
    given = {"algorithm": algorithm, **({"op": "sum"} if spec.reduces else {}),
             **({"root": 0} if spec.rooted else {})}
    method = getattr(world, collective)
    result_shape = spec.result_shape(shape, p)
    for step in range(2):  # the whole path, then its decision
        x = np.empty(shape)
        _fill(x, r, step)
        out = np.empty(result_shape)
        got = method(x, out=out, **given)
        if not (spec.result_at_root_only and r != 0):
            np.testing.assert_array_equal(got, _expected(collective, p, r, step, shape))
    x = np.empty(shape)
    _fill(x, r, 2)
    receives = not spec.result_at_root_only or r == 0
    if result_shape == shape or not receives:  # out=x is the in-place form, or ignored
        got = method(x, out=x, **given)
        if receives:
            np.testing.assert_array_equal(got, _expected(collective, p, r, 2, shape))
    else:
        with pytest.raises(MpicollError):
            method(x, out=x, **given)
    got, _ = _call(world, collective, algorithm, 3)
    _check(world, collective, 3, got)


@pytest.mark.parametrize("collective", sorted(decided.DECIDED - {"barrier"}))
def test_one_rank_on_the_whole_path_meets_the_others_decisions(world, collective):
    """Rank 0's input is a strided view (never kept): its calls take the whole path while
    the others run their decisions."""
    if world.size < 2:
        pytest.skip("needs two ranks")
    p, r = world.size, world.rank
    spec = mpicoll.spec.SPECS[collective]
    shape = (p, 3) if spec.input_rows else (5,)
    for step in range(3):
        whole = np.empty((*shape[:-1], 2 * shape[-1]))
        x = whole[..., ::2] if r == 0 else np.empty(shape)
        _fill(x, r, step)
        if collective in ("broadcast", "scatter"):
            got = getattr(world, collective)(x if r == 0 else None, 0)
        elif collective == "gather":
            got = world.gather(x, 0)
        elif collective == "reduce":
            got = world.reduce(x, "sum", 0)
        else:
            got = getattr(world, collective)(x)
        _check(world, collective, step, got)


@pytest.mark.parametrize(("collective", "algorithm"),
                         [(c, a) for c in ("broadcast", "scatter")
                          for a in [*REGISTRY[c], "native", "auto", None]])
def test_receivers_follow_a_root_that_changes_what_it_sends(world, collective, algorithm):
    """A receiver's decision expects the root's header of its first call; when the root
    sends another (shape, dtype, a size past the packet), the receiver goes on as the
    whole path does (algorithm None: the bare call, ``comm.scatter(None)``, which the
    entry's first branch keys)."""
    world._decisions.clear()
    p, r = world.size, world.rank
    for step, (n, dtype) in enumerate([(5, "f8"), (5, "f8"), (7, "f8"), (5, "i4"), (5, "f8"),
                                       (3000, "f8"), (5, "f8"), (0, "u1"), (5, "f8")]):
        shape = (n,) if collective == "broadcast" else (p, n)
        sent = (np.arange(np.prod(shape)).reshape(shape) + step).astype(dtype)
        got = getattr(world, collective)(sent.copy() if r == 0 else None,
                                         **({} if algorithm is None else {"algorithm": algorithm}))
        want = sent if collective == "broadcast" else sent[r]
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype


def test_a_refusal_on_one_rank_between_decided_calls(world):
    """Rank 1's out= of the wrong shape: its call declines the decision and refuses as
    the whole path does (taking part, then raising); every rank's next call is right."""
    if world.size < 2:
        pytest.skip("needs two ranks")
    world._decisions.clear()
    p, r = world.size, world.rank
    x = np.full(4, r + 1.0)
    total = p * (p + 1) / 2
    for _ in range(2):
        np.testing.assert_array_equal(world.all_reduce(x), np.full(4, total))
    if r == 1:
        with pytest.raises(MpicollError):
            world.all_reduce(x, out=np.empty(3))
    else:
        np.testing.assert_array_equal(world.all_reduce(x), np.full(4, total))
    for _ in range(2):
        np.testing.assert_array_equal(world.all_reduce(x), np.full(4, total))


@pytest.mark.parametrize("value", [0.0, False])
def test_a_kept_decision_refuses_what_the_whole_path_refuses(world, value):
    """A root of 0.0 or False equals 0 (and hashes as it does), but the whole path
    refuses it: it must not find the kept decision of root 0 and run."""
    world._decisions.clear()
    x = np.ones(3)
    for _ in range(2):
        world.broadcast(x, 0)
        world.reduce(x, "sum", 0)
        world.gather(x, 0)
    for call in (lambda: world.broadcast(x, value), lambda: world.reduce(x, "sum", value),
                 lambda: world.gather(x, root=value)):
        with pytest.raises(mpicoll.InvalidArgumentError, match="root"):
            call()
    total = world.reduce(x, "sum", 0)  # and the next call is right
    if world.rank == 0:
        np.testing.assert_array_equal(total, np.full(3, float(world.size)))


@pytest.mark.parametrize("change", ["shape", "dtype"])
@pytest.mark.parametrize("collective", ["all_reduce", "scan", "reduce", "all_gather"])
def test_an_out_changed_in_place_after_kept_calls_is_refused(world, collective, change):
    """``out.shape = ...`` or ``out.dtype = ...`` on the same array between kept calls:
    the decision's last binding of that array must not serve it (float64 bits read as
    float32, a result of the new shape), but the whole path's refusal, on every rank; the next
    call is right."""
    world._decisions.clear()
    spec = mpicoll.spec.SPECS[collective]
    given = {**({"op": "sum"} if spec.reduces else {}), **({"root": 0} if spec.rooted else {})}
    p, r = world.size, world.rank
    x = np.empty(4)
    out = np.empty(spec.result_shape((4,), p))
    method = getattr(world, collective)
    receives = not spec.result_at_root_only or r == 0
    for step in range(3):
        _fill(x, r, step)
        got = method(x, out=out, **given)
        if receives:
            np.testing.assert_array_equal(got, _expected(collective, p, r, step, (4,)))
    if change == "shape":
        out.shape = (*out.shape, 1)
    else:
        out.dtype = np.float32
    refused = False
    try:
        method(x, out=out, **given)
    except mpicoll.InvalidArgumentError:
        refused = True
    assert refused == receives  # (a non-root's out= is not its result: not read)
    _fill(x, r, 3)
    got = method(x, out=np.empty(spec.result_shape((4,), p)), **given)
    if receives:
        np.testing.assert_array_equal(got, _expected(collective, p, r, 3, (4,)))


def test_broadcast_out_is_refused_after_kept_calls_as_before(world):
    """broadcast has no out=: an ``out=`` is one of its tuning options, refused with
    "auto" on the first call; after kept calls it must still be refused on every rank,
    not find the decision of the call without it (the key keeps it)."""
    world._decisions.clear()
    b, y = np.arange(4.0) * (world.rank == 0), np.full(4, -1.0)
    for _ in range(3):
        world.broadcast(b, 0)
    for _ in range(2):
        with pytest.raises(mpicoll.InvalidArgumentError, match="this call takes no out="):
            world.broadcast(b, 0, out=y)
    np.testing.assert_array_equal(y, np.full(4, -1.0))
    np.testing.assert_array_equal(world.broadcast(b, 0), np.arange(4.0) * 1.0)


def test_a_user_op_is_never_kept(world):
    """A user's Op is not a key: the table would keep it alive (and its MPI op)."""
    op = mpicoll.Op(lambda a, b, out: np.add(a, b, out=out), commutative=True, name="plus")
    world._decisions.clear()
    x = np.ones(3)
    for _ in range(2):
        np.testing.assert_array_equal(world.all_reduce(x, op), np.full(3, world.size))
    assert not world._decisions


def test_a_small_slice_of_a_large_buffer_is_never_kept_alive_by_a_decision(world):
    """A decision keeps its last binding of small arrays only: a small view of a large
    buffer (a bias in a flat gradient) would keep the whole buffer alive."""
    world._decisions.clear()
    flat, own = np.ones(1 << 17), np.ones(4)
    out = np.empty(4)
    for x in (flat[:4], own):
        for _ in range(3):
            np.testing.assert_array_equal(world.all_reduce(x, out=out),
                                          np.full(4, float(world.size)))
    kept = [d.last for d in world._decisions.values() if d is not decided.DECLINED]
    assert all(last is None or last[1] is own for last in kept)
    assert any(last is not None and last[1] is own for last in kept)


_FORMS = {  # a call form: (collective, positional arguments after x, keywords)
    "all_reduce(x)": ("all_reduce", (), {}),
    "all_reduce(x, op)": ("all_reduce", ("sum",), {}),
    "all_reduce(x, op=)": ("all_reduce", (), {"op": "sum"}),
    "all_reduce(x, ReduceOp)": ("all_reduce", (mpicoll.ReduceOp.SUM,), {}),
    "all_reduce(x, op, algorithm=)": ("all_reduce", ("sum",), {"algorithm": "ring"}),
    "all_reduce(x, out=y)": ("all_reduce", (), {"out": "y"}),
    "all_reduce(x, out=None)": ("all_reduce", (), {"out": None}),
    "all_reduce(x, op, out=x)": ("all_reduce", ("sum",), {"out": "x"}),
    "all_reduce(x, algorithm=, out=y)": ("all_reduce", (), {"algorithm": "native", "out": "y"}),
    "broadcast(x, root)": ("broadcast", (0,), {}),
    "broadcast(x, root=)": ("broadcast", (), {"root": 0}),
    "reduce(x, op, root)": ("reduce", ("sum", 0), {}),
    "reduce(x, op=, root=)": ("reduce", (), {"op": "sum", "root": 0}),
    "gather(x, root, algorithm=)": ("gather", (0,), {"algorithm": "linear"}),
    "scan(x, op, out=y)": ("scan", ("sum",), {"out": "y"}),
}


def _counted(monkeypatch) -> tuple[list, list]:
    """The collectives that took the whole path (``entry.numbered``) and those keyed the
    longer way (``decided.key``), call by call, from now on."""
    from mpicoll.pipeline import entry

    whole, keyed = [], []
    original, original_key = entry.numbered, decided.key
    monkeypatch.setattr(entry, "numbered", lambda *a, **k: (whole.append(a[1]),
                                                             original(*a, **k))[1])
    monkeypatch.setattr(decided, "key", lambda *a: (keyed.append(a[0]), original_key(*a))[1])
    return whole, keyed


@pytest.mark.parametrize("form", sorted(_FORMS))
def test_every_call_form_finds_its_decision_from_its_second_call(world, form, monkeypatch):
    """The entry's first branch keys a call as decided.key does: from the second call
    of each form on, the call runs its kept decision, found by that branch (never by
    decided.key, the longer way, and never the whole path again), with the whole path's
    results. A key that differed would make every call take the longer way, or find
    another call's decision."""
    collective, rest, keywords = _FORMS[form]
    whole, keyed = _counted(monkeypatch)
    world._decisions.clear()
    p = world.size
    for step in range(4):
        x = np.full(3, step + 1.0)
        y = np.empty(3)
        kwargs = {k: x if v == "x" else y if v == "y" else v for k, v in keywords.items()}
        got = getattr(world, collective)(x, *rest, **kwargs)
        if collective == "all_reduce":
            want = np.full(3, (step + 1.0) * p)
        elif collective == "broadcast":
            want = np.full(3, step + 1.0)
        elif collective == "reduce":
            want = np.full(3, (step + 1.0) * p) if world.rank == 0 else None
        elif collective == "gather":
            want = np.full((p, 3), step + 1.0) if world.rank == 0 else None
        else:  # scan
            want = np.full(3, (step + 1.0) * (world.rank + 1))
        if want is None:
            assert got is None
        else:
            np.testing.assert_array_equal(got, want)
            if keywords.get("out") in ("x", "y"):
                assert got is kwargs["out"]
        assert whole == [collective], f"call {step}: the whole path ran {len(whole)} times"
        assert keyed == [collective], f"call {step}: keyed the longer way {len(keyed)} times"


@pytest.mark.parametrize("form", ["scatter(None)", "scatter(None, root)",
                                  "broadcast(None)", "broadcast(None, root)"])
def test_a_receiver_giving_none_finds_its_decision_from_its_second_call(world, form,
                                                                        monkeypatch):
    """A receiver's ``comm.scatter(None)`` or ``comm.broadcast(None, root)`` (it has no
    data, and no buffer) is keyed by the entry's first branch too, as decided.key keys
    it: from the second call on, its decision runs, never the longer way."""
    collective, with_root = form.split("(")[0], "root" in form
    whole, keyed = _counted(monkeypatch)
    world._decisions.clear()
    p, r = world.size, world.rank
    for step in range(4):
        data = np.full((p, 3) if collective == "scatter" else 3, step + 1.0)
        got = getattr(world, collective)(data if r == 0 else None, *((0,) if with_root else ()))
        np.testing.assert_array_equal(got, np.full(3, step + 1.0))
        assert whole == [collective], f"call {step}: the whole path ran {len(whole)} times"
        assert keyed == [collective], f"call {step}: keyed the longer way {len(keyed)} times"


def test_barrier_and_x_by_name_find_their_way(world, monkeypatch):
    """``comm.barrier()`` (no x at all) is keyed by the entry's first branch from its
    second call on; x given by name is x by position (``all_reduce(x=x)``, a receiver's
    ``broadcast(x=None, root=0)``), again and again; x given twice is a TypeError of the
    call, raised as mpicoll's error on every rank, and the next call goes on."""
    whole, keyed = _counted(monkeypatch)
    world._decisions.clear()
    for step in range(3):
        assert world.barrier() is None
        assert whole == ["barrier"] and keyed == ["barrier"], step
    x = np.full(3, 2.0)
    for _ in range(3):
        np.testing.assert_array_equal(world.all_reduce(x=x), np.full(3, 2.0 * world.size))
    assert whole.count("all_reduce") == 1  # (kept as all_reduce(x) is)
    for step in range(4):
        data = np.full(3, step + 1.0)
        got = world.broadcast(x=data if world.rank == 0 else None, root=0)
        np.testing.assert_array_equal(got, data)
    with pytest.raises(mpicoll.MpicollError, match="multiple values for argument 'x'"):
        world.all_reduce(x, x=x)
    np.testing.assert_array_equal(world.all_reduce(x), np.full(3, 2.0 * world.size))


def test_an_entry_keyword_is_never_part_of_a_key(world):
    """stream=None and async_op=False are plain values, but the entry's own keywords:
    the first branch keys them as given and finds nothing (decided.key is taken without
    them, so no key in the table holds one), and the call runs as the same call without
    them, through the longer way."""
    world._decisions.clear()
    x = np.full(3, 2.0)
    y = np.empty(3)
    for _ in range(3):
        for kwargs in ({}, {"stream": None}, {"async_op": False}, {"stream": None, "out": y},
                       {"op": "sum", "async_op": False}):
            got = world.all_reduce(x, **kwargs)
            np.testing.assert_array_equal(got, np.full(3, 2.0 * world.size))
            assert (got is y) == ("out" in kwargs)
    entry_keywords = {"stream", "async_op", "_site", "_refusal"}
    held = [k for key in world._decisions for k in key
            if type(k) is tuple and len(k) == 2 and k[0] in entry_keywords]
    assert world._decisions and not held, held


@pytest.mark.parametrize(("collective", "algorithm"),
                         [(c, a) for c in ("broadcast", "scatter")
                          for a in [*REGISTRY[c], "native", "auto"]])
def test_sizes_at_the_edge_of_the_packet(world, collective, algorithm):
    """The root's data fills the header's packet to its last byte, then passes it by one
    item: each size twice (the whole path, then its decision), every root, receivers with
    a buffer or None."""
    limit, p, r = world._backend.packed_bytes, world.size, world.rank
    edge = limit if collective == "broadcast" else limit // p  # uint8: a byte an item
    for root in range(p):
        for count in (edge, edge + 1):
            shape = (count,) if collective == "broadcast" else (p, count)
            sent = (np.arange(int(np.prod(shape))) % 251 + root).astype(np.uint8).reshape(shape)
            assert (sent.nbytes <= limit) == (count == edge)
            want = sent if collective == "broadcast" else sent[r]
            for _ in range(2):
                if collective == "broadcast":
                    x = sent.copy() if r == root else np.empty(shape, np.uint8) \
                        if r % 2 else None
                    got = world.broadcast(x, root, algorithm=algorithm)
                else:
                    got = world.scatter(sent.copy() if r == root else None, root,
                                        algorithm=algorithm)
                np.testing.assert_array_equal(got, want)


_TYPED = "?bBhHiIlLqQefdFD"  # (MPICH reduces no long double)


@pytest.mark.parametrize("collective", ["all_reduce", "reduce", "scan", "exscan",
                                        "reduce_scatter"])
@pytest.mark.parametrize("code", _TYPED)
def test_the_direct_call_names_count_and_datatype_as_mpi4py_finds_them(world, collective,
                                                                       code):
    """A decided call of MPI's own reduction gives each buffer as (array, count, datatype)
    (``mpi_native.typed``): results equal to mpi4py's own call on the bare arrays, call
    after call, in every dtype MPI reduces."""
    from mpi4py import MPI

    from mpicoll.backends.mpi_native import typed

    dtype = np.dtype(code)  # (equal dtypes of two buffer formats, 'l' and 'q': one named)
    assert typed(dtype) is not None and typed(dtype).Get_size() == dtype.itemsize
    p, r = world.size, world.rank
    op = "max" if dtype.kind != "c" else "sum"
    mpi = world._backend.transport.comm.Dup()
    world._decisions.clear()
    for step in range(3):
        x = ((np.arange(2 * p) + 3 * r + step) % 5).astype(dtype)
        if collective == "reduce_scatter":
            x = x.reshape(p, 2)
        args = (x, op, 0) if collective == "reduce" else (x, op)
        got = getattr(world, collective)(*args, algorithm="native")
        want = np.zeros((2,) if collective == "reduce_scatter" else x.shape, dtype)
        mop = MPI.MAX if op == "max" else MPI.SUM
        if dtype.kind == "b":
            mop = MPI.LOR
        method = {"all_reduce": mpi.Allreduce, "reduce": mpi.Reduce, "scan": mpi.Scan,
                  "exscan": mpi.Exscan, "reduce_scatter": mpi.Reduce_scatter_block}[collective]
        method(x, want, mop, *((0,) if collective == "reduce" else ()))
        if (collective == "reduce" and r != 0) or (collective == "exscan" and r == 0):
            assert got is None
        else:
            assert got.dtype == dtype and got.tobytes() == want.tobytes()
    decision = world._decisions.get(decided.key(collective, args, {"algorithm": "native"}))
    assert decision.direct or (collective == "exscan" and r == 0)  # (its rank 0: no result)
    mpi.Free()


@pytest.mark.parametrize("dtype", [">f4", "<i2" if np.little_endian is False else ">i2",
                                   [("a", "f4")], "(2,)f8", "bfloat16"])
def test_a_dtype_mpi4py_has_no_datatype_for_is_never_named(world, dtype):
    """``typed``: None where mpi4py finds no predefined datatype of the same size (a
    byte-swapped, structured or subarray dtype, ml_dtypes' bfloat16): the decided call
    then gives the bare arrays, as before."""
    from mpicoll.backends.mpi_native import typed

    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        dtype = ml_dtypes.bfloat16
    assert typed(np.dtype(dtype)) is None


@pytest.mark.parametrize("collective", ["all_reduce", "reduce", "scan", "exscan",
                                        "reduce_scatter"])
def test_equal_dtypes_of_other_buffer_formats_share_one_decision(world, collective):
    """int64 as 'l' and as 'q' (equal dtypes, one key; mpi4py names their buffers
    MPI_LONG and MPI_LONG_LONG): one MPI datatype names both buffers, so a call on 'q'
    after one on 'l' (a kept decision), an out= of the other format, and one rank's
    other format are right, not mpi4py's "mismatch in send and receive MPI datatypes"."""
    from mpicoll.backends.mpi_native import typed

    assert typed(np.dtype("q")) is typed(np.dtype("l")) is not None
    p, r = world.size, world.rank
    root = {"root": 0} if collective == "reduce" else {}
    first = "q" if r == 0 else "l"  # (one rank's other format first)
    for code, out_code in ((first, None), ("l", None), ("q", "l"), ("l", "q")):
        x = np.ones((p, 2), np.dtype(code)) * (r + 1)
        shape = (2,) if collective == "reduce_scatter" else (p, 2)
        out = None if out_code is None or (collective == "reduce" and r != 0) else \
            np.empty(shape, np.dtype(out_code))
        got = getattr(world, collective)(x, "sum", out=out, **root)
        ranks = {"scan": r + 1, "exscan": r}.get(collective, p)
        if got is not None:
            assert got.tolist() == np.full(shape, ranks * (ranks + 1) // 2).tolist()


def test_advance_moves_the_tag_as_begin_does(world):
    """``MPITransport.advance`` (a decided call of MPI's own collective, which sends
    nothing of ours) moves the tag exactly as ``begin`` does, wrapping at the limit, and
    clears the watchdog's slots; and so do the calls that make its stores themselves
    (``entry.prepare``'s MPI collective on a new result, in place, and a header packet
    alone; a persistent plan's start): every rank alike, so the tags stay in step."""
    t = world._backend.transport
    x, y = np.ones(3, np.float32), np.ones(3, np.float32)
    plan = world.all_reduce_init(x, out=np.empty_like(x))
    calls = {"advance": t.advance, "all_reduce": lambda: world.all_reduce(x),
             "all_reduce out=x": lambda: world.all_reduce(y, out=y),
             "broadcast": lambda: world.broadcast(np.ones(2)),
             "plan": plan}
    for _ in range(3):  # decided, and the plan's persistent request made
        for name, call in calls.items():
            if name != "advance":
                call()
    saved = t.tag
    try:
        for name, call in calls.items():
            for start in (5, t.tag_limit - 2, t.tag_limit - 1):
                t.tag = start
                t.begin()
                by_begin = t.tag
                t.tag = start
                t.step, t.wait_kind = 3, "recv"
                call()
                assert (name, t.tag, t.step, t.wait_kind) == (name, by_begin, 0, None)
    finally:
        t.tag = saved
    plan.free()
    world.barrier()


def test_an_in_place_all_reduce_is_mpis_in_place_call_alone(world, monkeypatch):
    """``comm.all_reduce(x, out=x)`` (mpicoll.dist's all_reduce) repeated: MPI's in-place
    Allreduce on x, nothing bound (``Decision.bound`` not called), right on every step;
    made read-only, x is refused as the whole path refuses it, and the next call is right."""
    world._decisions.clear()
    bound = []
    original = decided.Decision.bound
    monkeypatch.setattr(decided.Decision, "bound",
                        lambda self, x, out: (bound.append(1), original(self, x, out))[1])
    x = np.zeros(4)
    for step in range(4):
        x[...] = world.rank + step
        got = world.all_reduce(x, algorithm="native", out=x)
        assert got is x and x.tolist() == [float(sum(range(world.size)) + world.size * step)] * 4
    assert not bound
    x.flags.writeable = False
    with pytest.raises(mpicoll.InvalidArgumentError, match="read-only|writeable"):
        world.all_reduce(x, algorithm="native", out=x)
    np.testing.assert_array_equal(world.all_reduce(np.ones(2)), np.full(2, world.size))


@pytest.mark.parametrize("collective", ["broadcast", "scatter"])
def test_a_repeated_packet_call_moves_only_the_tag_and_reopens_where_it_goes_on(
        world, collective, monkeypatch):
    """A broadcast or scatter whose data rides in the header packet, repeated, is MPI's
    own broadcast of the packet alone: the transport's tag moves (``advance``), nothing
    else of it opens (``begin`` is not called). A receiver that then finds the root's
    header changed to a size past the packet reopens the transport's workspace before its
    messages (``reopen``), and gets the data right; so does every later call."""
    world._decisions.clear()
    t, p, r = world._backend.transport, world.size, world.rank
    counts = {"begin": 0, "reopen": 0}

    def counting(kind: str):
        fn = getattr(t, kind)

        def wrapped(*args):
            counts[kind] += 1
            return fn(*args)

        return wrapped

    for kind in counts:
        monkeypatch.setattr(t, kind, counting(kind))
    for step, n in enumerate([5, 5, 5, 3000, 5, 5]):
        shape = (n,) if collective == "broadcast" else (p, n)
        sent = np.arange(np.prod(shape), dtype="f8").reshape(shape) + step
        got = getattr(world, collective)(sent.copy() if r == 0 else None)
        np.testing.assert_array_equal(got, sent if collective == "broadcast" else sent[r])
        if step == 2:  # the first call took the whole path; the two after it, the packet
            assert counts == {"begin": 1, "reopen": 0}
    # (step 3: the root's whole path; each receiver goes on from its decision, reopened)
    assert counts["reopen"] == (0 if r == 0 else 1)


@pytest.mark.parametrize("dtype", ["int64", "float64", "uint64"])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_reduce", "scan"])
def test_a_decided_call_and_the_whole_path_make_one_mpi_collective(world, collective, dtype):
    """Every rank runs the same MPI collective whether its call is decided (no out=) or
    takes the whole path (out= an array MPI takes through mpicoll's native runs): on
    even blocks both are MPI_Reduce_scatter_block (a datatype named or not), never the
    block form on one rank and MPI_Reduce_scatter on another."""
    p, r = world.size, world.rank
    x = np.arange(2 * p, dtype=dtype).reshape(p, 2) if collective == "reduce_scatter" \
        else np.arange(4, dtype=dtype)
    shape = (2,) if collective == "reduce_scatter" else x.shape
    getattr(world, collective)(x, algorithm="native")  # (kept)
    for step in range(3):
        out = np.empty(shape, dtype) if (r + step) % 2 else None  # half the ranks out=
        got = getattr(world, collective)(x, algorithm="native", out=out)
        n = r + 1 if collective == "scan" else p
        want = (x * n)[r] if collective == "reduce_scatter" else x * n
        assert got.tolist() == want.tolist()
