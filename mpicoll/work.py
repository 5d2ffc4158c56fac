"""Asynchronous collectives: ``comm.all_reduce(x, async_op=True)`` returns a ``Work``.

How communication progresses while the caller computes: a progress thread per
communicator runs the asynchronous calls, one after another in the order they were
made, on a duplicate of the communicator (its own MPI communicator, or its own local
world), so their messages never match the caller's own blocking calls. Why a thread and
not nonblocking state machines: every algorithm is written once as straight-line code over
point-to-point messages, as the textbook gives it; a thread runs each one unchanged, and
mpi4py's blocking calls and NumPy's reductions release the GIL, so the thread moves and
reduces data while the caller's NumPy code runs. It needs MPI_THREAD_MULTIPLE (what
mpi4py asks for by default). Order: every rank makes its asynchronous calls in the same
order (as MPI requires of collectives), so one thread per rank running them in that order
matches them across ranks; handles may be waited on in any order.

On the NCCL backend an asynchronous call is queued on the CUDA stream as every NCCL call
is; its ``Work`` waits for a CUDA event recorded after it.
"""

from __future__ import annotations

import atexit
import contextlib
import numbers
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .errors import CollectiveTimeoutError, InvalidArgumentError
from .observe.watchdog import timeout_setting
from .pipeline.state import (
    entering_done_callback,
    in_done_callback,
    leaving_done_callback,
    refused_in_callback,
    waits_for_itself,
)

_UNSET = object()


