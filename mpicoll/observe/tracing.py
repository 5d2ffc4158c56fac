"""Step traces of the collectives: who sent which chunk to whom, when, and for how long.

    comm = mpicoll.Communicator(trace=True)        # or MPICOLL_TRACE=trace.json
    comm.all_reduce(x, algorithm="ring")
    comm.write_trace("trace.json")                 # collective: merged on rank 0

    python -m mpicoll.trace summary trace.json     # per call: steps, bytes, comm vs reduce
    python -m mpicoll.trace draw trace.json -o timeline.png   (mpicoll.observe.tracefile reads it)

Every point-to-point message of every collective call is recorded on every rank
(collective, algorithm, call, step, peer, bytes, chunk, start, end), and every reduction
(its time). ``step`` is the message's order among this rank's sends (or receives) in the
call; ``chunk`` is where the message lies in the buffer it is a view of, counted in p
equal chunks of that buffer (the tutorials' chunk numbers for ring and friends; None for
the transport's workspace, where ``offset`` is the message's place in it). The
merged file is Chrome's trace event format, which Perfetto (ui.perfetto.dev) and
chrome://tracing open: one process per rank, with tracks for calls, messages and
reductions. Clocks are aligned to rank 0's by a ping-pong estimate (the offset at the
smallest round trip of several). Calls made with ``async_op=True`` run on the
communicator's untraced duplicate and are not in the trace. When tracing is off nothing is wrapped: the transport
and ops are the untraced ones, so the cost is one ``is None`` test per call.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..buffers import chunk_bounds

_CALL, _MESSAGES, _REDUCE = 0, 1, 2  # the Chrome trace's thread ids: one track each


def _base(buf: Any) -> Any:
    """The array ``buf`` is a view of (itself where it is none's)."""
    base = buf
    while isinstance(base, np.ndarray) and isinstance(base.base, np.ndarray):
        base = base.base
    return base


class _Controlling:
    """``controlling``'s context where a tracer records."""

    __slots__ = ("tracer",)

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def __enter__(self) -> None:
        self.tracer.control += 1

    def __exit__(self, *exc: object) -> None:
        self.tracer.control -= 1


_UNTRACED = contextlib.nullcontext()  # (reusable: no generator made per exchange)


def controlling(tracer: Tracer | None) -> contextlib.AbstractContextManager:
    """The messages sent meanwhile are mpicoll's agreements (role "control"), not the
    algorithm's; nothing where ``tracer`` is None (tracing off: a v-variant's counts
    exchange, every call, pays a nullcontext's enter and exit)."""
    return _UNTRACED if tracer is None else _Controlling(tracer)


def algorithm_messages(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sends and receives of one call that are its algorithm's: never mpicoll's
    agreements; the header packet's only where it carried the data (no other message)."""
    messages = [e for e in events if e["kind"] in ("send", "recv")
                and e.get("role", "data") != "control"]
    data = [e for e in messages if e.get("role", "data") == "data"]
    return data if data else messages


@functools.lru_cache(maxsize=256)
def _bounds(nbytes: int, parts: int) -> tuple[int, ...]:
    return chunk_bounds(nbytes, parts)


def _chunk(buf: Any, parts: int, workspace: tuple = ()) -> tuple[int | None, int]:
    """(chunk index, byte offset) of ``buf`` in the array it is a view of; in the
    transport's ``workspace`` (its arenas), no chunk of the caller's buffers: (None, its
    offset there)."""
    if type(buf) is not np.ndarray:
        return None, 0
    base = _base(buf)
    offset = buf.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    if any(base is arena for arena in workspace):
        return None, offset
    if base.nbytes == 0 or parts < 1:
        return 0, offset
    return bisect.bisect_right(_bounds(base.nbytes, parts), offset) - 1, offset


# the records a rank keeps (calls, messages, reductions; some 270 bytes each, and 440 more
# as events when merged): a long job's trace stays bounded. The calls that begin
# once a rank holds this many are counted, not traced (whole calls: each is traced
# entirely or not at all); the merged file says how many on each rank
MAX_RECORDS = 200_000

_FIELDS = ("kind", "collective", "algorithm", "call", "start", "end", "track")
# role: "data" (the algorithm's own message), "header" (the Communicator's header
# packet: a broadcast's or scatter's shape and dtype, and the data too where it fits),
# "control" (mpicoll's agreements: a v-variant's counts, a compressed call's wire, check
# mode's comparison); trace summary and viz count the algorithm's steps without them
_MESSAGE_FIELDS = (*_FIELDS, "peer", "bytes", "step", "chunk", "offset", "role")


class Tracer:
    """One rank's record: the calls, messages and reductions, in this rank's clock.

    Records are kept as plain lists while the program runs (cheap to make) and turned
    into dicts when ``events`` is read."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size
        self._records: list[list[Any]] = []
        self._events: list[dict[str, Any]] = []
        self.calls = 0
        self.collective = self.algorithm = ""
        self.nbytes = 0
        self._sent = self._received = 0
        self._start = 0.0
        self._timed_ops: dict[Any, Any] = {}
        # this call's (message, its buffer) and (reduction, its operands and result)
        self._unplaced: list[tuple[list[Any], Any]] = []
        self.transport: Any = None  # the traced transport (its workspace is no chunk)
        self.full = False  # this call is not traced: MAX_RECORDS were kept before it
        self.untraced = 0  # the calls not traced so
        self._scratch: list[Any] = [None] * 13  # what an untraced message's record is
        self.control = 0  # > 0: the messages now are mpicoll's agreements (see role)
        self.header: Any = None  # the Communicator's header packet (its messages' role)

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every record so far as a dict (with ``rank``)."""
        for record in self._records[len(self._events):]:
            kind = record[0]
            names = _MESSAGE_FIELDS if kind in ("send", "recv") else _FIELDS
            event = dict(zip(names, record, strict=False))
            event["rank"] = self.rank
            if kind == "call":
                event["nbytes"] = record[7]
            elif kind == "reduce":  # its result's place, and its operands' (chunk, offset)
                event["bytes"], event["chunk"], event["offset"] = record[7], record[8], record[9]
                event["sources"] = record[10]
            self._events.append(event)
        return self._events

    def begin_call(self, collective: str) -> None:
        self.calls += 1
        self.full = len(self._records) >= MAX_RECORDS
        if self.full:
            self.untraced += 1
        self.collective, self.algorithm, self.nbytes = collective, "", 0
        self._sent = self._received = 0
        self._start = time.perf_counter()

    def chose(self, algorithm: str, nbytes: int) -> None:
        self.algorithm, self.nbytes = algorithm, nbytes

    def end_call(self) -> None:
        if self.full:
            self._unplaced.clear()
            return
        self._records.append(["call", self.collective, self.algorithm, self.calls,
                              self._start, time.perf_counter(), _CALL, self.nbytes])
        arenas = getattr(self.transport, "arenas", None)
        workspace = arenas() if arenas is not None else ()
        for record, buf in self._unplaced:  # after the call: not inside the times recorded
            if record[0] == "reduce":  # (buf: its operands and result)
                a, b, out = buf
                record[8], record[9] = _chunk(out, self.size, workspace)
                record[10] = [_chunk(a, self.size, workspace), _chunk(b, self.size, workspace)]
            elif self.header is not None and _base(buf) is self.header:
                record[10], record[11], record[12] = None, _chunk(buf, 0)[1], "header"
            else:
                record[10], record[11] = _chunk(buf, self.size, workspace)
        self._unplaced.clear()

    def message(self, kind: str, buf: Any, peer: int, start: float, end: float) -> list:
        if self.full:
            return self._scratch
        if kind == "send":
            step, self._sent = self._sent, self._sent + 1
        else:
            step, self._received = self._received, self._received + 1
        record = [kind, self.collective, self.algorithm, self.calls, start, end, _MESSAGES,
                  peer, int(buf.nbytes), step, None, 0,  # chunk, offset: at end_call
                  "control" if self.control else "data"]
        self._records.append(record)
        self._unplaced.append((record, buf))
        return record

    def reduction(self, nbytes: int, start: float, end: float, operands: tuple = ()) -> None:
        """A reduction of ``operands`` (a, b, out) took start..end (placed at end_call)."""
        if self.full:
            return
        record = ["reduce", self.collective, self.algorithm, self.calls, start, end, _REDUCE,
                  nbytes, None, 0, []]  # out's chunk and offset, a's and b's: at end_call
        self._records.append(record)
        if operands:
            self._unplaced.append((record, operands))


class _Posted:
    """A nonblocking message: the transport's request, and the event it ends."""

    __slots__ = ("request", "record")

    def __init__(self, request: Any, record: list) -> None:
        self.request, self.record = request, record


class TracingTransport:
    """A transport that records every message of the one it wraps."""

    def __init__(self, inner: Any, tracer: Tracer) -> None:
        self._inner, self._tracer = inner, tracer
        tracer.transport = inner

    def __getattr__(self, name: str) -> Any:  # rank, size, begin, scratch, comm ...
        return getattr(self._inner, name)

    @property
    def tag(self) -> int:
        return self._inner.tag

    @tag.setter
    def tag(self, value: int) -> None:  # the pipeline's resync sets the inner one's
        self._inner.tag = value

    def send(self, buf: Any, dest: int) -> None:
        start = time.perf_counter()
        self._inner.send(buf, dest)
        self._tracer.message("send", buf, dest, start, time.perf_counter())

    def recv(self, buf: Any, source: int) -> None:
        start = time.perf_counter()
        self._inner.recv(buf, source)
        self._tracer.message("recv", buf, source, start, time.perf_counter())

    def sendrecv(self, sendbuf: Any, dest: int, recvbuf: Any, source: int) -> None:
        start = time.perf_counter()
        self._inner.sendrecv(sendbuf, dest, recvbuf, source)
        end = time.perf_counter()
        self._tracer.message("send", sendbuf, dest, start, end)
        self._tracer.message("recv", recvbuf, source, start, end)

    def isend(self, buf: Any, dest: int) -> _Posted:
        start = time.perf_counter()
        return _Posted(self._inner.isend(buf, dest),
                       self._tracer.message("send", buf, dest, start, start))

    def irecv(self, buf: Any, source: int) -> _Posted:
        start = time.perf_counter()
        return _Posted(self._inner.irecv(buf, source),
                       self._tracer.message("recv", buf, source, start, start))

    def waitall(self, requests: Sequence[Any]) -> None:
        self._inner.waitall([r.request if isinstance(r, _Posted) else r for r in requests])
        end = time.perf_counter()
        for r in requests:
            if isinstance(r, _Posted):
                r.record[5] = end  # a nonblocking message ends when its wait returns


_TRACED: dict[str, int] = {}  # communicators traced to each trace file so far


def attach(backend: Any, rank: int, size: int) -> Tracer:
    """Record every message of ``backend`` from now on: its transport (and the control
    messages that share it) wrapped in a TracingTransport."""
    tracer = Tracer(rank, size)
    backend.transport = backend.control = TracingTransport(backend.transport, tracer)
    return tracer


def trace_path(path: str, writer: int = 0, peek: bool = False) -> str:
    """The file for the next communicator of this process traced to ``path``: path,
    path.2.json, ... (numbered per path: communicators given files of their own keep
    their names); where the communicator's rank 0 (which writes it) is not the job's
    rank 0 but MPI_COMM_WORLD rank ``writer`` (a split's, a group's), path.rank<writer>.json,
    path.2.rank<writer>.json, ...: a name no other process's communicator takes (each
    process numbers its own). ``peek``: the one it would be, without taking it."""
    number = _TRACED.get(path, 0) + 1
    if not peek:
        _TRACED[path] = number
    if number == 1 and not writer:
        return path
    root, ext = os.path.splitext(path)
    parts = ([str(number)] if number > 1 else []) + ([f"rank{writer}"] if writer else [])
    return f"{root}.{'.'.join(parts)}{ext or '.json'}"


TIMED_OPS = 64  # ops a tracer keeps timed: the most recent (a user's Op made per call
# is new each call: kept all, they grew with the calls, every one alive with the tracer)


def timed_op(op: Any, tracer: Tracer) -> Any:
    """``op`` with every application recorded as a reduction (made once per op, the
    ``TIMED_OPS`` most recent kept)."""
    timed = tracer._timed_ops.get(op)
    if timed is None:
        import dataclasses

        if len(tracer._timed_ops) >= TIMED_OPS:  # (the oldest first: dicts keep order)
            del tracer._timed_ops[next(iter(tracer._timed_ops))]

        def fn(a: Any, b: Any, out: Any) -> None:
            start = time.perf_counter()
            op(a, b, out)
            tracer.reduction(int(out.nbytes), start, time.perf_counter(), (a, b, out))

        timed = tracer._timed_ops[op] = dataclasses.replace(op, fn=fn)
    return timed


# ---- merging and writing ------------------------------------------------------------------


def clock_offset(comm: Any, tag: int, rounds: int = 8) -> float:
    """Seconds to add to this rank's perf_counter to read rank 0's (0 on rank 0): for
    each rank in turn, ping-pongs with rank 0; the round with the smallest round trip
    gives offset = t0 - (t_send + t_recv) / 2. ``tag``: one no call's message has (the
    transport's tag after a ``begin()`` of its own; pings and pongs go opposite ways)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    offset = 0.0
    buf = np.zeros(1, np.float64)
    for peer in range(1, size):
        if rank == 0:
            for _ in range(rounds):
                comm.Recv(buf, peer, tag)
                buf[0] = time.perf_counter()
                comm.Send(buf, peer, tag)
        elif rank == peer:
            best = np.inf
            for _ in range(rounds):
                sent = time.perf_counter()
                comm.Send(buf, 0, tag)
                comm.Recv(buf, 0, tag)
                back = time.perf_counter()
                if back - sent < best:
                    best, offset = back - sent, buf[0] - (sent + back) / 2
    return offset


def chrome_trace(events: list[dict[str, Any]], size: int, about: dict | None = None) -> dict:
    """Chrome trace event JSON of the merged events (times already in one clock)."""
    origin = min((e["start"] for e in events), default=0.0)
    trace = []
    for rank in range(size):
        trace.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                      "args": {"name": f"rank {rank}"}})
        for tid, name in ((_CALL, "calls"), (_MESSAGES, "messages"), (_REDUCE, "reductions")):
            trace.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                          "args": {"name": name}})
    for e in events:
        if e["kind"] == "call":
            name = f"{e['collective']} {e['algorithm']}"
        elif e["kind"] == "reduce":
            name = "reduce"
        else:
            arrow = "->" if e["kind"] == "send" else "<-"
            name = f"{e['kind']} {arrow} {e['peer']}" + ("" if e["chunk"] is None else f" chunk {e['chunk']}")
            if e.get("role", "data") != "data":  # (the header packet, an agreement)
                name += f" ({e['role']})"
        args = {k: v for k, v in e.items() if k not in ("start", "end", "track", "rank")}
        trace.append({"name": name, "cat": e["collective"], "ph": "X", "pid": e["rank"],
                      "tid": e["track"], "ts": (e["start"] - origin) * 1e6,
                      "dur": max(e["end"] - e["start"], 0.0) * 1e6, "args": args})
    return {"traceEvents": trace, "displayTimeUnit": "ns",
            "otherData": {"producer": "mpicoll", "ranks": size, **(about or {})}}


def gather_events(tracer: Tracer, comm: Any, tag: int,
                  ) -> tuple[list[dict[str, Any]], dict[int, int]] | None:
    """Every rank's events in rank 0's clock, and the calls each rank made past
    ``MAX_RECORDS`` (not traced; ranks with none left out), on rank 0 (None elsewhere).
    Collective over the mpi4py communicator ``comm`` (``tag``: see ``clock_offset``);
    metadata only, so mpi4py's pickle is fine here."""
    offset = clock_offset(comm, tag)
    mine = [{**e, "start": e["start"] + offset, "end": e["end"] + offset} for e in tracer.events]
    everything = comm.gather((mine, tracer.untraced), 0)
    if everything is None:
        return None
    return [e for events, _ in everything for e in events], \
        {rank: n for rank, (_, n) in enumerate(everything) if n}


def write_merged(tracer: Tracer, transport: Any, path: str) -> str | None:
    """Collective over an MPI transport: every rank's events merged on rank 0 in its
    clock and written there as Chrome trace JSON; rank 0's failure to write, as text on
    every rank (None: written). The clocks' ping-pongs take a tag of their own
    (``begin``), so no call's message, earlier or later, can match them."""
    import json

    transport.begin()
    gathered = gather_events(tracer, transport.comm, transport.tag)
    failure = None
    if gathered is not None:
        events, untraced = gathered
        about = None if not untraced else {"untraced_calls": {
            str(rank): n for rank, n in untraced.items()}, "max_records": MAX_RECORDS}
        try:
            with open(path, "w") as f:
                json.dump(chrome_trace(events, tracer.size, about), f)
        except OSError as exc:
            failure = f"write_trace: rank 0 cannot write the trace to {path}: {exc}"
        if untraced and failure is None:
            from .watchdog import report

            report(f"mpicoll: {path}: the trace holds each rank's first {MAX_RECORDS} records "
                   f"(mpicoll.observe.tracing.MAX_RECORDS); the calls after were not traced: "
                   + ", ".join(f"rank {r}: {n}" for r, n in sorted(untraced.items())))
    return transport.comm.bcast(failure, 0)


_HOOKED: list[bool] = []  # merge_at_exit registered
_UNMERGED: list[TraceFile] = []  # trace files to merge at exit (never freed so far)
_UNMERGED_LOCK = threading.Lock()


def merge_at_exit() -> None:
    """At exit (one atexit hook): every trace file not merged yet, in its Communicator's
    agreed exit order (``_exit_key``): each merge is a collective, so every rank that
    shares two Communicators merges them in one order (atexit's own order, the reverse
    of each rank's making them, may differ where threads made them at once)."""
    with _UNMERGED_LOCK:
        files = sorted(_UNMERGED, key=lambda f: f.key)
    for file in files:
        file.at_exit()


class TraceFile:
    """A Communicator's trace file (``MPICOLL_TRACE`` or ``trace=path``): merged into
    once, by ``write()`` at ``free()``, or at exit if it was never freed; never after."""

    def __init__(self, path: str, merge: Any, writer: int = 0,
                 before_exit: Any = None, key: tuple = ()) -> None:
        self.path: str | None = trace_path(path, writer)  # path, path.2.json, ...
        self.merge = merge  # the Communicator's: merge(path, error class), watched
        # at exit, what must end before the merge (the Communicator's: every progress
        # thread's calls, whose thread holds its communicator: the merge, a collective,
        # would be refused on this rank while the others wait in it)
        self.before_exit = before_exit
        self.key = key  # its place at exit (the Communicator's agreed _exit_key)
        with _UNMERGED_LOCK:
            if not _HOOKED:
                import atexit

                atexit.register(merge_at_exit)
                _HOOKED.append(True)
            _UNMERGED.append(self)

    def write(self) -> None:
        path, self.path = self.path, None
        if path is None:
            return
        with _UNMERGED_LOCK:
            if self in _UNMERGED:
                _UNMERGED.remove(self)
        from mpi4py import MPI

        if MPI.Is_finalized():
            from .watchdog import report

            report(f"mpicoll: the trace for {path} is lost: MPI was finalized first "
                   "(free() the Communicator before MPI.Finalize())")
            return
        from ..errors import ConfigError

        self.merge(path, ConfigError)

    def at_exit(self) -> None:
        path = self.path
        try:
            if path is not None and self.before_exit is not None:
                self.before_exit()
            self.write()
        except Exception as exc:  # noqa: BLE001 - at exit: one line, never a traceback
            from .watchdog import report  # (rank 0 could not write it: every rank knows)

            report(f"mpicoll: the trace for {path} is lost at exit: {exc}")
