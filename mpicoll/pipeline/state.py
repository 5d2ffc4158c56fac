"""CallState: what a Communicator's calls share, owned by the pipeline and declared here.

A ``Communicator`` is a ``CallState`` with the public methods on top. The stages take it
as ``c: CallState`` and read and write only what is declared below, so each field has one
description and one owner (the stage named beside it), and the pipeline needs nothing of
the API layer, not even for its type hints.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import TYPE_CHECKING, Any

from ..errors import ConcurrentCallError

if TYPE_CHECKING:
    import numpy as np

    from ..backends import Backend
    from ..observe.recorder import Watch
    from ..observe.tracing import Tracer
    from .choose import Chooser


class Turn:
    """One thread at a time in a Communicator's calls: a lock that never blocks.

    Its one token lies in a list: ``list.pop`` and ``list.append`` are atomic, and the two
    cost a quarter of a ``threading.Lock``'s ``acquire(False)`` and ``release()`` (25 ns
    against 100), on the path of every call. ``take()`` gives the turn or raises
    IndexError (another thread has it); ``give()`` gives it back, once per take;
    ``release()`` is ``give(True)``, a C call too (a Python method's entry is where a
    pending Ctrl-C is raised: before the turn is given back). Take it with ``entry.turn``,
    or as ``numbered`` does, in the try that gives it back: a method returning it (a
    Lock's ``acquire``) let a pending Ctrl-C land after it was taken, before that try."""

    __slots__ = ("take", "give", "release")

    def __init__(self) -> None:
        token = [True]
        self.take, self.give = token.pop, token.append
        self.release = functools.partial(token.append, True)


class CallState:
    """The state of one Communicator's calls.

    Attributes:
        _backend: the library's Backend: transport, control transport, its own
            collectives, capabilities (``mpicoll.backends``).
        _chooser: selection from agreed values only; it records each call's algorithm and
            bytes in the flight recorder (``choose``).
        _watch: the flight recorder and the watchdog's clock (``observe.recorder.Watch``).
        _tracer: the Tracer where ``trace=`` is on, else None.
        _decisions: what default calls decided, by ``decided.key`` (``decided``); None
            where calls always take the whole path (check mode, traces).
        _seq: the calls numbered so far, the same on every rank (``entry``).
        _entry: the turn of one thread at a time (``Turn``, ``entry``).
        _refused_alone: the number of a call this rank refused or failed alone, 0 if none:
            the next call resyncs first (written by ``entry.ended`` and ``agree.settle``,
            cleared by ``agree.resync``).
        _packet, _packet_header: broadcast's and scatter's first message: the root's
            header, and the data when it fits (``run``, ``decided``).
        _node_of: each rank's node index, agreed (``agree.nodes``).
        _freed: ``free()`` was called: every later call refuses (``entry``), plans too.
        check: check mode, agreed (``agree.settings``).
        timeout: seconds a call may take before the watchdog reports it (this rank's:
            it may differ per rank, as the watchdog's clock is each rank's own).
        _rank0_timeout: rank 0's timeout, the same on every rank (``agree.settings``):
            what a call whose outcome every rank decides alike waits (monitored_barrier).
        _exit_key: this Communicator's place in the collectives every rank makes at exit
            (trace merges, progress threads' closes), agreed (``agree.settings``).
        _private: the Communicators private to objects made on this one (a Bucketer's
            duplicate), in the order every rank made them: freed with it (``let_go``).
        _progress: its progress thread (``mpicoll.work``), once an async call made it.
    """

    _backend: Backend
    _chooser: Chooser
    _watch: Watch | None
    _tracer: Tracer | None
    _decisions: dict[tuple, Any] | None
    _seq: int
    _entry: Turn
    _refused_alone: int
    _plans_made: int
    _freed: bool
    _packet: np.ndarray
    _packet_header: np.ndarray
    _node_of: list[int]
    timeout: float
    _rank0_timeout: float
    _exit_key: tuple[int, ...]
    _rank_names: list[int] | None
    _receives_here: weakref.WeakSet

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._watch = self._tracer = self._decisions = None
        # the ranks its errors name, said as these (by rank) too: mpicoll.dist's groups,
        # whose users name the job's global ranks; None: its own ranks alone
        self._rank_names = None
        self._seq = 0
        self._plans_made = 0  # plans made on it (every rank makes each: mpicoll.plan)
        self._refused_alone = 0
        self._freed = False
        self._entry = Turn()
        self._private: list[Any] = []
        # its irecvs that may take a message of this rank's own (mpicoll.p2p: a blocking
        # send to itself is then no deadlock)
        self._receives_here = weakref.WeakSet()

    @property
    def check(self) -> bool:
        return self._check

    @check.setter
    def check(self, value: bool) -> None:
        """Check mode set on a live Communicator (on every rank alike) takes effect at the
        next call: the kept decisions of default calls, which skip its exchange, are
        dropped while it is on (a call that hit one on a rank would send other messages
        than the fingerprint its peers send), and are made again once it is off."""
        self._check = bool(value)
        if self._watch is not None and not self._freed:  # (made: __init__ sets the table)
            self._decisions = None if self._check or self._tracer is not None else \
                (self._decisions if self._decisions is not None else {})
            # its asynchronous calls' and plans' starts too: the progress thread's
            # duplicate takes it between the calls queued before and after, in the order
            # every rank queues them (it kept the setting it was made with)
            progress = getattr(self, "_progress", None)
            if progress is not None:
                checked = self._check
                progress.submit("check", lambda duplicate: setattr(duplicate, "check", checked),
                                claim=False)

    @property
    def rank(self) -> int:
        return self._backend.transport.rank

    @property
    def size(self) -> int:
        return self._backend.transport.size


# -- done callbacks (mpicoll.Work.add_done_callback, mpicoll.dist's futures) run on the
# progress thread that ended the call: a call made there would interleave with the
# calling thread's own calls in an order that differs between ranks, so it is refused

# the threads in done callbacks now (every Communicator's progress threads), each with how
# many it is in (one may run another); empty on the hot path, so a call reads it and goes on
CALLBACK_THREADS: dict[int, int] = {}
_CALLBACKS_LOCK = threading.Lock()


def close_progress(c: CallState) -> None:
    """free()'s: the progress thread of ``c``'s async calls ended (they finished)."""
    progress, c._progress = c._progress, None
    if progress is not None:
        progress.close()


def let_go(c: CallState) -> None:
    """The end of ``c``'s free() (every rank's: free() is collective), once its own
    communicators are released: the Communicators private to objects made on it freed
    too (a Bucketer dropped without its free() would keep its duplicate and progress
    thread to the end of the job). One that another thread is in is kept, and said:
    free() again frees it."""
    busy = None
    for comm in list(c._private):
        try:
            comm.free()
        except ConcurrentCallError as exc:
            busy = busy or exc
            continue
        c._private.remove(comm)
    if busy is not None:
        raise ConcurrentCallError(
            f"free: this Communicator is freed, but not the one a Bucketer made on it works "
            f"on ({busy}); call free() again once that call has ended")


def entering_done_callback() -> None:
    """This thread starts a done callback (``mpicoll.work``: on a progress thread, or
    in the caller's thread where the call had finished already)."""
    me = threading.get_ident()
    with _CALLBACKS_LOCK:
        CALLBACK_THREADS[me] = CALLBACK_THREADS.get(me, 0) + 1


def leaving_done_callback() -> None:
    me = threading.get_ident()
    with _CALLBACKS_LOCK:
        if CALLBACK_THREADS[me] > 1:
            CALLBACK_THREADS[me] -= 1
        else:
            del CALLBACK_THREADS[me]


def in_done_callback() -> bool:
    """Whether this thread is in a done callback."""
    return threading.get_ident() in CALLBACK_THREADS


def refuse_in_callback(what: str) -> None:
    """Raise ``refused_in_callback(what)`` in a done callback."""
    if CALLBACK_THREADS and in_done_callback():
        raise refused_in_callback(what)


def waits_for_itself(what: str) -> ConcurrentCallError:
    """What a wait made in a done callback for a call its own thread would end raises."""
    return ConcurrentCallError(
        f"{what}: made in a done callback (a future's then() or add_done_callback) on the "
        "progress thread that would end it: it would wait for itself forever. Wait in your "
        "own thread")


def refused_in_callback(what: str) -> ConcurrentCallError:
    """What a call made in a done callback raises (on every rank alike: each runs the
    same callback, on its progress thread or at once where the call had finished),
    before it takes a number."""
    return ConcurrentCallError(
        f"{what}: made in a done callback (a future's then() or add_done_callback), which "
        "runs on the progress thread that ended the asynchronous call (or at once, on a "
        "rank where it had ended); its calls would interleave with your thread's in an "
        "order that differs between ranks. Make the call in your own thread, after the "
        "future's wait()")
