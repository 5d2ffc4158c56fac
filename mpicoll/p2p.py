"""Point-to-point messages of the program: ``send``/``recv``, ``isend``/``irecv``,
``sendrecv`` and ``batch_isend_irecv``, on NumPy, CuPy and ``__dlpack__`` arrays.

    comm.send(x, dest=1, tag=7)                      # returns once x may be reused
    source = comm.recv(out, source=mpicoll.ANY)      # fills out; who sent it
    status = comm.probe(source=mpicoll.ANY, tag=mpicoll.ANY)  # the next message's
    out = np.empty(status.count(np.float64))         # source, tag and bytes, not taken
    comm.recv(out, status.source, status.tag, status=status)
    request = comm.isend(x, dest=1)                  # request.wait(), request.test()
    requests = comm.batch_isend_irecv([mpicoll.P2POp("isend", x, 1),
                                       mpicoll.P2POp("irecv", y, 1)])

Messages travel as raw bytes (no pickle) on a communicator of their own, made with the
Communicator, so a program's tags never meet a collective's messages, and they are not
numbered calls: a send matches the receive of the same (source, tag) in order, as in MPI.
A receive takes a message of at most ``out``'s bytes; its ``status=`` (an ``mpicoll.Status``)
is filled with the sender, the tag and the message's bytes (``status.count(dtype)``: its
elements), as MPI's status: the rest of ``out`` is left as it was. ``out`` may be strided
(a column): the message lands in a contiguous copy of it, copied back once it is in (for
an irecv, at the ``wait()`` or ``test()`` that sees it done: never for a request dropped
unwaited, and writes to ``out`` between the irecv and that wait are overwritten), as a
strided send is sent from a contiguous copy. ``source`` and a
receive's ``tag`` may be ``mpicoll.ANY``. Every blocking step (a send, a
receive, a request's ``wait``) is watched: past the Communicator's timeout the rank
reports what it waits for (the peer and the tag) and the job ends, as for every call.
One thread at a time, as for the collectives.

On the nccl backend (``NCCLPeers``) messages move GPU arrays on NCCL communicators made
for each pair of ranks and tag at its first message (a meeting point of the two ranks),
queued on the current CuPy stream: blocking calls synchronize it, a Request's ``wait``
waits for an event recorded after the message. NCCL has no wildcard receive
(``source=ANY`` and ``tag=ANY`` are refused, as is ``probe``) and cannot tell a shorter
message: a receive must be exactly as long as its send. A rank runs its messages in the order it issues them, so messages
that two ranks exchange, or receive in another order than they were sent, go in one
``sendrecv`` or ``batch_isend_irecv`` (one NCCL group), as with torch's NCCL backend.
A backend's peers object says what it cannot do: ``any_source`` (default True) and
``device_only`` (default False); ``batch`` where it starts a batch as one operation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .buffers import overlapping, overlaps_itself, writable
from .buffers.arrays import as_array, may_share_memory, module_of, off_backend_gpu, shares_memory
from .errors import (
    CollectiveError,
    CollectiveTimeoutError,
    InvalidArgumentError,
    MpicollError,
)
from .pipeline.entry import freed, watched_step
from .transport import Status
from .work import as_seconds, program_frame

ANY = -1  # ``source=ANY``: a message from any rank


@dataclass(frozen=True)
class P2POp:
    """One message of ``batch_isend_irecv``: ``op`` is "isend" or "irecv" (or the
    Communicator's ``isend``/``irecv`` method, or torch's function of that name)."""

    op: Any
    tensor: Any
    peer: int
    tag: int = 0


class Request:
    """A message started by ``isend``/``irecv``: ``wait()`` blocks until it is done (an
    irecv's gives the source rank, an isend's None), ``test()`` tells without blocking."""

    def __init__(self, comm: Any, what: str, peer: int, tag: int, request: Any,
                 receive: bool, back: Any = None) -> None:
        self._comm, self._what, self._peer, self._tag = comm, what, peer, tag
        self._request, self._receive = request, receive
        self._back = back  # a strided out's, copied once the message is in (_incoming)

    def _landed(self) -> None:
        """The message is in: a strided ``out`` gets it (once: a copy that failed is
        tried again by the next wait or test)."""
        try:
            _land(self._back)
        except Exception as exc:  # noqa: BLE001 - named, with its cause
            raise CollectiveError(f"{self._what}: the message is in, but copying it into "
                                  f"out failed: {type(exc).__name__}: {exc}") from exc
        self._back = None

    def __repr__(self) -> str:
        return f"<mpicoll.Request {self._what} peer {self._peer} tag {self._tag}>"

    def _watched(self) -> Any:
        """A wait of this request as a watched step, at the program's line that waits."""
        return watched_step(self._comm, self._what,
                            _waiting(self._comm, self._what, self._peer, self._tag),
                            program_frame(3))

    def wait(self, status: Status | None = None, timeout: Any = None) -> int | None:
        """Wait until it is done: a receive's source (``status``, where given, filled as
        ``recv``'s), a send's None. ``timeout`` (seconds or a timedelta; None or 0: none
        of its own, the watchdog's bounds the wait): not done within it, a
        ``CollectiveTimeoutError``, the message still pending (wait again)."""
        status = _status(status)
        seconds = 0.0 if timeout is None else as_seconds(timeout)
        if self._comm._freed and not self.test():
            # its Communicator freed since it started: as MPI_Comm_free leaves pending
            # messages to complete normally, it is waited for (no new call's refusal),
            # bounded by the Communicator's timeout as any wait (and by its own)
            own = bool(seconds) and seconds <= (self._comm.timeout or math.inf)
            limit = seconds if own else self._comm.timeout or math.inf
            self._poll(limit, ", the message still pending (wait again)" if own else
                       ", its Communicator freed (comm.free()) with it pending: the peer "
                       "did not take part in time")
        elif seconds and not self.test():  # (watched too: a timeout past the
            # Communicator's, or math.inf, still ends with the watchdog's report at the
            # Communicator's)
            with self._watched():
                self._poll(seconds)
        try:
            if self._comm._freed or getattr(self._request, "finished", False) and \
                    getattr(self._request, "error", None) is None:
                got = self._request.wait()  # done (freed since, too): nothing to wait for
            else:
                with self._watched():
                    got = self._request.wait()
        except CollectiveError:  # (cut short: a strided out gets its first bytes too)
            if self._back is not None:
                self._landed()
            raise
        if self._back is not None:
            self._landed()
        return _filled(status, got) if self._receive else None

    def _poll(self, seconds: float, said: str = "") -> None:
        """``test()`` until it is done, for at most ``seconds``; past them, a
        CollectiveTimeoutError (``said`` after its words)."""
        deadline, pause = time.monotonic() + seconds, 1e-5
        while not self.test():
            if time.monotonic() > deadline:
                raise CollectiveTimeoutError(f"{self!r}: not done after {seconds:g} s{said}")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def test(self) -> bool:
        """Whether it is done, without blocking (while another thread waits on this
        request, not known yet: False; the backend's request is touched by one thread at
        a time)."""
        try:
            done = bool(self._request.test())
        except CollectiveError:  # (cut short: a strided out gets its first bytes too)
            if self._back is not None:
                self._landed()
            raise
        except MpicollError:
            raise
        except Exception as exc:  # noqa: BLE001 - named, with its cause
            raise CollectiveError(f"{self._what}: {type(exc).__name__}: {exc}") from exc
        if done and self._back is not None:
            self._landed()
        elif not done and self._comm._backend.ranks_are_threads:  # (the peer, a thread of
            time.sleep(0)  # this process, needs the GIL to go on: as Work.test's)
        return done

    is_completed = test  # torch's name