class Work:
    """The handle of an asynchronous collective.

    ``wait()`` blocks until the collective has finished on this rank and returns its result
    (what the blocking call returns), or raises what the blocking call would have raised.
    ``test()`` and ``done`` tell, without blocking, whether it has finished. ``wait`` is
    bounded by the Communicator's timeout (``timeout``; 0: unbounded) plus ``GRACE``
    seconds, so that the watchdog, which times the call itself, reports it first.
    """

    GRACE = 5.0

    def __init__(self, what: str, timeout: float | None = None) -> None:
        self.what = what
        self.timeout = timeout_setting(timeout)
        self._finished = threading.Event()
        self._result: Any = _UNSET
        self._error: BaseException | None = None
        self._event: Any = None  # NCCL: a CUDA event after the call
        self.started_at = self.finished_at = float("nan")  # time.perf_counter() on this rank
        self._callbacks: list[Callable[[Work], None]] | None = []  # None once finished
        self._queue: Any = None  # the progress thread that runs it, if one does
        self._callbacks_lock = threading.Lock()

    def _set(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self.finished_at = time.perf_counter()
        self._finished.set()
        with self._callbacks_lock:
            callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            _run_callback(callback, self)

    def add_done_callback(self, callback: Callable[[Work], None]) -> None:
        """Call ``callback(work)`` once the collective has finished on this rank (as
        ``concurrent.futures.Future``'s): at once, in this thread, if it has; else in
        the thread that finishes it (the progress thread, on the MPI backend). On NCCL,
        finished means queued on its stream (``wait()`` also waits for the GPU). An
        exception a callback raises is reported as a warning, not raised."""
        with self._callbacks_lock:
            if self._callbacks is not None:
                self._callbacks.append(callback)
                return
        _run_callback(callback, self)

    @property
    def done(self) -> bool:
        if self._event is not None and self._finished.is_set() and self._error is None:
            return bool(self._event.done)
        if self._finished.is_set():
            return True
        if self._queue is not None:  # its progress thread needs the GIL for each step of
            # the call: a caller that polls test() in a loop would hold it for Python's
            # whole switch interval (5 ms) at each step (55x slower); given up a moment
            time.sleep(0)
        return self._finished.is_set()

    def test(self) -> bool:
        """True once the collective has finished (``wait`` would not block)."""
        return self.done

    is_completed = test  # torch.distributed's name

    def wait(self, timeout: float | None = None) -> Any:
        """The collective's result, once it has finished.

        ``timeout``: seconds (or a ``datetime.timedelta``); 0 asks whether it has
        finished without waiting (``mpicoll.dist``'s Work takes torch's 0, no limit).
        Default: the Communicator's timeout, plus ``GRACE`` (its timeout 0: no limit),
        counted from the moment the call begins (the calls queued before it run first).

        Raises:
            CollectiveTimeoutError (a TimeoutError): not finished within ``timeout``.
        """
        queue = self._queue
        if queue is not None and queue._thread is threading.current_thread() and \
                not self._finished.is_set():  # its own progress thread: it never would
            raise waits_for_itself(f"{self.what} wait()")
        if timeout is None:
            seconds = self.timeout and self.timeout + self.GRACE
            deadline = time.monotonic() + seconds if seconds else float("inf")
            if seconds:
                self._running_past(seconds)  # (a call queued behind others is not late)
        else:
            seconds = as_seconds(timeout)
            deadline = time.monotonic() + seconds
            if not self._finished.wait(_bounded(seconds)):
                raise CollectiveTimeoutError(f"{self.what}: not finished after {seconds:g} s")
        self._finished.wait()  # (set: at once; unbounded: the watchdog bounds the call)
        if self._error is not None:
            raise self._error
        if self._event is not None:  # NCCL: the call is queued on a stream
            while not self._event.done:
                if time.monotonic() > deadline:
                    raise CollectiveTimeoutError(
                        f"{self.what}: the GPU has not finished it after {seconds:g} s")
                time.sleep(0.0001)
        return self._result

    def _running_past(self, seconds: float) -> None:
        """``wait()``'s default bound: return once the call has finished, or raise once
        it has run ``seconds`` since it began on the progress thread, or waited that long
        to begin while no earlier call ran there (an earlier call running, which the
        watchdog times, does not count against this one)."""
        waiting = time.perf_counter()
        while not self._finished.wait(min(seconds, 1.0)):
            now, started = time.perf_counter(), self.started_at  # (NaN: not begun yet)
            queue = self._queue
            if queue is not None and not queue._thread.is_alive():  # (killed: never)
                raise CollectiveTimeoutError(f"{self.what}: its progress thread has ended")
            if started != started and queue is not None and queue.running is not None:
                waiting = now  # an earlier call runs: this one is not late
            elif now - (started if started == started else waiting) > seconds:
                raise CollectiveTimeoutError(f"{self.what}: not finished after {seconds:g} s")

    def host_result(self) -> Any:
        """The result of a call that has finished (``done`` on the MPI backend; queued on
        its stream on NCCL, whose GPU may still be running it), or its error raised,
        without waiting: what a done callback reads."""
        if not self._finished.is_set():
            raise InvalidArgumentError(f"{self.what}: not finished (wait() for it)")
        if self._error is not None:
            raise self._error
        return self._result

    def __repr__(self) -> str:
        state = "done" if self._finished.is_set() else "pending"
        return f"<mpicoll.Work {self.what} {state}>"


_LOCAL = threading.local()  # .progress: this thread is a ProgressThread's


def on_progress_thread() -> bool:
    """Whether this thread is a ProgressThread's (which runs the calls it would wait for)."""
    return getattr(_LOCAL, "progress", False)


def _run_callback(callback: Callable[[Work], None], work: Work) -> None:
    """``callback(work)``, marked as a done callback (a collective call it makes is
    refused: ``pipeline.state.in_done_callback``) wherever it runs: on the progress
    thread, or at once in the caller's thread where the call had finished when it was
    added (which of the two is a matter of timing on each rank: the refusal is not)."""
    on_progress = on_progress_thread()
    entering_done_callback()
    try:
        callback(work)
    except BaseException as exc:  # noqa: BLE001 - never into the thread that finished the call
        if not on_progress and not isinstance(exc, Exception):
            raise  # (SystemExit, KeyboardInterrupt: the caller's own thread's to handle)
        import warnings

        text = f"mpicoll: a done callback of {work.what} raised {type(exc).__name__}: {exc}"
        try:
            warnings.warn(text, RuntimeWarning, stacklevel=2)
        except Exception:  # noqa: BLE001 - warnings as errors (python -W error): the warning
            if not on_progress:  # is the caller's to get; never the progress thread's
                raise
            from .observe.watchdog import report

            report(text)
    finally:
        leaving_done_callback()


def _bounded(seconds: float) -> float | None:
    """A wait of ``seconds`` as threading's waits take it: None (no limit) past the
    longest they can wait (``threading.TIMEOUT_MAX``, some 292 years)."""
    return None if seconds >= threading.TIMEOUT_MAX else seconds


def as_seconds(timeout: Any) -> float:
    """A wait's ``timeout`` in seconds (a number, or a timedelta); below 0 as 0."""
    if hasattr(timeout, "total_seconds"):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or timeout != timeout:
        raise InvalidArgumentError(f"timeout: expected a number of seconds or a timedelta, "
                                   f"got {timeout!r}")
    return max(float(timeout), 0.0)


def program_frame(depth: int = 2) -> Any:
    """The frame of the program's line that made the call (``depth``: 2, the caller of
    the function that asks), past mpicoll.dist's own frames (its functions are calls of
    the Communicator's): the site a call's reports and check mode name."""
    frame = sys._getframe(depth)
    while frame.f_back is not None and \
            str(frame.f_globals.get("__name__", "")).startswith("mpicoll.dist"):
        frame = frame.f_back
    return frame


class Site:
    """Where the caller made an asynchronous call (what a frame gives the watchdog's
    record: its code and instruction), so check mode and the reports name the user's
    line, not mpicoll's."""

    __slots__ = ("f_code", "f_lasti")

    def __init__(self, frame: Any) -> None:
        self.f_code, self.f_lasti = frame.f_code, frame.f_lasti


_RUNNING: weakref.WeakSet = weakref.WeakSet()  # progress threads not yet closed


class ProgressThread:
    """Runs a communicator's asynchronous calls in order on a duplicate of it.

    One thread submits at a time: while calls of one thread are pending, another
    thread's submission is refused (ranks would queue the two threads' calls in
    different orders, and pair one thread's data with the other's)."""

    def __init__(self, duplicate: Any) -> None:
        self.comm = duplicate
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.pending = 0  # submitted and not finished
        self.running: Work | None = None  # the call it runs now
        self.calling_back: str | None = None  # the call whose done callbacks run now
        self.owner: int | None = None  # the thread whose calls are pending
        self._thread = threading.Thread(target=self._run, name="mpicoll-progress", daemon=True)
        self._thread.start()
        _RUNNING.add(self)
        _exit_hook()

    def other_thread_pending(self) -> bool:
        """Whether calls another thread submitted are still pending."""
        with self.lock:
            return self.pending > 0 and self.owner not in (None, threading.get_ident())

    def adopt(self) -> None:
        """The calling thread takes over the pending calls: for a private Communicator
        whose owner fixes the order of its calls whatever thread makes them (the
        Bucketer's, under its lock, in bucket order)."""
        with self.lock:
            if self.pending:
                self.owner = threading.get_ident()

    def submit(self, name: str, call: Callable[[Any], Any], claim: bool = True) -> Work:
        """Queue ``call``; ``claim``: the submitting thread owns the pending calls (not a
        refused submission, which only takes its number)."""
        work = Work(name, self.comm.timeout)
        work._queue = self
        with self.lock:
            self.pending += 1
            if claim:
                self.owner = threading.get_ident()
        self._calls.put((work, call))
        return work

    def _run(self) -> None:
        _LOCAL.progress = True
        while True:
            item = self._calls.get()
            if item is None:
                return
            work, call = item
            item = None
            work.started_at = time.perf_counter()
            self.running = work
            result = error = None
            try:
                result = call(self.comm)
            except BaseException as exc:  # noqa: BLE001 - handed to wait() on this rank
                error = exc
            # its done callbacks run with no call running (the calls queued behind wait
            # for them, and their waits' bounds count it); their errors are theirs
            self.running = call = None
            # no longer pending before wait() can return: a thread given the Communicator
            # once its owner's wait() returned may call at once (the done callbacks, run
            # next, make no call on it)
            with self.lock:
                self.pending -= 1
                if not self.pending:
                    self.owner = None
            self.calling_back = work.what  # (its done callbacks run now: said at exit)
            try:
                work._set(result, error)
            finally:
                work = result = error = self.calling_back = None  # nothing of the call
                # outlives it here

    def close(self, timeout: float | None = None) -> bool:
        """Finish what was submitted (within ``timeout`` seconds; None: no bound), then
        stop the thread and free the duplicate; whether it finished."""
        self._calls.put(None)
        self._thread.join(None if timeout is None else _bounded(timeout))
        if self._thread.is_alive():
            return False
        _RUNNING.discard(self)
        self.comm.free()
        return True


_HOOKED = [False]


def _exit_hook() -> None:
    if not _HOOKED[0]:
        _HOOKED[0] = True
        atexit.register(finish_at_exit)


def finish_at_exit() -> None:
    """At exit (also first thing in a trace file's at-exit write, which may run before
    this hook: atexit runs the hooks last made first), a rank with asynchronous calls unfinished (a ``wait()`` that timed out
    and was not caught, calls never waited for) lets them finish, as long as the
    watchdog allows a call; if they cannot, it ends the job: the other ranks would wait
    for it, and MPI's finalization would wait for them, unwatched."""
    from .observe.watchdog import watchdog
    from .pipeline.describe import Call

    for watch in list(watchdog().watches):  # plans' starts on MPI's persistent requests
        t = getattr(watch.backend, "transport", None)  # never waited for: waited now,
        if getattr(t, "started_persistent", None) and t.started_persistent():  # watched
            with watch.aside(Call(watch.current.call.seq, "exit"), "waiting for every rank "
                             "to end the running starts of this rank's plans (at exit)"), \
                    contextlib.suppress(Exception):
                t.end_persistent()
    # in their duplicates' agreed exit order, the same on every rank that shares two
    # (closing one frees its duplicate, a collective: its trace's merge; a WeakSet's
    # order is addresses, and the order threads made them in may differ per rank)
    for progress in sorted(_RUNNING, key=lambda p: p.comm._exit_key):
        timeout = progress.comm.timeout
        # the watchdog times the running call and ends the job at its timeout; the
        # bound here only covers calls still queued behind it
        if progress.close(timeout=None if not timeout else 4 * timeout + 10):
            continue
        from .observe.watchdog import EXIT_UNCAUGHT, dump_and_abort, world_rank

        rank = world_rank(progress.comm.rank)
        callback = progress.calling_back  # (its call ended: no longer pending)
        parts = ([f"{progress.pending} asynchronous call(s) unfinished"] if progress.pending
                 else []) + ([f"a done callback of its {callback} still running"]
                             if callback else [])
        what = ", and ".join(parts) or "its asynchronous calls unfinished"
        dump_and_abort([f"mpicoll: rank {rank} exits with {what} after "
                        f"{4 * timeout + 10:g} s; aborting the job (exit code "
                        f"{EXIT_UNCAUGHT})"], f"exit with {what}", rank, EXIT_UNCAUGHT,
                       grace=0.0)


def submit(comm: Any, name: str, args: tuple, kwargs: dict, stream: Any, frame: Any,
           refused: Exception | None = None) -> Work:
    """``comm.<name>(*args, async_op=True, **kwargs)``: queue the call and return its Work.

    The call is numbered on every path: a submission refused here (another thread's
    calls pending or in a call, a bad ``stream=``) raises at once and still takes its
    number on the progress thread (as a refused call), so the next call pairs with the
    other ranks' next call. In check mode the call is first agreed on ``comm`` itself
    (a numbered step of its own), so a rank that makes it async while another makes it
    blocking raises on every rank, and the progress communicator is made only where
    every rank makes it. ``refused``: the caller's own refusal of the call (the entry's
    ``_refusal=``), settled as these.
    """
    if in_done_callback():
        raise refused_in_callback(f"{name}(async_op=True)")
    site = Site(frame)
    if comm._backend.queues_on_stream:  # NCCL is asynchronous already: queue it
        if refused is not None:  # numbered there (refused), then raised here, as below
            kwargs = {**kwargs, "_refusal": refused}
        work = queued_on_stream(
            name, lambda current: getattr(comm, name)(*args, stream=current, _site=site, **kwargs),
            stream, comm.timeout)
        if refused is not None:
            raise refused
        return work
    from .errors import ConcurrentCallError, InvalidArgumentError
    from .pipeline.entry import announce, busy, freed
    from .pipeline.validate import stream_refusal

    try:  # (the turn: as numbered takes it)
        comm._entry.take()
    except IndexError:
        refusal = ConcurrentCallError(busy(comm, f"{name}(async_op=True)"))
        if comm._progress is not None:  # a blocking call of another thread holds comm
            _refused(comm._progress, name, args, kwargs, stream, site, refusal)
        raise refusal from None
    except BaseException:  # (Ctrl-C as take() returned: the turn was taken)
        comm._entry.give(True)
        raise
    try:
        if comm._freed:  # freed by another thread since the caller's check (as numbered
            # checks again): a new progress thread would be made on the freed communicator
            raise freed(f"{name}(async_op=True)")
        refusal = refused
        progress = comm._progress
        if refusal is None and progress is not None and progress.other_thread_pending():
            refusal = ConcurrentCallError(
                f"{name}(async_op=True): another thread's asynchronous calls are still "
                "pending on this Communicator; the ranks could queue the two threads' calls "
                "in different orders. One Communicator serves one thread at a time: give "
                "each thread its own with comm.dup(), made before the threads start")
        elif refusal is None and stream is not None:
            refusal = stream_refusal(stream)
        if comm.check:  # agree the call (and any refusal) on comm first: every rank raises
            announce(comm, f"{name} async", site, refusal)
        if progress is None:
            progress = _made_progress(comm, site)
        if refusal is None:
            # the progress thread runs on the caller's GPU and after the caller's stream
            # (nothing to do where no stream or CuPy buffer is in play)
            from .buffers.cuda import capture_device_and_stream

            try:
                on_callers_gpu = capture_device_and_stream(stream, (*args, *kwargs.values()))
            except Exception as exc:  # noqa: BLE001 - refused, and numbered below
                refusal = exc if isinstance(exc, InvalidArgumentError) else \
                    InvalidArgumentError(f"stream: {type(exc).__name__}: {exc}")
        if refusal is not None:
            _refused(progress, name, args, kwargs, stream, site, refusal)
            raise refusal

        def call(duplicate: Any) -> Any:
            with on_callers_gpu():
                return getattr(duplicate, name)(*args, stream=stream, _site=site, **kwargs)

        return progress.submit(name, call)
    finally:
        comm._entry.release()


def _made_progress(comm: Any, site: Site) -> ProgressThread:
    """``comm``'s progress thread, made now (its duplicate communicator: a collective of
    ``comm``), the caller holding ``comm``'s entry."""
    if not comm._backend.ranks_are_threads:  # MPI carries the progress thread's calls
        from mpi4py import MPI

        from .errors import InvalidArgumentError

        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            raise InvalidArgumentError(
                "async_op=True: needs MPI_THREAD_MULTIPLE (mpi4py's default; "
                "mpi4py.rc.thread_level was set lower)")
    from .pipeline.entry import resync_owed

    resync_owed(comm, "async_op=True (its progress thread)", site)  # (before the duplicate)
    progress = comm._progress = ProgressThread(comm._duplicate(site))
    return progress


def start_progress(comm: Any, frame: Any) -> None:
    """Collective: make ``comm``'s progress thread now, where every rank is (the first
    ``async_op=True`` call makes it otherwise: where ranks make their first async calls on
    two communicators in different orders, those duplicates would wait for each other).
    The Bucketer's constructor calls it for its communicator."""
    from .pipeline.entry import freed, turn

    if comm._freed:
        raise freed("start_progress")
    if comm._backend.queues_on_stream or comm._progress is not None:
        return

    with turn(comm, "start_progress"):
        _made_progress(comm, Site(frame))


def _refused(progress: ProgressThread, name: str, args: tuple, kwargs: dict, stream: Any,
             site: Site, refusal: Exception) -> None:
    """Queue call ``name`` as refused: the progress thread numbers it and refuses it as
    every stage refuses (in check mode on every rank; else here, and the next call
    checks that the others refused it too)."""
    progress.submit(name, lambda duplicate: getattr(duplicate, name)(
        *args, _site=site, _refusal=refusal, **kwargs), claim=False)


def queued_on_stream(name: str, call: Callable[[Any], Any], stream: Any,
                     timeout: float | None = None) -> Work:
    """An asynchronous call on a backend that queues its work on a CUDA stream (NCCL):
    ``call(stream)`` now, on ``stream`` (default: the current one), and a CUDA event
    recorded after it, which ``wait()`` synchronizes; a failure is raised by ``wait()``,
    as on the MPI backend. ``timeout``: the Communicator's (bounds ``wait()``)."""
    work = Work(name, timeout)
    try:
        from .buffers.arrays import cupy_module

        cuda = cupy_module().cuda
        current = stream if stream is not None else cuda.get_current_stream()
        result = call(current)
        work._event = cuda.Event(block=False, disable_timing=True)
        work._event.record(current)
        work._set(result)
    except Exception as exc:  # noqa: BLE001 - raised by wait()
        work._set(error=exc)
    return work
