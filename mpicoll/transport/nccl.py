"""The NCCL transport: ncclSend/ncclRecv of cupy.cuda.nccl on the current CUDA stream.

NCCL's point-to-point calls are asynchronous on a stream and must be issued in matching
groups on both sides, so the transport queues every message and issues the queue as one
group (ncclGroupStart ... ncclGroupEnd) at the next point where MPI semantics would wait:
a blocking send/recv/sendrecv issues the queue with itself, ``waitall`` issues the queue
when it waits on a message still in it. A group lets its sends and receives progress
together, so the order of a rank's messages inside one never deadlocks it. A wait on a
message already issued issues nothing: stream order already puts what follows after it,
and a send issued alone, ahead of the receive its peer posts later, would block both
(a pipelined ring sends each summed segment while the next one is still arriving). Nothing waits on the host:
reductions run on the same stream, after the messages, in stream order, and the result
is ready when the stream gets there, as with NCCL's own collectives.

Messages go counted in elements, as an NCCL type as wide as the buffer's items (or
a divisor of their width: 8, 4, 2 or 1 bytes), never in bytes where the dtype allows, so
a count stays within what CuPy's binding takes (``count_limit``); every algorithm of
mpicoll runs over this transport unchanged.

The program's own messages (``comm.send``, ``recv``, ...) go by ``NCCLPeers``, on
two-rank NCCL communicators made per pair of ranks and tag, never on this transport's.
"""

from __future__ import annotations

import contextlib
import functools
import platform
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..buffers.arrays import cupy_module
from ..errors import CollectiveError, InvalidArgumentError
from . import Status, Workspace

NCCL_UINT8 = 1  # ncclDataType_t ncclUint8
# data that only moves: an NCCL type of each width (ncclUint64, ncclUint32, ncclFloat16,
# ncclUint8); NCCL copies it as bytes, the type only sets how many
_WORDS = ((8, 5), (4, 3), (2, 6), (1, NCCL_UINT8))
C_INT_MAX = 2**31 - 1
UNIQUE_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES
# where GCC's plain `char` is unsigned: CuPy <= 13's tuple ids hold 0..255 there
_UNSIGNED_CHAR_MACHINES = ("aarch64", "arm64", "armv7l", "armv8l", "ppc64le", "ppc64",
                           "s390x", "riscv64")


def cupy_major() -> int:
    """CuPy's major version (13, 14, ...)."""
    return int(cupy_module().__version__.split(".")[0])


def wire(buf: Any) -> tuple[int, int]:
    """(count, ncclDataType_t) that move ``buf``'s bytes: its elements where an NCCL type
    is as wide as its items (8, 4, 2 or 1 bytes), else the widest that divides them
    (complex128 as two uint64 words, a 3-byte record as three uint8)."""
    itemsize = buf.dtype.itemsize
    for width, datatype in _WORDS:
        if itemsize % width == 0:
            return buf.nbytes // width, datatype
    raise AssertionError("unreachable: every itemsize divides by 1")


@functools.cache
def count_limit(communicator_type: type, method: str) -> int:
    """The largest count ``NcclCommunicator.<method>`` of the installed CuPy takes.

    CuPy's Cython methods embed their C signature in the docstring; where it declares the
    count a C ``int`` (CuPy 13's ``broadcast``, fixed to ``size_t`` in cupy#8562) a larger
    count would fail in the binding, so it is 2**31 - 1; ``size_t``: 2**64 - 1. A
    signature that cannot be read counts as ``int``: the narrower is refused clearly
    rather than overflowing.
    """
    first = (getattr(communicator_type, method).__doc__ or "").strip().split("\n")[0]
    declared = re.search(r"\b(\w+)\s+(?:count|recvcount)\b", first)
    if declared and declared.group(1) == "size_t":
        return 2**64 - 1
    return C_INT_MAX


def check_count(comm: Any, method: str, count: int, what: str) -> int:
    """``count`` when ``comm.<method>`` takes it (``comm``: an NcclCommunicator, or its
    class); else an InvalidArgumentError naming the call (every rank of an NCCL
    collective holds the same count, so all refuse alike).

    Raises:
        InvalidArgumentError: the count does not fit the binding's count type.
    """
    limit = count_limit(comm if isinstance(comm, type) else type(comm), method)
    if count > limit:
        raise InvalidArgumentError(
            f"{what}: {count} elements for NcclCommunicator.{method}, but the installed "
            f"CuPy's binding takes at most {limit} (its count is a C int there); split "
            "the data into smaller calls, or use a CuPy that takes a size_t count")
    return count