def _apart(checked: list[tuple], backs: list[Any]) -> None:
    """Refuse a batch where a receive's memory overlaps another message's (a send's
    buffer or another receive's): which bytes land there would depend on the order the
    messages end in. Sends may share memory: they only read it."""
    places = [back[0] if back is not None else buf
              for (_, buf, _, _), back in zip(checked, backs, strict=True)]
    for i, (is_send, *_rest) in enumerate(checked):
        if is_send:
            continue
        for j, other in enumerate(places):
            if j != i and shares_memory(places[i], other):
                raise InvalidArgumentError(
                    f"ops[{i}].tensor: the receive's memory overlaps ops[{j}].tensor's, whose "
                    "bytes would then depend on the order the messages end in; give each "
                    "receive memory of its own")


def _waiting(comm: Any, what: str, peer: int, tag: int) -> str:
    """What a watched message waits for, its peer said as the job's rank too where the
    Communicator is an mpicoll.dist group's."""
    names = comm._rank_names
    rank = f"rank {peer}" + (f" (the job's rank {names[peer]})"
                             if names is not None and 0 <= peer < len(names) else "")
    if what in ("recv", "irecv"):
        return (f"waiting to receive from {'any rank' if peer == ANY else rank} "
                f"(point-to-point, {'any tag' if tag == ANY else f'tag {tag}'})")
    return f"waiting to send to {rank} (point-to-point, tag {tag})"


