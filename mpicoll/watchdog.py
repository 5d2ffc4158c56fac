"""Never hang silently: a timeout on every call, a watchdog thread, a flight recorder.

Each Communicator has a ``Watch``: the call it is in (a start time, or 0 when idle) and
a flight recorder, a ring of the last N calls (``MPICOLL_FLIGHT_RECORDER``, default 64)
whose entries are made once and rewritten in place. The hot path only writes into them:
the call's entry on the way in, its end and state on the way out; the transports write
the peer, the kind of wait and the step number before each blocking call, and the
Chooser writes the algorithm and the bytes.

One watchdog thread per process sleeps and looks at the watches. When a call has run
longer than its Communicator's timeout (``Communicator(timeout=)``, ``MPICOLL_TIMEOUT``,
default 1800 s, 0: off), the rank prints one report to stderr, beginning
``mpicoll: timeout``: its rank, the call's number, collective, algorithm, bytes, step and
what it waits for, then its flight recorder. With ``MPICOLL_DUMP_DIR=D`` it also writes
the recorder to ``D/rank-<r>.json`` (read them with ``python -m mpicoll.trace hang D``),
and the other ranks, seeing its mark there, write theirs. Then it aborts the job:
``ncclCommAbort`` on NCCL, then ``MPI_Abort`` with exit code ``EXIT_TIMEOUT``.

On the local backend (ranks are threads of one process) nothing is aborted: the waiting
receive raises ``CollectiveTimeoutError`` in the waiting thread instead.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from typing import Any

import numpy as np

from .errors import ConfigError

DEFAULT_TIMEOUT = 1800.0  # seconds: torch's default for NCCL
DEFAULT_RECORDER = 64  # calls kept per Communicator
EXIT_TIMEOUT = 75  # MPI_Abort's code when a call exceeded the timeout
EXIT_UNCAUGHT = 70  # MPI_Abort's code after an uncaught exception (abort_on_exception)
MARK = "TIMEOUT"  # the file in MPICOLL_DUMP_DIR that tells every rank to write its dump

RUNNING, DONE = "running", "done"
_now = time.monotonic


def timeout_setting(value: float | None) -> float:
    """``timeout=`` (None: ``MPICOLL_TIMEOUT``, else 1800 s) in seconds; 0 turns it off."""
    if value is None:
        text = os.environ.get("MPICOLL_TIMEOUT", "").strip()
        if not text:
            return DEFAULT_TIMEOUT
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value >= 0:  # NaN too
            raise ConfigError(f"MPICOLL_TIMEOUT: expected seconds >= 0 (0: off), got {text!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ConfigError(f"timeout: expected seconds >= 0 (0: off), got {value!r}")
    return float(value)


def recorder_length() -> int:
    """How many calls the flight recorder keeps (``MPICOLL_FLIGHT_RECORDER``, default 64)."""
    text = os.environ.get("MPICOLL_FLIGHT_RECORDER", "").strip()
    if not text:
        return DEFAULT_RECORDER
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"MPICOLL_FLIGHT_RECORDER: expected a number of calls >= 1, got {text!r}")
    return int(text)


class Call:
    """One collective call on this rank: what the fingerprint, the reports and the
    flight recorder name it by.

    Its site is kept as the caller's code object and instruction offset, and turned into
    file:line only when something reads it: a frame's ``f_lineno`` scans the code's line
    table, which costs a microsecond in a long function, on every call.
    """

    __slots__ = ("seq", "collective", "code", "offset")

    def __init__(self, seq: int = 0, collective: str = "", depth: int | None = None) -> None:
        self.seq, self.collective = seq, collective
        self.code, self.offset = None, -1
        if depth is not None:
            self.at(sys._getframe(depth))

    def at(self, frame: Any) -> None:
        """The call is made in ``frame``, at its current instruction."""
        self.code, self.offset = frame.f_code, frame.f_lasti

    @property
    def file(self) -> str:
        return "?" if self.code is None else self.code.co_filename

    @property
    def line(self) -> int:
        if self.code is not None:
            for start, end, line in self.code.co_lines():
                if start <= self.offset < end:
                    return line or 0
        return 0

    @property
    def site(self) -> str:
        """The caller's file:line."""
        return f"{self.file}:{self.line}"

    def name(self) -> str:
        return f"{self.collective} (call #{self.seq})"


