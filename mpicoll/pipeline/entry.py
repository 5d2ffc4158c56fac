"""The entry of every collective call: describe it, one thread at a time.

The wrapper numbers the call (the number advances on every rank for every call, refused
or not, and the transport's tag follows it), makes its record (``describe.Call``), starts
the watchdog's clock, runs the resync a lone refusal left owed, and lets nothing but
mpicoll's errors leave the call.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from sys import _getframe as getframe
from typing import TYPE_CHECKING, Any

from numpy import empty, ndarray

from ..buffers.arrays import is_cupy, kept_view, off_backend_gpu, to_torch
from ..errors import (
    CollectiveError,
    ConcurrentCallError,
    InvalidArgumentError,
    MpicollError,
    OpError,
)
from ..observe.recorder import DONE, RUNNING, now
from ..observe.watchdog import PARAMETERS
from . import agree, decided
from .decided import DECLINED, PLAIN
from .describe import Call
from .state import CALLBACK_THREADS, in_done_callback, refuse_in_callback, refused_in_callback
from .validate import Verdict, stream_refusal

if TYPE_CHECKING:
    from .state import CallState


def busy(c: CallState, what: str) -> str:
    """Why ``what`` cannot run now: another thread is in a call of this Communicator."""
    watch = c._watch
    current = watch.current  # read once each: the other thread rewrites them
    inside = (f"in {current.call.name()} (at {current.call.site})" if watch.started
              else "entering or leaving a call")
    return (f"{what}: another thread is {inside} on this Communicator; one Communicator "
            "serves one thread at a time: give each thread its own with comm.dup(), made "
            "before the threads start")


@contextlib.contextmanager
def turn(c: CallState, what: str) -> Iterator[None]:
    """``c``'s entry held for ``what``, a step that sends on ``c`` but is no numbered call
    (dup, write_trace, start_progress, free, a split): refused in a done callback (every
    rank runs the callback alike) or while another thread is in a call; given back however
    the step ends. A Ctrl-C raised as the turn is taken, or as the step is entered, gives
    it back too (the generator's finally, run as it is dropped): a function that took it
    returned to its caller's ``try``, where such an interrupt left it taken for good."""
    refuse_in_callback(what)
    try:
        c._entry.take()
    except IndexError:
        raise ConcurrentCallError(busy(c, what)) from None
    except BaseException:  # (Ctrl-C as take() returned: the turn was taken)
        c._entry.give(True)
        raise
    try:
        yield
    finally:
        c._entry.release()


def freed(what: str) -> InvalidArgumentError:
    """What a call on a freed Communicator raises."""
    return InvalidArgumentError(f"{what}: this Communicator was freed (comm.free()); make "
                                "calls on a live one")


_ENTRY_KEYWORDS = frozenset(("stream", "async_op", "_site", "_refusal"))
NOTHING: Any = type("Nothing", (), {"__repr__": lambda self: "NOTHING", "__slots__": ()})()
# (a collective's x where the call gave none: barrier())


def entry(method: Callable[..., Any]) -> Callable[..., Any]:
    """Give a collective its entry: the call's number, one thread at a time, and its
    common keywords.

    ``stream=``: run it with that CUDA stream current (its messages, copies and reductions
    are queued on it). Default: the current stream.
    ``async_op=True``: return a ``mpicoll.Work`` at once; its ``wait()`` returns the result
    (see ``mpicoll.work`` for how it progresses). The input must not change until then.
    """
    name = method.__name__
    signature = decided.SIGNATURES[name] = inspect.signature(method)
    PARAMETERS[name] = tuple(  # the positional parameters after self, call and x
        n for n, p in list(signature.parameters.items())[3:]
        if p.kind is p.POSITIONAL_OR_KEYWORD)
    keeps = name in decided.DECIDED  # whether a default call's decision is kept
    keeps_device = name in decided.DEVICE_DECIDED  # and a CuPy x's
    takes_out = "out" in signature.parameters  # (broadcast's out= is one of its **options)
    takes_x = "x" in signature.parameters
    if takes_out:
        decided.TAKES_OUT.add(name)
    public = public_signature(signature)

    bare_key, none_key = (name,), (name, None)  # barrier(); a receiver's broadcast(None)

    @functools.wraps(method)
    def collective(self: Any, x: Any = NOTHING, /, *args: Any, **kwargs: Any) -> Any:
        # (x positional-only, so that x given twice is the call's TypeError, numbered as
        # every call's; x given by name is x: keyed and run as x by position)
        if x is NOTHING and kwargs and takes_x and "x" in kwargs:
            x = kwargs.pop("x")
        if keeps:
            if not args and not kwargs:  # the most frequent calls of all: comm.all_reduce(x),
                # comm.scatter(None), comm.barrier(), on a contiguous NumPy x
                decisions = self._decisions
                if decisions is not None:
                    if type(x) is ndarray:
                        prepared = decisions.get((name, x.shape, x.dtype), DECLINED).call \
                            if x.flags.c_contiguous else None
                    elif x is NOTHING or x is None:
                        prepared = decisions.get(bare_key if x is NOTHING else none_key,
                                                 DECLINED).call
                    elif (view := kept_view(x)) is not None:  # comm.all_reduce(t): a small
                        # torch CPU tensor, on its NumPy view kept since an earlier call (a
                        # kept view is contiguous); the result given back as torch's
                        prepared = decisions.get((name, view.shape, view.dtype), DECLINED).call
                        if prepared is not None:
                            result = prepared(getframe(1), view, None, args, kwargs)
                            # (a result that is the view itself, a broadcast's buffer: the
                            # caller's own tensor; a new array: a tensor over it)
                            return x if result is view else to_torch(result)
                    elif keeps_device and is_cupy(x) and x.flags.c_contiguous:
                        prepared = decisions.get(
                            (name, "cuda", x.data.device_id, x.shape, x.dtype), DECLINED).call
                    else:
                        prepared = None
                    if prepared is not None:
                        return prepared(getframe(1), x, None, args, kwargs)
            elif type(x) is ndarray:  # with op and root, out= and options: each a key's part
                decisions = self._decisions
                if decisions is not None and x.flags.c_contiguous and (
                        not args or type(args[0]) in PLAIN and (
                            len(args) == 1 or len(args) == 2 and type(args[1]) in PLAIN)):
                    out = key = site = None  # (args_key's keys, made inline: a NumPy
                    given = False  # call's loop, comm.all_reduce(x, out=y), saves 60 ns)
                    if not kwargs:
                        key = (name, x.shape, x.dtype, args)
                    else:
                        given = takes_out and "out" in kwargs
                        if given:  # (prepared takes it apart from kwargs; put back below)
                            out = kwargs.pop("out")
                        if kwargs and "_site" in kwargs:  # (mpicoll.dist's: its caller's
                            site = kwargs.pop("_site")  # frame, the call's site)
                        if out is None or type(out) is ndarray:
                            rest = tuple(kwargs.items()) if kwargs else ()
                            key = (name, x.shape, x.dtype, args, *rest) if rest else \
                                (name, x.shape, x.dtype, args)
                            for item in rest:
                                if type(item[1]) not in PLAIN:
                                    key = None
                                    break
                    prepared = None if key is None else decisions.get(key, DECLINED).call
                    if prepared is not None:
                        return prepared(site or getframe(1), x, out, args, kwargs)
                    if given:  # (as the caller gave it, for the longer way)
                        kwargs["out"] = out
                    if site is not None:
                        kwargs["_site"] = site
            elif x is None:  # a receiver's broadcast or scatter: comm.scatter(None, root)
                decisions = self._decisions
                if decisions is not None and not kwargs and len(args) == 1 and type(
                        args[0]) in PLAIN:
                    prepared = decisions.get((name, None, args), DECLINED).call
                    if prepared is not None:
                        return prepared(getframe(1), x, None, args, kwargs)
            elif x is not NOTHING and (view := kept_view(x)) is not None:
                # a small torch CPU tensor (kept since an earlier call): the same keys as a
                # NumPy x on its view, out= a tensor as its view, the result given back as
                # torch's (the caller's own tensor where it is out= or x itself)
                decisions = self._decisions
                if decisions is not None and (not args or type(args[0]) in PLAIN and (
                        len(args) == 1 or len(args) == 2 and type(args[1]) in PLAIN)):
                    out = out_tensor = None
                    given = takes_out and "out" in kwargs
                    if given:  # (prepared takes it apart from kwargs; put back below)
                        out_tensor = kwargs.pop("out")
                        out = None if out_tensor is None else view if out_tensor is x \
                            else kept_view(out_tensor)
                    site = kwargs.pop("_site") if kwargs and "_site" in kwargs else None
                    key = args_key((name, view.shape, view.dtype), args, kwargs) \
                        if out is not None or out_tensor is None else None
                    prepared = None if key is None else decisions.get(key, DECLINED).call
                    if prepared is not None:
                        result = prepared(site or getframe(1), view, out, args, kwargs)
                        if result is out and out is not None:
                            return out_tensor
                        return x if result is view else to_torch(result)
                    if given:  # (as the caller gave it, for the longer way)
                        kwargs["out"] = out_tensor
                    if site is not None:
                        kwargs["_site"] = site
            elif keeps_device and is_cupy(x):  # a contiguous CuPy x: decided.key's keys,
                # made here (about 2 us less of a GPU call's host time)
                decisions = self._decisions
                if decisions is not None and x.flags.c_contiguous and (
                        not args or type(args[0]) in PLAIN and (
                            len(args) == 1 or len(args) == 2 and type(args[1]) in PLAIN)):
                    out = None
                    given = takes_out and "out" in kwargs
                    if given:  # (prepared takes it apart from kwargs; put back below)
                        out = kwargs.pop("out")
                    site = kwargs.pop("_site") if kwargs and "_site" in kwargs else None
                    key = args_key((name, "cuda", x.data.device_id, x.shape, x.dtype), args,
                                   kwargs)
                    prepared = None if key is None else decisions.get(key, DECLINED).call
                    if prepared is not None:
                        return prepared(site or getframe(1), x, out, args, kwargs)
                    if given:  # (as the caller gave it, for the longer way)
                        kwargs["out"] = out
                    if site is not None:
                        kwargs["_site"] = site
        if x is not NOTHING:
            args = (x, *args)
        # the entry's own keywords (stream=, async_op=, and from mpicoll.work.submit _site=,
        # the caller's line of an async call, and _refusal=, an async call refused at
        # submission, numbered here) taken from kwargs only where there are any
        stream = site = refusal = None
        if kwargs and not _ENTRY_KEYWORDS.isdisjoint(kwargs):
            stream, site = kwargs.pop("stream", None), kwargs.pop("_site", None)
            refusal = kwargs.pop("_refusal", None)
            if kwargs.pop("async_op", False):  # (_site: a caller's own frame, the Bucketer's;
                # _refusal: the caller's refusal, mpicoll.dist's: queued refused)
                return self._submit(name, args, kwargs, stream, site or getframe(1), refusal)
        site = site or getframe(1)
        decisions = self._decisions
        if keeps and decisions is not None and stream is None and refusal is None:
            x = args[0] if args else None
            tensors = None
            # torch CPU tensors: NumPy views (a CuPy array: as it is)
            if x is not None and type(x) is not ndarray and not is_cupy(x):
                args, kwargs, tensors = decided.from_torch(args, kwargs)
                x = args[0]
            key = decided.key(name, args, kwargs)
            decision = None if key is None else decisions.get(key)
            if decision is None or decision is DECLINED:
                result = numbered(self, name, site, args, kwargs, method,
                                  keep=None if decision is DECLINED else key)
            else:
                out = kwargs.pop("out", None) if kwargs else None
                result = decision.call(site, x if args else NOTHING, out, args[1:], kwargs)
            return result if tensors is None else decided.to_caller(result, tensors)
        return numbered(self, name, site, args, kwargs, method, stream, refusal)

    collective.__signature__ = public  # type: ignore[attr-defined]
    return collective


def args_key(head: tuple, args: tuple, kwargs: dict) -> tuple | None:
    """The key ``decided.key`` gives a call with positional ``args`` after x (at least
    one of them, or of the keywords, given) and the keywords left in ``kwargs`` (out=
    taken out): ``head`` (the collective and x's facts), args, then each keyword; None
    where a keyword's value is not PLAIN (a call whose decision is not kept)."""
    if not kwargs:
        return (*head, args)
    rest = tuple(kwargs.items())
    for item in rest:
        if type(item[1]) not in PLAIN:
            return None
    return (*head, args, *rest)


def public_signature(signature: inspect.Signature, async_op: bool = True) -> inspect.Signature:
    """A collective's signature as its caller writes the call: without the ``call`` the
    entry passes, with the entry's keywords (``stream=``, and ``async_op=`` unless it is
    a plan's ``_init``) before the algorithm's ``**options``."""
    kept = [p for name, p in signature.parameters.items() if name != "call"]
    extra = [inspect.Parameter("stream", inspect.Parameter.KEYWORD_ONLY, default=None)]
    if async_op:
        extra.append(inspect.Parameter("async_op", inspect.Parameter.KEYWORD_ONLY,
                                       default=False))
    var = [p for p in kept if p.kind is p.VAR_KEYWORD]
    rest = [p for p in kept if p.kind is not p.VAR_KEYWORD]
    return signature.replace(parameters=[*rest, *extra, *var])


HOST_ONLY = frozenset(("monitored_barrier",))  # calls that never touch a GPU (NCCL's MPI side)


def numbered(c: CallState, name: str, site: Any, args: tuple, kwargs: dict, method: Any,
             stream: Any = None, refusal: Exception | None = None,
             keep: tuple | None = None, held: bool = False) -> Any:
    """One call of ``c``, made at ``site``: numbered, watched, one thread at a time, with
    its refusal (if any) settled as every stage's, then ``method(c, call, *args,
    **kwargs)``: the whole path. ``keep``: the key under which the whole path's decision
    is kept once it succeeds (``mpicoll.pipeline.decided``); ``held``: the caller holds
    ``c``'s turn (``turn``) for a step of its own around the call (a split), and
    keeps it. Nothing but mpicoll's errors leaves it."""
    if c._freed:  # (free() is collective: every rank refuses, before any message)
        raise freed(name)
    if CALLBACK_THREADS and in_done_callback():
        raise refused_in_callback(name)
    if not held:  # (taken inline, as entry.turn takes it, on the path of every call: a
        try:  # Ctrl-C raised as a helper returned it would land before the try below
            c._entry.take()  # gives it back, and leave it taken for good)
        except IndexError:
            raise ConcurrentCallError(busy(c, name)) from None
        except BaseException:  # (Ctrl-C as take() returned: the turn was taken)
            c._entry.give(True)
            raise
    if c._freed and not held:  # (freed by another thread since the check above)
        c._entry.release()
        raise freed(name)
    b, tracer, watch = c._backend, c._tracer, c._watch
    try:
        c._seq += 1
        # the call's record: the flight recorder's entry, with the watchdog's clock
        call = watch.enter(c._seq, name, site, args, kwargs)
        b.transport.begin()  # the call's tag: every rank advances it, refused or not
        if b.separate_control:
            b.control.begin()
        if tracer is not None:
            tracer.begin_call(name)
        if c._refused_alone:
            agree.resync(c, call)
        if refusal is None and stream is not None:
            refusal = stream_refusal(stream)
        if refusal is None and b.device is not None and name not in HOST_ONLY and (
                elsewhere := off_backend_gpu(b.device)):
            # (NCCL on another GPU's stream fails on this rank alone, mid-call)
            refusal = InvalidArgumentError(f"{name}: {elsewhere}")
        if refusal is not None:
            # a refusal of the call's parameters, as every stage's: in check mode every
            # rank raises it; otherwise this rank at once, and its next call resyncs
            refused = Verdict()
            refused.refuse("params", refusal)
            agree.settle(c, call, refused, "refused")
        if stream is None:
            result = method(c, call, *args, **kwargs)
        else:
            with stream:
                result = method(c, call, *args, **kwargs)
        if keep is not None:
            decision = decided.keep(c, name, args, kwargs, keep)
            if decision is not None:
                decision.call = prepare(c, name, method, decision)
        return result
    except Exception as exc:  # noqa: BLE001 - nothing but mpicoll's errors leaves a call
        raise ended(c, name, exc)  # noqa: B904 - ended keeps exc as the cause
    except BaseException as exc:  # Ctrl-C mid-call: said in its entry, then raised as it is
        watch.interrupted(exc)
        raise
    finally:
        try:
            watch.leave()
            if tracer is not None:
                tracer.end_call()
        finally:  # (given back whatever interrupts the steps above: Ctrl-C)
            if not held:
                c._entry.release()


def ended(c: CallState, name: str, exc: Exception) -> MpicollError:
    """What a call that raised ``exc`` raises, with its flight-recorder entry marked:
    mpicoll's own error as it is (a refusal, or a failure mid-call: then the others may
    wait in this call, and this rank's next call resyncs), anything else as a
    CollectiveError naming the call and caused by it."""
    watch = c._watch
    watch.timed_out(exc, c.rank)  # (the local backend's receive: said with its call)
    if isinstance(exc, (OpError, CollectiveError)):
        c._refused_alone = c._seq  # failed mid-call here: the others may wait in it
        watch.failed(exc)
        return said_in_ranks(c, exc)
    if isinstance(exc, MpicollError):
        watch.failed(exc, refused=True)
        return said_in_ranks(c, exc)
    c._refused_alone = c._seq
    watch.failed(exc)
    error = CollectiveError(f"{name} (call #{c._seq}) failed on rank {c.rank}: "
                            f"{type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return said_in_ranks(c, error)


def said_in_ranks(c: CallState, exc: MpicollError) -> MpicollError:
    """``exc``, its words followed by the ranks they name as ``c._rank_names`` names them
    (an mpicoll.dist group's: the global ranks), once; as it is where there are none."""
    names = c._rank_names
    if names is None or getattr(exc, "_ranks_said", False) or not exc.args:
        return exc
    shown = ", ".join(f"{i}: {g}" for i, g in enumerate(names[:16]))
    exc.args = (f"{exc.args[0]} (ranks named are this group's; as the job's ranks, "
                f"{shown}{', ...' if len(names) > 16 else ''})", *exc.args[1:])
    exc._ranks_said = True  # type: ignore[attr-defined]
    return exc


def _both(first: Callable[[], Any], then: Callable[[], Any]) -> Callable[[], None]:
    def both() -> None:
        first()
        then()

    return both


def prepare(c: CallState, name: str, method: Any,
            decision: decided.Decision) -> Callable[[Any, Any, Any, tuple, dict], Any]:
    """The prepared call of a kept decision (``mpicoll.pipeline.decided``): ``numbered``
    for a call that repeats the deciding call's values, with everything it reads bound
    once (the lock, the flight recorder, the transport, the runs). It takes the same
    number, record, tag, watch and errors, without the stages a decided call cannot need
    (no stream, no refusal, no trace: the entry checked; a resync owed: the whole path),
    and runs the decision on the call's ``x`` and ``out`` (``direct`` or ``fresh``: on a
    new result), or the whole path where the decision declines them, before any message.

    It writes the call's flight-recorder entry itself, with ``Watch.enter``'s stores of
    a call whose facts are kept (``Watch.kept``) and ``Watch.leave``'s (a method call
    costs about what its stores do, and this is the path of every repeated call).

    ``prepared(site, x, out, rest, kwargs)``: ``out`` is the call's out= (None: none),
    taken out of ``kwargs``; ``x``: ``NOTHING`` where the call gave none (barrier());
    ``rest``: the positional arguments after x."""
    watch, transport = c._watch, c._backend.transport
    take, give, begin = c._entry.take, c._entry.give, transport.begin
    if c._backend.separate_control:  # NCCL's MPI side: its tag moves with every call too
        begin = _both(transport.begin, c._backend.control.begin)
    ring, length = watch.ring, watch.length
    fresh, bound, kept = decision.fresh, decision.bound, decision.kept
    work, shape, dtype, in_place = decision.direct or (None, None, None, False)
    quiet = decision.quiet  # fresh sends by MPI's own calls alone: the tag alone moves
    # MPITransport.advance's stores, made in the call (its method call costs what they
    # do): only decisions of MPI's own collectives are direct or quiet
    t = transport
    limit = t.tag_limit if work is not None or quiet else 0
    in_callbacks = CALLBACK_THREADS  # (empty: no thread is in a done callback)

    def prepared(site: Any, x: Any, out: Any, rest: tuple, kwargs: dict) -> Any:
        if c._refused_alone or in_callbacks:  # a resync owed first, or a call in a done
            # callback: the whole path (which refuses the latter)
            return numbered(c, name, site, rest if x is NOTHING else (x, *rest),
                            as_given(kwargs, out), method)
        try:
            take()  # (the Communicator's turn, or IndexError: another thread has it)
        except IndexError:
            raise ConcurrentCallError(busy(c, name)) from None
        except BaseException:  # (Ctrl-C as take() returned: the turn was taken)
            give(True)
            raise
        seq = c._seq = c._seq + 1
        rec = ring[seq % length]  # the call's flight-recorder entry (its facts kept)
        try:
            watch.current = rec
            call = rec.call
            call.seq, call.collective, call.code, call.offset = \
                seq, name, site.f_code, site.f_lasti
            rec.facts, rec.state = kept, RUNNING
            watch.started = rec.start = now()
            if out is None and work is not None:  # MPI's own collective, a new result
                tag = t.tag + 1  # the call's tag, as begin() moves it (no message of
                t.tag = tag if tag < limit else 1  # ours goes), the watchdog's slots clear
                t.step = 0
                t.wait_kind = None
                if shape is None:  # (no result on this rank)
                    return work(x, None)
                result = empty(shape, dtype)
                work(x, result)
                return result
            if out is None and fresh is not None:  # the call run at once, a new result
                if quiet:  # the call's tag: every rank advances it
                    tag = t.tag + 1
                    t.tag = tag if tag < limit else 1
                    t.step = 0
                    t.wait_kind = None
                else:
                    begin()
                result = fresh(call, x)
                if result is not DECLINED:
                    return result
                if quiet:  # (declined before any message)
                    transport.reopen()
            elif out is x and in_place and x.flags.writeable:  # in place (MPI_IN_PLACE)
                tag = t.tag + 1
                t.tag = tag if tag < limit else 1
                t.step = 0
                t.wait_kind = None
                work(x, x)
                return x
            else:
                begin()  # the call's tag: every rank advances it
                run = bound(x, out)  # None: it declines these buffers, before any message
                if run is not None:
                    result = run(call)
                    if result is not DECLINED:
                        return result
            # not a buffer it serves: the whole path, its own entry
            args = rest if x is NOTHING else (x, *rest)
            watch.enter(seq, name, site, args, as_given(kwargs, out))
            return method(c, call, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - only mpicoll's errors leave
            raise ended(c, name, exc)  # noqa: B904 - ended keeps the cause
        except BaseException as exc:  # Ctrl-C mid-call: said in its entry, raised as it is
            watch.interrupted(exc)
            raise
        finally:  # (Watch.leave; the turn given back whatever interrupts it: Ctrl-C)
            try:  # (its state first: a Ctrl-C raised as now() returns leaves it done)
                rec = watch.current
                if rec.state is RUNNING:
                    rec.state = DONE
                rec.end = now()
            finally:
                watch.started = 0.0
                give(True)

    return prepared


def prepare_start(c: CallState, name: str, site: Any, kept: tuple, run: Callable[[Any], Any],
                  persistent: tuple | None = None,
                  request_wait: Callable[[], None] | None = None) -> Callable[[], Any]:
    """A plan's settled start (``Plan.__call__``): ``prepare``'s steps with its values
    fixed (the plan's site, its flight-recorder entry ``kept``, its buffers bound in
    ``run(call)``, which gives the result), as ``start()``. ``persistent``: (Start, Wait,
    result) where the start is MPI's persistent request and nothing else (``run`` then
    only names it); Wait None: ``plan.start()``'s, which returns (seq, entry) once
    MPI_Start has, the request running on and its flight-recorder entry with it, for
    ``prepare_request_wait`` (``request_wait``: its request's MPI_Wait, which ends a start
    that Ctrl-C interrupted as MPI_Start returned). The caller checked that no resync is
    owed and the Communicator lives."""
    watch, transport = c._watch, c._backend.transport
    take, give, begin = c._entry.take, c._entry.give, transport.begin
    if c._backend.separate_control:  # (as prepare's)
        begin = _both(transport.begin, c._backend.control.begin)
    ring, length = watch.ring, watch.length
    code, offset = site.f_code, site.f_lasti
    mpi_start, mpi_wait, result = persistent or (None, None, None)
    request_wait = request_wait or mpi_wait
    said = f"{name} plan.start()" if mpi_start is not None and mpi_wait is None \
        else f"{name} plan()"  # (what a refusal names)
    # whether the request may still be active (a start that Ctrl-C ended before its wait
    # ended it, a second Ctrl-C landing in that wait): the next start waits for it first
    # (MPI_Wait returns at once on an ended request); shared with run's own starts
    pending = getattr(run, "pending", None) or [False]
    t = transport
    limit = t.tag_limit if mpi_start is not None else 0  # (as prepare's)

    def start() -> Any:
        if CALLBACK_THREADS and in_done_callback():
            raise refused_in_callback(said)
        try:
            take()  # (the Communicator's turn, or IndexError: another thread has it)
        except IndexError:
            raise ConcurrentCallError(busy(c, said)) from None
        except BaseException:  # (Ctrl-C as take() returned: the turn was taken)
            give(True)
            raise
        seq = c._seq = c._seq + 1
        rec = ring[seq % length]  # the call's flight-recorder entry (its facts kept)
        running = False  # (plan.start()'s request, once started: its entry stays running)
        try:
            watch.current = rec
            call = rec.call
            call.seq, call.collective, call.code, call.offset = seq, name, code, offset
            rec.facts, rec.state = kept, RUNNING
            watch.started = rec.start = now()
            if mpi_start is not None:  # MPI's persistent request alone
                tag = t.tag + 1  # the call's tag, as begin() moves it (no message of
                t.tag = tag if tag < limit else 1  # ours goes), the watchdog's slots clear
                t.step = 0
                t.wait_kind = None
                try:
                    if pending[0]:
                        request_wait()
                    pending[0] = True
                    mpi_start()
                    if mpi_wait is None:  # plan.start(): the plan's wait() ends it and
                        running = True  # clears the mark (prepare_request_wait); a Ctrl-C
                        return seq, rec  # before the plan keeps what this returns leaves
                        #                  it set, for the next start to end the request
                    mpi_wait()
                    pending[0] = False
                except BaseException as exc:
                    if not isinstance(exc, Exception) and not running:  # Ctrl-C once
                        request_wait()  # MPI_Start returned: the start ends, watched, first
                    raise
                return result
            begin()  # the call's tag: every rank advances it
            return run(call)
        except Exception as exc:  # noqa: BLE001 - nothing but mpicoll's errors leaves
            raise ended(c, name, exc)  # noqa: B904 - keeps the cause
        except BaseException as exc:  # (Ctrl-C: as prepared's)
            watch.interrupted(exc)
            raise
        finally:  # (Watch.leave; the turn given back whatever interrupts it: Ctrl-C)
            try:
                if not running:  # (its state first, as prepared's)
                    if rec.state is RUNNING:
                        rec.state = DONE
                    rec.end = now()
            finally:
                watch.started = 0.0
                give(True)

    return start


def prepare_request_wait(c: CallState, name: str, site: Any, mpi_wait: Callable[[], None],
                         pending: list[bool]) -> Callable[[tuple], None]:
    """A plan's ``wait()`` for a ``plan.start()`` of ``prepare_start``: MPI's wait on its
    request, watched (the start's flight-recorder entry is current again, the watchdog's
    clock from now), one thread at a time; the entry done once it returns. Where the
    flight recorder has given the entry's place to later calls (more than its length
    while the request ran), the wait is watched as a step of its own. ``pending``: the
    request's mark that it may still be active (see ``prepare_start``), cleared once the
    wait has ended it."""
    watch, t = c._watch, c._backend.transport
    take, give = c._entry.take, c._entry.give

    def wait(started: tuple, since: float = 0.0) -> None:
        """``since``: the watchdog's clock from then (a start found overdue by a poll)."""
        seq, rec = started
        if rec.call.seq != seq:  # (its entry written over by later calls)
            with watched_step(c, f"{name} plan.wait()", "waiting for every rank to start "
                              "the plan and its request to end", site):
                mpi_wait()
            pending[0] = False
            return
        try:
            take()  # (the Communicator's turn, or IndexError: another thread has it)
        except IndexError:
            raise ConcurrentCallError(busy(c, f"{name} plan.wait()")) from None
        except BaseException:  # (Ctrl-C as take() returned: the turn was taken)
            give(True)
            raise
        try:
            watch.current = rec
            t.step = 0  # (in MPI's wait: no step of a call since, no peer of one)
            t.wait_kind = None
            watch.started = since or now()
            mpi_wait()
            pending[0] = False
        except Exception as exc:  # noqa: BLE001 - nothing but mpicoll's errors leaves
            raise ended(c, name, exc)  # noqa: B904 - keeps the cause
        except BaseException as exc:  # (Ctrl-C: as prepared's)
            watch.interrupted(exc)
            raise
        finally:
            try:
                watch.leave()  # (the entry current: its end, done unless it failed)
            finally:
                give(True)

    return wait


def as_given(kwargs: dict, out: Any) -> dict:
    """A prepared call's keywords as its caller gave them: with the out= taken out for
    the key (None: none), where the whole path runs it."""
    if out is not None:
        kwargs["out"] = out
    return kwargs


def resync_owed(c: CallState, what: str, site: Any = None) -> None:
    """A rank that refused a call alone (``c._refused_alone``) gives the others its account
    (``agree.resync``) before anything it sends next: also before MPI's own collectives
    made outside a numbered call (a progress thread's duplicate, a plan's vote), which MPI
    would match with a collective the others still wait in. The caller holds ``c``'s turn."""
    if not c._refused_alone:
        return
    call = Call(c._seq, what)
    if site is not None:
        call.at(site)
    with c._watch.aside(call, "every rank's account of the call refused here"):
        agree.resync(c, call)


@contextlib.contextmanager
def watched_step(c: CallState, what: str, note: str, site: Any = None) -> Iterator[None]:
    """A step of ``c`` that is not a numbered collective (a point-to-point message, a
    plan's vote), made at ``site``: one thread at a time, watched by the watchdog under
    ``what`` (``note``: what it waits for), nothing but mpicoll's errors leaving it."""
    if c._freed:
        raise freed(what)
    with turn(c, what):
        try:
            call = Call(c._seq, what)
            if site is not None:
                call.at(site)
            with c._watch.aside(call, note):
                yield
        except MpicollError:
            raise
        except Exception as exc:  # noqa: BLE001 - MPI's errors, named
            raise CollectiveError(f"{what} on rank {c.rank}: {type(exc).__name__}: "
                                  f"{' '.join(str(exc).split())}") from exc


def announce(c: CallState, label: str, site: Any, refusal: Exception | None,
             algorithm: Any = "async_op=True", op: Any = None, root: Any = agree.ANY) -> None:
    """Check mode: agree a step that is not itself a collective call on ``c`` (``label``:
    "all_reduce async", an async call before it is queued; "all_reduce_init", a plan)
    as a numbered step of its own, the caller holding ``c``'s entry: a rank that makes a
    call asynchronous while another makes it blocking, or a refusal on one rank, raises
    on every rank; and a plan's ``algorithm`` (with its options), ``op`` and ``root``,
    where the ranks give them, are compared as a call's are."""
    b, watch = c._backend, c._watch
    c._seq += 1
    call = watch.enter(c._seq, label, site, (), {})
    try:
        b.transport.begin()
        if b.separate_control:
            b.control.begin()
        if c._refused_alone:
            agree.resync(c, call)
        verdict = Verdict()
        if refusal is not None:
            verdict.refuse("params", refusal)
        agree.fingerprint(c, call, verdict, algorithm, op, root, None, None)
    except MpicollError as exc:
        watch.timed_out(exc, c.rank)  # (the local backend's receive: said with its call)
        watch.failed(exc, refused=True)
        raise
    except Exception as exc:  # noqa: BLE001 - nothing but mpicoll's errors leaves a call
        c._refused_alone = c._seq
        watch.failed(exc)
        raise CollectiveError(f"{label} (call #{c._seq}) failed on rank {c.rank}: "
                              f"{type(exc).__name__}: {exc}") from exc
    finally:
        watch.leave()