def unique_id_bytes(unique_id: bytes | Sequence[int]) -> bytes:
    """What ``nccl.get_unique_id()`` returned, as NCCL's 128 raw bytes: CuPy >= 14 gives
    bytes; CuPy <= 13 a tuple of C ``char`` values (-128..127 on x86, 0..255 on ARM)."""
    raw = unique_id if isinstance(unique_id, bytes) else bytes(int(c) & 0xFF for c in unique_id)
    if len(raw) != UNIQUE_ID_BYTES:
        raise InvalidArgumentError(f"NCCL unique id: {len(raw)} bytes, expected {UNIQUE_ID_BYTES}")
    return raw


def unique_id_for_cupy(raw: bytes, major: int, machine: str | None = None) -> bytes | tuple:
    """NCCL's 128 raw bytes as this rank's ``NcclCommunicator`` takes its ``commId``:
    bytes (CuPy >= 14), or a tuple of this machine's C ``char`` values (CuPy <= 13)."""
    if major >= 14:
        return bytes(raw)
    machine = (platform.machine() if machine is None else machine).lower()
    if machine in _UNSIGNED_CHAR_MACHINES:
        return tuple(raw)
    return tuple(b - 256 if b > 127 else b for b in raw)


def _made_unique_id() -> tuple[np.ndarray, str]:
    """NCCL's unique id made here, in a packet: a status word (0, or 1 where it could not
    be made, with the reason) and the 128 raw bytes, as one message carries them."""
    packet = np.zeros(8 + UNIQUE_ID_BYTES, np.uint8)
    problem = ""
    try:
        from cupy.cuda import nccl

        packet[8:] = np.frombuffer(unique_id_bytes(nccl.get_unique_id()), np.uint8)
    except Exception as exc:  # noqa: BLE001 - NcclError, ImportError, a CUDA error
        problem = f"{type(exc).__name__}: {exc}"
        packet[:8].view(np.int64)[0] = 1
    return packet, problem


def _unique_id_in(packet: np.ndarray, problem: str, refusal: str) -> bytes:
    """The 128 raw bytes of a ``_made_unique_id`` packet, or InvalidArgumentError(refusal)
    where its maker could not make the id."""
    if packet[:8].view(np.int64)[0] != 0:
        raise InvalidArgumentError(refusal + (f" ({problem})" if problem else ""))
    return packet[8:].tobytes()


def unique_id_over_mpi(comm: Any) -> bytes:
    """Collective: rank 0 makes NCCL's unique id; MPI broadcasts it (128 raw bytes after
    a status word, no pickle), so a failure at rank 0 reaches every rank.

    Returns:
        The 128 raw bytes (``unique_id_for_cupy`` turns them into CuPy's form).
    Raises:
        InvalidArgumentError: on every rank, when rank 0 could not make the id.
    """
    if comm.Get_rank() == 0:
        packet, problem = _made_unique_id()
    else:
        packet, problem = np.zeros(8 + UNIQUE_ID_BYTES, np.uint8), ""
    comm.Bcast(packet, 0)
    return _unique_id_in(packet, problem, "backend 'nccl' cannot start: rank 0 could not "
                                          "create NCCL's unique id")


