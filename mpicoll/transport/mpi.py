"""The MPI transport: point-to-point messages of mpi4py on a private duplicate communicator.

Library messages travel on ``comm.Dup()``, so they never match the user's own messages,
and each collective call takes the next tag, so two calls never match each other. Data
goes as raw bytes (``MPI.BYTE``) through mpi4py's buffer interface: no pickle, and no
dtype needs an MPI datatype.

GPU buffers (CuPy arrays) take one of two paths, decided once per communicator by
``mpicoll.buffers.cuda.cuda_aware_mpi``:

- CUDA-aware MPI: the device buffer goes to MPI as it is, after the current stream is
  synchronized (the kernels that produced the data, or still read the buffer about to be
  overwritten, must be done: MPI does not order itself after the stream).
- otherwise, staging: a send copies device -> pinned host memory (waiting for the stream)
  and sends that; a receive lands in pinned memory and is copied to the device on the
  current stream, so the reductions that follow are ordered after it. The pinned memory
  is the communicator's (``PinnedStaging``), reused call after call.
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from ..errors import CollectiveError
from . import Status, Workspace, cut_short

# Tags of this process's transports so far: a new transport starts above all of them, so
# that a message an erroneous call left behind on a freed communicator (whose context id
# MPI may give to the next one) never matches a later call.
_LIVE: weakref.WeakSet = weakref.WeakSet()
_RETIRED = [0]  # the highest tag of transports already freed
_LIVE_LOCK = threading.Lock()  # (threads make and free Communicators of other parents)


def new_comm(make: Any, what: str) -> Any:
    """``make()``, a collective that makes an MPI communicator (MPI_Comm_dup, _split),
    with MPI's failure named as mpicoll's: the MPI library has run out of communicators
    (MPICH has about two thousand; each mpicoll Communicator holds two) where a program
    makes groups and never frees them. Every rank fails alike (MPI agrees the new
    communicator's context id over all of them), the parent staying usable."""
    try:
        return make()
    except MPI.Exception as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        last = lines[-1] if lines else type(exc).__name__  # (MPICH's stack: the cause last)
        raise CollectiveError(
            f"{what}: the MPI library could not make a communicator ({last}). MPI has a "
            "limited number of them (MPICH about 2000; each mpicoll Communicator holds "
            "two): free the Communicators and groups no longer used (comm.free(), "
            "mesh.free(), dist.destroy_process_group(group))") from exc


def _highest_tag() -> int:
    with _LIVE_LOCK:
        return max([_RETIRED[0], *(t.tag for t in list(_LIVE))])


class MPITransport(Workspace):
    """Point-to-point transport over a private duplicate of an mpi4py intracommunicator.

    Tags: one per collective call (``begin``), counting up from a start the ranks agree
    on when the transport is made: above every tag any of them used before, on any
    communicator, so that no call can match an earlier call's left-over message.
    """

    def __init__(self, comm: MPI.Intracomm) -> None:
        super().__init__()
        self.comm = new_comm(comm.Dup, "Communicator")
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        tag_ub = self.comm.Get_attr(MPI.TAG_UB)
        # calls take tags below the limit; [limit, 2 limit) is left for the pipeline's
        # resync after a refused call (side_tags), which no call's messages may match
        self.tag_limit = min((int(tag_ub) + 1) // 2 if tag_ub else 16384, 1 << 30)
        self.side_tags = self.tag_limit
        start = np.array([_highest_tag()], np.int64)
        self.comm.Allreduce(MPI.IN_PLACE, start, MPI.MAX)
        self.tag = int(start[0]) % self.tag_limit
        self.born_tag = self.tag  # (agreed by every rank: it tells this communicator from a
        #                           dup of the same ranks in the hang dumps)
        with _LIVE_LOCK:
            _LIVE.add(self)
        self.cuda_aware: bool | None = None  # decided at the first device buffer
        self._staging: Any = None  # PinnedStaging, when staging
        self._copies: list[tuple[MPI.Request, np.ndarray, Any]] = []  # staged irecvs
        # what the last blocking call waits for, read by the watchdog when a call is
        # overdue: plain attribute writes before each wait, no allocation
        self.step = 0  # blocking calls so far in this collective call
        self.wait_kind: str | None = None  # "send", "recv", "sendrecv", "waitall"
        self.wait_peer = self.wait_dest = self.wait_count = -1
        self._notes: list[tuple[MPI.Request, np.ndarray]] = []  # post()'s sends in flight
        # every receive's length is checked: a message shorter than its buffer (MPI says
        # nothing) comes of ranks that gave other counts or shapes, and would leave the
        # buffer's tail as it was, a result silently wrong
        self._status = MPI.Status()
        self._statuses: list[MPI.Status] = []  # waitall's, reused
        self._receives: list[tuple[MPI.Request, int, int]] = []  # irecvs: (request, bytes, from)
        self._persistent: list[MPI.Prequest] = []  # persistent requests of plans
        self._retired: list[MPI.Prequest] = []  # theirs whose plans were dropped
        self._buffers: dict[int, tuple] = {}  # each persistent request's buffer specs
        self.persists = True  # plans may make persistent requests here (agreed: see Plan)

    def begin(self, like: Any = None) -> None:
        tag = self.tag + 1
        self.tag = tag if tag < self.tag_limit else 1
        if like is None and not self._device and self._staging is None:
            # host buffers only, as most calls (every call on the hot path): the
            # watchdog's slots and the workspace, as _start_call resets them
            self.step, self.wait_kind = 0, None
            if self._receives:  # (a failed call's, never waited for)
                self._receives = []
            tops = self._tops
            if tops[0]:
                tops[0] = 0
            if self._retired:  # dropped plans' requests: between calls, never inside one
                self._free_retired()
            return
        self._start_call(like)
        self._receives = []
        if self._copies:  # staged receives a failed call never waited for
            self._drop_copies()
        if self._staging is not None and self._staging.capacity:
            self._staging.reset()  # once the last call's copies from it have run

    def advance(self) -> None:
        """``begin()`` for a call that sends nothing through this transport (MPI's own
        collective, called at once on host arrays: ``pipeline.entry.prepare``): its tag
        moves as every rank's does and the watchdog's slots are cleared; the workspace
        and the requests plans retired wait for the next ``begin()``."""
        tag = self.tag + 1
        self.tag = tag if tag < self.tag_limit else 1
        self.step, self.wait_kind = 0, None

    def reopen(self) -> None:
        """After ``advance()``: the call goes on with messages of its own (a decided call
        that found the root's header changed), so the transport is left as ``begin()``
        leaves it (workspace free, host memory, staging reset, retired requests freed),
        its tag having moved already."""
        tag = self.tag
        self.tag = tag - 1 if tag > 1 else self.tag_limit - 1  # (begin() moves it back)
        self.begin()

    # -- host buffers: straight to MPI; device buffers: _device_* below -------------------

    def send(self, buf: Any, dest: int) -> None:
        self.step += 1
        self.wait_kind, self.wait_peer = "send", dest
        if type(buf) is np.ndarray:
            self.comm.Send([buf, MPI.BYTE], dest, self.tag)
        else:
            mark = self._mark()
            self.comm.Send([self._outgoing(buf), MPI.BYTE], dest, self.tag)
            self._release(mark)
        self.wait_kind = None  # (done: a report says this rank computes, not waits)

    def recv(self, buf: Any, source: int) -> None:
        self.step += 1
        self.wait_kind, self.wait_peer = "recv", source
        status = self._status
        if type(buf) is np.ndarray:
            self.comm.Recv([buf, MPI.BYTE], source, self.tag, status)
            if status.Get_count(MPI.BYTE) != buf.nbytes:
                raise _short(status, buf.nbytes, source)
        else:
            landing = self._incoming(buf)
            self.comm.Recv([landing, MPI.BYTE], source, self.tag, status)
            if status.Get_count(MPI.BYTE) != landing.nbytes:
                raise _short(status, landing.nbytes, source)
            self._arrived(landing, buf)
        self.wait_kind = None

    def sendrecv(self, sendbuf: Any, dest: int, recvbuf: Any, source: int) -> None:
        self.step += 1
        self.wait_kind, self.wait_peer, self.wait_dest = "sendrecv", source, dest
        status = self._status
        if type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray:
            self.comm.Sendrecv([sendbuf, MPI.BYTE], dest, self.tag,
                               [recvbuf, MPI.BYTE], source, self.tag, status)
            if status.Get_count(MPI.BYTE) != recvbuf.nbytes:
                raise _short(status, recvbuf.nbytes, source)
            self.wait_kind = None
            return
        outgoing = sendbuf if type(sendbuf) is np.ndarray else self._outgoing(sendbuf)
        landing = recvbuf if type(recvbuf) is np.ndarray else self._incoming(recvbuf)
        self.comm.Sendrecv([outgoing, MPI.BYTE], dest, self.tag,
                           [landing, MPI.BYTE], source, self.tag, status)
        if status.Get_count(MPI.BYTE) != landing.nbytes:
            raise _short(status, landing.nbytes, source)
        if landing is not recvbuf:
            self._arrived(landing, recvbuf)
        self.wait_kind = None

    def isend(self, buf: Any, dest: int) -> MPI.Request:
        self.wait_peer = dest
        if type(buf) is not np.ndarray:
            buf = self._outgoing(buf)  # staged: the pinned copy stays until the next call
        return self.comm.Isend([buf, MPI.BYTE], dest, self.tag)

    def irecv(self, buf: Any, source: int) -> MPI.Request:
        self.wait_peer = source
        if type(buf) is np.ndarray:
            request = self.comm.Irecv([buf, MPI.BYTE], source, self.tag)
            self._receives.append((request, buf.nbytes, source))
            return request
        landing = self._incoming(buf)
        request = self.comm.Irecv([landing, MPI.BYTE], source, self.tag)
        self._receives.append((request, landing.nbytes, source))
        if landing is not buf:
            self._copies.append((request, landing, buf))
        return request

    def waitall(self, requests: Sequence[MPI.Request]) -> None:
        requests = list(requests)
        self.step += 1
        self.wait_kind, self.wait_count = "waitall", len(requests)
        if not self._receives:  # sends alone
            MPI.Request.Waitall(requests)
        else:
            statuses = self._statuses
            try:
                MPI.Request.Waitall(requests, statuses)  # (mpi4py fills its first ones)
            except MPI.Exception as exc:
                raise self._failed_receive(exc, requests, statuses) from exc
            self._check_receives(requests, statuses)
        if self._copies:  # staged receives among them: now copy them to the device
            waited = {id(r) for r in requests}
            pending = []
            for request, landing, buf in self._copies:
                if id(request) in waited:
                    self._arrived(landing, buf)
                else:
                    pending.append((request, landing, buf))
            self._copies = pending
        self.wait_kind = None

    def _check_receives(self, requests: list[MPI.Request], statuses: list[MPI.Status]) -> None:
        """The lengths of the receives among ``requests`` (just waited for), as ``recv``
        checks its own; those not among them stay for a later waitall."""
        pending = []
        for received in self._receives:
            request = received[0]
            for k, r in enumerate(requests):
                if r is request:
                    if statuses[k].Get_count(MPI.BYTE) != received[1]:
                        self._receives = []
                        raise _short(statuses[k], received[1], received[2])
                    break
            else:
                pending.append(received)
        self._receives = pending

    def _failed_receive(self, exc: MPI.Exception, requests: list[MPI.Request],
                        statuses: list[MPI.Status]) -> Exception:
        """Waitall's error, where MPI put it in a receive's status (MPI_ERR_IN_STATUS): a
        message longer than its buffer said as ``recv`` says it, naming the sender (it
        was "See the MPI_ERROR field in MPI_Status"); any other as it is."""
        if exc.Get_error_class() != MPI.ERR_IN_STATUS:
            return exc
        for received in self._receives:
            for k, r in enumerate(requests[:len(statuses)]):
                if r is received[0] and MPI.Get_error_class(
                        statuses[k].Get_error()) == MPI.ERR_TRUNCATE:
                    self._receives = []
                    sender = statuses[k].Get_source()
                    return cut_short(sender if sender >= 0 else received[2], -1, received[1])
        return exc

    def _drop_copies(self) -> None:
        """Cancel the staged receives a failed call left posted, and wait for them, so
        none lands later in pinned memory the next call reuses; their data (of the
        failed call) is not copied to the device."""
        copies, self._copies = self._copies, []
        for request, _, _ in copies:
            if request != MPI.REQUEST_NULL:
                request.Cancel()  # one already matched completes instead: its sender sends
        MPI.Request.Waitall([request for request, _, _ in copies])

    def try_recv(self, buf: np.ndarray, source: int, seconds: float) -> bool:
        """Receive into host ``buf`` if the message comes within ``seconds``; whether it
        came (the receive is cancelled if not)."""
        self.step += 1
        self.wait_kind, self.wait_peer = "recv", source
        request = self.comm.Irecv([buf, MPI.BYTE], source, self.tag)
        deadline = time.monotonic() + max(seconds, 0.0)
        while not request.Test():
            if time.monotonic() > deadline:
                request.Cancel()
                status = MPI.Status()
                request.Wait(status)
                return not status.Is_cancelled()
            time.sleep(0.001)
        self.wait_kind = None
        return True

    def post(self, buf: np.ndarray, dest: int) -> None:
        """Send host ``buf`` to ``dest`` without waiting for it to be received (a note
        a rank may never read: the buffer is kept until the send completes)."""
        self._notes = [(r, b) for r, b in self._notes if not r.Test()]
        buf = buf.copy()
        self._notes.append((self.comm.Isend([buf, MPI.BYTE], dest, self.tag), buf))

    def duplicate(self) -> MPITransport:
        """A transport of the same ranks whose messages never match this one's
        (collective: every rank calls it at the same point)."""
        return MPITransport(self.comm)

    def synchronize(self) -> None:
        """Nothing to wait for: MPI calls have finished when they return."""

    def persistent(self, collective: str, *args: Any) -> MPI.Prequest:
        """MPI-4's persistent ``collective`` (mpi4py's method name: "Allreduce") on these
        buffer specs: ``<collective>_init``, collective (every rank makes it at the same
        point), freed by ``release`` or with the transport."""
        self._free_retired()
        request = getattr(self.comm, f"{collective}_init")(*args)
        self._persistent.append(request)
        # its buffers live as long as it does: a plan dropped while its start runs must
        # not take with it the memory MPI still writes into
        self._buffers[id(request)] = args
        return request

    def release(self, request: MPI.Prequest) -> None:
        """Free a persistent request of ``persistent``; a start of it still running (its
        plan dropped, or the Communicator freed, before a wait) is waited for first: every
        rank started it, so it ends, and MPI forbids freeing an active collective request."""
        if any(r is request for r in self._persistent):
            self._persistent = [r for r in self._persistent if r is not request]
            if not MPI.Is_finalized():
                if not request.Test():
                    request.Wait()
                request.Free()
            self._buffers.pop(id(request), None)

    def started_persistent(self) -> bool:
        """Whether a start of a persistent request is still running here."""
        return not MPI.Is_finalized() and not all(r.Test() for r in self._persistent)

    def end_persistent(self) -> None:
        """Wait for every running start of a persistent request (``started_persistent``)."""
        for request in self._persistent:
            request.Wait()

    def retire(self, request: MPI.Prequest) -> None:
        """A request whose plan was dropped (the garbage collector may run anywhere, even
        inside an MPI call): freed at the next call's ``begin`` or with the transport."""
        self._retired.append(request)

    def _free_retired(self) -> None:
        while self._retired:
            self.release(self._retired.pop())

    def free(self) -> None:
        with _LIVE_LOCK:
            _RETIRED[0] = max(_RETIRED[0], self.tag)
            _LIVE.discard(self)
        for request in list(self._persistent):
            self.release(request)
        if self._staging is not None:  # (its pinned memory goes back to CuPy's pool with
            self._staging.drain()  # the transport: no copy may still read it then)
        self.let_go()
        if self.comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self.comm.Free()

    # -- device buffers ----------------------------------------------------------------

    @staticmethod
    def _stream() -> Any:
        from ..buffers.cuda import current_stream

        return current_stream()

    def _decide(self, forced: bool | None = None) -> None:
        from ..buffers.cuda import cuda_aware_mpi

        self.cuda_aware = cuda_aware_mpi() if forced is None else forced
        if not self.cuda_aware:
            self._pinned()

    def force_cuda_aware(self, forced: bool) -> None:
        """Decide now, as ``MPICOLL_CUDA_AWARE`` says (read when the Communicator was
        made), instead of asking at the first device buffer."""
        self._decide(forced)

    def _pinned(self) -> Any:
        """The pinned staging memory (made at first use: a CUDA-aware MPI needs it only
        for what it cannot take from the device, such as a user op's reduction)."""
        if self._staging is None:
            from ..buffers.cuda import PinnedStaging

            self._staging = PinnedStaging()
        return self._staging

    def _outgoing(self, buf: Any) -> Any:
        """What MPI sends for device ``buf``: buf itself once the stream is done with it
        (CUDA-aware), or a pinned host copy of it (staging)."""
        if self.direct():
            return buf
        return self._copy_to_host(buf)

    def _incoming(self, buf: Any) -> Any:
        """Where MPI receives for device ``buf``: buf itself (CUDA-aware; the stream must
        be done with it first) or pinned host memory, kept until the next call."""
        return buf if self.direct() else self._pinned().take(buf.nbytes)

    def _arrived(self, landing: Any, buf: Any) -> None:
        if landing is not buf:  # host -> device on the current stream, ordered before
            self._copy_to_device(landing, buf)  # the kernels that will read buf

    def _copy_to_host(self, buf: Any) -> np.ndarray:
        """Device ``buf``'s bytes in pinned memory (waits for the stream, then the copy)."""
        host = self._pinned().take(buf.nbytes)
        buf.view(np.uint8).get(out=host)
        return host

    def _copy_to_device(self, host: np.ndarray, buf: Any) -> None:
        """Pinned ``host`` into device ``buf`` on the current stream. The copy reads the
        pinned memory when the stream gets there, so the staging keeps it until then."""
        stream = self._stream()
        buf.view(np.uint8).set(host.view(np.uint8), stream)
        self._staging.read_on(stream)

    def direct(self) -> bool:
        """Whether device buffers go to MPI as they are (CUDA-aware); the stream is
        synchronized first, as MPI reads them at once."""
        if self.cuda_aware is None:
            self._decide()
        if self.cuda_aware:
            self._stream().synchronize()
        return bool(self.cuda_aware)

    def to_host(self, buf: Any) -> np.ndarray:
        """A pinned host copy of device ``buf`` (same dtype and shape), kept for the call."""
        return self._copy_to_host(buf).view(buf.dtype).reshape(buf.shape)

    def host_space(self, buf: Any) -> np.ndarray:
        """Pinned host memory shaped like device ``buf``, for a result to land in."""
        return self._pinned().take(buf.nbytes).view(buf.dtype).reshape(buf.shape)

    def to_device(self, host: np.ndarray, buf: Any) -> None:
        """Copy ``to_host``'s ``host`` back into ``buf`` on the current stream."""
        self._copy_to_device(host, buf)

    def _mark(self) -> Any:
        return None if self._staging is None else self._staging.mark()

    def _release(self, mark: Any) -> None:
        if mark is not None:
            self._staging.release(mark)


class MPIPeers:
    """The program's own point-to-point messages (``comm.send``/``recv``) on a communicator
    of their own, so that no user tag ever meets a collective's messages. Made with the
    Communicator (a collective MPI_Comm_dup); GPU buffers go as the data transport decides
    (CUDA-aware, or copied through host memory)."""

    def __init__(self, transport: MPITransport) -> None:
        self.comm = new_comm(transport.comm.Dup, "Communicator")
        self.transport = transport
        # requests dropped before they finished: kept, with the memory MPI still reads or
        # writes (a strided send's copy, a staged message's host buffer), until it is done;
        # oldest first (reap), and how many were kept after the last reap
        self._orphans: collections.deque[PeerRequest] = collections.deque()
        self._kept = 0
        tag_ub = self.comm.Get_attr(MPI.TAG_UB)
        self.max_tag = int(tag_ub) if tag_ub else 32767

    def _outgoing(self, buf: Any) -> Any:
        if type(buf) is np.ndarray or self.transport.direct():
            return buf
        return buf.view(np.uint8).get()  # waits for the stream, then a host copy

    def _landing(self, buf: Any) -> Any:
        if type(buf) is np.ndarray or self.transport.direct():
            return buf
        return np.empty(buf.nbytes, np.uint8)

    def send(self, buf: Any, dest: int, tag: int) -> None:
        self.reap()
        self.comm.Send([self._outgoing(buf), MPI.BYTE], dest, tag)

    def recv(self, buf: Any, source: int, tag: int) -> Status:
        self.reap()
        status = MPI.Status()
        landing = self._landing(buf)
        try:
            self.comm.Recv([landing, MPI.BYTE], _any(source, MPI.ANY_SOURCE),
                           _any(tag, MPI.ANY_TAG), status)
        except MPI.Exception as exc:
            raise _cut_short(exc, buf, status, source, tag) from exc
        _check_length(buf, status, source, tag)
        if landing is not buf:  # (a staged receive)
            _onto_device(buf, landing, status)
        return _status(status)

    def sendrecv(self, sendbuf: Any, dest: int, send_tag: int, recvbuf: Any, source: int,
                 recv_tag: int) -> Status:
        self.reap()
        status = MPI.Status()
        landing = self._landing(recvbuf)
        try:
            self.comm.Sendrecv([self._outgoing(sendbuf), MPI.BYTE], dest, send_tag,
                               [landing, MPI.BYTE], _any(source, MPI.ANY_SOURCE),
                               _any(recv_tag, MPI.ANY_TAG), status)
        except MPI.Exception as exc:
            raise _cut_short(exc, recvbuf, status, source, recv_tag) from exc
        _check_length(recvbuf, status, source, recv_tag)
        if landing is not recvbuf:
            _onto_device(recvbuf, landing, status)
        return _status(status)

    def probe(self, source: int, tag: int, wait: bool) -> Status | None:
        """The status of the next message from ``source`` with ``tag`` (either may be
        mpicoll.ANY), without receiving it; ``wait=False``: None where none has come."""
        status = MPI.Status()
        source, tag = _any(source, MPI.ANY_SOURCE), _any(tag, MPI.ANY_TAG)
        if wait:
            self.comm.Probe(source, tag, status)
        elif not self.comm.Iprobe(source, tag, status):
            return None
        return _status(status)

    def isend(self, buf: Any, dest: int, tag: int) -> PeerRequest:
        self.reap()
        outgoing = self._outgoing(buf)  # kept by the request until it completes
        return PeerRequest(self.comm.Isend([outgoing, MPI.BYTE], dest, tag), outgoing,
                           orphans=self._orphans)

    def irecv(self, buf: Any, source: int, tag: int) -> PeerRequest:
        self.reap()
        landing = self._landing(buf)
        return PeerRequest(self.comm.Irecv([landing, MPI.BYTE], _any(source, MPI.ANY_SOURCE),
                                           _any(tag, MPI.ANY_TAG)),
                           landing, None if landing is buf else buf, source, tag,
                           orphans=self._orphans, receive=True)

    def reap(self) -> None:
        """Let go of the requests dropped unfinished (``PeerRequest.__del__``) that MPI
        has finished with (a staged receive's message then onto its GPU array): each call
        tests the two oldest, and one more for each dropped since the last call, those
        not done going to the back. A cost bounded by the drops, not by how many are
        kept: testing every one each call made each point-to-point call slower with every
        receive dropped that no message ever matches (MPI keeps it posted: so is it here)."""
        orphans = self._orphans
        if not orphans:
            return
        for _ in range(min(len(orphans), 2 + max(0, len(orphans) - self._kept))):
            request = orphans.popleft()  # (a __del__ may append meanwhile: deques are safe)
            if not request.done_quietly():
                orphans.append(request)
        self._kept = len(orphans)

    def free(self) -> None:
        if self.comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self.comm.Free()


def _any(value: int, wildcard: int) -> int:
    return wildcard if value < 0 else value  # mpicoll.ANY is -1


def _cut_short(exc: MPI.Exception, buf: Any, status: MPI.Status, source: int = -1,
               tag: int = -1) -> Exception:
    """A receive's MPI error as mpicoll's: a message longer than the buffer (MPI cuts it
    short, MPI_ERR_TRUNCATE) said so, naming its sender and tag (the status's where MPI
    filled it in, which it need not on an error; else the receive's own ``source`` and
    ``tag`` where they are not ANY); any other as it is (the caller's step names it)."""
    if exc.Get_error_class() != MPI.ERR_TRUNCATE:
        return exc
    got, got_tag = status.Get_source(), status.Get_tag()
    return cut_short(got if got >= 0 else source, got_tag if got_tag >= 0 else tag, buf.nbytes)


def _short(status: MPI.Status, nbytes: int, source: int) -> CollectiveError:
    """A collective's message of another length than this rank's buffer for it: the
    ranks gave the call other counts or shapes (longer ones MPI reports itself, as
    truncated)."""
    got = status.Get_count(MPI.BYTE)
    sender = status.Get_source()
    return CollectiveError(
        f"the message from rank {sender if sender >= 0 else source} had {got} bytes where "
        f"this rank expected {nbytes}: the ranks gave the call other counts or shapes "
        "(every rank gives the same; MPICOLL_CHECK=1 names the difference)")


def _check_length(buf: Any, status: MPI.Status, source: int, tag: int) -> None:
    """A message longer than its buffer that MPI did not report: MPICH's receive from
    ANY_SOURCE now and then completes with the message's whole length in its status and
    no MPI_ERR_TRUNCATE. The status's length tells it; raised as MPI's error would be."""
    if status.Get_count(MPI.BYTE) > buf.nbytes:
        got, got_tag = status.Get_source(), status.Get_tag()
        raise cut_short(got if got >= 0 else source, got_tag if got_tag >= 0 else tag,
                        buf.nbytes)


def _status(status: MPI.Status) -> Status:
    return Status(status.Get_source(), status.Get_tag(), status.Get_count(MPI.BYTE))


def _onto_device(device: Any, landing: np.ndarray, status: MPI.Status) -> None:
    """A staged receive's message onto the GPU array it was for: its bytes only (a
    shorter message leaves the rest of the array as it was)."""
    count = status.Get_count(MPI.BYTE)
    device.view(np.uint8)[:count].set(landing[:count])


class PeerRequest:
    """An MPI request of ``MPIPeers``: ``wait()`` (a receive's Status), ``test()``."""

    def __init__(self, request: MPI.Request, keep: Any, device: Any = None,
                 source: int = -1, tag: int = -1, orphans: Any = None,
                 receive: bool = False) -> None:
        self.request, self.keep, self.device = request, keep, device
        self.receive = receive
        self.status = MPI.Status()
        self.finished = False
        self.error: Exception | None = None  # why it ended badly (raised at every wait)
        self.source, self.tag = source, tag  # (a receive's: what it asked for)
        self._orphans = orphans
        # MPI's request and status, one thread at a time: a test() while another thread
        # waits says "not yet" (MPI_Test and MPI_Wait of one request at once corrupt it)
        self._lock = threading.Lock()

    def __del__(self) -> None:
        # dropped unfinished: MPI still reads or writes its memory, which must outlive
        # the message, so the request is kept (once: Python finalizes an object once)
        # until the peers' next message finds it done (MPIPeers.reap)
        if not self.finished and self._orphans is not None and \
                self.request != MPI.REQUEST_NULL and not MPI.Is_finalized():
            self._orphans.append(self)

    def done_quietly(self) -> bool:
        """Whether a dropped request is done (its errors: nobody waits to hear them)."""
        try:
            return self.test()
        except Exception:  # noqa: BLE001 - a dropped receive cut short: done, unheard
            return True

    def _finish(self) -> None:
        self.finished = True
        if self.receive and self.status.Get_count(MPI.BYTE) > self.keep.nbytes:
            buf = self.keep if self.device is None else self.device
            self.keep = self.device = None
            try:  # (MPI did not report it: the status's length tells it)
                _check_length(buf, self.status, self.source, self.tag)
            except CollectiveError as error:
                self.error = error
                raise
        if self.device is not None:  # a staged receive: now onto the GPU
            _onto_device(self.device, self.keep, self.status)
        self.keep = self.device = None

    def wait(self) -> Status:
        with self._lock:
            return self._wait()

    def _wait(self) -> Status:
        if self.error is not None:  # (the error again, at every wait, as MPI's status)
            raise CollectiveError(str(self.error)) from self.error
        if not self.finished:
            try:
                self.request.Wait(self.status)
            except MPI.Exception as exc:
                raise self._cut_short(exc) from exc
            self._finish()
        return _status(self.status)

    def test(self) -> bool:
        if not self._lock.acquire(False):
            return False  # (another thread waits on it now)
        try:
            if not self.finished and self.request.Test(self.status):
                self._finish()
        except MPI.Exception as exc:
            raise self._cut_short(exc) from exc
        finally:
            self._lock.release()
        return self.finished

    def _cut_short(self, exc: MPI.Exception) -> Exception:
        """A receive's error (``_cut_short``), the request ended: its buffers let go."""
        buf = self.keep if self.device is None else self.device
        error = _cut_short(exc, buf, self.status, self.source, self.tag)
        self.finished, self.keep, self.device = True, None, None
        self.error = error
        return error