def _peers(comm: Any) -> Any:
    """The backend's point-to-point transport (every method asks it first)."""
    if comm._freed:
        raise freed("point-to-point messages")
    peers = comm._backend.peers
    if peers is None:
        raise InvalidArgumentError(
            f"point-to-point messages: not on the {comm.backend} backend yet; use a "
            "Communicator of the mpi backend on the same ranks")
    return peers


def _source(comm: Any, peers: Any, value: Any, name: str = "source") -> int:
    """A receive's source: a rank, or ANY where the backend can receive from any rank."""
    source = _rank(comm, value, name, True)
    if source == ANY and not getattr(peers, "any_source", True):
        raise InvalidArgumentError(
            f"{name}: mpicoll.ANY (any rank) is not on the {comm.backend} backend: NCCL "
            "has no wildcard receive; name the sending rank")
    return source


def _rank(comm: Any, value: Any, name: str, any_ok: bool = False) -> int:
    if any_ok and value is None:
        return ANY
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(f"{name}: expected a rank (int), got {type(value).__name__}")
    value = int(value)
    if any_ok and value == ANY:
        return ANY
    if not 0 <= value < comm.size:
        raise InvalidArgumentError(f"{name}: {value} is out of range for {comm.size} ranks")
    return value


def _tag(peers: Any, tag: Any, any_ok: bool = False, name: str = "tag") -> int:
    """A message's tag (the argument ``name``); a receive's (``any_ok``) may be ANY where
    the backend can match any tag."""
    if any_ok and isinstance(tag, (int, np.integer)) and \
            not isinstance(tag, (bool, np.bool_)) and tag == ANY:
        if not getattr(peers, "any_source", True):
            raise InvalidArgumentError(f"{name}: mpicoll.ANY (any tag) is not on the nccl "
                                       "backend: NCCL has no wildcard receive; name the tag")
        return ANY
    if isinstance(tag, (bool, np.bool_)) or not isinstance(tag, (int, np.integer)) \
            or not 0 <= tag <= peers.max_tag:
        raise InvalidArgumentError(f"{name}: expected an int in 0..{peers.max_tag}"
                                   f"{' or mpicoll.ANY' if any_ok else ''}, got {tag!r}")
    return int(tag)


def _status(status: Any) -> Status | None:
    """A receive's ``status=``, checked before any message: None or an mpicoll.Status."""
    if status is not None and not isinstance(status, Status):
        raise InvalidArgumentError(f"status: expected an mpicoll.Status, got "
                                   f"{type(status).__name__}")
    return status


def _filled(status: Status | None, got: Status) -> int:
    """A receive's source, its ``status=`` filled where given."""
    if status is not None:
        status.fill(got)
    return got.source


def _on_device(comm: Any, peers: Any, array: Any, name: str) -> Any:
    """``array``, or a refusal of a host array where the backend moves GPU arrays only."""
    if not getattr(peers, "device_only", False):
        return array
    if type(array) is np.ndarray:
        raise InvalidArgumentError(
            f"{name}: backend '{comm.backend}' moves GPU arrays (CuPy, or a CUDA __dlpack__ "
            "tensor); got a host array: use backend 'mpi' for host memory")
    if elsewhere := off_backend_gpu(comm._backend.device):
        raise InvalidArgumentError(f"{name}: {elsewhere}")
    return array