class NCCLTransport(Workspace):
    """Point-to-point over one ``NcclCommunicator``, bootstrapped over an MPI communicator.

    Collective, and safe to fail: the ranks first agree that each has its own GPU
    (``check_one_gpu_per_rank``), then share rank 0's unique id with its status, so a
    rank that cannot start makes every rank raise instead of leaving them in NCCL's
    bootstrap.
    """

    def __init__(self, comm: Any) -> None:
        super().__init__()
        from ..buffers.cuda import check_one_gpu_per_rank

        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        check_one_gpu_per_rank(comm)
        from cupy.cuda import nccl

        self._nccl = nccl
        commid = unique_id_for_cupy(unique_id_over_mpi(comm), cupy_major())
        try:
            self.nccl = nccl.NcclCommunicator(self.size, commid, self.rank)
        except Exception as exc:  # noqa: BLE001 - NcclError, or the argument types
            raise InvalidArgumentError(
                f"backend 'nccl': ncclCommInitRank failed on rank {self.rank} "
                f"({type(exc).__name__}: {exc})") from exc
        self._queue: list[tuple[bool, Any, int]] = []  # (is_send, device buffer, peer)
        self._queued = self._issued = 0  # messages ever queued / ever issued: the tickets
        cupy = cupy_module()
        self._device_like = cupy.empty(0, np.uint8)
        self._tokens = cupy.zeros(2, np.uint8)[:1], cupy.zeros(2, np.uint8)[1:]

    def begin(self, like: Any = None) -> None:
        self._start_call(self._device_like, True)  # workspace is always on the device
        # NCCL has no tags: a message an earlier call queued and never issued (it failed
        # mid-way) would be matched by this call's receives, so it is dropped
        self._queue.clear()
        self._issued = self._queued

    def stream_ptr(self) -> int:
        return cupy_module().cuda.get_current_stream().ptr

    def synchronize(self) -> None:
        """Issue what is queued, then wait on the host until the stream has run it."""
        self.issue()
        cupy_module().cuda.get_current_stream().synchronize()

    def _device_buffer(self, buf: Any, send: bool) -> Any:
        """``buf`` as a device buffer: an empty host message (a barrier's) becomes a
        one-byte device token, as NCCL skips empty messages and would not synchronize."""
        if type(buf) is not np.ndarray:
            return buf
        if buf.nbytes == 0:
            return self._tokens[0 if send else 1]
        raise TypeError("the NCCL transport moves device (CuPy) buffers only")

    def issue(self) -> None:
        """Issue every queued message as one NCCL group."""
        if not self._queue:
            return
        nccl, comm, stream = self._nccl, self.nccl, self.stream_ptr()
        queue, self._queue = self._queue, []
        self._issued = self._queued
        # every message's count is checked before any is issued
        calls = []
        for is_send, buf, peer in queue:
            buf = self._device_buffer(buf, is_send)
            count, datatype = wire(buf)
            method = "send" if is_send else "recv"
            check_count(comm, method, count,
                        f"a send to rank {peer}" if is_send else f"a receive from rank {peer}")
            calls.append((getattr(comm, method), buf.data.ptr, count, datatype, peer))
        nccl.groupStart()
        try:
            for call, ptr, count, datatype, peer in calls:
                call(ptr, count, datatype, peer, stream)
        finally:
            nccl.groupEnd()

    def _enqueue(self, is_send: bool, buf: Any, peer: int) -> int:
        self._queue.append((is_send, buf, peer))
        self._queued += 1
        return self._queued - 1  # the request: this message's ticket

    def send(self, buf: Any, dest: int) -> None:
        self._enqueue(True, buf, dest)
        self.issue()

    def recv(self, buf: Any, source: int) -> None:
        self._enqueue(False, buf, source)
        self.issue()

    def sendrecv(self, sendbuf: Any, dest: int, recvbuf: Any, source: int) -> None:
        self._enqueue(True, sendbuf, dest)
        self._enqueue(False, recvbuf, source)
        self.issue()

    def isend(self, buf: Any, dest: int) -> int:
        return self._enqueue(True, buf, dest)

    def irecv(self, buf: Any, source: int) -> int:
        return self._enqueue(False, buf, source)

    def waitall(self, requests: Sequence[Any]) -> None:
        if any(ticket is None or ticket >= self._issued for ticket in requests):
            self.issue()

    def free(self) -> None:
        """Destroy the NCCL communicator (once; later calls do nothing)."""
        if getattr(self, "nccl", None) is not None:
            self.nccl.destroy()
            self.nccl = None


# ---- the program's own point-to-point messages ----------------------------------------


