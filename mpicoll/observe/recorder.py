"""The flight recorder: each Communicator's call in progress and its last N calls.

Each Communicator has a ``Watch``: the call it is in (a start time, or 0 when idle) and
a flight recorder, a ring of the last N calls (``MPICOLL_FLIGHT_RECORDER``, default 64)
whose entries are made once and rewritten in place. The hot path only writes into them:
the call's entry on the way in, its end and state on the way out; the transports write
the peer, the kind of wait and the step number before each blocking call, and the
Chooser writes the algorithm and the bytes. The watchdog (``mpicoll.observe.watchdog``) reads
them when a call is overdue, and the dumps and reports print them.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np

from ..errors import CollectiveTimeoutError, ConfigError
from ..pipeline.describe import Call

DEFAULT_RECORDER = 64  # calls kept per Communicator
MAX_RECORDER = 1 << 16  # (each entry is made when the Communicator is: some 300 bytes)

RUNNING, DONE = "running", "done"
_NO_FACTS = (None, None, (), None, None, None, -1)  # shape ... nbytes: no call yet
now = time.monotonic  # the clock of every entry's start and end


def world_ranks(transport: Any) -> list[int] | None:
    """The MPI_COMM_WORLD ranks of ``transport``'s communicator's ranks, in its rank
    order, or None where it has no MPI communicator (the local backend)."""
    mpi = sys.modules.get("mpi4py.MPI")
    comm = getattr(transport, "comm", None)
    if mpi is None or not isinstance(comm, mpi.Comm) or comm == mpi.COMM_NULL:
        return None
    group, world = comm.Get_group(), mpi.COMM_WORLD.Get_group()
    try:
        return [int(r) for r in mpi.Group.Translate_ranks(group, list(range(group.Get_size())),
                                                          world)]
    finally:
        group.Free()
        world.Free()


def recorder_length() -> int:
    """How many calls the flight recorder keeps (``MPICOLL_FLIGHT_RECORDER``, default 64)."""
    text = os.environ.get("MPICOLL_FLIGHT_RECORDER", "").strip()
    if not text:
        return DEFAULT_RECORDER
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_RECORDER:
        raise ConfigError(f"MPICOLL_FLIGHT_RECORDER: expected a number of calls in "
                          f"1..{MAX_RECORDER}, got {text!r}")
    return int(text)


def _shape(shape: Any) -> list[int] | str | None:
    """An entry's shape as JSON takes it: a list of ints, or its text where the caller's
    refused call gave something else (an entry never stops a report)."""
    if shape is None:
        return None
    try:
        return [int(d) for d in shape]
    except (TypeError, ValueError):
        return str(shape)


def unsaid_receive_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a transport's receive that timed out (the local backend's, in
    its own words), not yet said with its call: a monitored barrier's or a wait's
    timeout names its call already."""
    return isinstance(exc, CollectiveTimeoutError) and bool(exc.args) and \
        not getattr(exc, "_call_said", False) and \
        str(exc.args[0]).startswith("mpicoll: timeout: rank")


