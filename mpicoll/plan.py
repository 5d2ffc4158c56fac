"""Persistent collectives, MPI-4 style: bind a call's arguments once, start it many times.

    plan = comm.all_reduce_init(x, "sum", out=y)    # every rank, in the same order
    for step in range(n):
        x[...] = produce(step)                       # refill the bound input in place
        plan.start()                                 # runs while this rank computes
        ...
        y = plan.wait()                              # the result (the bound out=)
    plan.free()                                      # or: with comm.all_reduce_init(...) as plan

``plan()`` is start + wait in the calling thread (no hand-over to the progress thread:
the lowest latency), ``plan.start()`` hands the call to the Communicator's progress
thread (``mpicoll.work``), so it overlaps the caller's work, as ``MPI_Start`` does;
``plan.test()`` tells whether a start has finished. Every start is a call of its own:
numbered, watched by the watchdog, traced, and in check mode fingerprinted, so every rank
must start its plans in the same order and in the same form (all ``start()`` or all
``plan()``). Buffers are bound at init: the input ``x`` (refill it in place between
starts, never while a start runs) and the result, made once at init where this rank can
know its shape (``out=`` when given), so the result array of every start is the same
array, overwritten by the next start (as MPI's receive buffer): copy it to keep it.

Refused, on the rank that does it: a start while the plan's previous start has not been
waited for, a start or wait after ``free()``, a start after the Communicator's ``free()``.
In check mode, making a plan is agreed across ranks too (a rank making another plan, or a
rank refusing its arguments, raises on every rank).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .arrays import as_array, empty
from .arrays import same as _same
from .errors import InvalidArgumentError, MpicollError
from .ops import resolve_op
from .pipeline.deliver import average
from .pipeline.entry import numbered
from .spec import SPECS
from .work import Site, Work, submit

_UNSET = object()

# what a plan binds besides x: the collectives that take out=
_TAKES_OUT = frozenset(("scatter", "gather", "all_gather", "reduce", "all_reduce",
                        "reduce_scatter", "all_to_all", "scan", "exscan"))
# a v-variant's algorithms are its collective's
_ALGORITHMS_OF = {"all_gather_v": "all_gather", "gather_v": "gather", "scatter_v": "scatter",
                  "all_to_all_v": "all_to_all"}


class Plan:
    """A persistent collective: ``start()``/``wait()``/``test()``, ``plan()`` (start +
    wait), ``free()``; a context manager that frees it. Made by ``comm.<collective>_init``."""

    def __init__(self, comm: Any, collective: str, args: tuple, kwargs: dict, site: Site) -> None:
        self.comm, self.collective = comm, collective
        self._args, self._kwargs = args, kwargs
        self._stream = kwargs.pop("stream", None)
        self._site = site
        self._work: Work | None = None
        self._bound: Any = None  # plan(): the start as decided by the first (see _bind_*)
        self._freed = False
        self.starts = 0  # how many times it was started

    def __repr__(self) -> str:
        state = "freed" if self._freed else "active" if self._work is not None else "inactive"
        return f"<mpicoll.Plan {self.collective} {state}, {self.starts} starts>"

    def _check_usable(self, what: str) -> None:
        if self._freed:
            raise InvalidArgumentError(f"plan.{what}: this {self.collective} plan was freed")
        if getattr(self.comm, "_freed", False):
            raise InvalidArgumentError(
                f"plan.{what}: the Communicator of this {self.collective} plan was freed")

    def start(self) -> None:
        """Start the collective on the bound buffers; it runs on the progress thread."""
        self._check_usable("start()")
        if self._work is not None:
            raise InvalidArgumentError(
                f"plan.start(): this {self.collective} plan is already started; wait() for "
                "it before starting it again")
        self.starts += 1
        self._work = submit(self.comm, self.collective, self._args, self._kwargs,
                            self._stream, self._site)

    def wait(self, timeout: float | None = None) -> Any:
        """The result of the last start (what the blocking call returns), once finished."""
        if self._freed:
            raise InvalidArgumentError(f"plan.wait(): this {self.collective} plan was freed")
        if self._work is None:
            raise InvalidArgumentError(f"plan.wait(): this {self.collective} plan is not started")
        work, self._work = self._work, None
        try:
            return work.wait(timeout)
        except BaseException:
            if not work.done:  # not finished: it stays the plan's active start
                self._work = work
            raise

    def test(self) -> bool:
        """Whether a wait() would not block (True when no start is active)."""
        return self._work is None or self._work.test()

    def __call__(self) -> Any:
        """Start and wait, in the calling thread: the result."""
        self._check_usable("__call__()")
        if self._work is not None:
            raise InvalidArgumentError(
                f"plan(): this {self.collective} plan is already started; wait() for it first")
        self.starts += 1
        comm = self.comm
        if self._bound is not None and not comm._refused_alone:
            return numbered(comm, self.collective, self._site, self._args, self._kwargs,
                            None, bound=self._bound)
        result = getattr(comm, self.collective)(*self._args, stream=self._stream,
                                                _site=self._site, **self._kwargs)
        if self._bound is None and self.starts == 1:  # decided and agreed: keep it
            self._bound = _BINDERS.get(self.collective, _unbound)(self)
        return result

    def free(self) -> None:
        """Let go of the plan (an active start is waited for first)."""
        if self._freed:
            return
        try:
            if self._work is not None:
                self.wait()
        finally:
            self._freed = True
            self._args, self._kwargs, self._bound = (), {}, None

    def __enter__(self) -> Plan:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()


def _bound_result(comm: Any, collective: str, args: tuple, kwargs: dict) -> Any:
    """The result array a plan binds at init (None where this rank cannot know its shape
    before the call: a scatter receiver, a v-variant; the call then makes it)."""
    if collective not in _TAKES_OUT or kwargs.get("out") is not None or not args:
        return None
    spec = SPECS[collective]
    x, back = as_array(args[0], "x")
    if not type(args[0]).__module__.startswith("torch"):
        back = _same  # a torch tensor's result is a tensor over the same memory; JAX's are
        # immutable, so any other kind binds an array of x's library
    rank, size = comm.rank, comm.size
    root = args[2] if spec.rooted and spec.reduces and len(args) > 2 else \
        args[1] if spec.rooted and not spec.reduces and len(args) > 1 else kwargs.get("root", 0)
    if spec.result_at_root_only and rank != root:
        return None
    if collective == "scatter":
        return None if rank != root else back(empty(x.shape[1:], x.dtype, like=x))
    if collective == "reduce_scatter":
        counts = kwargs.get("counts")
        shape = x.shape[1:] if counts is None else (int(list(counts)[rank]),)
    elif spec.result_rows and not spec.input_rows:  # gather, all_gather
        shape = (size, *x.shape)
    else:  # reduce, all_reduce, all_to_all, scan, exscan
        shape = x.shape
    return back(empty(shape, x.dtype, like=x))  # the caller's kind: a tensor for a tensor


def make_plan(comm: Any, collective: str, args: tuple, kwargs: dict, frame: Any) -> Plan:
    """``comm.<collective>_init(*args, **kwargs)``: check what this rank can check now,
    bind the buffers, and (check mode) agree the plan across ranks."""
    site = Site(frame)
    if kwargs.pop("async_op", False):
        raise InvalidArgumentError(f"{collective}_init: a plan takes no async_op (use start())")
    refusal: MpicollError | None = None
    try:
        algorithm = kwargs.get("algorithm", "auto")
        if algorithm != "auto":
            comm._chooser._lookup(_ALGORITHMS_OF.get(collective, collective), algorithm)
        if args and args[0] is not None:
            as_array(args[0], "x")
        result = _bound_result(comm, collective, args, kwargs)
        if result is not None:
            kwargs["out"] = result
    except MpicollError as exc:
        refusal = exc
    except Exception as exc:  # noqa: BLE001 - a bad argument, named
        refusal = InvalidArgumentError(f"{collective}_init: {type(exc).__name__}: {exc}")
    if comm.check:  # making a plan is agreed: every rank raises a refusal or a mismatch
        from .pipeline.entry import announce

        if not comm._entry.acquire(False):
            from .errors import ConcurrentCallError
            from .pipeline.entry import busy

            raise ConcurrentCallError(busy(comm, f"{collective}_init"))
        try:
            announce(comm, f"{collective}_init", site, refusal)
        finally:
            comm._entry.release()
    elif refusal is not None:
        raise refusal
    return Plan(comm, collective, args, kwargs, site)


def init_method(collective: str) -> Any:
    """The Communicator's ``<collective>_init``: the blocking call's parameters."""

    def init(self: Any, *args: Any, **kwargs: Any) -> Plan:
        return make_plan(self, collective, args, kwargs, sys._getframe(1))

    init.__name__ = init.__qualname__ = f"{collective}_init"
    init.__doc__ = (f"A persistent {collective} (MPI-4's ``MPI_{collective.title()}_init``): "
                    f"the parameters of ``{collective}``; returns an ``mpicoll.Plan`` whose "
                    "``start()``/``wait()`` (or ``plan()``) run it on the bound buffers. "
                    "See ``mpicoll.plan``.")
    return init


# -- plan(): what the first start decided, run again without deciding again -------------
#
# A start after the first one is still a numbered, watched call (the entry numbers it and
# a rank that owes a resync takes the full path); only the stages that cannot decide
# differently on bound buffers (validation, the op, the choice of algorithm) are skipped.
# Where any of it could differ (check mode, traces, a GPU stream, a strided or
# overlapping buffer) the plan keeps the full path on every start.


def _unbound(plan: Plan) -> None:
    return None


def _op_of(plan: Plan, dtype: np.dtype) -> Any:
    """The plan's op (its second positional argument, or op=) resolved for ``dtype``."""
    args = plan._args
    return resolve_op(args[1] if len(args) > 1 else plan._kwargs.get("op", "sum"), dtype)


