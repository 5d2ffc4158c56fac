"""Decided calls: what a call decided, run again on new buffers without deciding again.

A call's decision (the algorithm's function, the op, the block bounds, the root's
header) is made from values every rank holds alike or the call agreed: the collective,
the shape and dtype, the op, the root, the algorithm and its options, the number of ranks
and the tables agreed when the Communicator was made. Once a call with those values has
run the whole pipeline, the decision is kept and run again:

- by a persistent plan (``mpicoll.plan``), bound to the plan's buffers once and run at
  every start;
- by the default call (``comm.all_reduce(x)``), from the Communicator's table of
  decisions keyed by those values (``key``), bound to each call's buffers.

A decision is ``bind(x, out)``: the run of the call on those buffers (``run(call)``,
which returns the result), with every check of the buffers made in the binding. It
runs exactly what the whole path runs for the same values (the same function on the
same views, so the same messages: the other ranks cannot tell a hit from a miss),
numbered and watched by the entry like every call. It declines (``bind`` gives None,
before any message) a buffer it was not made for (not a contiguous host NumPy array of
its shape and dtype, an ``out=`` of another shape or overlapping the input), and the
whole path runs that call. Check mode, traces, ``stream=``, user ops
in the default call and a rank that owes a resync always take the whole path.

A default all_reduce of a contiguous CuPy array (staged or CUDA-aware MPI, or NCCL: the
call the device's users make most, where the whole path's checks cost NCCL's own call
several times over) is decided too, keyed also by the array's GPU, run on the current
stream, with a built-in op and no compress=; its decision declines an ``out=`` it was not
made for and a call while another GPU is current (the whole path refuses that).
"""

from __future__ import annotations

import functools
import inspect
import math
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..buffers import counts_bounds, even_bounds
from ..buffers.arrays import (
    is_cupy,
    is_torch,
    kept_view,
    module_of,
    same_memory,
    to_torch,
    torch_numpy,
)
from ..errors import InvalidArgumentError
from ..ops import ReduceOp, resolve_op
from ..spec import SPECS
from ..transport.compress import Compressing, wire_dtype
from . import agree
from .deliver import average

if TYPE_CHECKING:
    from .state import CallState


class _Declined:
    """In the table: such calls take the whole path (no decision, so no prepared call).
    Also what a run returns where it declines its buffers, before any message."""

    __slots__ = ()
    call = None


DECLINED = _Declined()

# a default call is kept only when every argument but x and out is one of these: values
# that hash by what they are (never a user's Op, which the table would keep alive), and
# that no value of another of them equals (not bool or float: 0 == 0.0 == False, so a
# root of 0.0, which the whole path refuses, would find root 0's decision; ReduceOp.SUM
# equals "sum", which means the same)
PLAIN = frozenset((str, int, type(None), ReduceOp))
_LIMIT = 256  # decisions one Communicator keeps; the table starts over beyond it
_PIN_BYTES = 1 << 16  # a decision keeps its last binding of arrays up to this size

SIGNATURES: dict[str, inspect.Signature] = {}  # each collective's method, from @entry
TAKES_OUT: set[str] = set()  # the collectives with an out= parameter, from @entry


def key(name: str, args: tuple, kwargs: dict) -> tuple | None:
    """The default call's key in the table of decisions, or None (not kept)."""
    if args:
        x = args[0]
        if type(x) is np.ndarray:
            if not x.flags.c_contiguous:
                return None
            if len(args) == 1 and not kwargs:  # comm.all_reduce(x): the most frequent
                return (name, x.shape, x.dtype)
            head: tuple = (name, x.shape, x.dtype)
        elif x is None:
            head = (name, None)
        elif name in _DEVICE_DECIDERS and is_cupy(x) and x.flags.c_contiguous:
            # (never a host key; the entry makes the same keys itself: entry.collective)
            head = (name, "cuda", x.data.device_id, x.shape, x.dtype)
        else:
            return None
        for a in args[1:]:
            if type(a) not in PLAIN:
                return None
    else:
        head = (name,)
    if kwargs:
        # out= is left out of the key where the collective takes one (the decision binds
        # it each call); where it does not (broadcast), it is an option like any other
        rest = tuple(kwargs.items()) if "out" not in kwargs or name not in TAKES_OUT else \
            tuple(item for item in kwargs.items() if item[0] != "out")
        for _, v in rest:
            if type(v) not in PLAIN:
                return None
        return (*head, args[1:], *rest)
    return (*head, args[1:]) if len(args) > 1 else head


def from_torch(args: tuple, kwargs: dict) -> tuple[tuple, dict, tuple | None]:
    """A torch CPU tensor's call as the same call on NumPy views of its tensors (no copy:
    ``Tensor.numpy()``, far cheaper than a DLPack import), and what ``to_caller`` needs to
    give the result back; None: not such a call (a GPU tensor, one that needs grad, a
    dtype NumPy lacks), which takes the whole path as it is."""
    x = args[0]
    host = kept_view(x)  # a small tensor's view, made at an earlier call
    if host is None:
        if not is_torch(x) or not getattr(x, "is_cpu", False):
            return args, kwargs, None
        host = torch_numpy(x)  # bfloat16 through ml_dtypes; None: grad, conjugate
        if host is None:
            return args, kwargs, None
    out = kwargs.get("out") if kwargs else None
    if out is None:
        return (host, *args[1:]), kwargs, (x, host, None, None)
    host_out = host if out is x else torch_numpy(out) \
        if is_torch(out) and getattr(out, "is_cpu", False) else None
    if host_out is None:
        return args, kwargs, None
    kwargs["out"] = host_out  # (the entry's own **kwargs: a dict of this call's)
    return (host, *args[1:]), kwargs, (x, host, out, host_out)