class NCCLPeers:
    """The program's point-to-point messages (``comm.send``/``recv``, ...) over NCCL, on
    NCCL communicators of their own, so they never meet a collective's messages.

    NCCL has no tags and matches a pair's messages in the order they are issued on one
    communicator, so, as torch's ProcessGroupNCCL does, each pair of ranks gets its own
    two-rank communicator, and here one per tag too (messages of different tags never
    match each other, as in MPI): made at the pair's first message on that tag, from a
    unique id the lower rank makes and sends to the higher over a private duplicate of
    the backend's MPI communicator (tag: the message's tag), in an exchange that also
    tells the lower that the higher has come. So the first message of a pair on a tag is
    a meeting point of the two; the communicators an operation needs are made in one
    order on every rank (lower rank, higher rank, tag), so a ring of ``sendrecv``s makes
    its pairs without a cycle.

    Messages go on the current CuPy stream as one NCCL group per operation; a blocking
    one synchronizes that stream, a started one records an event after it. What NCCL
    cannot do is refused by ``mpicoll.p2p`` before any message: a receive from any rank
    (``any_source``), host arrays (``device_only``). A receive must be as long as its
    send, byte for byte: NCCL cannot tell a shorter message.
    """

    any_source = False  # NCCL has no wildcard receive (of a rank, or of a tag)
    device_only = True  # device buffers only, as the backend's collectives

    def __init__(self, comm: Any, device: int | None = None) -> None:
        from cupy.cuda import nccl
        from mpi4py import MPI

        self._nccl = nccl
        self.device = device  # the backend's GPU: a pair is made on it, whatever thread
        from .mpi import new_comm

        self.comm = new_comm(comm.Dup, "Communicator")  # the unique ids' messages: no
        #                                                 collective uses it
        self.rank = self.comm.Get_rank()
        tag_ub = self.comm.Get_attr(MPI.TAG_UB)
        self.max_tag = int(tag_ub) if tag_ub else 32767
        self.pairs: dict[tuple[int, int], Any] = {}  # (peer, tag): NcclCommunicator

    def _make_pair(self, peer: int, tag: int) -> Any:
        """The NCCL communicator of this rank and ``peer`` for ``tag`` (``peer`` itself:
        one rank), made with ``peer`` (it makes the same one now)."""
        lower, higher = min(self.rank, peer), max(self.rank, peer)
        if self.rank == lower:
            packet, problem = _made_unique_id()
        else:
            packet, problem = np.zeros(8 + UNIQUE_ID_BYTES, np.uint8), ""
        if peer != self.rank:
            # the two meet here, in MPI (a wait the watchdog sees: CuPy holds the GIL in
            # ncclCommInitRank), so NCCL's init starts only once both have come
            theirs = np.zeros_like(packet)
            self.comm.Sendrecv(packet, peer, tag, theirs, peer, tag)
            if self.rank == higher:
                packet = theirs
        pair = f"ranks {lower} and {higher}" if lower != higher else f"rank {lower}"
        raw = _unique_id_in(packet, problem, f"point-to-point on backend 'nccl': rank {lower} "
                                             f"could not create NCCL's unique id for {pair} "
                                             f"(tag {tag})")
        try:
            with contextlib.nullcontext() if self.device is None else \
                    cupy_module().cuda.Device(self.device):  # (made on the thread's current)
                return self._nccl.NcclCommunicator(1 if lower == higher else 2,
                                                   unique_id_for_cupy(raw, cupy_major()),
                                                   0 if self.rank == lower else 1)
        except Exception as exc:  # noqa: BLE001 - NcclError, named
            raise CollectiveError(
                f"point-to-point on backend 'nccl': ncclCommInitRank of the communicator of "
                f"{pair} (tag {tag}) failed on rank {self.rank} ({type(exc).__name__}: "
                f"{exc})") from exc

    def _issue(self, ops: Sequence[tuple[bool, Any, int, int]]) -> Any:
        """Issue ``ops`` ((is_send, device buffer, peer, tag), ...) as one NCCL group on
        the current stream, after making the communicators they need; the stream.

        Raises:
            InvalidArgumentError: before any message, where a count does not fit the
                binding, or a message to this rank has no receive of its own in the group.
        """
        calls = []
        for is_send, buf, peer, tag in ops:
            count, datatype = wire(buf)
            method = "send" if is_send else "recv"
            check_count(self._nccl.NcclCommunicator, method, count,
                        f"a send to rank {peer}" if is_send else f"a receive from rank {peer}")
            calls.append((method, buf.data.ptr, count, datatype, peer, tag))
        self._check_messages_to_self(ops)
        needed = {(peer, tag) for _, _, peer, tag in ops}
        for peer, tag in sorted(needed, key=lambda k: (min(k[0], self.rank),
                                                       max(k[0], self.rank), k[1])):
            if (peer, tag) not in self.pairs:
                self.pairs[peer, tag] = self._make_pair(peer, tag)
        stream = cupy_module().cuda.get_current_stream()
        self._nccl.groupStart()
        try:
            for method, ptr, count, datatype, peer, tag in calls:
                # the peer's rank in the pair's communicator: the lower rank is 0
                getattr(self.pairs[peer, tag], method)(ptr, count, datatype,
                                                       int(peer > self.rank), stream.ptr)
        finally:
            self._nccl.groupEnd()
        return stream

    def _check_messages_to_self(self, ops: Sequence[tuple[bool, Any, int, int]]) -> None:
        """A message to this rank must meet its receive in the same NCCL group (the send
        would otherwise wait for a receive queued behind it on the same stream)."""
        sent: dict[int, list[int]] = {}
        received: dict[int, list[int]] = {}
        for is_send, buf, peer, tag in ops:
            if peer == self.rank:
                (sent if is_send else received).setdefault(tag, []).append(buf.nbytes)
        if sent != received:
            raise InvalidArgumentError(
                f"rank {self.rank}: on backend 'nccl' a message to this rank itself goes in "
                "one NCCL group with a receive of it, of as many bytes: use sendrecv, or "
                "batch_isend_irecv with both")

    @staticmethod
    def _requests(stream: Any, ops: Sequence[tuple[bool, Any, int, int]]) -> list[NCCLPeerRequest]:
        event = cupy_module().cuda.Event(block=False, disable_timing=True)
        event.record(stream)
        return [NCCLPeerRequest(event, Status(peer, tag, buf.nbytes), buf)
                for _, buf, peer, tag in ops]

    def send(self, buf: Any, dest: int, tag: int) -> None:
        self._issue([(True, buf, dest, tag)]).synchronize()

    def recv(self, buf: Any, source: int, tag: int) -> Status:
        self._issue([(False, buf, source, tag)]).synchronize()
        return Status(source, tag, buf.nbytes)  # (NCCL's messages are as long as the receive)

    def sendrecv(self, sendbuf: Any, dest: int, send_tag: int, recvbuf: Any, source: int,
                 recv_tag: int) -> Status:
        self._issue([(True, sendbuf, dest, send_tag), (False, recvbuf, source, recv_tag)]
                    ).synchronize()
        return Status(source, recv_tag, recvbuf.nbytes)

    def isend(self, buf: Any, dest: int, tag: int) -> NCCLPeerRequest:
        return self.batch([(True, buf, dest, tag)])[0]

    def irecv(self, buf: Any, source: int, tag: int) -> NCCLPeerRequest:
        return self.batch([(False, buf, source, tag)])[0]

    def batch(self, ops: Sequence[tuple[bool, Any, int, int]]) -> list[NCCLPeerRequest]:
        """Start ``ops`` ((is_send, device buffer, peer, tag), ...) in one NCCL group, so
        their order on this rank and on their peers does not matter; a request each."""
        return self._requests(self._issue(ops), ops)

    def abort(self) -> None:
        """ncclCommAbort every pair communicator, without waiting for their peers: the
        watchdog's, as a timed-out job ends (``free`` later destroys nothing twice).

        Safe from another thread than the one sending; a communicator whose abort fails
        is passed over, the others are aborted all the same, and nothing is raised.
        """
        for communicator in list(self.pairs.values()):  # a pair may be being made now
            with contextlib.suppress(Exception):  # the job is ending: abort the others
                communicator.abort()

    def free(self) -> None:
        """Destroy the pair communicators and free the private MPI communicator."""
        pairs, self.pairs = self.pairs, {}
        for communicator in pairs.values():
            communicator.destroy()
        from mpi4py import MPI

        if self.comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self.comm.Free()


class NCCLPeerRequest:
    """Messages ``NCCLPeers`` queued on a stream: ``wait()`` waits on the host for the
    event recorded after them and gives the peer (a receive's source); ``test()`` asks
    the event without waiting. The buffer is kept until then."""

    def __init__(self, event: Any, status: Status, keep: Any) -> None:
        self.event, self.status, self.keep = event, status, keep

    def wait(self) -> Status:
        if self.keep is not None:
            self.event.synchronize()
            self.keep = None
        return self.status

    def test(self) -> bool:
        if self.keep is not None and self.event.done:
            self.keep = None
        return self.keep is None