def _bind_all_reduce(plan: Plan) -> Any:
    """all_reduce on host NumPy arrays: the chosen function on the bound x and result."""
    comm, args, kwargs = plan.comm, plan._args, plan._kwargs
    x, out = args[0], kwargs.get("out")
    if (comm.check or comm._tracer is not None or plan._stream is not None
            or type(x) is not np.ndarray or type(out) is not np.ndarray
            or not x.flags.c_contiguous or not x.flags.writeable
            or not out.flags.c_contiguous or x.dtype != out.dtype or x.shape != out.shape
            or (out is not x and np.may_share_memory(x, out))):
        return None
    options = {k: v for k, v in kwargs.items() if k not in ("op", "algorithm", "out")}
    opd = _op_of(plan, x.dtype)
    fn, name = comm._chooser._resolve("all_reduce", kwargs.get("algorithm", "auto"), x.nbytes,
                                      opd, options or None, x.dtype, False)
    t, watch, nbytes, size = comm._backend.transport, comm._watch, x.nbytes, comm.size
    dst = out.reshape(-1)
    src = dst if out is x else x.reshape(-1)
    averages_itself = comm._backend.averages_itself
    if not opd.builtin:  # a user's op: guarded, its failures agreed (mpicoll.ops)
        from .pipeline.run import _reducing

        def reduce(call: Any) -> None:
            _reducing(comm, call, opd, fn, t, src, dst, opd)
    elif name == "native" and comm.backend == "mpi":
        # the MPI library's MPI_Allreduce with its arguments made once: the very call the
        # whole path makes (never MPI's persistent MPI_Allreduce_init, which does not match
        # a blocking MPI_Allreduce: a rank taking the whole path must meet the same call)
        allreduce, send, recv, mop = _native_all_reduce(t, src, dst, opd)

        def reduce(call: Any) -> None:
            allreduce(send, recv, mop)
    else:
        def reduce(call: Any) -> None:
            fn(t, src, dst, opd)

    def start(call: Any) -> Any:
        rec = watch.current  # the flight recorder's algorithm and bytes, as choose writes
        rec.algorithm, rec.nbytes = name, nbytes
        reduce(call)
        average(out, opd, fn, size, averages_itself)
        return out

    return start


