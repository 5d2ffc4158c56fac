"""The NCCL backend: CuPy arrays over ncclSend/ncclRecv, NCCL's own collectives as
``native`` (``nccl_native``), host messages over MPI (the communicator that bootstrapped
NCCL), the program's own point-to-point messages on NCCL communicators per pair of ranks
and tag."""

from __future__ import annotations

from typing import Any

from .base import Backend
from .mpi import mpi_comm


class NCCLBackend(Backend):
    """The NCCL backend over ``comm`` (collective). ``device``: the GPU this rank
    already runs on (a parent Communicator's), kept; None: chosen by ``select_device``."""

    name = "nccl"
    device_only = True
    separate_control = True
    packed_bytes = -1  # data always goes over NCCL, never in the host packet
    queues_on_stream = True
    auto_prefers_native = True
    has_native = True
    native_is_mpi = False
    traceable = False
    merges_traces = False
    ranks_are_threads = False

    def __init__(self, comm: Any = None, device: int | None = None) -> None:
        comm = mpi_comm(comm)
        from ..buffers.cuda import keep_device, require_nccl, select_device
        from ..transport.mpi import MPITransport
        from ..transport.nccl import NCCLPeers, NCCLTransport
        from .mpi_native import NATIVE as MPI_NATIVE
        from .nccl_native import AVERAGES_ITSELF, NATIVE, nccl_op

        require_nccl(comm)  # collective: a rank without CuPy or NCCL fails everywhere
        device = select_device(comm) if device is None else keep_device(device)
        control = MPITransport(comm)
        try:
            transport = NCCLTransport(control.comm)
        except Exception:
            control.free()
            raise
        try:
            peers = NCCLPeers(control.comm, device)
        except Exception:
            transport.free()
            control.free()
            raise
        super().__init__(transport, NATIVE, nccl_op, control=control,
                         control_native=MPI_NATIVE)
        self.like, self.averages_itself = transport._device_like, AVERAGES_ITSELF
        self.device, self.peers = device, peers

    def duplicate(self) -> NCCLBackend:
        return NCCLBackend(self.control.comm, self.device)

    def sub(self, comm: Any) -> NCCLBackend:
        return NCCLBackend(comm, self.device)
