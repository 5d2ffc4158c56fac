"""The Backend every library's backend is: a transport, a control transport, the
library's own collectives, and its capabilities (see ``Backend``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import UnsupportedDtypeError
from ..ops import Op

# broadcasts up to this many bytes travel in one host message with their header
PACKED_BYTES = 736  # a 1 KiB packet with the 288-byte header: MPI sends it about as fast
# as 8 B (at 2 ranks, MPICH 5: 1.72 us against 1.65; a 4 KiB packet took 2.85), so every
# small broadcast saves 1 us, and one of 737 B to 4 KiB pays a second message

# what a backend can do: every subclass declares each one itself (see Backend)
CAPABILITIES = ("device_only", "separate_control", "packed_bytes", "queues_on_stream",
                "auto_prefers_native", "has_native", "native_is_mpi", "traceable",
                "merges_traces", "ranks_are_threads")


def _no_native(op: Op, dtype: np.dtype) -> None:
    raise UnsupportedDtypeError("this backend has no native collectives")


class Backend:
    """One backend's parts (common to every library) and capabilities (one subclass per
    library declares each: the pipeline reads them, never the library's name).

    Attributes:
        name: "mpi", "nccl" or "local" (``Communicator.backend``; messages).
        transport: what the algorithms' data moves over.
        control: what host messages (headers, counts, fingerprints) move over.
        native: the library's collectives by name, with the algorithms' signatures.
        control_native: the control transport's own collectives ({} on local).
        op_check: raises UnsupportedDtypeError where ``native`` cannot reduce (op, dtype).
        averages_itself: the functions of ``native`` that divide avg themselves (NCCL's
            ncclAvg): the pipeline must not divide again.
        like: the device array a rank without input allocates its result like (NCCL);
            None: NumPy, or the root's kind of array.
        device: the GPU this rank runs on (NCCL: chosen once, when the first Communicator
            is made, and kept by its sub-communicators and duplicates); None elsewhere.
        peers: the program's point-to-point messages.

    Capabilities (class attributes, ``CAPABILITIES``):
        device_only: moves device arrays only (NCCL): a host array is refused where a
            call takes one, and a rank without input allocates its result ``like``.
        separate_control: host messages go over their own transport (NCCL: MPI's), which
            begins its own tag at every call; decided calls, which begin the data
            transport's alone, are not kept.
        packed_bytes: broadcasts (and small "auto" scatters) up to this size go with
            their header in the host packet (-1: never).
        queues_on_stream: calls are queued on a CUDA stream: async_op records an event,
            and a barrier waits until the stream has run it.
        auto_prefers_native: "auto" takes the library's collective wherever it serves.
        has_native: the library has collectives of its own (algorithm="native").
        native_is_mpi: ``native`` is MPI's own collectives on the transport's
            communicator: a decided call may call them directly on host arrays
            (``native.host_direct``), a plan keep one as MPI's persistent request.
        traceable: the tracer can wrap the transport (trace=True).
        merges_traces: a trace file (trace=path, ``write_trace``) is merged over the
            transport (MPI).
        ranks_are_threads: the ranks are threads of this process (local), and no MPI is
            in play: the LocalWorld keeps the timeout, a stall raises in the waiting
            thread instead of ending the job, a split makes a sub-world.
    """

    name: str
    device_only: bool
    separate_control: bool
    packed_bytes: int
    queues_on_stream: bool
    auto_prefers_native: bool
    has_native: bool
    native_is_mpi: bool
    traceable: bool
    merges_traces: bool
    ranks_are_threads: bool

    averages_itself: frozenset = frozenset()
    like: Any = None

    def __init__(self, transport: Any, native: dict[str, Callable[..., None]],
                 op_check: Callable[[Op, np.dtype], object], *, control: Any = None,
                 control_native: dict[str, Callable[..., None]] | None = None) -> None:
        self.transport, self.native, self.op_check = transport, native, op_check
        self.control = transport if control is None else control
        self.control_native = native if control_native is None else control_native
        self.device: int | None = None
        self.peers: Any = None

    def duplicate(self) -> Backend:
        """The same backend on a duplicate of its communicator (collective)."""
        raise NotImplementedError

    def sub(self, comm: Any) -> Backend:
        """The same backend over ``comm``, an MPI communicator split from this one's
        (collective over ``comm``), every rank keeping the GPU it runs on here."""
        raise NotImplementedError(f"backend {self.name!r} splits its own way")

    def split(self, color: int | None, key: int, colors: np.ndarray,
              keys: np.ndarray) -> Backend | None:
        """The backend of this rank's group of a split (collective), None where ``color``
        is None. ``color``, ``key``: this rank's; ``colors``, ``keys``: every rank's, as
        agreed. Here: MPI_Comm_split of the control communicator, then ``sub``."""
        from mpi4py import MPI

        from ..transport.mpi import new_comm

        parent = self.control.comm  # the private duplicate: every rank is at this same point
        sub = new_comm(lambda: parent.Split(MPI.UNDEFINED if color is None else int(color),
                                            int(key)), "split")
        if sub == MPI.COMM_NULL:
            return None
        try:  # every rank keeps what it runs on (NCCL: its GPU), whatever its rank in the group
            return self.sub(sub)
        finally:
            sub.Free()  # the new backend works on its own duplicate

    def free(self) -> None:
        if self.peers is not None:
            self.peers.free()
        for t in {id(self.transport): self.transport, id(self.control): self.control}.values():
            t.free()

    def force_cuda_aware(self, forced: bool | None) -> None:
        """``MPICOLL_CUDA_AWARE`` as the Communicator read it when it was made: the MPI
        transports give device buffers to MPI as they are (True) or stage them (False);
        None leaves it to the MPI library's answer at the first device buffer."""
        if forced is not None:
            for t in (self.transport, self.control):
                if hasattr(t, "force_cuda_aware"):
                    t.force_cuda_aware(forced)