def to_caller(result: Any, tensors: tuple) -> Any:
    """A result of ``from_torch``'s call as torch's: the caller's own tensor where the
    result is its memory (``out=``, a broadcast's buffer), else a tensor over it."""
    if result is None:
        return None
    x, host, out, host_out = tensors
    if result is host_out:
        return out
    if result is host:
        return x
    return to_torch(result)


def keep(c: CallState, name: str, args: tuple, kwargs: dict, key: tuple) -> Decision | None:
    """Keep the decision of the call that just ran the whole path (DECLINED: none), and
    return it."""
    decisions = c._decisions
    if len(decisions) >= _LIMIT:
        decisions.clear()
    try:
        decision = decide(c, name, args, kwargs, device=True)
    except Exception:  # noqa: BLE001 - the call succeeded: its later ones take the whole path
        decision = None
    if decision is not None:
        decision.kept = c._watch.kept()  # the entry the whole path wrote for these values
    decisions[key] = DECLINED if decision is None else decision
    return decision


def decide(c: CallState, name: str, args: tuple, kwargs: dict,
           device: bool = False) -> Callable[..., Any] | None:
    """The decision of a call of ``name`` with these arguments, which has just run the
    whole path successfully on this rank; None where the whole path must keep running
    such calls. ``device``: a default call's, which may be of a CuPy array (a plan's
    buffers are host arrays)."""
    decider = _DECIDERS.get(name)
    if decider is None or c.check or c._tracer is not None:
        return None
    try:
        bound = SIGNATURES[name].bind(c, None, *args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    a = bound.arguments
    x = a.get("x")
    if x is not None and type(x) is not np.ndarray:
        if not device or name not in _DEVICE_DECIDERS or not is_cupy(x) or \
                not x.flags.c_contiguous:
            return None
        decider = _DEVICE_DECIDERS[name]
    elif c._backend.separate_control or x is not None and not x.flags.c_contiguous:
        return None  # (NCCL's calls are of device arrays)
    decision = decider(c, a, x)
    return decision if decision is None or isinstance(decision, Decision) else Decision(decision)


# A decision is ``bind(x, out)``: the runner of the call on these buffers, ``run(call)``
# returning the call's result, or None where it declines them (nothing was sent). The
# default call binds each call's buffers; a plan binds its own once.


class Decision:
    """``bind(x, out)`` (see above), and ``fresh(call, x)`` where the decision has one:
    the call without ``out=`` run at once, on a new result, with no runner made (or
    DECLINED, before any message, for buffers it was not made for).

    ``direct``, where that fresh call is nothing but one call of MPI's own collective
    (``native.host_direct``'s ``run(x, result)``) on a new result: ``(run, shape, dtype,
    in_place)`` (shape None: this rank gets no result, as a reduce's non-root; in_place:
    ``out=x`` is ``run(x, x)``, MPI_IN_PLACE, where x can be written), which the prepared
    call makes itself (``entry.prepare``), the most frequent calls being those."""

    __slots__ = ("bind", "fresh", "persist", "direct", "quiet", "kept", "last", "call")

    def __init__(self, bind: Callable[..., Any], fresh: Callable[..., Any] | None = None,
                 persist: Callable[..., Any] | None = None, direct: tuple | None = None,
                 quiet: bool = False):
        self.bind, self.fresh, self.persist, self.direct = bind, fresh, persist, direct
        # quiet: fresh sends only by MPI's own calls (a header packet's MPI_Bcast), so the
        # call's tag need only move (transport.advance); where it goes on as the whole
        # path, fresh itself reopens the transport's workspace first (transport.reopen)
        self.quiet = quiet
        self.kept: tuple = ()  # the flight recorder's entry of its calls (Watch.kept)
        self.last: tuple | None = None  # the last binding of small buffers (see bound)
        self.call: Callable[..., Any] | None = None  # its prepared call (entry.prepare)

    def bound(self, x: Any, out: Any) -> Callable[[Any], Any] | None:
        """``bind(x, out)``, where the last call bound the same small arrays in the same
        state (a loop calling ``comm.all_reduce(x, out=y)`` binds once): the same runner.
        Kept only for arrays of at most _PIN_BYTES, whose memory it keeps alive."""
        last = self.last
        if last is not None and last[0] is out and last[1] is x and out.flags.writeable \
                and last[2] == x.flags.writeable and out.shape == last[4] \
                and out.dtype == last[5] and out.strides == last[6]:
            return last[3]  # (the same arrays: x's shape and dtype are the key's, and
            #                 out's may have been set in place since: compared)
        run = self.bind(x, out)
        if run is not None and type(out) is np.ndarray and type(x) is np.ndarray \
                and _small_owner(out) and _small_owner(x):
            self.last = (out, x, x.flags.writeable, run, out.shape, out.dtype, out.strides)
        return run

    def __call__(self, x: Any, out: Any) -> Callable[[Any], Any] | None:
        return self.bind(x, out)


class DeviceDecision(Decision):
    """A decision on CuPy arrays, whose last binding is kept by weak references (device
    memory is not kept alive by it): a loop calling ``comm.all_reduce(x, out=y)`` on the
    same arrays checks them once (about a microsecond of CuPy attribute reads a call),
    then only that they are those arrays, ``out`` still in the shape it was bound in (a
    CuPy array's shape can be set in place; its memory, dtype and device cannot) and the
    current GPU still theirs. ``runner(x, out)``: the run on buffers ``bind`` accepted;
    ``here()``: whether the current GPU is the decision's."""

    __slots__ = ("runner", "here", "refs")

    def __init__(self, bind: Callable[..., Any], fresh: Callable[..., Any],
                 runner: Callable[[Any, Any], Callable[[Any], Any]],
                 here: Callable[[], bool]):
        super().__init__(bind, fresh)
        self.runner, self.here = runner, here
        self.refs: tuple | None = None  # (weak x, weak out, out's shape) of the last binding

    def bound(self, x: Any, out: Any) -> Callable[[Any], Any] | None:
        refs = self.refs
        if refs is not None and refs[0]() is x and refs[1]() is out and \
                out.shape == refs[2] and self.here():
            return self.runner(x, out)
        run = self.bind(x, out)
        self.refs = None if run is None else (weakref.ref(x), weakref.ref(out), out.shape)
        return run


def _small_owner(a: np.ndarray) -> bool:
    """Whether all the memory ``a`` keeps alive is at most _PIN_BYTES (its own, or the
    array or torch tensor it views: a small slice of a large buffer would keep the whole
    buffer)."""
    base = a.base
    if base is None:
        return a.nbytes <= _PIN_BYTES
    if type(base) is np.ndarray:
        return base.base is None and base.nbytes <= _PIN_BYTES
    storage = getattr(base, "untyped_storage", None)  # Tensor.numpy()'s view of a tensor
    try:
        return storage is not None and int(storage().nbytes()) <= _PIN_BYTES
    except Exception:  # noqa: BLE001 - an owner it cannot size: keep nothing
        return False


def _fits(out: Any, shape: tuple[int, ...], dtype: np.dtype) -> bool:
    """Whether ``out`` is a result buffer a decision serves: a contiguous, writeable host
    array of the result's shape and dtype."""
    return (type(out) is np.ndarray and out.shape == shape and out.dtype == dtype
            and out.flags.c_contiguous and out.flags.writeable)


def _reader(t: Any, x: np.ndarray, dst: Any) -> Callable[[], Any]:
    """How each run reads x, flat: ``run._input``'s rule, decided once (a copy in the
    call's workspace where x overlaps the result ``dst`` or cannot be written; some
    algorithms stage blocks in their input)."""
    src = x.reshape(-1)
    if x.flags.writeable and (dst is None or not np.may_share_memory(src, dst)):
        return lambda: src

    def copied() -> Any:
        copy = t.take(src.size, src.dtype)
        copy[...] = src
        return copy

    return copied


def _flat(t: Any, x: np.ndarray) -> np.ndarray:
    """x flat as a run without an ``out=`` reads it (``_reader``'s rule with no result to
    overlap): its own memory, or a copy in the call's workspace where it cannot be written."""
    src = x.reshape(-1)
    if x.flags.writeable:
        return src
    copy = t.take(src.size, src.dtype)
    copy[...] = src
    return copy


def _direct(c: CallState, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``fn`` as a decided run calls it: MPI's own collective without the wrapper that
    stages device buffers (a decision serves host arrays only)."""
    if name == "native" and c._backend.native_is_mpi:
        return getattr(fn, "__wrapped__", fn)
    return fn


def _host(c: CallState, collective: str, name: str, op: Any, dtype: np.dtype,
          root: int = 0, count: int | None = None) -> Callable[[Any, Any], None] | None:
    """Where the decision is MPI's own collective: it as one direct mpi4py call on the
    call's host arrays (``native.host_direct``; ``count``: x's elements, as every call
    that takes the decision has); else None."""
    if name != "native" or not c._backend.native_is_mpi:
        return None
    from ..backends.mpi_native import host_direct

    return host_direct(c._backend.transport, collective, op, dtype, root, count)


def _persisted(c: CallState, collective: str, name: str, op: Any, dtype: Any, root: int,
               x: Any, result: Any, done: Callable[[], Any],
               before: Callable[[], None] | None = None) -> Callable[[], tuple] | None:
    """Where the decision is MPI's own collective: how to make a plan's persistent request
    on its buffers ``x`` and ``result`` (``native.host_persistent``): ``make()`` gives
    (run, request), ``run(call)`` being ``before()`` (what host_direct does before MPI's
    call: all_gather's copy of x into its row), its Start and Wait, and then ``done()``,
    the start's result. None where MPI's collective takes more than one call."""
    if _host(c, collective, name, op, dtype, root) is None:
        return None
    t = c._backend.transport

    def make() -> tuple[Callable[[Any], Any], Any]:
        from ..backends.mpi_native import host_persistent

        request = host_persistent(t, collective, op, dtype, root, x, result)
        start, wait = request.Start, request.Wait
        # whether the request may still be active: a start that Ctrl-C ended between its
        # MPI_Start and MPI_Wait (a second Ctrl-C can land in the wait that ends it). The
        # next start waits for it first (MPI_Wait returns at once on an ended request),
        # where MPI_Start would raise "already active"; entry.prepare_start shares it
        pending = [False]

        def run(call: Any) -> Any:
            if pending[0]:
                wait()
            pending[0] = True
            start()
            wait()
            pending[0] = False
            return done()

        if before is None and type(done) is Fixed:  # Start and Wait alone: a plan's
            run.persistent = (start, wait, done.value)  # type: ignore[attr-defined] # (entry.prepare_start)

        def run_after(call: Any) -> Any:
            before()
            return run(call)

        made = run if before is None else run_after
        made.pending = pending  # type: ignore[attr-defined]
        # a plan's start() and wait() apart, on every rank that made the request alike
        # (whatever each does around MPI's calls): before() and Start, then Wait and done()
        made.parts = (start if before is None else lambda: (before(), start()), done)  # type: ignore[attr-defined]
        return made, request

    # MPI asks MPI_IN_PLACE of every rank or none, where every rank may give it (the
    # plan's vote checks this; reduce's root alone and all_gather's every rank are fine)
    make.in_place = x is result if collective in _IN_PLACE_AT_ALL else None  # type: ignore[attr-defined]
    return make


class Fixed:
    """A persistent start's ``done()`` that gives the same value every time (the bound
    result, or None), so that the start can return it without calling anything."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self) -> Any:
        return self.value


_IN_PLACE_AT_ALL = frozenset(("all_reduce", "scan", "exscan"))
# where native.host_direct gives MPI_IN_PLACE for x is result (reduce: at the root)
IN_PLACE_AS_MPI = frozenset((*_IN_PLACE_AT_ALL, "reduce"))


def _averaged_by(opd: Any, fn: Callable[..., Any], ranks: int,
                 averages_itself: frozenset) -> Callable[[Any], Any]:
    """``done(result)``: the result divided by the ``ranks`` combined (op avg)."""
    def done(result: Any) -> Any:
        average(result, opd, fn, ranks, averages_itself)
        return result

    return done


def _averaged(out: Any, opd: Any, fn: Callable[..., Any], ranks: int,
              averages_itself: frozenset) -> Callable[[], Any]:
    """A persistent start's result: ``out``, divided by the ``ranks`` combined where the
    op is avg (as ``deliver.average`` does for every other run)."""
    if not opd.average:
        return Fixed(out)
    done = _averaged_by(opd, fn, ranks, averages_itself)
    return lambda: done(out)


def _separate_or_in_place(x: np.ndarray, out: Any, shape: tuple, dtype: Any) -> bool:
    """Whether a plan's ``out`` is a result MPI can take beside ``x``: ``x`` itself
    (writeable: in place) or a fitting array apart from it."""
    if x is None:
        return False
    if out is x:
        return bool(x.flags.writeable)
    return _fits(out, shape, dtype) and not np.may_share_memory(out, x)


def _resolve(c: CallState, collective: str, algorithm: str, nbytes: int, op: Any, options: dict,
             dtype: Any, uneven: bool = False) -> tuple[Callable[..., Any], str]:
    return c._chooser._resolve(collective, algorithm, nbytes, op, options or None, dtype, uneven)


def _reduce_with(c: CallState, opd: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as the reduction's runner: a user's op guarded, its failures agreed."""
    if opd.builtin:
        return lambda call, *args: fn(*args)
    from .run import _reducing

    return lambda call, *args: _reducing(c, call, opd, fn, *args)


# -- the collectives where every rank contributes: x's shape and dtype decide -------------


def _all_reduce(c: CallState, a: dict, x: np.ndarray) -> Callable[..., Any]:
    opd = resolve_op(a["op"], x.dtype)
    t, shape, dtype, nbytes = c._backend.transport, x.shape, x.dtype, x.nbytes
    if a["compress"] is None:
        fn, name = _resolve(c, "all_reduce", a["algorithm"], nbytes, opd, a["options"], dtype)
    else:  # as run.all_reduce: chosen for the wire's bytes, over the compressing transport
        wire = wire_dtype(a["compress"])
        fn, name = c._chooser._resolve("all_reduce", a["algorithm"], x.size * wire.itemsize,
                                       opd, a["options"] or None, dtype, False, False)
        t = Compressing(t, wire)
        fn = t.rounding(fn)  # (on a copy of x, its result rounded: transport.compress)
        fn = agree.told_wire(c, fn, wire, a["compress"])  # (every rank's wire told first)
    size, averages_itself, average_it = c.size, c._backend.averages_itself, opd.average
    reduce = _reduce_with(c, opd, fn)
    native_mpi = name == "native" and c._backend.native_is_mpi and opd.builtin
    # MPI_Allreduce called directly (what native.native_all_reduce calls), where the
    # compressing transport is not between: allreduce(x, result), x is result in place
    allreduce = _host(c, "all_reduce", name, opd, dtype, 0, x.size) \
        if native_mpi and t is c._backend.transport else None
    native_mpi = allreduce is not None

    def fresh(call: Any, x: Any) -> Any:
        result = np.empty(shape, dtype)
        if native_mpi:  # MPI reads x as it is (contiguous: the key's)
            allreduce(x, result)
        else:
            reduce(call, t, _flat(t, x), result.reshape(-1), opd)
        if average_it:
            average(result, opd, fn, size, averages_itself)
        return result

    def bind(x: Any, out: Any) -> Callable[[Any], Any] | None:
        if out is None:  # a new result every run
            return lambda call: fresh(call, x)
        if out is x:  # in place
            if not x.flags.writeable:
                return None
            dst = x.reshape(-1)
            read = lambda: dst  # noqa: E731 - every all_reduce algorithm allows src is dst
        elif _fits(out, shape, dtype) and not np.may_share_memory(out, x):
            dst = out.reshape(-1)
            read = _reader(t, x, dst)
        else:
            return None

        def run(call: Any) -> Any:
            if native_mpi:
                allreduce(read(), dst)
            else:
                reduce(call, t, read(), dst, opd)
            if average_it:
                average(out, opd, fn, size, averages_itself)
            return out

        return run

    def persist(x: Any, out: Any) -> Callable[[], tuple] | None:
        """Where MPI's own Allreduce runs a plan's buffers: how to make its persistent one."""
        if t is not c._backend.transport or not _separate_or_in_place(x, out, shape, dtype):
            return None  # compressed, or buffers MPI cannot take as they are

        return _persisted(c, "all_reduce", name, opd, dtype, 0, x, out,
                          _averaged(out, opd, fn, size, averages_itself))

    mpi_alone = None
    if native_mpi and not average_it:  # fresh, and in place: MPI_Allreduce alone
        mpi_alone = (allreduce, shape, dtype, True)
    return Decision(bind, fresh, persist, mpi_alone)


def _device_all_reduce(c: CallState, a: dict, x: Any) -> Decision | None:
    """all_reduce of a contiguous CuPy array: the whole path's function (MPI's staged or
    CUDA-aware, NCCL's) on the same flat views, each call on the current stream."""
    opd = resolve_op(a["op"], x.dtype)
    if a["compress"] is not None or not opd.builtin:
        return None
    b = c._backend
    t, shape, dtype, device = b.transport, x.shape, x.dtype, x.data.device_id
    fn, name = _resolve(c, "all_reduce", a["algorithm"], x.nbytes, opd, a["options"], dtype)
    size, averages_itself, average_it = c.size, b.averages_itself, opd.average
    cupy = module_of(x)
    array, current_device, empty = cupy.ndarray, cupy.cuda.runtime.getDevice, cupy.empty
    shares = cupy.may_share_memory
    one_dimension = len(shape) == 1  # (CuPy's reshape costs a microsecond)
    if b.name == "nccl":  # its workspace is the GPU's from begin() on
        if name == "native":  # ncclAllReduce, its arguments fixed once
            from ..backends.nccl_native import direct_all_reduce

            reduce = direct_all_reduce(t, opd, dtype, x.size)
        else:
            reduce = lambda src, dst: fn(t, src, dst, opd)  # noqa: E731
    else:  # MPI's transport: workspace on the GPU from here (begin took the host)
        def reduce(src: Any, dst: Any) -> None:
            t.use(src)
            fn(t, src, dst, opd)

    def fresh(call: Any, x: Any) -> Any:
        if current_device() != device:  # (the whole path refuses it)
            return DECLINED
        result = empty(shape, dtype)
        if one_dimension:
            reduce(x, result)
        else:
            reduce(x.reshape(-1), result.reshape(-1))
        if average_it:
            average(result, opd, fn, size, averages_itself)
        return result

    def runner(x: Any, out: Any) -> Callable[[Any], Any]:
        """The run on ``x`` and ``out``, buffers ``bind`` accepted."""
        if out is x:  # in place: every all_reduce algorithm allows src is dst
            src = dst = x if one_dimension else x.reshape(-1)
        else:
            src, dst = (x, out) if one_dimension else (x.reshape(-1), out.reshape(-1))

        def run(call: Any) -> Any:
            reduce(src, dst)
            if average_it:
                average(out, opd, fn, size, averages_itself)
            return out

        return run

    def bind(x: Any, out: Any) -> Callable[[Any], Any] | None:
        if current_device() != device:
            return None
        if out is x or type(out) is array and out.shape == shape and out.dtype == dtype and \
                out.flags.c_contiguous and out.data.device_id == device and \
                not shares(out, x):
            return runner(x, out)
        return None

    def here() -> bool:
        return current_device() == device

    return DeviceDecision(bind, fresh, runner, here)


def _from_spec(c: CallState, a: dict, x: np.ndarray, name: str) -> Decision | None:
    """The decision of a collective ``run.collective`` runs (gather, all_gather, reduce,
    reduce_scatter, scan, exscan, all_to_all), read from the same spec: the same function
    on the same views, so the same messages."""
    spec = SPECS[name]
    p, rank = c.size, c.rank
    root = a["root"] if spec.rooted else 0
    if type(root) is not int or not 0 <= root < p or (spec.input_rows and (
            x.ndim == 0 or x.shape[0] != p)) or x.ndim > 31:
        return None
    counts = a.get("counts")  # reduce_scatter's v-form: blocks cut flat, of these sizes
    if counts is None:
        bounds, shape = spec.bounds(x.shape, p), spec.result_shape(x.shape, p)
    else:
        counts = [int(n) for n in counts]
        if len(counts) != p or sum(counts) != x.size or min(counts) < 0:
            return None
        bounds, shape = counts_bounds(counts), (counts[rank],)
    opd = resolve_op(a["op"], x.dtype) if spec.reduces else None
    fn, algorithm = _resolve(c, name, a["algorithm"], spec.chosen_bytes(x.nbytes, p), opd,
                             a["options"], x.dtype if spec.reduces else None, counts is not None)
    t, dtype, invoke = c._backend.transport, x.dtype, spec.invoke
    receives = not spec.result_at_root_only or rank == root
    combined = spec.combined(rank, p)  # the ranks avg divides by; 0: no result here
    nothing = receives and not combined  # exscan's rank 0: workspace, and None
    lo, hi = (bounds[rank], bounds[rank + 1]) if spec.input_in_result else (0, 0)
    done = None if opd is None or not opd.average else \
        _averaged_by(opd, fn, combined, c._backend.averages_itself)
    host = _host(c, name, algorithm, opd, dtype, root, x.size) if counts is None else None
    if opd is None or opd.builtin:
        direct = _direct(c, fn, algorithm)

        def runs(call: Any, src: Any, dst: Any) -> None:
            invoke(direct, t, src, dst, bounds, opd, root)
    else:  # a user's op: guarded, its failures agreed
        from .run import _reducing

        def runs(call: Any, src: Any, dst: Any) -> None:
            _reducing(c, call, opd, invoke, fn, t, src, dst, bounds, opd, root)

    def fresh(call: Any, x: Any) -> Any:
        result = np.empty(shape, dtype) if receives else None
        if host is not None:
            host(x, result)
        elif spec.input_in_result:
            buf = result.reshape(-1)
            buf[lo:hi] = x.reshape(-1)
            runs(call, None, buf)
        else:
            dst = None if result is None else \
                t.take(result.size, dtype) if nothing else result.reshape(-1)
            runs(call, _flat(t, x), dst)
        if result is None or nothing:
            return None
        return result if done is None else done(result)

    def bind(x: Any, out: Any) -> Callable[[Any], Any] | None:
        if out is not None and not (receives and _fits(out, shape, dtype)):
            return None  # (the whole path checks and ignores a non-root's out=; out=x
            #               fits where the result has x's shape and x can be written)
        if not receives or nothing:
            read = _reader(t, x, None)

            def run_aside(call: Any) -> None:
                runs(call, read(), t.take(math.prod(shape), dtype) if nothing else None)

            return run_aside
        if spec.input_in_result:
            src, copy_in = x.reshape(-1), True
            if out is not None:
                if same_memory(src, out.reshape(-1)[lo:hi]):  # x is its own row: in place
                    copy_in = False
                elif np.may_share_memory(src, out):
                    return None

            def run_gathered(call: Any) -> Any:
                result = np.empty(shape, dtype) if out is None else out
                buf = result.reshape(-1)
                if copy_in:
                    buf[lo:hi] = src
                runs(call, None, buf)
                return result

            return run_gathered
        in_place = out is x and spec.dst_may_be_src  # src is dst, which these algorithms allow
        # else a copy where x overlaps out or cannot be written
        read = None if in_place else _reader(t, x, None if out is None else out.reshape(-1))

        def run(call: Any) -> Any:
            result = np.empty(shape, dtype) if out is None else out
            dst = result.reshape(-1)
            runs(call, dst if in_place else read(), dst)
            return result if done is None else done(result)

        return run

    def persist(x: Any, out: Any) -> Callable[[], tuple] | None:
        """Where MPI's own collective runs a plan's buffers: how to make its persistent one."""
        if host is None:
            return None
        if not receives:
            return None if out is not None else \
                _persisted(c, name, algorithm, opd, dtype, root, x, None, Fixed(None))
        if spec.input_in_result:  # all_gather: x into its row first, unless it is that row
            if not _fits(out, shape, dtype):
                return None
            row = out[rank, ...]  # (a view: out[rank] of a 0-d x's result is a scalar)
            if same_memory(x.reshape(-1), row.reshape(-1)):
                copy_in = None
            elif np.may_share_memory(x, out):
                return None
            else:  # (x's memory as bound, flat: an x whose shape the caller set in place
                # since is copied all the same, as MPI's own request reads it, never refused
                # here alone, before MPI_Start, while the others' requests wait for it)
                dst = row.reshape(-1)
                if x.flags.c_contiguous:
                    src = x.reshape(-1)  # (a view)

                    def copy_in() -> None:
                        dst[...] = src
                else:  # (a strided x: read as it is at each start)
                    def copy_in() -> None:
                        dst[...] = x.reshape(-1)
            return _persisted(c, name, algorithm, None, dtype, root, x, out, Fixed(out), copy_in)
        if out is x and (name not in IN_PLACE_AS_MPI or nothing):
            return None  # (MPI may write exscan's rank 0's result: not into its x)
        if not _separate_or_in_place(x, out, shape, dtype):
            return None
        finished = Fixed(None) if nothing else Fixed(out) if done is None else \
            (lambda: done(out))
        return _persisted(c, name, algorithm, opd, dtype, root, x, out, finished)

    mpi_alone = None
    if host is not None and done is None and not nothing:  # fresh is MPI's call alone
        mpi_alone = (host, shape if receives else None, dtype, False)
    return Decision(bind, fresh, persist, mpi_alone)


def _barrier(c: CallState, a: dict, x: Any) -> Callable[..., Any]:
    fn, name = _resolve(c, "barrier", a["algorithm"], 0, None, a["options"], None)
    t = c._backend.transport

    direct = _direct(c, fn, name)

    def run(call: Any) -> None:
        direct(t)

    return Decision(lambda x, out: run, lambda call, x: direct(t),
                    lambda x, out: _persisted(c, "barrier", name, None, None, 0, None, None,
                                              Fixed(None)))


# -- broadcast and scatter: the root's header still goes first, with the data when it fits


def _header_of_last_call(c: CallState, root: int) -> tuple[np.ndarray, Any, Any] | None:
    """A receiver's decision: the root's header of the call that just ran, and its dtype
    and shape (None where a receiver cannot decide from it: a refusal, GPU data)."""
    words = c._packet_header.copy()
    if words[0] != agree.OK:
        return None
    from ..errors import MpicollError

    try:
        dtype, shape, device = agree.unpack_header(words, root, None)
    except MpicollError:
        return None
    return None if device else (words, dtype, shape)


def _broadcast(c: CallState, a: dict, x: Any) -> Callable[..., Any] | None:
    """The root sends the header it sent before (its x's shape and dtype are the key's);
    a receiver compares the header that comes with what it decided from: the same, it
    takes the data as decided; another, it goes on as the whole path does from there."""
    root, algorithm, options = a["root"], a["algorithm"], a["options"]
    if type(root) is not int or not 0 <= root < c.size:
        return None
    b = c._backend
    t, watch, packet, header, limit = b.transport, c._watch, c._packet, c._packet_header, \
        b.packed_bytes
    pack_fn, pack_name = _resolve(c, "broadcast", algorithm, agree.HEADER_BYTES + limit, None,
                                  options, None)
    if c.rank == root:
        if x is None:
            return None
        words = agree.header_of(x.dtype, x.shape)
        if words[0] != agree.OK:
            return None
        nbytes, shape, dtype = x.nbytes, x.shape, x.dtype
    else:
        last = _header_of_last_call(c, root)
        if last is None:
            return None
        words, dtype, shape = last
        if x is not None and (x.shape != shape or x.dtype != dtype):
            return None
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    packed = nbytes <= limit
    fn = name = None
    if not packed:
        fn, name = _resolve(c, "broadcast", algorithm, nbytes, None, options, None)
        fn = _direct(c, fn, name)
    end = agree.HEADER_BYTES + nbytes
    # the data's place in the packet, as the caller's array (a view made once)
    payload = packet[agree.HEADER_BYTES:end].view(dtype).reshape(shape) if packed else None
    packet_bytes = agree.HEADER_BYTES + limit
    # the header packet: as MPI's own broadcast, one direct call (as every scatter's)
    send_packet, by_mpi = _packet_sender(c, packet, root) \
        if _host(c, "broadcast", pack_name, None, None, root) is not None \
        else (functools.partial(pack_fn, t, packet, root), False)
    quiet = packed and by_mpi  # a fresh call sends nothing through the transport

    def persist(x: Any, out: Any) -> Callable[[], tuple] | None:
        """A plan's buffers are bound: every rank knows the shape from the first start,
        so from the vote on, the data alone goes, as MPI's persistent Bcast (where the
        data went as MPI's own broadcast), into a receiver's x or an array of its own."""
        if x is not None and not x.flags.writeable:
            return None
        buf = x if x is not None or c.rank == root else np.empty(shape, dtype)
        return None if buf is None else _persisted(
            c, "broadcast", pack_name if packed else name, None, dtype, root, buf, None,
            Fixed(buf))

    sent = words.tobytes()  # the root's header, as the packet's first bytes hold it
    if c.rank == root:
        def fresh_root(call: Any, x: Any) -> Any:
            if header.tobytes() != sent:  # (comparing costs a tenth of writing)
                header[:] = words
            if packed:  # (the flight recorder's entry: the packet's, as kept)
                payload[...] = x
            else:
                rec = watch.current
                rec.chose(pack_name, packet_bytes)
            send_packet()
            if not packed:
                rec.chose(name, nbytes)
                src = x.reshape(-1)
                if not x.flags.writeable:  # some algorithms stage blocks in their input
                    src = t.take(src.size, dtype)
                    src[...] = x.reshape(-1)
                fn(t, src, root)
            return x

        def bind_root(x: Any, out: Any) -> Callable[[Any], Any]:
            # (a plan's: x as bound, a view of its own, whose shape and dtype the caller's
            # x.shape = ... cannot change in place; the caller's x given back)
            bound = x.view()

            def run(call: Any) -> Any:
                fresh_root(call, bound)
                return x

            return run

        return Decision(bind_root, fresh_root, persist, quiet=quiet)

    expected = sent
    from .run import broadcast_received

    def fresh(call: Any, x: Any) -> Any:
        if x is not None and not x.flags.writeable:
            return DECLINED  # the whole path refuses it
        rec = watch.current
        rec.chose(pack_name, packet_bytes)
        send_packet()
        if header.tobytes() != expected:  # the root sent another header: as the whole path
            return broadcast_received(c, call, x, root, algorithm, options)
        result = np.empty(shape, dtype) if x is None else x
        rec.chose(name, nbytes)
        fn(t, result.reshape(-1), root)
        return result

    def fresh_packed(call: Any, x: Any) -> Any:
        # (the flight recorder's entry is the packet's, as kept)
        if x is not None and not x.flags.writeable:
            return DECLINED  # the whole path refuses it
        send_packet()
        if header.tobytes() != expected:  # the root sent another header: as the whole path
            if quiet:
                t.reopen()
            return broadcast_received(c, call, x, root, algorithm, options)
        if x is None:
            return payload.copy()
        x[...] = payload
        return x

    def bind(x: Any, out: Any) -> Callable[[Any], Any] | None:
        if x is not None and not x.flags.writeable:
            return None  # the whole path refuses it (fresh would decline each run)
        bound = None if x is None else x.view()  # (x as bound: see bind_root)

        def run(call: Any) -> Any:
            if bound is not None and not x.flags.writeable:  # a plan's x, made read-only
                receive(call, None)  # since: take part, refuse
                raise InvalidArgumentError(
                    "broadcast: x, the receive buffer this plan bound, was made read-only")
            result = receive(call, bound)
            return x if result is bound else result

        return run

    receive = fresh_packed if packed else fresh  # a receiver's fresh call
    return Decision(bind, receive, persist, quiet=quiet)


def _packet_sender(c: CallState, packet: np.ndarray,
                   root: int) -> tuple[Callable[[], None], bool]:
    """``agree.broadcast(c, packet, root)``, the root's header packet as the whole path
    sends it: one direct MPI_Bcast where that is what it calls (``native.host_direct``),
    and whether it is that (then it sends nothing through the transport)."""
    b = c._backend
    if b.control is b.transport and _host(c, "broadcast", "native", None, None, root) is not None:
        from ..backends.mpi_native import host_packet

        return host_packet(b.transport, packet, root), True
    return lambda: agree.broadcast(c, packet, root), False


def _scatter(c: CallState, a: dict, x: Any) -> Callable[..., Any] | None:
    """As broadcast: the root sends the header (with every row, when "auto" and small)
    it sent before; a receiver that gets another goes on as the whole path does."""
    root, algorithm, options = a["root"], a["algorithm"], a["options"]
    if type(root) is not int or not 0 <= root < c.size:
        return None
    b = c._backend
    t, packet, header, size, rank = b.transport, c._packet, c._packet_header, c.size, c.rank
    if rank == root:
        if x is None or x.ndim == 0 or x.shape[0] != size:
            return None
        words = agree.header_of(x.dtype, x.shape[1:])
        if words[0] != agree.OK:
            return None
        if algorithm == "auto" and x.nbytes <= b.packed_bytes:
            words[3] |= agree.IN_PACKET
        dtype, shape = x.dtype, x.shape[1:]
    else:  # a receiver's x is not read (its result is out=, or made)
        last = _header_of_last_call(c, root)
        if last is None:
            return None
        words, dtype, shape = last
    in_packet = bool(words[3] & agree.IN_PACKET)
    send_packet, by_mpi = _packet_sender(c, packet, root)
    quiet = in_packet and by_mpi  # a fresh call sends nothing through the transport
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dtype.itemsize * size
    bounds = even_bounds(count, size)
    fn = None
    name = "packet"
    if not in_packet:
        fn, name = _resolve(c, "scatter", algorithm, nbytes, None, options, None)
        fn = _direct(c, fn, name)
    lo, hi = bounds[rank], bounds[rank + 1]
    first, last_byte = (agree.HEADER_BYTES + i * dtype.itemsize for i in (lo, hi))
    end = agree.HEADER_BYTES + nbytes
    # views made once: the rows in the packet (the root's), this rank's row in it
    rows = packet[agree.HEADER_BYTES:end].view(dtype).reshape((size, *shape)) \
        if in_packet else None
    my_row = packet[first:last_byte].view(dtype).reshape(shape) if in_packet else None

    def persist(x: Any, out: Any) -> Callable[[], tuple] | None:
        """As broadcast's: from a plan's vote on, the rows alone go, as MPI's persistent
        Scatter (where the rows went in the packet or as MPI's own scatter), into the
        plan's result (a receiver's out=, or an array of its own)."""
        if not in_packet and name != "native":
            return None
        if rank == root:
            if not _fits(out, shape, dtype) or np.may_share_memory(out, x):
                return None
            result = out
        elif out is None:
            result = np.empty(shape, dtype)
        elif _fits(out, shape, dtype):
            result = out
        else:
            return None
        return _persisted(c, "scatter", "native", None, dtype, root,
                          x if rank == root else None, result, Fixed(result))

    sent = words.tobytes()  # the root's header, as the packet's first bytes hold it
    if rank == root:
        def fresh_root(call: Any, x: Any) -> Any:
            if header.tobytes() != sent:  # (comparing costs a tenth of writing)
                header[:] = words
            if in_packet:
                rows[...] = x
                send_packet()
                return my_row.copy()
            send_packet()
            result = np.empty(shape, dtype)
            fn(t, x.reshape(-1), result.reshape(-1), bounds, root)
            return result

        def bind_root(x: Any, out: Any) -> Callable[[Any], Any] | None:
            if out is None:
                return lambda call: fresh_root(call, x)
            if not _fits(out, shape, dtype):
                return None
            src, dst = x.reshape(-1), out.reshape(-1)
            mine = src[lo:hi]
            own_row = same_memory(dst, mine)  # out=x[root]: MPI's in-place scatter
            if not own_row and np.may_share_memory(src, out):
                return None  # the whole path's stand-in

            def run(call: Any) -> Any:
                if header.tobytes() != sent:
                    header[:] = words
                if in_packet:
                    rows[...] = x
                send_packet()
                if in_packet:
                    if not own_row:
                        dst[...] = mine
                else:
                    fn(t, src, dst, bounds, root)
                return out

            return run

        return Decision(bind_root, fresh_root, persist, quiet=quiet)

    expected = sent
    from .run import scatter_received

    def fresh(call: Any, x: Any) -> Any:
        send_packet()
        if header.tobytes() != expected:  # the root sent another header: as the whole path
            if quiet:
                t.reopen()
            return scatter_received(c, call, root, algorithm, None, options)
        if in_packet:
            return my_row.copy()
        result = np.empty(shape, dtype)
        fn(t, None, result.reshape(-1), bounds, root)
        return result

    def bind(x: Any, out: Any) -> Callable[[Any], Any] | None:
        if out is None:
            return lambda call: fresh(call, x)
        if not _fits(out, shape, dtype):
            return None

        def receive(call: Any) -> Any:
            send_packet()
            if header.tobytes() != expected:  # the root sent another header: as the whole path
                return scatter_received(c, call, root, algorithm, out, options)
            if in_packet:
                out[...] = my_row
            else:
                fn(t, None, out.reshape(-1), bounds, root)
            return out

        return receive

    return Decision(bind, fresh, persist, quiet=quiet)


_DECIDERS: dict[str, Callable[..., Any]] = {
    "all_reduce": _all_reduce, "barrier": _barrier, "broadcast": _broadcast,
    "scatter": _scatter,
}
# every other collective is one run.collective runs: its decision is read from its spec
_DECIDERS.update({name: functools.partial(_from_spec, name=name) for name in SPECS
                  if name not in _DECIDERS})
DECIDED = frozenset(_DECIDERS)
# the collectives whose default call of a CuPy array is decided too
_DEVICE_DECIDERS: dict[str, Callable[..., Any]] = {"all_reduce": _device_all_reduce}
DEVICE_DECIDED = frozenset(_DEVICE_DECIDERS)  # the collectives whose CuPy calls are kept