class Record:
    """One call in the flight recorder (made once, rewritten for every N-th call).

    What the call was given and what it chose are one tuple, ``facts``: (shape, dtype,
    args, op, root, algorithm, nbytes), so that a call repeating a kept decision writes
    them with one store (``entry.prepare``); the properties read them by name."""

    __slots__ = ("call", "facts", "start", "end", "state", "note")

    def __init__(self) -> None:
        self.call: Any = Call()  # the pipeline's Call: seq, collective, file, line
        self.facts: tuple = _NO_FACTS
        self.start = self.end = 0.0
        self.state = DONE
        self.note = ""  # what a step that is not a numbered call waits for

    shape = property(lambda self: self.facts[0])
    dtype = property(lambda self: self.facts[1])
    args = property(lambda self: self.facts[2])  # op, root, counts: small values, never data
    op = property(lambda self: self.facts[3])
    root = property(lambda self: self.facts[4])
    algorithm = property(lambda self: self.facts[5])
    nbytes = property(lambda self: self.facts[6])

    def chose(self, algorithm: Any, nbytes: int) -> None:
        """The call chose ``algorithm``, for ``nbytes``."""
        self.facts = (*self.facts[:5], algorithm, nbytes)

    def as_dict(self, names: tuple[str, ...], transport: Any, clock: float) -> dict[str, Any]:
        """The entry as JSON-ready values; ``names``: the collective's positional
        parameters after x; ``clock``: time.time() - time.monotonic()."""
        call = self.call
        given = dict(zip(names, self.args, strict=False))
        op = self.op if self.op is not None else given.get("op")
        root = self.root if self.root is not None else given.get("root")
        state = self.state
        if state == RUNNING and transport is not None:
            state = f"in step {getattr(transport, 'step', 0)}"
        return {
            "seq": call.seq, "collective": call.collective, "site": call.site,
            "algorithm": None if self.algorithm is None else str(self.algorithm),
            "nbytes": self.nbytes,
            "shape": _shape(self.shape),
            "dtype": None if self.dtype is None else str(self.dtype),
            "op": None if op is None else getattr(op, "name", str(op)),
            "root": None if root is None else int(root) if isinstance(root, int) else str(root),
            "start": round(self.start + clock, 6),
            "end": None if self.state == RUNNING else round(self.end + clock, 6),
            "state": state,
        }