def _outgoing(comm: Any, peers: Any, x: Any, name: str = "x") -> Any:
    """What a send sends: ``x``'s bytes as a flat contiguous array (a copy if strided)."""
    array = _on_device(comm, peers, as_array(x, name)[0], name)
    if not array.flags.c_contiguous:
        from .buffers.arrays import module_of

        array = module_of(array).ascontiguousarray(array)
    return array.reshape(-1)


def _incoming(comm: Any, peers: Any, out: Any, name: str = "out") -> tuple[Any, Any]:
    """Where a receive lands, flat, and what to copy once it has: ``out``'s own memory
    (None to copy), or for a strided ``out`` (a column, a transposed view) a contiguous
    copy of it, ``(out, copy)``, copied back whole once the message is in (the bytes
    past a shorter message keep ``out``'s own values, as in a contiguous ``out``)."""
    writable(out, name)
    array = _on_device(comm, peers, as_array(out, name)[0], name)
    if type(array) is np.ndarray and not array.flags.writeable:
        raise InvalidArgumentError(f"{name}: a receive buffer must be writeable")
    if overlaps_itself(array):  # (every element would hold the last one written there)
        raise overlapping(name)
    if array.flags.c_contiguous:
        return array.reshape(-1), None
    landing = module_of(array).ascontiguousarray(array)
    return landing.reshape(-1), (array, landing)


def _land(back: Any) -> None:
    """A received strided ``out``'s message, copied from where it landed (``_incoming``)."""
    if back is not None:
        array, landing = back
        if type(array) is np.ndarray:
            array[...] = landing
            return
        cuda = module_of(array).cuda  # on out's GPU, whichever is current (a wait from
        with cuda.Device(array.data.device_id):  # another thread: its GPU 0)
            array[...] = landing
            cuda.get_current_stream().synchronize()  # done for every stream, as a
            # contiguous out's wait is


