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

Bytes go as ncclUint8; every algorithm of mpicoll runs over this transport unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..arrays import cupy_module
from . import ScratchPool

NCCL_UINT8 = 1  # ncclDataType_t ncclUint8


def unique_id_over_mpi(comm: Any) -> tuple[int, ...]:
    """Rank 0 makes NCCL's unique id; MPI broadcasts its 128 bytes (no pickle)."""
    from cupy.cuda import nccl

    raw = np.zeros(128, np.int8)
    if comm.Get_rank() == 0:
        raw[:] = nccl.get_unique_id()
    comm.Bcast(raw, 0)
    return tuple(int(b) for b in raw)


class NCCLTransport(ScratchPool):
    """Point-to-point over one ``NcclCommunicator``, bootstrapped over an MPI communicator."""

    def __init__(self, comm: Any) -> None:
        super().__init__()
        from cupy.cuda import nccl

        self._nccl = nccl
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.nccl = nccl.NcclCommunicator(self.size, unique_id_over_mpi(comm), self.rank)
        self._queue: list[tuple[bool, Any, int]] = []  # (is_send, device buffer, peer)
        self._queued = self._issued = 0  # messages ever queued / ever issued: the tickets
        self._device_like = cupy_module().empty(0, np.uint8)
        self._tokens = cupy_module().zeros(2, np.uint8)[:1], cupy_module().zeros(2, np.uint8)[1:]

    def begin(self, like: Any = None) -> None:
        self.use(self._device_like)  # workspace is always on the device

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
        nccl.groupStart()
        try:
            for is_send, buf, peer in queue:
                buf = self._device_buffer(buf, is_send)
                if is_send:
                    comm.send(buf.data.ptr, buf.nbytes, NCCL_UINT8, peer, stream)
                else:
                    comm.recv(buf.data.ptr, buf.nbytes, NCCL_UINT8, peer, stream)
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
        self.nccl.destroy()