class Watch:
    """One Communicator's call in progress and flight recorder, as the watchdog sees them.

    Attributes:
        started: time.monotonic() when the current call began; 0.0 when idle.
        current: the Record of the current (or the last) call.
        timeout: seconds a call may run (0: unwatched).
        aborts: whether a timeout aborts the process (False on the local backend, whose
            receives raise instead).
    """

    __slots__ = ("rank", "size", "backend", "timeout", "aborts", "started", "length", "ring",
                 "current", "index", "members")

    def __init__(self, communicator: Any, timeout: float, aborts: bool,
                 length: int | None = None) -> None:
        self.rank, self.size = communicator.rank, communicator.size
        self.backend = communicator._backend
        self.timeout, self.aborts = timeout, aborts
        self.started = 0.0
        self.length = recorder_length() if length is None else length  # calls kept
        self.ring = [Record() for _ in range(self.length)]
        self.current = self.ring[0]
        self.index = -1  # this Communicator's place among the process's, set by register
        # its ranks' ranks in MPI_COMM_WORLD (a split's are not 0..size-1): what the dumps
        # of different processes are matched and named by (None: no MPI communicator)
        self.members = world_ranks(getattr(self.backend, "control", None))

    def enter(self, seq: int, collective: str, frame: Any, args: tuple, kwargs: dict) -> Any:
        """Call ``seq`` of ``collective`` began (made in ``frame``): fill its flight-recorder
        entry, start its clock, and return the entry's Call record (the Chooser fills in
        the algorithm and the bytes once it has chosen). Every call runs this: plain
        stores, no allocation but the shape tuple."""
        rec = self.ring[seq % self.length]
        self.current = rec
        call = rec.call
        call.seq = seq
        call.collective = collective
        call.code = frame.f_code
        call.offset = frame.f_lasti
        op = root = None
        if args:
            x = args[0]
            given = args[1:]  # op, root, counts: small values, never the data
            if given and hasattr(given[0], "fn"):  # a user's Op: kept by name only,
                given = (given[0].name, *given[1:])  # so it can die with its MPI op
        else:
            x = kwargs.get("x")
            given = ()
        if kwargs:
            op = kwargs.get("op")
            if hasattr(op, "fn"):
                op = op.name
            root = kwargs.get("root")
        if type(x) is np.ndarray:
            rec.facts = (x.shape, x.dtype, given, op, root, None, -1)
        else:  # (an object whose shape raises, a nested tensor's: none, and the call
            # refuses x as every call refuses what is no array)
            rec.facts = (_attribute(x, "shape"), _attribute(x, "dtype"), given, op, root,
                         None, -1)
        rec.state = RUNNING
        self.started = rec.start = now()
        return call

    def kept(self) -> tuple:
        """What a call repeating a kept decision writes as its entry's facts
        (``entry.prepare``), as the current entry holds it."""
        return self.current.facts

    def rewrite(self, kept: tuple) -> None:
        """Write ``kept`` (see ``kept``) into the current entry."""
        self.current.facts = kept

    def leave(self) -> None:
        """The call ended (its state is done unless ``failed`` said otherwise)."""
        # (in this order: a Ctrl-C's KeyboardInterrupt raised as now() returns leaves the
        # ended call neither "running" nor timed by the watchdog, which would end the job
        # if this rank then did something else past its timeout)
        self.started = 0.0
        rec = self.current
        if rec.state is RUNNING:
            rec.state = DONE
        rec.end = now()

    def timed_out(self, exc: BaseException, rank: int) -> None:
        """A receive of the current call that timed out in the waiting thread (the local
        backend's; over MPI the watchdog reports and ends the job): its words put after
        the watchdog's description of the call (its number, collective, algorithm, step
        and what it waits for, or why), once; any other exception as it is."""
        if not self.started or not unsaid_receive_timeout(exc):
            return
        try:
            described = self.describe_current(now())
        except Exception:  # noqa: BLE001 - the receive's own words stay
            return
        exc.args = (f"mpicoll: timeout: rank {rank}: {described} ({exc.args[0]})",
                    *exc.args[1:])
        exc._call_said = True  # type: ignore[attr-defined]

    def aside(self, call: Any, note: str = "") -> Any:
        """Watch a step that is not a numbered call (making a duplicate, a point-to-point
        message) under ``call``'s name, outside the flight recorder: ``with
        watch.aside(call): ...``; ``note``: what it waits for (default: every rank)."""
        return _Aside(self, call, note)

    def failed(self, exc: BaseException, refused: bool = False) -> None:
        text = " ".join(str(exc).split())  # one line: MPI's error stacks span several
        self.current.state = (f"{'refused' if refused else 'failed'}: "
                              f"{type(exc).__name__}: {text}")[:200]

    def interrupted(self, exc: BaseException) -> None:
        """The running call left on this rank by ``exc``, no error of the call's (Ctrl-C's
        KeyboardInterrupt, SystemExit): its entry says so, never "done", since the other
        ranks may still wait in it (its messages carry its own tag: no later call of this
        rank meets them). Nothing where no call runs (it landed on the way in or out)."""
        if self.started:
            self.current.state = (f"failed: interrupted by {type(exc).__name__} on this "
                                  "rank (the others may still wait in it)")

    # -- what the watchdog reads when a call is overdue -----------------------------------

    def transports(self) -> list[Any]:
        """The backend's transports, unwrapped from a tracer (data first, then control)."""
        b = self.backend
        seen = []
        for t in (b.transport, b.control):
            t = getattr(t, "_inner", t)
            if all(t is not s for s in seen):
                seen.append(t)
        return seen

    def waiting(self) -> str:
        """What the current call waits for, from the transports' last blocking call."""
        rec = self.current
        if rec.note:
            return rec.note
        for t in self.transports():
            kind = getattr(t, "wait_kind", None)
            if kind is None:
                continue
            peer, tag = self.named(getattr(t, "wait_peer", -1)), getattr(t, "tag", "?")
            if kind == "recv":
                return f"waiting to receive from {peer} (tag {tag})"
            if kind == "send":
                return f"waiting to send to {peer} (tag {tag})"
            if kind == "sendrecv":
                return (f"waiting to receive from {peer} and send to "
                        f"{self.named(getattr(t, 'wait_dest', -1))} (tag {tag})")
            return (f"waiting for {getattr(t, 'wait_count', '?')} posted messages "
                    f"(tag {tag}; last posted: {peer})")
        if rec.algorithm == "native":
            what = rec.call.collective
            if what in AGREEMENT_STEPS:  # (a split's agreement: an all_gather, named as it)
                what = f"all_gather (the {what}'s agreement)"
            return f"waiting inside the {self.backend.name.upper()} library's own {what}"
        return "not waiting for a message (computing, or in the library's own collective)"

    def named(self, rank: int) -> str:
        """This communicator's ``rank`` as a report names it: by its MPI_COMM_WORLD rank
        (as the report names every process), with its rank here where the two differ (a
        split's, a group's)."""
        members = self.members
        if members is None or not 0 <= rank < len(members) or members[rank] == rank and \
                members == list(range(len(members))):
            return f"rank {rank}"
        return f"rank {members[rank]} (rank {rank} of communicator {self.index})"

    def peer(self) -> tuple[str | None, int]:
        """(kind of the last blocking call, the rank it waits for), or (None, -1)."""
        for t in self.transports():
            kind = getattr(t, "wait_kind", None)
            if kind is not None:
                return kind, getattr(t, "wait_peer", -1)
        return None, -1

    def step(self) -> int:
        return max((getattr(t, "step", 0) for t in self.transports()), default=0)

    def is_aside(self, rec: Record) -> bool:
        """Whether ``rec`` is a step's aside (point-to-point, making a Communicator, a
        plan's vote), not a numbered call's own entry of the flight recorder."""
        return all(rec is not entry for entry in self.ring)

    def describe_current(self, now: float) -> str:
        rec, call = self.current, self.current.call
        what = f"call #{call.seq} {call.collective}"
        if rec.note and not self.is_aside(rec):  # a numbered call's own
            # step with a note (the resync a refusal alone left owed)
            return (f"{what} ({call.site}) has run {now - self.started:.1f} s "
                    f"(timeout {self.timeout:g} s); {rec.note}")
        if rec.note:
            after = f" after call #{call.seq}" if call.seq else ""  # (0: before any call)
            where = "" if call.code is None else f" ({call.site})"  # (None: at exit)
            return (f"{call.collective}{after}{where} has run "
                    f"{now - self.started:.1f} s (timeout {self.timeout:g} s); {rec.note}")
        details = [f"algorithm {rec.algorithm}"]
        if rec.nbytes >= 0:
            details.append(f"{rec.nbytes} B")
        details.append(call.site)
        return (f"{what} ({', '.join(details)}) has run {now - self.started:.1f} s "
                f"(timeout {self.timeout:g} s); in step {self.step()}, {self.waiting()}")

    def records(self, names: dict[str, tuple[str, ...]], clock: float) -> list[dict[str, Any]]:
        """The flight recorder, oldest call first."""
        data = self.transports()[0]
        live = [r for r in self.ring if r.start]  # entries a call has filled
        live.sort(key=lambda r: r.call.seq)
        return [r.as_dict(names.get(r.call.collective, ()), data if r is self.current else None,
                          clock) for r in live]