class PointToPoint:
    """The Communicator's point-to-point methods (see ``mpicoll.p2p``)."""

    def send(self, x: Any, dest: int, tag: int = 0) -> None:
        """Send ``x`` to rank ``dest``; returns once ``x`` may be reused."""
        peers = _peers(self)
        dest, tag, buf = _rank(self, dest, "dest"), _tag(peers, tag), _outgoing(self, peers, x)
        if dest == self.rank and not self._receive_posted_here(peers, tag):
            raise InvalidArgumentError("dest: a blocking send to this rank itself, with no "
                                       "irecv of it posted first, would wait forever; post "
                                       "the irecv first, or use isend")
        with watched_step(self, "send", _waiting(self, "send", dest, tag), program_frame()):
            peers.send(buf, dest, tag)

    def recv(self, out: Any, source: int = ANY, tag: int = 0,
             status: Status | None = None) -> int:
        """Receive a message of at most ``out``'s bytes (on nccl: exactly) from ``source``
        (``mpicoll.ANY``: any rank; not on nccl) with ``tag`` (ANY: any tag; not on nccl)
        into ``out`` in place; returns the rank that sent it. ``status``: an
        ``mpicoll.Status``, filled with the sender, the tag and the message's bytes."""
        peers = _peers(self)
        source, tag = _source(self, peers, source), _tag(peers, tag, True)
        (buf, back), status = _incoming(self, peers, out), _status(status)
        if source == self.rank and not self._already_sent(peers, tag):
            raise InvalidArgumentError("source: a blocking receive from this rank itself "
                                       "would wait forever (no such message was sent); use "
                                       "isend and irecv")
        try:
            with watched_step(self, "recv", _waiting(self, "recv", source, tag), program_frame()):
                got = peers.recv(buf, source, tag)
        except CollectiveError:  # (a message cut short: a strided out holds its first
            _land(back)  # bytes too, as the error says; else its copy lands unchanged)
            raise
        _land(back)
        return _filled(status, got)

    def probe(self, source: int = ANY, tag: int = ANY) -> Status:
        """Wait for a message from ``source`` with ``tag`` (either mpicoll.ANY) and give
        its Status (sender, tag, bytes) without receiving it: the next matching receive
        takes it (a buffer of ``status.count(dtype)`` elements holds it). Not on nccl."""
        peers = self._prober("probe")
        source, tag = _source(self, peers, source), _tag(peers, tag, True)
        if source == self.rank and not self._already_sent(peers, tag):
            raise InvalidArgumentError("source: a blocking probe of this rank itself would "
                                       "wait forever (no such message was sent)")
        with watched_step(self, "probe", _waiting(self, "recv", source, tag), program_frame()):
            return peers.probe(source, tag, True)

    def iprobe(self, source: int = ANY, tag: int = ANY) -> Status | None:
        """``probe`` without waiting: the Status of a matching message that has come, or
        None."""
        peers = self._prober("iprobe")
        source, tag = _source(self, peers, source), _tag(peers, tag, True)
        with watched_step(self, "iprobe", _waiting(self, "recv", source, tag), program_frame()):
            return peers.probe(source, tag, False)

    def _already_sent(self, peers: Any, tag: int) -> bool:
        """Whether a message of this rank to itself with ``tag`` has come (an isend
        started before): then a blocking receive or probe of it ends at once. (Probed
        for up to a tenth of a second: MPI may need a few turns of its progress to see
        a message this rank posted.)"""
        if not hasattr(peers, "probe"):
            return False
        deadline, pause = time.monotonic() + 0.1, 1e-6
        with watched_step(self, "iprobe", _waiting(self, "recv", self.rank, tag), program_frame(3)):
            while peers.probe(self.rank, tag, False) is None:
                if time.monotonic() > deadline:
                    return False
                time.sleep(pause)
                pause = min(pause * 2, 1e-3)
        return True

    def _receive_posted_here(self, peers: Any, tag: int) -> bool:
        """Whether an irecv of this rank, posted and not done, takes a message of its own
        with ``tag`` (then a blocking send to itself ends, as MPI's). Not on nccl: its
        messages run in the order they are issued, the receive first."""
        if hasattr(peers, "batch"):
            return False
        for request in list(self._receives_here):
            if request._tag in (tag, ANY):
                try:
                    if not request.test():
                        return True
                except MpicollError:  # (done, cut short: its own wait says so)
                    pass
        return False

    def _prober(self, what: str) -> Any:
        peers = _peers(self)
        if not hasattr(peers, "probe"):
            raise InvalidArgumentError(f"{what}: not on the {self.backend} backend: NCCL "
                                       "cannot look at a message before receiving it")
        return peers

    def sendrecv(self, x: Any, dest: int, out: Any, source: int = ANY, send_tag: int = 0,
                 recv_tag: int = 0, status: Status | None = None) -> int:
        """Send ``x`` to ``dest`` and receive into ``out`` from ``source`` at once (no
        deadlock when two ranks exchange); returns the rank the message came from
        (``status``: filled as ``recv``'s). ``out`` may be ``x`` itself, or overlap it
        (MPI_Sendrecv_replace): ``x`` is sent as it was before the call."""
        peers = _peers(self)
        dest, source = _rank(self, dest, "dest"), _source(self, peers, source)
        send_tag = _tag(peers, send_tag, name="send_tag")
        recv_tag = _tag(peers, recv_tag, True, "recv_tag")
        sendbuf, (recvbuf, back) = _outgoing(self, peers, x), _incoming(self, peers, out)
        if may_share_memory(sendbuf, recvbuf):  # (MPI forbids the two to overlap)
            sendbuf = sendbuf.copy()
        status = _status(status)
        # (either half may be what waits: a receive no one sends, a send no one takes)
        note = f"{_waiting(self, 'send', dest, send_tag)} and " \
            f"{_waiting(self, 'recv', source, recv_tag).removeprefix('waiting ')}"
        with watched_step(self, "sendrecv", note, program_frame()):
            got = peers.sendrecv(sendbuf, dest, send_tag, recvbuf, source, recv_tag)
        _land(back)
        return _filled(status, got)

    def isend(self, x: Any, dest: int, tag: int = 0) -> Request:
        """Start sending ``x`` to ``dest``: a Request; ``x`` must not change until its
        ``wait()``."""
        peers = _peers(self)
        dest, tag, buf = _rank(self, dest, "dest"), _tag(peers, tag), _outgoing(self, peers, x)
        with watched_step(self, "isend", _waiting(self, "send", dest, tag), program_frame()):
            return Request(self, "isend", dest, tag, peers.isend(buf, dest, tag), False)

    def irecv(self, out: Any, source: int = ANY, tag: int = 0) -> Request:
        """Start receiving into ``out`` from ``source`` (tag: or ANY): a Request whose
        ``wait()`` gives the rank the message came from (``wait(status)``: and fills it)."""
        peers = _peers(self)
        source, tag = _source(self, peers, source), _tag(peers, tag, True)
        buf, back = _incoming(self, peers, out)
        with watched_step(self, "irecv", _waiting(self, "recv", source, tag), program_frame()):
            return self._posted(Request(self, "irecv", source, tag,
                                        peers.irecv(buf, source, tag), True, back))

    def _posted(self, request: Request) -> Request:
        """An irecv, kept (weakly) where it may take a message of this rank's own."""
        if request._peer in (self.rank, ANY):
            self._receives_here.add(request)
        return request

    def batch_isend_irecv(self, ops: Sequence[P2POp]) -> list[Request]:
        """Start every message of ``ops`` (P2POps) and return their Requests, in order
        (on nccl: every one checked first, then all in one NCCL group)."""
        try:
            ops = list(ops)
        except TypeError:
            raise InvalidArgumentError(f"ops: expected a list of mpicoll.P2POp, got "
                                       f"{type(ops).__name__}") from None
        kinds = []
        for i, p in enumerate(ops):
            if not isinstance(p, P2POp):
                raise InvalidArgumentError(f"ops[{i}]: expected an mpicoll.P2POp, got "
                                           f"{type(p).__name__}")
            name = p.op if isinstance(p.op, str) else getattr(p.op, "__name__", "")
            if name not in ("isend", "irecv"):
                raise InvalidArgumentError(f"ops[{i}].op: expected 'isend' or 'irecv', got {p.op!r}")
            owner = getattr(p.op, "__self__", self)
            if isinstance(owner, PointToPoint) and owner is not self:
                raise InvalidArgumentError(f"ops[{i}].op: the {name} of another Communicator; "
                                           "a batch's messages go on the Communicator it is "
                                           "started on")
            kinds.append(name)
        peers = _peers(self)
        batched = hasattr(peers, "batch")  # (NCCL's group; MPI's: each its own request)
        checked = []  # (is_send, buffer, peer, tag), every one before any message
        backs: list[Any] = [None] * len(ops)  # a strided receive's (see _incoming)
        for i, (kind, p) in enumerate(zip(kinds, ops, strict=True)):
            if kind == "isend":
                checked.append((True, _outgoing(self, peers, p.tensor, f"ops[{i}].tensor"),
                                _rank(self, p.peer, f"ops[{i}].peer"),
                                _tag(peers, p.tag, name=f"ops[{i}].tag")))
            else:
                buf, back = _incoming(self, peers, p.tensor, f"ops[{i}].tensor")
                backs[i] = back
                checked.append((False, buf, _source(self, peers, p.peer, f"ops[{i}].peer"),
                                _tag(peers, p.tag, not batched, f"ops[{i}].tag")))
        _apart(checked, backs)
        if not batched:
            requests = []
            note = f"starting {len(checked)} point-to-point messages"
            with watched_step(self, "batch_isend_irecv", note, program_frame()):
                for kind, (is_send, buf, peer, tag), back in zip(kinds, checked, backs,
                                                                 strict=True):
                    start = peers.isend if is_send else peers.irecv
                    request = Request(self, kind, peer, tag, start(buf, peer, tag),
                                      not is_send, back)
                    requests.append(request if is_send else self._posted(request))
            return requests
        note = (f"starting {len(checked)} point-to-point messages with rank(s) "
                f"{', '.join(str(r) for r in sorted({peer for _, _, peer, _ in checked}))}")
        with watched_step(self, "batch_isend_irecv", note, program_frame()):
            started = peers.batch(checked)
        return [Request(self, kind, peer, tag, request, not is_send, back)
                for kind, (is_send, _, peer, tag), request, back in zip(kinds, checked, started,
                                                                       backs, strict=True)]
