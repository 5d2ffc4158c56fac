"""Persistent collectives, MPI-4 style: bind a call's arguments once, start it many times.

    plan = comm.all_reduce_init(x, "sum", out=y)    # every rank, in the same order
    for step in range(n):
        x[...] = produce(step)                       # refill the bound input in place
        plan.start()                                 # runs while this rank computes
        ...
        y = plan.wait()                              # the result (the bound out=)
    plan.free()                                      # or: with comm.all_reduce_init(...) as plan

``plan()`` is start + wait in the calling thread (no hand-over to the progress thread:
the lowest latency). ``plan.start()`` is ``MPI_Start`` where the plan is the MPI library's
persistent request (made with the plan, where every rank's call is one the library runs
as it is: ``_persist_at_init``), returning while it runs, and ``wait()`` its
``MPI_Wait``; otherwise it hands the call to the Communicator's progress thread
(``mpicoll.work``), so it overlaps the caller's work, as ``MPI_Start`` does;
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

import contextlib
import math
import sys
import time
import weakref
import zlib
from typing import TYPE_CHECKING, Any

import numpy as np

from .buffers import result_buffer
from .buffers.arrays import as_array, empty, is_cupy, off_backend_gpu
from .buffers.arrays import same as _same
from .errors import (
    CollectiveError,
    CollectiveTimeoutError,
    ConcurrentCallError,
    InvalidArgumentError,
    MismatchError,
    MpicollError,
    RemoteError,
)
from .ops import resolve_op
from .pipeline import agree, decided
from .pipeline.choose import auto_takes_no_options
from .pipeline.decided import Decision, decide
from .pipeline.entry import (
    numbered,
    prepare_request_wait,
    prepare_start,
    public_signature,
    resync_owed,
    said_in_ranks,
    turn,
    watched_step,
)
from .pipeline.validate import Verdict, reduction_op, stream_refusal
from .pipeline.validate import array as validate_array
from .pipeline.validate import block_counts as validate_block_counts
from .pipeline.validate import root as validate_root
from .pipeline.validate import rows as validate_rows
from .spec import SPECS
from .work import Site, Work, as_seconds, start_progress, submit

if TYPE_CHECKING:
    from .communicator import Communicator

_UNSET = object()
# the collectives whose decisions can run as MPI's persistent request (Decision.persist):
# every one that keeps decisions
_PERSISTS = decided.DECIDED

# those whose persistent request can be made with the plan: every one but broadcast's and
# scatter's, whose receivers learn the shape from the root's header at the first start
_AT_INIT = _PERSISTS - {"broadcast", "scatter"}

# a v-variant's algorithms are its collective's
_ALGORITHMS_OF = {"all_gather_v": "all_gather", "gather_v": "gather", "scatter_v": "scatter",
                  "all_to_all_v": "all_to_all"}


class Plan:
    """A persistent collective: ``start()``/``wait()``/``test()``, ``plan()`` (start +
    wait), ``free()``; a context manager that frees it. Made by ``comm.<collective>_init``."""

    def __init__(self, comm: Communicator, collective: str, args: tuple, kwargs: dict,
                 site: Site) -> None:
        self.comm, self.collective = comm, collective
        # x and out as bound (MPI's rule: their memory, in their shape and dtype now):
        # views of their own, which the caller's x.shape = ... or x.dtype = ... in place
        # cannot change, whichever way a start runs; the caller's arrays given back
        self._given: dict[int, tuple[Any, Any]] = {}  # id(view): (view, the caller's)
        self._swapped: dict[int, tuple[Any, Any]] = {}  # as _given: see _arguments_now
        args, kwargs = self._bind_views(args, kwargs)
        self._args, self._kwargs = args, kwargs
        # the bound NumPy arrays and the arrays whose memory they view, each with a weak
        # reference: NumPy then refuses to resize them in place (ndarray.resize, even with
        # refcheck=False), which would free the memory the plan's starts still use
        self._pins = _pinned((*args, *kwargs.values()))
        self._stream = kwargs.pop("stream", None)
        self._site = site
        # its number among the Communicator's plans (every rank makes each plan, the
        # refused ones on none: make_plan), which with the call that made it names it in
        # each start's agreement (_agree_start); outside check mode making a plan is not
        # a numbered call, so plans made between two calls share that call's number
        comm._plans_made += 1
        self._number, self._made = comm._plans_made, comm._seq
        self._work: Work | None = None
        self._bound: Any = None  # plan(): the start as decided by the first (see _bind_*)
        self._freed = False
        self.starts = 0  # how many times it was started
        self._decision: Decision | None = None  # what the first plan() decided
        self._request: Any = None  # the MPI library's persistent request (see _persist)
        self._lean: Any = None  # plan()'s lean path, once settled (__call__)
        self._start_request: Any = None  # start()'s MPI_Start, where persistent (start)
        self._wait_request: Any = None  # and wait()'s MPI_Wait
        self._done: Any = None  # and what gives its result after it (Fixed, or avg's)
        self._in_flight: tuple | None = None  # a start whose request runs (its seq, entry)
        self._kept: tuple = ()  # its flight-recorder entry (Watch.kept)
        # once settled: (the NumPy array its starts write into, a writeable view of it made
        # then), to take part in a start after the caller made it read-only and then raise
        self._guard: tuple | None = None
        self._restore: Any = None  # a start()'s copy of such an array: wait() puts it back
        # whether the second plan() votes on a persistent request: values every rank
        # holds alike (the backend, check mode and traces are agreed when comm is made)
        self._votes = collective in _PERSISTS and comm._backend.native_is_mpi \
            and not comm.check and comm._tracer is None

    def _bind_views(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """``args`` and ``kwargs`` with x and out as views of their own (NumPy and CuPy
        arrays; a torch tensor's memory is viewed at each start), kept in ``_given``."""
        def bound(a: Any) -> Any:
            if type(a) is not np.ndarray and not is_cupy(a):
                return a
            view = a.view()
            self._given[id(view)] = (view, a)
            return view

        if args:
            args = (bound(args[0]), *args[1:])
        if kwargs.get("out") is not None:
            kwargs["out"] = bound(kwargs["out"])
        return args, kwargs

    def _back(self, result: Any) -> Any:
        """The start's result as the caller knows it: its own array where the result is
        the view of it bound (see _bind_views)."""
        given = self._given.get(id(result))
        if given is None and self._swapped:  # (a whole-path start's read-only view)
            given = self._swapped.get(id(result))
        return result if given is None or given[0] is not result else given[1]

    def _arguments_now(self) -> tuple[tuple, dict]:
        """The plan's arguments for a start that takes the whole path, its views as
        writeable as the caller's arrays are now: one made read-only since is given as a
        read-only view of its own (refused there, as the caller's own array), the bound
        view left writeable (the decided starts write through it, and check the caller's
        array themselves: made read-only, a bound view had stayed so once the caller made
        the array writeable again, and the next start failed on this rank alone, mid-call);
        one made writeable again is made so."""
        swapped = {}
        for key, (view, array) in self._given.items():
            if type(view) is not np.ndarray or view.flags.writeable == array.flags.writeable:
                continue
            if array.flags.writeable:
                try:
                    view.flags.writeable = True
                except ValueError:  # (read-only memory: refused there)
                    pass
            else:
                swapped[key] = view.view()
                swapped[key].flags.writeable = False
        # (what _back gives as the caller's array: a broadcast root's result is its x)
        self._swapped = {id(v): (v, self._given[key][1]) for key, v in swapped.items()}
        if not swapped:
            return self._args, self._kwargs
        return tuple(swapped.get(id(a), a) for a in self._args), \
            {k: swapped.get(id(v), v) for k, v in self._kwargs.items()}

    def __repr__(self) -> str:
        state = "freed" if self._freed else "active" if \
            self._work is not None or self._in_flight is not None else "inactive"
        return f"<mpicoll.Plan {self.collective} {state}, {self.starts} starts>"

    def _check_usable(self, what: str) -> None:
        if self._freed:
            raise InvalidArgumentError(f"plan.{what}: this {self.collective} plan was freed")
        if getattr(self.comm, "_freed", False):
            raise InvalidArgumentError(
                f"plan.{what}: the Communicator of this {self.collective} plan was freed")

    def start(self) -> None:
        """Start the collective on the bound buffers: ``MPI_Start`` where the plan is the
        MPI library's persistent request (agreed when it was made: see ``_persist_at_init``),
        returning while it runs; else on the progress thread."""
        self._check_usable("start()")
        if self._work is not None or self._in_flight is not None:
            raise InvalidArgumentError(
                f"plan.start(): this {self.collective} plan is already started; wait() for "
                "it before starting it again")
        comm = self.comm
        self._agree_start("start()")
        if self._start_request is not None:
            if comm._refused_alone:  # a resync owed first: the start at once, numbered
                self._work = _Ended(self())
                return
            guard = self._guard
            restore = guard[1].copy() \
                if guard is not None and not guard[0].flags.writeable else None
            self.starts += 1
            try:
                self._in_flight = self._start_request()
            except ConcurrentCallError:  # (a start refused as busy was not made)
                self.starts -= 1
                raise
            self._restore = restore  # (wait() puts it back and raises)
            return
        self.starts += 1
        args, kwargs = self._arguments_now()
        try:
            self._work = submit(comm, self.collective, args, kwargs, self._stream, self._site)
        except ConcurrentCallError:  # (a start refused as busy was not made)
            self.starts -= 1
            raise

    def _agree_start(self, what: str) -> None:
        """Check mode: a start is a call every rank makes in the same order, of the same
        plan. Its collective and buffers are fingerprinted as any call's, but two plans
        alike (same collective, shapes, dtype) started in different orders would pass and
        pair one plan's buffers with the other's: so each start is first agreed as a
        numbered step of its own naming the plan by its number among the Communicator's
        plans (and the call that made it), and ranks that disagree raise MismatchError on
        every rank before any of its messages."""
        comm = self.comm
        if not comm.check:
            return
        from .pipeline.entry import announce

        # (refused in a done callback, as every call: before any message, on every rank
        # alike)
        with turn(comm, f"{self.collective} plan.{what}"):
            # (and what it was made with: a plan made before check mode was turned on was
            # not compared when it was made)
            (name, _), op, root = _agreed_at_init(
                _arguments(self.collective, self._args, self._kwargs), comm.size)
            announce(comm, f"{self.collective} plan", self._site, None,
                     algorithm=f"{name}: plan #{self._number}, made by call #{self._made}",
                     op=op, root=root)

    def _restored(self) -> None:
        """After a start made on a result array the caller had made read-only: the
        array as it was, and this rank raises (it took part: the others have theirs)."""
        before, self._restore = self._restore, None
        if before is not None:
            self._guard[1][...] = before  # type: ignore[index]
            raise InvalidArgumentError(self._read_only())

    def _read_only(self) -> str:
        name = "x" if self.collective == "broadcast" else "out"
        return (f"{self.collective} plan: the array its starts write into ({name}, "
                "bound when the plan was made) was made read-only since; this rank took part "
                "in the start, left the array as it was and raises")

    def _start_read_only(self, lean: Any) -> Any:
        """plan() on a result array made read-only: the start (the others wait for this
        rank's part), the array put back as it was, then the refusal."""
        array, writer = self._guard
        before = writer.copy()
        # for the start alone, writeable again: mpicoll's algorithms write through the
        # bound array (its bases first, where the caller made them read-only too)
        chain = [array]
        while isinstance(chain[-1].base, np.ndarray) and not chain[-1].base.flags.writeable:
            chain.append(chain[-1].base)
        made = []
        try:
            try:
                for a in reversed(chain):
                    a.flags.writeable = True
                    made.append(a)
            except ValueError:  # memory no array may write: MPI's own request writes as ever
                pass
            lean()
        finally:
            writer[...] = before
            for a in reversed(made):
                a.flags.writeable = False
        raise InvalidArgumentError(self._read_only())

    def _guard_result(self, result: Any) -> None:
        """Once settled: the NumPy array this rank's starts write into (the bound result:
        out=, a broadcast receiver's x), with a writeable view of it made now; none where
        they write nothing (a broadcast's root, a reduce's or gather's other ranks,
        exscan's rank 0) or not into NumPy's (a tensor's memory is torch's)."""
        if type(result) is not np.ndarray or not result.flags.writeable:
            return
        spec, rank = SPECS[self.collective], self.comm.rank
        root = (_arguments(self.collective, self._args, self._kwargs) or {}).get("root") \
            if spec.rooted else None
        if self.collective == "broadcast" and root == rank or \
                spec.result_at_root_only and root != rank or \
                self.collective == "exscan" and rank == 0:
            return
        self._guard = (result, result.view())

    def wait(self, timeout: float | None = None) -> Any:
        """The result of the last start (what the blocking call returns), once finished."""
        if self._freed:
            raise InvalidArgumentError(f"plan.wait(): this {self.collective} plan was freed")
        if self._in_flight is not None:  # MPI's wait, bounded by the watchdog
            if timeout is not None:  # (Work.wait's: not ended by then, it stays started)
                seconds = as_seconds(timeout)
                deadline = time.monotonic() + seconds
                while not self._request.Test():
                    if self._overdue():  # past the Communicator's timeout: as a call is
                        break
                    if time.monotonic() >= deadline:
                        raise CollectiveTimeoutError(
                            f"{self.collective} plan.wait(): not finished after {seconds:g} s")
                    time.sleep(0.0001)
            started, self._in_flight = self._in_flight, None
            try:
                # (a start running past the timeout: the watchdog's clock from the start,
                # so it reports it at once)
                self._wait_request(started, started[1].start if self._overdue(started) else 0.0)
            except ConcurrentCallError:  # (another thread's call: still started)
                self._in_flight = started
                raise
            self._restored()
            try:
                return self._back(self._done())  # (avg's division)
            except MpicollError:
                raise
            except Exception as exc:  # noqa: BLE001 - np.seterr(raise)'s: named
                raise CollectiveError(f"{self.collective} plan.wait(): {type(exc).__name__}: "
                                      f"{exc}") from exc
        if self._work is None:
            raise InvalidArgumentError(f"plan.wait(): this {self.collective} plan is not started")
        work, self._work = self._work, None
        try:
            return self._back(work.wait(timeout))
        except BaseException as exc:
            if exc is not work._error:  # the wait's own bound (or Ctrl-C), finished since
                self._work = work  # or not: it stays the plan's active start, to wait for
            raise                  # again (the call's own error ended it)

    def _overdue(self, started: tuple | None = None) -> bool:
        """Whether the running start (MPI's persistent request) has run past the
        Communicator's timeout since it began (its entry still its own)."""
        seq, rec = started or self._in_flight
        timeout = self.comm.timeout
        return bool(timeout) and rec.call.seq == seq and time.monotonic() - rec.start > timeout

    def test(self) -> bool:
        """Whether a wait() would not block (True when no start is active)."""
        if self._freed:
            raise InvalidArgumentError(f"plan.test(): this {self.collective} plan was freed")
        if self._in_flight is not None:
            if not self._request.Test():
                if self._overdue():  # polled past the Communicator's timeout: the watched
                    self.wait()      # wait, from the start (the watchdog reports it)
                return False
            try:  # (MPI's wait on an ended request returns at once: its entry done)
                self._work = _Ended(self.wait())
            except InvalidArgumentError as exc:  # (made on an array made read-only:
                self._work = _Ended(None, exc)  # wait() raises it)
            return True
        return self._work is None or self._work.test()

    def __call__(self) -> Any:
        """Start and wait, in the calling thread: the result."""
        lean = self._lean
        if lean is not None:
            comm = self.comm
            if self._work is None and self._in_flight is None and not comm._refused_alone \
                    and comm._decisions is not None:  # (None: freed, or check mode turned
                # on since: each start is then agreed first)
                # what the first start decided (or the persistent request the second
                # made), on the bound buffers: entry.prepare's steps, its values fixed
                self.starts += 1
                guard = self._guard
                try:
                    if guard is not None and not guard[0].flags.writeable:
                        return self._start_read_only(lean)
                    return self._back(lean())
                except ConcurrentCallError:  # (a start refused as busy was not made)
                    self.starts -= 1
                    raise
        self._check_usable("__call__()")
        if self._work is not None or self._in_flight is not None:
            raise InvalidArgumentError(
                f"plan(): this {self.collective} plan is already started; wait() for it first")
        self._agree_start("__call__()")
        self.starts += 1  # (a start refused as busy was not made: not counted)
        comm = self.comm
        try:
            if self.starts == 2 and self._votes:
                self._persist()
            if self._bound is not None and not comm.check:  # settled: from the next start
                # on, the lean path (in check mode every start takes the whole path, which
                # compares it: a rank whose start is not decided takes it, as every rank)
                self._lean = prepare_start(comm, self.collective, self._site, self._kept,
                                           self._bound, getattr(self._bound, "persistent", None))
                return self._back(numbered(comm, self.collective, self._site, self._args,
                                           self._kwargs, self._settled))  # (the resync first,
                # where a rank owes one)
            args, kwargs = self._arguments_now()
            result = getattr(comm, self.collective)(*args, stream=self._stream,
                                                    _site=self._site, **kwargs)
        except ConcurrentCallError:
            self.starts -= 1
            raise
        if self.starts == 1 and self._stream is None:  # decided and agreed: keep it
            self._bind_result(result)
            self._bound = self._decided()
            if self._bound is not None:
                self._guard_result(self._back(result))
        return self._back(result)

    def _settle(self, decision: Decision, run: Any, request: Any, facts: tuple) -> None:
        """The plan's persistent request, made as the plan was (``_persist_at_init``):
        every ``plan()`` is its start and wait, every ``start()`` its ``MPI_Start``."""
        self._decision, self._bound, self._kept = decision, run, facts
        self._votes = False  # (agreed already)
        self._keep(request)
        self._guard_result(self._back(self._args[0] if self.collective == "broadcast" and
                                      self._args else self._kwargs.get("out")))
        # start() is MPI_Start on every rank (a rank's own steps around it: all_gather's
        # copy into its row before, avg's division after; one rank's start() on the
        # progress thread would be another call, which the others' requests never meet)
        start, self._done = run.parts
        self._start_request = prepare_start(self.comm, self.collective, self._site,
                                            facts, run, (start, None, None), request.Wait)
        self._wait_request = prepare_request_wait(self.comm, self.collective, self._site,
                                                  request.Wait, run.pending)

    def _bind_result(self, result: Any) -> None:
        """A receiver that passed no buffer (broadcast's x, scatter's out) binds the first
        start's result: every later start fills that same array, whichever way it runs."""
        if result is None:
            return
        if self.collective == "broadcast" and self._args and self._args[0] is None:
            self._args = (result, *self._args[1:])
        elif self.collective == "scatter" and self._kwargs.get("out") is None:
            self._kwargs["out"] = result

    def _settled(self, comm: Communicator, call: Any, *args: Any, **kwargs: Any) -> Any:
        """A start as the other ranks run it, as the whole path's method of ``numbered``."""
        comm._watch.rewrite(self._kept)  # the entry as the first start wrote it
        guard = self._guard
        if guard is not None and not guard[0].flags.writeable:
            return self._start_read_only(lambda: self._bound(call))
        return self._bound(call)

    def _decided(self) -> Any:
        """What the first start decided, bound to the plan's buffers once: every later
        ``plan()`` runs it (None: they take the whole path)."""
        try:
            decision = decide(self.comm, self.collective, self._args, self._kwargs)
            run = None if decision is None else decision(
                self._args[0] if self._args else None, self._kwargs.get("out"))
        except Exception:  # noqa: BLE001 - its starts take the whole path
            return None
        if run is None:
            return None
        self._decision = decision
        self._kept = self.comm._watch.kept()  # the first start's flight-recorder entry
        return run

    def _persist(self) -> None:
        """The second ``plan()`` (of a plan whose request was not made with it: a
        broadcast's or scatter's, whose receivers learn the shape at the first start):
        every rank says whether it can run the plan's buffers through the MPI library's
        persistent collective (where the first start decided ``native``, on host buffers
        MPI takes as they are), and where all can, each makes it and every later start
        is its ``Start`` and ``Wait`` (``_vote_and_make``)."""
        persist = None
        if self._bound is not None and self._stream is None and self._decision is not None \
                and self._decision.persist is not None:
            try:
                persist = self._decision.persist(self._args[0] if self._args else None,
                                                 self._kwargs.get("out"))
            except Exception:  # noqa: BLE001 - this rank votes no
                persist = None
        made = _vote_and_make(self.comm, persist, 0, f"{self.collective} plan",
                              "waiting for every rank to start the plan the second time (its "
                              "vote on a persistent request)", self._site)
        if made is not None:
            self._bound, request = made
            self._keep(request)
            if self._kept:  # its starts are MPI's own collective (a packet's was "auto"'s)
                self._kept = (*self._kept[:5], "native", self._kept[6])

    def _keep(self, request: Any) -> None:
        """The plan's persistent request: a plan dropped without free() lets it go (at
        the next plan's, or with the Communicator); free() lets it go at once."""
        self._request = request
        self._retire = weakref.finalize(self, self.comm._backend.transport.retire, request)

    def free(self) -> None:
        """Let go of the plan (an active start is waited for first; where another thread
        is in a call of the Communicator, ConcurrentCallError and nothing is freed)."""
        if self._freed:
            return
        try:
            if self._work is not None or self._in_flight is not None:
                self.wait()
        except ConcurrentCallError:
            raise  # (the start runs on: free() may be called again)
        except BaseException:
            self._let_go()
            raise
        self._let_go()

    def _let_go(self) -> None:
        """free()'s end: the plan's buffers and its persistent request let go, holding the
        Communicator's turn (another thread in a call of it, a plan() of this one too:
        ConcurrentCallError, nothing let go)."""
        comm = self.comm
        with turn(comm, f"{self.collective} plan.free()") if not comm._freed else \
                contextlib.nullcontext():
            self._freed = True
            self._args, self._kwargs, self._bound, self._pins = (), {}, None, []
            self._given = {}
            self._decision = self._lean = self._start_request = self._wait_request = None
            if self._request is not None:
                self._retire.detach()
                comm._backend.transport.release(self._request)
                self._request = None

    def __enter__(self) -> Plan:
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.free()
        except MpicollError:
            if exc[0] is None:  # (leaving on an exception of its own: that one goes on)
                raise


class _Ended:
    """A start that ended before ``start()`` returned: ``wait()`` gives its result."""

    done = True

    def __init__(self, result: Any, error: Exception | None = None) -> None:
        self.result, self._error = result, error  # (_error: as a Work's)

    def wait(self, timeout: float | None = None) -> Any:
        if self._error is not None:
            raise self._error
        return self.result

    def test(self) -> bool:
        return True


def _bound_result(comm: Communicator, collective: str, args: tuple, kwargs: dict) -> Any:
    """The result array a plan binds at init (None where this rank cannot know its shape
    before the call: a scatter receiver, a v-variant; the call then makes it). An
    ``out=`` given is checked against that shape and dtype now (its refusal is the plan's,
    on every rank), and bound as it is (None)."""
    if "out" not in decided.SIGNATURES[collective].parameters or not args \
            or args[0] is None:  # (a scatter receiver's x)
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
    if spec.input_at_root_only and rank != root:
        return None  # (a scatter receiver: its shape comes with the root's header)
    counts = kwargs.get("counts")  # reduce_scatter's v-form: block [rank], flat
    if counts is None:
        if spec.input_rows and (x.ndim == 0 or x.shape[0] != size):
            return None  # (no row per rank: refused at init, _parameter_refusal)
        shape = spec.result_shape(x.shape, size)
    else:  # (counts that fit no rank: refused at init, _parameter_refusal)
        try:
            counts = [int(n) for n in counts]
        except (TypeError, ValueError):
            return None
        if len(counts) != size or min(counts) < 0:
            return None
        shape = (counts[rank],)
    out = kwargs.get("out")
    if out is not None:  # (as every start checks it: a rank that knows its result's shape)
        result_buffer(out, shape, x.dtype, like=x)
        return None
    return back(empty(shape, x.dtype, like=x))  # the caller's kind: a tensor for a tensor


def _arguments(collective: str, args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """A plan's parameters by name, their defaults where not given (``stream=`` aside);
    None where they do not bind (the first start refuses them, on every rank in check
    mode)."""
    given = {k: v for k, v in kwargs.items() if k != "stream"}
    try:
        bound = decided.SIGNATURES[collective].bind(None, None, *args, **given)
    except TypeError:
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


def _agreed_at_init(arguments: dict[str, Any] | None, size: int) -> tuple:
    """What check mode compares when a plan is made, besides the collective: (algorithm
    with its options, op, root) as the plan's ``arguments`` give them (a root that is no
    rank of ``size`` is left to the first start, which refuses it on every rank, as are
    the shapes and counts)."""
    if arguments is None:
        return ("auto", None, agree.ANY)
    root = arguments.get("root", agree.ANY)
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) \
            or not 0 <= root < size:
        root = agree.ANY
    options = arguments.get("options") or {}
    if arguments.get("compress") is not None:  # (compared as a call's: with the options)
        options = {**options, "compress": arguments["compress"]}
    return ((arguments.get("algorithm", "auto"), options), arguments.get("op"), root)


def _pinned(values: tuple) -> list[weakref.ref]:
    pins, seen = [], set()
    for value in values:
        while isinstance(value, np.ndarray) and id(value) not in seen:
            seen.add(id(value))
            pins.append(weakref.ref(value))
            value = value.base
    return pins


def _check_algorithm(comm: Communicator, collective: str, arguments: dict[str, Any] | None,
                     algorithm: Any) -> None:
    """Refuse a plan's unknown algorithm, a tuning option it does not take or takes
    another value of, an op it cannot reduce with (a non-commutative one where it
    reorders operands; native: one the library lacks for the dtype), or a v-form where it
    needs equal blocks, as every start would (the same errors)."""
    if arguments is None:  # (refused by _parameter_refusal)
        return
    # (out= where the collective takes none is no tuning option: the start refuses it)
    options = {k: v for k, v in (arguments.get("options") or {}).items() if k != "out"}
    if algorithm == "auto":
        if options:  # (the call's own words)
            raise auto_takes_no_options(collective, options)
        return
    name = _ALGORITHMS_OF.get(collective, collective)
    _, registered = comm._chooser._lookup(name, algorithm)
    spec, op, dtype = SPECS.get(collective), None, None
    if spec is not None and spec.reduces and arguments.get("x") is not None:
        try:
            dtype = as_array(arguments["x"], "x")[0].dtype
            op = resolve_op(arguments.get("op"), dtype)
        except Exception:  # noqa: BLE001 - refused by _parameter_refusal, which names it
            return
    # (a v-variant's blocks, reduce_scatter's counts: uneven, as their calls pick them;
    # all_to_all_v's exchange finds whether its blocks are alike, at each start)
    comm._chooser.refuse(name, algorithm, registered, op, dtype,
                         uneven=collective in _ALGORITHMS_OF and collective != "all_to_all_v"
                         or arguments.get("counts") is not None)
    if registered is None:
        if options:
            raise InvalidArgumentError(f"{', '.join(options)}: 'native' takes no tuning options")
        return
    if options:
        comm._chooser._options(name, algorithm, registered, options)


def _parameter_refusal(comm: Communicator, collective: str, args: tuple, kwargs: dict,
                       arguments: dict[str, Any] | None) -> MpicollError | None:
    """What the first start would refuse at once on this rank: a root that is no rank, a
    ``stream=`` that is no usable CUDA stream, arguments that do not bind to the
    collective's (a keyword it lacks, one too many), an x that is no array it takes
    where every rank gives one as input, an op that cannot reduce it."""
    if arguments is None:
        try:
            decided.SIGNATURES[collective].bind(
                None, None, *args, **{k: v for k, v in kwargs.items() if k != "stream"})
        except TypeError as exc:
            return InvalidArgumentError(f"{collective}_init: {exc}")
        return None
    if "out" in (arguments.get("options") or {}):  # (as the start's refusal: choose's)
        return InvalidArgumentError(
            "out: this call takes no out= (it returns its result; its keywords besides "
            f"algorithm= are tuning options of the {collective} algorithms)")
    if "root" in arguments:
        verdict = Verdict()
        validate_root(verdict, arguments["root"], comm.size)
        if verdict.params is not None:
            return verdict.params
    stream = kwargs.get("stream")
    if stream is not None and (refusal := stream_refusal(stream)) is not None:
        return refusal
    if elsewhere := off_backend_gpu(comm._backend.device):
        return InvalidArgumentError(f"{collective}_init: {elsewhere}")
    spec = SPECS.get(collective)
    if spec is None and collective in _ALGORITHMS_OF and "x" in arguments:
        # a v-variant's x: an array it takes, where this rank gives it as input (scatter_v:
        # the root alone), as the start would refuse it at once (its counts: agreed there)
        if collective == "scatter_v" and arguments.get("root") != comm.rank:
            return None
        verdict = Verdict()
        validate_array(verdict, arguments["x"], device_only=comm._backend.device_only)
        return verdict.params or verdict.input
    if spec is None or spec.input_at_root_only or "x" not in arguments:
        return None  # (a root's input travels in its header: every rank learns it there)
    # x, where every rank gives it as input (a refusal the call would raise at once,
    # alone), the op it is reduced with, and how it is cut: one row per rank, or
    # reduce_scatter's counts (a start refusing them alone would leave the others in it)
    verdict = Verdict()
    x, _ = validate_array(verdict, arguments["x"], device_only=comm._backend.device_only)
    if spec.reduces and x is not None:
        reduction_op(verdict, arguments.get("op"), x)
    counts = arguments.get("counts")
    if counts is None and spec.input_rows:
        validate_rows(verdict, x, comm.size, collective)
    elif counts is not None and x is not None and not verdict:
        validate_block_counts(verdict, counts, comm.size, x)
    return verdict.params or verdict.input


def make_plan(comm: Communicator, collective: str, args: tuple, kwargs: dict, frame: Any) -> Plan:
    """``comm.<collective>_init(*args, **kwargs)``: check what this rank can check now,
    bind the buffers, and (check mode) agree the plan across ranks."""
    site = Site(frame)
    if comm.freed:  # (free() is collective: every rank refuses, before any message)
        raise InvalidArgumentError(f"{collective}_init: this Communicator was freed "
                                   "(comm.free()); make plans on a live one")
    refusal: MpicollError | None = None
    if kwargs.pop("async_op", False):  # (refused after taking part, as every refusal)
        refusal = InvalidArgumentError(f"{collective}_init: a plan takes no async_op "
                                       "(use start())")
    if not args and "x" in kwargs and "x" in decided.SIGNATURES[collective].parameters:
        args = (kwargs.pop("x"),)  # x by name: where every step of the plan reads it
    arguments = _arguments(collective, args, kwargs)
    try:
        algorithm = kwargs.get("algorithm", "auto")
        # what the first start would refuse of the parameters alone, refused now, where
        # every rank learns it (a start one rank refuses alone leaves the others in it):
        # the algorithm and its options, the root, the stream, arguments that do not bind
        _check_algorithm(comm, collective, arguments, algorithm)
        refusal = refusal or _parameter_refusal(comm, collective, args, kwargs, arguments)
        if args and args[0] is not None:
            as_array(args[0], "x")
        if collective == "all_reduce" and arguments is not None and \
                arguments.get("compress") is not None:  # (refused now, as a call's)
            from .pipeline.run import compress_refusal

            refusal = refusal or compress_refusal(arguments["compress"], arguments["x"],
                                                  arguments["op"], algorithm)
        result = _bound_result(comm, collective, args, kwargs)
        if result is not None:
            kwargs["out"] = result
    except MpicollError as exc:
        refusal = refusal or exc
    except Exception as exc:  # noqa: BLE001 - a bad argument, named
        refusal = refusal or InvalidArgumentError(
            f"{collective}_init: {type(exc).__name__}: {exc}")
    if comm.check:  # making a plan is agreed: every rank raises a refusal or a mismatch
        from .pipeline.entry import announce, busy

        try:  # (the turn: as numbered takes it)
            comm._entry.take()
        except IndexError:
            raise ConcurrentCallError(busy(comm, f"{collective}_init")) from None
        except BaseException:  # (Ctrl-C as take() returned: the turn was taken)
            comm._entry.give(True)
            raise
        try:
            announce(comm, f"{collective}_init", site, refusal,
                     *_agreed_at_init(arguments, comm.size))
        finally:
            comm._entry.release()
    # (a resync owed since a refusal here alone comes first: in the progress thread's
    # duplicate, or in the verdicts' exchange, before any message)
    # its starts run on comm's progress thread, whose duplicate communicator is made now,
    # where every rank makes the plan (at a first start, ranks starting plans of two
    # communicators in different orders would wait in each other's duplicate): by every
    # rank, a refusing one too
    start_progress(comm, frame)
    if not comm.check:  # (check mode agreed it above)
        refusal = _agreed_refusal(comm, collective, refusal, site)
    persistent = _persist_at_init(comm, collective, args, kwargs, arguments, refusal, site)
    if refusal is not None:  # on every rank
        raise refusal
    plan = Plan(comm, collective, args, kwargs, site)
    if persistent is not None:
        plan._settle(*persistent)
    return plan


def _agreed_refusal(comm: Communicator, collective: str, refusal: MpicollError | None,
                    site: Site) -> MpicollError | None:
    """Making a plan is a step every rank makes, so a refusal on any rank is every rank's
    (its own there; a RemoteError naming it elsewhere): one rank's next call never meets
    the others' first start. One small all-gather over the control side, watched."""
    table = np.zeros(comm.size, np.int64)
    table[comm.rank] = refusal is not None
    with watched_step(comm, f"{collective}_init",
                      "waiting for every rank's verdict on the plan's arguments", site):
        resync_owed(comm, f"{collective}_init", site)
        comm._backend.control.begin()
        agree.all_gather(comm, table, 1)
    refused = np.flatnonzero(table).tolist()
    if refusal is not None or not refused:
        return refusal
    return said_in_ranks(comm, RemoteError(
        f"{collective}_init: refused on rank(s) {', '.join(map(str, refused))} (its "
        "arguments); every rank gives what the others can take"))


def _persist_at_init(comm: Communicator, collective: str, args: tuple, kwargs: dict,
                     arguments: dict[str, Any] | None, refusal: Exception | None,
                     site: Site) -> tuple | None:
    """Where the MPI library has the collective as a persistent request (MPI-4's
    ``MPI_Allreduce_init`` and kin), make it now, as the plan is made (every rank, in
    one order), so that every start is its ``MPI_Start`` and wait its ``MPI_Wait``:
    where every rank's plan is the same call (collective, shape, dtype, op, root,
    algorithm: one fingerprint) whose decision is MPI's own collective on buffers MPI
    takes as they are (and MPI_IN_PLACE on every rank or none). Every rank votes in one
    small all-gather, a refusing one too (no); then each makes its request and all say
    whether they did. (decision, run, request, flight-recorder facts), or None: the plan
    runs as before (its second ``plan()`` votes again, once its first has decided; so
    do broadcast's and scatter's, whose receivers learn the shape at the first start).
    Only where the vote is on every rank: the backend, check mode and traces are agreed."""
    if collective not in _AT_INIT or not comm._backend.native_is_mpi or comm.check \
            or comm._tracer is not None:
        return None
    decision = persist = None
    fingerprint = call = None
    x = args[0] if args else None
    if refusal is None and kwargs.get("stream") is None and arguments is not None:
        try:
            op, root = arguments.get("op"), arguments.get("root")
            # what every rank's call must give alike (their elements, not their shapes:
            # MPI's counts), each as check mode compares it ("sum" and ReduceOp.SUM one
            # op, 1 and np.int64(1) one root), and with the shape, what makes the plans
            # one request
            call = (collective, None if x is None else (math.prod(x.shape), x.dtype.str),
                    None if op is None else agree.op_text(op), _plain(root),
                    arguments.get("algorithm"),
                    sorted((k, _plain(v)) for k, v in (arguments.get("options") or {}).items()))
            fingerprint = zlib.crc32(repr((call, getattr(x, "shape", None))).encode())
            call = zlib.crc32(repr(call).encode())
            decision = decide(comm, collective, args, kwargs)
            if decision is not None and decision.persist is not None:
                persist = decision.persist(x, kwargs.get("out"))
        except Exception:  # noqa: BLE001 - this rank votes no; its first start tells why
            persist = None
    made = _vote_and_make(comm, persist, fingerprint or 0, f"{collective}_init", "waiting for "
                          "every rank to make the plan (its vote on a persistent request)",
                          site, call)
    if made is None:
        return None
    run, request = made
    given = tuple(getattr(a, "name", a) if hasattr(a, "fn") else a for a in args[1:])
    facts = (getattr(x, "shape", None), getattr(x, "dtype", None), given, kwargs.get("op"),
             kwargs.get("root"), "native", getattr(x, "nbytes", 0))
    return decision, run, request, facts


def _vote_and_make(comm: Communicator, persist: Any, fingerprint: int, what: str, note: str,
                   site: Site, call: int | None = None) -> tuple | None:
    """Every rank says, in one small all-gather watched as ``what``, whether it can run
    its plan on MPI's persistent request (``persist``: its maker, or None), whether it
    gives MPI_IN_PLACE (every rank or none must) and its call's ``fingerprint`` (every
    rank's must be the same); where all agree, each makes the request and all say whether
    they did. (run, request) on every rank, or None on every rank.

    ``call``: what every rank's call must give alike (the collective, x's elements and
    dtype, op, root, algorithm and options), as one number, or None where this rank
    cannot say (it passes): ranks whose numbers differ raise MismatchError on every rank,
    as check mode's agreement would (their plans ran on, to a wrong result or MPI's abort).
    A library without
    MPI-4's persistent collectives votes no on every rank, as does a transport where a
    request failed before (a rank may fail inside MPI's init, which counts the
    communicator's persistent collectives: no more of them there)."""
    from mpi4py import MPI

    t = comm._backend.transport
    can = persist is not None and t.persists and MPI.Get_version() >= (4, 0)
    in_place = getattr(persist, "in_place", None)
    mine = np.array([can, in_place is not False, in_place is not True, fingerprint,
                     call is not None, call or 0], np.int64)
    votes = np.zeros((comm.size, 6), np.int64)
    with watched_step(comm, what, note, site):
        resync_owed(comm, what, site)  # (MPI's own collective next: never before that)
        t.comm.Allgather(mine, votes)
        said = votes[votes[:, 4] == 1, 5]
        if len(set(said.tolist())) > 1:
            raise _unlike(comm, what, votes)
        if not (votes[:, 0].all() and (votes[:, 1].all() or votes[:, 2].all())
                and (votes[:, 3] == votes[0, 3]).all()):
            return None
        run = request = None
        try:
            run, request = persist()
        except Exception:  # noqa: BLE001 - this rank could not: all are told
            request = None
        made = np.array([request is not None], np.int64)
        t.comm.Allreduce(MPI.IN_PLACE, made, MPI.MIN)
    if made[0]:
        return run, request
    if request is not None:
        t.release(request)  # never started: a local free
    t.persists = False
    return None


def _plain(value: Any) -> Any:
    """An integer argument as Python's int (NumPy's repr differs), anything else as it is."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    return value


def _unlike(comm: Communicator, what: str, votes: np.ndarray) -> MismatchError:
    """The ranks' calls differ (``_vote_and_make``'s votes): each group of ranks named."""
    groups: dict[int, list[int]] = {}
    for rank in np.flatnonzero(votes[:, 4]).tolist():
        groups.setdefault(int(votes[rank, 5]), []).append(rank)
    said = "; ".join(f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
                     f"{('make' if len(ranks) > 1 else 'makes') + ' one' if i == 0 else 'another'}"
                     for i, ranks in enumerate(groups.values()))
    return MismatchError(
        f"{what}: the ranks' plans are not the same call (x's elements or dtype, the op, "
        f"root, algorithm or options differ): {said} (MPICOLL_CHECK=1 names what differs)")


def end_running_starts(comm: Communicator) -> None:
    """Before ``comm.free()`` frees its plans' persistent requests: their running starts
    end first (every rank started them, so they end; MPI forbids freeing an active
    collective request), in a wait the watchdog bounds as any other."""
    if comm._freed or not comm._backend.native_is_mpi:
        return
    t = comm._backend.transport
    if t.started_persistent():
        with watched_step(comm, "free()", "waiting for every rank to end the running starts "
                          "of this Communicator's plans", sys._getframe(2)):
            t.end_persistent()


def init_method(collective: str) -> Any:
    """The Communicator's ``<collective>_init``: the blocking call's parameters."""

    def init(self: Any, *args: Any, **kwargs: Any) -> Plan:
        return make_plan(self, collective, args, kwargs, sys._getframe(1))

    init.__name__ = init.__qualname__ = f"{collective}_init"
    init.__signature__ = public_signature(  # type: ignore[attr-defined]
        decided.SIGNATURES[collective], async_op=False).replace(return_annotation="Plan")
    init.__doc__ = (f"A persistent {collective} (MPI-4's ``MPI_{collective.title()}_init``): "
                    f"the parameters of ``{collective}``; returns an ``mpicoll.Plan`` whose "
                    "``start()``/``wait()`` (or ``plan()``) run it on the bound buffers. "
                    "See ``mpicoll.plan``.")
    return init


# plan(): a start after the first runs what the first decided (mpicoll.pipeline.decided)
# on the bound buffers: still a numbered, watched call (the entry numbers it, and a rank
# that owes a resync takes the whole path); where anything could decide differently
# (check mode, traces, a GPU stream, the NCCL backend) every start takes the whole path.