# the steps numbered as calls of their own, each an all_gather of its ranks' values
# (groups.agreed_rows: a split's agreement, a Bucketer's), by the call's name: the
# watchdog's report says what such a step waits in, check mode's names another rank's
# (each rank a process of its own: every name any rank may meet, listed)
AGREEMENT_STEPS = frozenset((
    "split", "new_group", "mesh", "split_group", "new_subgroups",
    "new_subgroups_by_enumeration", "DeviceMesh", "Bucketer", "Bucketer.wait",
    "all_reduce_coalesced", "all_gather_coalesced"))


def _attribute(x: Any, name: str) -> Any:
    """``x.name``, or None where x has none or reading it raises."""
    try:
        return getattr(x, name, None)
    except Exception:  # noqa: BLE001 - the flight recorder's fact: none
        return None


class _Aside:
    def __init__(self, watch: Watch, call: Any, note: str = "") -> None:
        self.watch, self.call, self.record, self.note = watch, call, Record(), note

    def __enter__(self) -> None:
        self.saved = self.watch.current, self.watch.started
        self.watch.current = self.record
        self.record.call, self.record.state = self.call, RUNNING
        self.record.note = self.note or \
            f"waiting for every rank to make the {self.call.collective} (collective)"
        self.watch.started = self.record.start = time.monotonic()

    def __exit__(self, kind: Any, exc: BaseException | None, traceback: Any) -> None:
        if exc is not None:  # (the local backend's receive: said with the step's name)
            self.watch.timed_out(exc, self.watch.rank)
        self.watch.current, self.watch.started = self.saved  # as it was before the step