def _native_all_reduce(t: Any, src: np.ndarray, dst: np.ndarray, op: Any) -> tuple:
    """(comm.Allreduce, send, receive, op) as ``native.native_all_reduce`` makes them."""
    from mpi4py import MPI

    from .native import mpi_op

    datatype, mop = mpi_op(op, src.dtype)
    recv = dst if datatype is None else [dst, dst.size, datatype]
    send = MPI.IN_PLACE if src is dst else src if datatype is None else [src, src.size, datatype]
    return t.comm.Allreduce, send, recv, mop


def _host_plan(plan: Plan) -> bool:
    """Whether the plan's starts may run as decided: no check mode, traces or stream
    (each start then decides as a call), and a contiguous host input."""
    comm, args = plan.comm, plan._args
    x = args[0] if args else None
    return not (comm.check or comm._tracer is not None or plan._stream is not None
                or comm._backend.separate_control
                or type(x) is not np.ndarray or not x.flags.c_contiguous)


def _result(plan: Plan, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
    """The plan's bound out= where it is a contiguous host array of the result's shape."""
    out = plan._kwargs.get("out")
    if type(out) is not np.ndarray or not out.flags.c_contiguous or out.shape != shape \
            or out.dtype != dtype:
        return None
    return out


def _options(kwargs: dict) -> dict | None:
    return {k: v for k, v in kwargs.items()
            if k not in ("op", "algorithm", "out", "counts", "root")} or None


def _recorded(plan: Plan, name: str, nbytes: int, run: Any) -> Any:
    """A start: the flight recorder's algorithm and bytes (as choose writes), then run."""
    watch = plan.comm._watch

    def start(call: Any) -> Any:
        rec = watch.current
        rec.algorithm, rec.nbytes = name, nbytes
        return run(call)

    return start


def _bind_reduce(plan: Plan) -> Any:
    """reduce: the chosen function on the bound input and (at the root) result, with the
    whole path's copy of an input the result overlaps, and its average."""
    from .pipeline.run import _input, _reducing

    if not _host_plan(plan):
        return None
    comm, args, kwargs = plan.comm, plan._args, plan._kwargs
    x = args[0]
    root = args[2] if len(args) > 2 else kwargs.get("root", 0)
    is_root = comm.rank == root
    out = _result(plan, x.shape, x.dtype) if is_root else None
    if is_root and out is None:
        return None
    opd = _op_of(plan, x.dtype)
    fn, name = comm._chooser._resolve("reduce", kwargs.get("algorithm", "auto"), x.nbytes, opd,
                                      _options(kwargs), x.dtype, False)
    t, size, flat_x = comm._backend.transport, comm.size, x.reshape(-1)
    dst = None if out is None else out.reshape(-1)
    averages_itself = comm._backend.averages_itself

    def run(call: Any) -> Any:
        _reducing(comm, call, opd, fn, t, _input(t, flat_x, dst), dst, opd, root)
        if out is not None:  # the root's result
            average(out, opd, fn, size, averages_itself)
        return out

    return _recorded(plan, name, x.nbytes, run)


def _bind_reduce_scatter(plan: Plan) -> Any:
    """reduce_scatter: even rows (or the bound counts) of the bound input into the result."""
    from .buffers import counts_bounds, even_bounds
    from .pipeline.run import _input, _reducing

    if not _host_plan(plan):
        return None
    comm, args, kwargs = plan.comm, plan._args, plan._kwargs
    x, counts = args[0], kwargs.get("counts")
    if counts is None:
        if x.ndim == 0 or x.shape[0] != comm.size:
            return None
        bounds, shape = even_bounds(x[0].size, comm.size), x.shape[1:]
    else:
        counts = [int(c) for c in counts]
        bounds, shape = counts_bounds(counts), (counts[comm.rank],)
    out = _result(plan, shape, x.dtype)
    if out is None:
        return None
    opd = _op_of(plan, x.dtype)
    fn, name = comm._chooser._resolve("reduce_scatter", kwargs.get("algorithm", "auto"),
                                      x.nbytes, opd, _options(kwargs), x.dtype, counts is not None)
    t, size, flat_x, dst = comm._backend.transport, comm.size, x.reshape(-1), out.reshape(-1)
    averages_itself = comm._backend.averages_itself

    def run(call: Any) -> Any:
        _reducing(comm, call, opd, fn, t, _input(t, flat_x, dst), bounds, opd, dst)
        average(out, opd, fn, size, averages_itself)
        return out

    return _recorded(plan, name, x.nbytes, run)


def _bind_all_gather(plan: Plan) -> Any:
    """all_gather: this rank's block copied into the bound result, then the chosen function."""
    from .arrays import same_memory
    from .buffers import even_bounds

    if not _host_plan(plan):
        return None
    comm, kwargs = plan.comm, plan._kwargs
    x = plan._args[0]
    out = _result(plan, (comm.size, *x.shape), x.dtype)
    if out is None:
        return None
    fn, name = comm._chooser._resolve("all_gather", kwargs.get("algorithm", "auto"),
                                      x.nbytes * comm.size, None, _options(kwargs), None, False)
    t, src, buf = comm._backend.transport, x.reshape(-1), out.reshape(-1)
    bounds = even_bounds(src.size, comm.size)
    mine = buf[bounds[comm.rank]:bounds[comm.rank + 1]]
    in_place = same_memory(src, mine)

    def run(call: Any) -> Any:
        if not in_place:
            mine[...] = src
        fn(t, buf, bounds)
        return out

    return _recorded(plan, name, x.nbytes * comm.size, run)


def _bind_gather(plan: Plan) -> Any:
    """gather: the bound input to the root's bound result."""
    from .buffers import even_bounds
    from .pipeline.run import _input

    if not _host_plan(plan):
        return None
    comm, args, kwargs = plan.comm, plan._args, plan._kwargs
    x = args[0]
    root = args[1] if len(args) > 1 else kwargs.get("root", 0)
    out = _result(plan, (comm.size, *x.shape), x.dtype) if comm.rank == root else None
    if comm.rank == root and out is None:
        return None
    fn, name = comm._chooser._resolve("gather", kwargs.get("algorithm", "auto"),
                                      x.nbytes * comm.size, None, _options(kwargs), None, False)
    t, src = comm._backend.transport, x.reshape(-1)
    dst = None if out is None else out.reshape(-1)
    bounds = even_bounds(src.size, comm.size)

    def run(call: Any) -> Any:
        fn(t, _input(t, src, dst), dst, bounds, root)
        return out

    return _recorded(plan, name, x.nbytes * comm.size, run)


def _bind_all_to_all(plan: Plan) -> Any:
    """all_to_all: row j of the bound input to rank j, into the bound result."""
    from .buffers import even_bounds
    from .pipeline.run import _input

    if not _host_plan(plan):
        return None
    comm, kwargs = plan.comm, plan._kwargs
    x = plan._args[0]
    out = _result(plan, x.shape, x.dtype)
    if out is None or x.ndim == 0 or x.shape[0] != comm.size:
        return None
    fn, name = comm._chooser._resolve("all_to_all", kwargs.get("algorithm", "auto"), x.nbytes,
                                      None, _options(kwargs), None, False)
    t, src, dst = comm._backend.transport, x.reshape(-1), out.reshape(-1)
    bounds = even_bounds(src.size // comm.size, comm.size)

    def run(call: Any) -> Any:
        fn(t, _input(t, src, dst), bounds, dst, bounds)
        return out

    return _recorded(plan, name, x.nbytes, run)


def _bind_barrier(plan: Plan) -> Any:
    comm = plan.comm
    if comm.check or comm._tracer is not None or comm._backend.separate_control:
        return None
    fn, name = comm._chooser._resolve("barrier", plan._kwargs.get("algorithm", "auto"), 0,
                                      None, _options(plan._kwargs), None, False)
    t = comm._backend.transport
    return _recorded(plan, name, 0, lambda call: fn(t))


def _bind_scan(plan: Plan) -> Any:
    """scan and exscan: the chosen function on the bound input and result (exscan's rank
    0 takes part with workspace and gets None), avg divided by the ranks combined."""
    from .pipeline.run import _input, _reducing

    if not _host_plan(plan):
        return None
    comm, args, kwargs, collective = plan.comm, plan._args, plan._kwargs, plan.collective
    x = args[0]
    out = _result(plan, x.shape, x.dtype)
    if out is None or (out is not x and np.may_share_memory(x, out)):
        return None
    opd = _op_of(plan, x.dtype)
    fn, name = comm._chooser._resolve(collective, kwargs.get("algorithm", "auto"), x.nbytes, opd,
                                      _options(kwargs), x.dtype, False)
    t, flat_x = comm._backend.transport, x.reshape(-1)
    nothing = collective == "exscan" and comm.rank == 0
    combined = comm.rank + 1 if collective == "scan" else comm.rank
    averages_itself = comm._backend.averages_itself

    def run(call: Any) -> Any:
        dst = out.reshape(-1) if not nothing else t.take(x.size, x.dtype)
        src = dst if out is x and not nothing else _input(t, flat_x, dst)
        _reducing(comm, call, opd, fn, t, src, dst, opd)
        if nothing:
            return None
        average(out, opd, fn, combined, averages_itself)  # by the ranks combined
        return out

    return _recorded(plan, name, x.nbytes, run)


# broadcast and scatter keep the whole path: the root's header goes with every call
_BINDERS = {"all_reduce": _bind_all_reduce, "reduce": _bind_reduce,
            "reduce_scatter": _bind_reduce_scatter, "all_gather": _bind_all_gather,
            "gather": _bind_gather, "all_to_all": _bind_all_to_all, "barrier": _bind_barrier,
            "scan": _bind_scan, "exscan": _bind_scan}