class Record:
    """One call in the flight recorder (made once, rewritten for every N-th call)."""

    __slots__ = ("call", "shape", "dtype", "args", "op", "root", "algorithm", "nbytes",
                 "start", "end", "state", "note")

    def __init__(self) -> None:
        self.call: Any = Call()  # the pipeline's Call: seq, collective, file, line
        self.shape = self.dtype = self.op = self.root = self.algorithm = None
        self.args: tuple = ()
        self.nbytes = -1
        self.start = self.end = 0.0
        self.state = DONE
        self.note = ""  # what a step that is not a numbered call waits for

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
            "shape": None if self.shape is None else list(self.shape),
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
                 "current", "index")

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
        if args:
            x = args[0]
            rec.args = args[1:]  # op, root, counts: small values, never the data
            if rec.args and hasattr(rec.args[0], "fn"):  # a user's Op: kept by name only,
                rec.args = (rec.args[0].name, *rec.args[1:])  # so it can die with its MPI op
        else:
            x = kwargs.get("x")
            rec.args = ()
        if type(x) is np.ndarray:
            rec.shape = x.shape
            rec.dtype = x.dtype
        else:
            rec.shape = getattr(x, "shape", None)
            rec.dtype = getattr(x, "dtype", None)
        if kwargs:
            rec.op = kwargs.get("op")
            if hasattr(rec.op, "fn"):
                rec.op = rec.op.name
            rec.root = kwargs.get("root")
        else:
            rec.op = rec.root = None
        rec.algorithm = None
        rec.nbytes = -1
        rec.state = RUNNING
        self.started = rec.start = _now()
        return call

    def enter_kept(self, seq: int, collective: str, frame: Any, kept: tuple) -> Any:
        """``enter`` for a call that runs a kept decision (``mpicoll.pipeline.decided``):
        ``kept`` is the entry's (shape, dtype, args, op, root, algorithm, nbytes) as the
        call that made the decision recorded them (a kept call has the same values)."""
        rec = self.ring[seq % self.length]
        self.current = rec
        call = rec.call
        call.seq, call.collective, call.code, call.offset = \
            seq, collective, frame.f_code, frame.f_lasti
        rec.shape, rec.dtype, rec.args, rec.op, rec.root, rec.algorithm, rec.nbytes = kept
        rec.state = RUNNING
        self.started = rec.start = _now()
        return call

    def kept(self) -> tuple:
        """What ``enter_kept`` writes, as the current entry holds it."""
        rec = self.current
        return rec.shape, rec.dtype, rec.args, rec.op, rec.root, rec.algorithm, rec.nbytes

    def rewrite(self, kept: tuple) -> None:
        """Write ``kept`` (see ``kept``) into the current entry."""
        rec = self.current
        rec.shape, rec.dtype, rec.args, rec.op, rec.root, rec.algorithm, rec.nbytes = kept

    def leave(self) -> None:
        """The call ended (its state is done unless ``failed`` said otherwise)."""
        rec = self.current
        rec.end = _now()
        if rec.state is RUNNING:
            rec.state = DONE
        self.started = 0.0

    def aside(self, call: Any, note: str = "") -> Any:
        """Watch a step that is not a numbered call (making a duplicate, a point-to-point
        message) under ``call``'s name, outside the flight recorder: ``with
        watch.aside(call): ...``; ``note``: what it waits for (default: every rank)."""
        return _Aside(self, call, note)

    def failed(self, exc: BaseException, refused: bool = False) -> None:
        text = " ".join(str(exc).split())  # one line: MPI's error stacks span several
        self.current.state = (f"{'refused' if refused else 'failed'}: "
                              f"{type(exc).__name__}: {text}")[:200]

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
            peer, tag = getattr(t, "wait_peer", -1), getattr(t, "tag", "?")
            if kind == "recv":
                return f"waiting to receive from rank {peer} (tag {tag})"
            if kind == "send":
                return f"waiting to send to rank {peer} (tag {tag})"
            if kind == "sendrecv":
                return (f"waiting to receive from rank {peer} and send to rank "
                        f"{getattr(t, 'wait_dest', -1)} (tag {tag})")
            return (f"waiting for {getattr(t, 'wait_count', '?')} posted messages "
                    f"(tag {tag}; last posted: rank {peer})")
        if rec.algorithm == "native":
            return f"waiting inside the {self.backend.name.upper()} library's own {rec.call.collective}"
        return "not waiting for a message (computing, or in the library's own collective)"

    def peer(self) -> tuple[str | None, int]:
        """(kind of the last blocking call, the rank it waits for), or (None, -1)."""
        for t in self.transports():
            kind = getattr(t, "wait_kind", None)
            if kind is not None:
                return kind, getattr(t, "wait_peer", -1)
        return None, -1

    def step(self) -> int:
        return max((getattr(t, "step", 0) for t in self.transports()), default=0)

    def describe_current(self, now: float) -> str:
        rec, call = self.current, self.current.call
        what = f"call #{call.seq} {call.collective}"
        if rec.note:
            return (f"{call.collective} after call #{call.seq} ({call.site}) has run "
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

    def __exit__(self, *exc: Any) -> None:
        self.watch.current, self.watch.started = self.saved  # as it was before the step


# positional parameters after x, by collective: what a record's args are
PARAMETERS: dict[str, tuple[str, ...]] = {}


class Watchdog:
    """The process's watchdog thread: it sleeps, wakes a few times per timeout, and
    ends the job when a watched call is overdue."""

    def __init__(self) -> None:
        self.watches: list[Watch] = []
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.fired = False
        self.dumped = False
        self.born = time.time()
        self.registered = 0

    def register(self, watch: Watch) -> None:
        if not self.registered and dump_dir():
            import atexit

            atexit.register(self._exiting)
        with self.lock:
            watch.index = self.registered
            self.registered += 1
            self.watches.append(watch)
            if self.thread is None and watch.timeout and watch.aborts:
                self.thread = threading.Thread(target=self._run, name="mpicoll-watchdog",
                                               daemon=True)
                self.thread.start()

    def unregister(self, watch: Watch) -> None:
        with self.lock:
            if watch in self.watches:
                self.watches.remove(watch)

    def _exiting(self) -> None:
        """At exit with ``MPICOLL_DUMP_DIR``: leave this rank's recorder for ``trace hang``
        (a rank that left, or died of an exception, while others may still wait)."""
        if self.fired:
            return
        error = getattr(sys, "last_value", None)
        reason = "exit" if error is None else f"exit after {type(error).__name__}"
        write_dump(self, reason)

    def _interval(self, watches: list[Watch]) -> float:
        timeouts = [w.timeout for w in watches if w.timeout and w.aborts]
        return min(1.0, max(0.05, min(timeouts, default=10.0) / 10))

    def _run(self) -> None:
        while True:
            with self.lock:
                watches = list(self.watches)
            time.sleep(self._interval(watches))
            now = time.monotonic()
            for watch in watches:
                started = watch.started
                if (started and watch.aborts and watch.timeout
                        and now - started > watch.timeout):
                    self.fire(watch, now)
                    return
            if not self.dumped and dump_dir() and self._marked():
                self.dumped = True
                write_dump(self, "another rank timed out or failed")

    def _marked(self) -> bool:
        try:
            return os.path.getmtime(os.path.join(dump_dir(), MARK)) >= self.born - 1
        except OSError:
            return False

    def fire(self, watch: Watch, now: float) -> None:
        """Report the overdue call of ``watch`` and end the job."""
        self.fired = True
        rank = world_rank(watch.rank)
        lines = [f"mpicoll: timeout: rank {rank} (rank {watch.rank} of {watch.size} on "
                 f"communicator {watch.index}, {watch.backend.name}, pid {os.getpid()} on "
                 f"{socket.gethostname()}): {watch.describe_current(now)}"]
        lines += recorder_lines(self)
        path = None
        if dump_dir():
            path = write_dump(self, "timeout", watch)
            mark(rank)
            lines.append(f"mpicoll: flight recorder written to {path}; read every rank's "
                         f"with: python -m mpicoll.trace hang {dump_dir()}")
        lines.append(f"mpicoll: aborting the job (exit code {EXIT_TIMEOUT})")
        report("\n".join(lines))
        # a moment for the other ranks to report and dump too, then end the job
        abort_job(EXIT_TIMEOUT, grace=1.5 if path else 0.3)


_WATCHDOG = Watchdog()


def abort_nccl() -> None:
    """ncclCommAbort every NCCL communicator of this process, so no GPU kernel waits on:
    each backend's own (its collectives') and its peers' (``NCCLPeers``: the program's
    point-to-point messages, one per pair of ranks and tag). A failing abort stops none
    of the others."""
    dog = _WATCHDOG
    with dog.lock:
        watches = list(dog.watches)
    for watch in watches:
        nccl = getattr(watch.backend.transport, "nccl", None)
        peers = getattr(watch.backend, "peers", None)
        for abort in (getattr(nccl, "abort", None), getattr(peers, "abort", None)):
            if abort is not None:
                try:
                    abort()
                except Exception:  # noqa: BLE001, S110 - ending the job matters more
                    pass


def abort_job(code: int, grace: float = 0.0) -> None:
    """End every rank of the job with exit ``code``: NCCL's communicators first, then
    ``MPI_Abort`` on MPI_COMM_WORLD (``os._exit`` when MPI is not running)."""
    time.sleep(grace)
    abort_nccl()
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Abort(code)
    os._exit(code)


def watchdog() -> Watchdog:
    """The process's watchdog."""
    return _WATCHDOG


def report(text: str) -> None:
    """Write ``text`` to the process's own stderr in one piece (not a ``sys.stderr`` that
    a test runner or notebook replaced: the job is about to end, and what such a
    replacement holds would be lost with it)."""
    stream = sys.__stderr__ or sys.stderr
    try:
        stream.write(text + "\n")
        stream.flush()
    except (OSError, ValueError, AttributeError):
        os.write(2, (text + "\n").encode())


def world_rank(default: int) -> int:
    """This process's rank in MPI_COMM_WORLD (``default`` without MPI)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD.Get_rank()
    return default


def dump_dir() -> str:
    return os.environ.get("MPICOLL_DUMP_DIR", "")


def mark(rank: int) -> None:
    """Tell the other ranks' watchdogs to write their dumps too (this rank wrote its own)."""
    _WATCHDOG.dumped = True
    try:
        with open(os.path.join(dump_dir(), MARK), "w") as f:
            f.write(f"rank {rank}\n")
    except OSError:
        pass


def snapshot(dog: Watchdog, reason: str, overdue: Watch | None = None) -> dict[str, Any]:
    """This rank's state and flight recorders, as JSON-ready values."""
    clock = time.time() - time.monotonic()
    now = time.monotonic()
    with dog.lock:
        watches = list(dog.watches)
    rank = world_rank(watches[0].rank if watches else 0)
    communicators = []
    for w in watches:
        entry: dict[str, Any] = {
            "index": w.index, "rank": w.rank, "size": w.size, "backend": w.backend.name,
            "timeout": w.timeout, "calls": w.records(PARAMETERS, clock)}
        if w.started:
            kind, peer = w.peer()
            entry["in_call"] = {"seq": w.current.call.seq, "running_s": round(now - w.started, 3),
                                "step": w.step(), "waiting": w.waiting(), "kind": kind,
                                "peer": peer}
        communicators.append(entry)
    return {"rank": rank, "pid": os.getpid(), "host": socket.gethostname(),
            "reason": reason, "time": round(time.time(), 6),
            "overdue": None if overdue is None else overdue.index,
            "communicators": communicators}


def write_dump(dog: Watchdog, reason: str, overdue: Watch | None = None) -> str | None:
    """Write this rank's snapshot to ``MPICOLL_DUMP_DIR/rank-<r>.json``; its path."""
    data = snapshot(dog, reason, overdue)
    path = os.path.join(dump_dir(), f"rank-{data['rank']}.json")
    try:
        os.makedirs(dump_dir(), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(data, f, indent=1)
        os.replace(path + ".tmp", path)
    except OSError as exc:
        report(f"mpicoll: cannot write the flight recorder to {path}: {exc}")
        return None
    return path


def recorder_lines(dog: Watchdog) -> list[str]:
    """The flight recorders of this process, as report lines."""
    clock = time.time() - time.monotonic()
    with dog.lock:
        watches = list(dog.watches)
    lines = []
    for w in watches:
        calls = w.records(PARAMETERS, clock)
        if not calls:
            continue
        lines.append(f"mpicoll: flight recorder of communicator {w.index} "
                     f"(last {len(calls)} calls, oldest first):")
        lines += ["  " + record_line(c) for c in calls]
    return lines


def record_line(c: dict[str, Any]) -> str:
    """One flight-recorder entry on one line."""
    parts = [f"#{c['seq']}", c["collective"]]
    if c.get("algorithm") is not None:
        parts.append(f"algorithm={c['algorithm']}")
    for key in ("shape", "dtype", "op", "root"):
        if c.get(key) is not None:
            parts.append(f"{key}={c[key]}")
    if c.get("nbytes", -1) >= 0:
        parts.append(f"{c['nbytes']} B")
    parts.append(c["site"])
    if c.get("end") is not None:
        parts.append(f"{(c['end'] - c['start']) * 1e3:.3f} ms")
    parts.append(c["state"])
    return " ".join(parts)
