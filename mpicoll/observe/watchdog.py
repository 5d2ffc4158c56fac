"""The watchdog: the thread that ends an overdue call, with its report, dump and abort.

Never hang silently: every call has a timeout. Each Communicator's ``Watch`` (the call
in progress and the flight recorder of its last calls, ``mpicoll.observe.recorder``) is
registered here, and one watchdog thread per process sleeps and looks at the watches.
When a call has run longer than its Communicator's timeout (``Communicator(timeout=)``,
``MPICOLL_TIMEOUT``, default 1800 s, 0: off), the rank prints one report to stderr,
beginning ``mpicoll: timeout``: its rank, the call's number, collective, algorithm,
bytes, step and what it waits for, then its flight recorder. With ``MPICOLL_DUMP_DIR=D``
it also writes the recorder to ``D/rank-<r>.json`` (read them with ``python -m
mpicoll.trace hang D``), and the other ranks, seeing its mark there, write theirs. Then
it aborts the job: ``ncclCommAbort`` on NCCL, then ``MPI_Abort`` with exit code
``EXIT_TIMEOUT``.

On the local backend (ranks are threads of one process) nothing is aborted: the waiting
receive raises ``CollectiveTimeoutError`` in the waiting thread instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

from ..config import unwritable
from ..errors import CollectiveError, ConfigError, MpicollError
from ..pipeline.describe import Call
from .recorder import Watch, unsaid_receive_timeout

DEFAULT_TIMEOUT = 1800.0  # seconds: torch's default for NCCL
EXIT_TIMEOUT = 75  # MPI_Abort's code when a call exceeded the timeout
EXIT_UNCAUGHT = 70  # MPI_Abort's code after an uncaught exception (abort_on_exception)
MARK = "TIMEOUT"  # the file in MPICOLL_DUMP_DIR that tells every rank to write its dump


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
        self.exit_hook = False  # whether _exiting is registered with atexit

    def register(self, watch: Watch, numbered: bool = True) -> None:
        """Watch ``watch``; ``numbered``: it is a Communicator's, which takes the next
        index (a Communicator being made is watched under the index it will have)."""
        if not self.exit_hook and dump_dir():
            import atexit

            self.exit_hook = True  # (once: a Communicator refused leaves registered at 0)
            atexit.register(self._exiting)
        with self.lock:
            watch.index = self.registered
            self.registered += numbered
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
        # (a folder the Communicator refused, by this same check: its ConfigError said so;
        # one not made yet is made by write_dump; none where the program unset it since)
        if self.fired or not dump_dir() or unwritable(dump_dir(), directory=True):
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
        """Report the overdue call of ``watch`` and end the job. Whatever the report's
        parts raise (an entry's values a caller gave), the job ends: a part that fails
        is said in one line in its place, never the watchdog thread's end."""
        self.fired = True
        rank = world_rank(watch.rank)
        lines = [f"mpicoll: timeout: rank {rank} (rank {watch.rank} of {watch.size} on "
                 f"communicator {watch.index}, {watch.backend.name}, pid {os.getpid()} on "
                 f"{socket.gethostname()}): "
                 f"{_said(lambda: watch.describe_current(now), 'the overdue call')}"]
        path = None
        try:
            lines += recorder_lines(self)
            if dump_dir():
                path = write_dump(self, "timeout", watch)
                mark(rank)
                lines.append(f"mpicoll: flight recorder written to {path}; read every rank's "
                             f"with: python -m mpicoll.trace hang {dump_dir()}")
        except Exception as exc:  # noqa: BLE001 - the job ends all the same
            lines.append(f"mpicoll: (the flight recorder could not be written: "
                         f"{type(exc).__name__}: {exc})")
        finally:
            lines.append(f"mpicoll: aborting the job (exit code {EXIT_TIMEOUT})")
            with contextlib.suppress(Exception):
                report("\n".join(lines))
            # a moment for the other ranks to report and dump too, then end the job
            abort_job(EXIT_TIMEOUT, grace=1.5 if path else 0.3)


_WATCHDOG = Watchdog()


def _said(part: Callable[[], str], what: str) -> str:
    """``part()``, or a line saying it could not be said (a report is never lost to it)."""
    try:
        return part()
    except Exception as exc:  # noqa: BLE001 - named in its place
        return f"({what} could not be described: {type(exc).__name__}: {exc})"


@contextlib.contextmanager
def making(rank: int, size: int, backend: str, timeout: float, site: Any) -> Iterator[None]:
    """Making a Communicator (rank ``rank`` of ``size`` on ``backend``, made at ``site``)
    before it has a watch of its own: its collective steps there (MPI_Comm_dup of the
    communicator its messages go on, the exchange that finds each rank's node) watched as
    one step, so that a rank that never makes it ends the job with a report naming the
    rank and the step, as any call does, not a silent wait. ``timeout``: this rank's
    (0: unwatched)."""
    try:
        if not timeout:
            yield
            return
        stand_in = SimpleNamespace(  # what the watchdog reads of a Communicator: no transport
            rank=rank, size=size, _backend=SimpleNamespace(name=backend, transport=None,
                                                           control=None))
        watch = Watch(stand_in, timeout, True, 1)
        dog = watchdog()
        dog.register(watch, numbered=False)
        call = Call(0, "making a Communicator")
        call.at(site)
        try:
            with watch.aside(call, f"waiting for every one of the {size} ranks to make the "
                             "Communicator (collective: its communicator's MPI_Comm_dup and "
                             "the exchange of nodes)"):
                yield
        finally:
            dog.unregister(watch)
    except MpicollError:
        raise
    except Exception as exc:  # noqa: BLE001 - MPI's own failure, named (never a raw error)
        mpi = type(exc).__module__.startswith("mpi4py")  # (MPI's, not another failure's)
        raise CollectiveError(
            f"making a Communicator failed on rank {rank}: {type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:300]}" + (
                " (where MPI ran out of communicators: free() the Communicators no longer "
                "used, dup()s and splits too)" if mpi else "")) from exc


def made_late(exc: BaseException, rank: int, size: int) -> None:
    """A constructor raised ``exc``: a receive that timed out (the local backend's: a rank
    never came) is named as ``making`` names it over MPI."""
    if unsaid_receive_timeout(exc):
        exc.args = (f"mpicoll: timeout: rank {rank}: making a Communicator: waiting for every "
                    f"one of the {size} ranks to make it ({exc.args[0]})", *exc.args[1:])
        exc._call_said = True  # type: ignore[attr-defined]


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


def dump_and_abort(lines: list[str], reason: str, rank: int, code: int,
                   grace: float) -> None:
    """End the job for a failure of this rank's own (not a timeout's, which ``fire``
    ends): with ``MPICOLL_DUMP_DIR``, this rank's dump (``reason``) and the mark that
    makes the others' watchdogs write theirs; ``lines`` reported (and where the dump
    went); then ``abort_job`` after ``grace`` seconds, with dumps 1.5 s, long enough for
    the others' watchdogs, which look for the mark once a second at most (as a
    timeout's abort waits)."""
    if dump_dir():
        path = write_dump(_WATCHDOG, reason)
        mark(rank)
        lines = [*lines, f"mpicoll: flight recorder written to {path}"]
    report("\n".join(lines))
    abort_job(code, grace=1.5 if dump_dir() else grace)


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
        born = [t.born_tag for t in w.transports() if hasattr(t, "born_tag")]
        entry: dict[str, Any] = {
            "index": w.index, "rank": w.rank, "size": w.size, "members": w.members,
            "born_tag": born[-1] if born else None,  # (the control transport's: agreed)
            "backend": w.backend.name,
            "timeout": w.timeout, "calls": w.records(PARAMETERS, clock)}
        if w.started:
            current = w.current
            # a step that is not a numbered call (point-to-point, making a Communicator,
            # a plan's vote): its own name and note; the transports' slots are a call's
            # (a numbered call's own step with a note, its agreement: the call itself)
            aside = bool(current.note) and w.is_aside(current)
            kind, peer = (None, -1) if aside else w.peer()
            entry["in_call"] = {"seq": current.call.seq, "running_s": round(now - w.started, 3),
                                "step": -1 if aside else w.step(), "waiting": w.waiting(),
                                "kind": kind, "peer": peer, "aside": aside,
                                "collective": current.call.collective,
                                # (None: a step no line of the program made, at exit)
                                "site": None if current.call.code is None
                                else str(current.call.site)}
        communicators.append(entry)
    return {"rank": rank, "pid": os.getpid(), "host": socket.gethostname(),
            "reason": reason, "time": round(time.time(), 6),
            "overdue": None if overdue is None else overdue.index,
            "communicators": communicators}


def write_dump(dog: Watchdog, reason: str, overdue: Watch | None = None) -> str | None:
    """Write this rank's snapshot to ``MPICOLL_DUMP_DIR/rank-<r>.json``; its path."""
    path = os.path.join(dump_dir(), f"rank-{world_rank(0)}.json")
    # each writer its own temporary file (the watchdog, an uncaught error's hook and the
    # exit may write at once), the whole file replacing the last one written
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        data = snapshot(dog, reason, overdue)
        path = os.path.join(dump_dir(), f"rank-{data['rank']}.json")
        os.makedirs(dump_dir(), exist_ok=True)
        with open(temporary, "w") as f:
            json.dump(data, f, indent=1, default=str)
        os.replace(temporary, path)
    except Exception as exc:  # noqa: BLE001 - said; the caller goes on (ends the job)
        report(f"mpicoll: cannot write the flight recorder to {path}: "
               f"{type(exc).__name__}: {exc}")
        with contextlib.suppress(OSError):
            os.remove(temporary)
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
