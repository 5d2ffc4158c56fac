"""The MPI backend: NumPy or CuPy arrays over mpi4py point-to-point messages, MPI's own
collectives as ``native`` (``mpi_native``), host messages on the same transport."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgumentError
from .base import PACKED_BYTES, Backend


def mpi_comm(comm: Any) -> Any:
    """``comm`` (default COMM_WORLD) as an mpi4py intracommunicator, or a clear refusal."""
    try:
        from mpi4py import MPI
    except (ImportError, OSError, RuntimeError) as exc:  # no libmpi.so: nothing to load
        raise InvalidArgumentError(
            f"backend 'mpi': mpi4py cannot load an MPI library ({exc}). Install one: "
            "pip install 'mpicoll[mpich]' (MPICH from PyPI), or your system's MPI "
            "(apt install libmpich-dev / libopenmpi-dev, or the cluster's module)") from exc
    comm = MPI.COMM_WORLD if comm is None else comm
    if isinstance(comm, MPI.Comm) and comm == MPI.COMM_NULL:
        raise InvalidArgumentError(
            "comm: MPI.COMM_NULL, which no rank is in (as a Split with MPI.UNDEFINED gives "
            "the ranks outside every group): make a Communicator only where there is one")
    if not isinstance(comm, MPI.Intracomm):
        raise InvalidArgumentError(
            f"comm: expected an mpi4py intracommunicator, got {type(comm).__name__}")
    return comm


class MPIBackend(Backend):
    """The MPI backend over ``comm`` (default COMM_WORLD; collective)."""

    name = "mpi"
    device_only = False
    separate_control = False
    packed_bytes = PACKED_BYTES
    queues_on_stream = False
    auto_prefers_native = False
    has_native = True
    native_is_mpi = True
    traceable = True
    merges_traces = True
    ranks_are_threads = False

    def __init__(self, comm: Any = None) -> None:
        comm = mpi_comm(comm)
        from ..transport.mpi import MPIPeers, MPITransport
        from .mpi_native import NATIVE, check_op

        transport = MPITransport(comm)
        super().__init__(transport, NATIVE, check_op)
        try:
            self.peers = MPIPeers(transport)
        except Exception:
            transport.free()
            raise

    def duplicate(self) -> MPIBackend:
        return MPIBackend(self.transport.comm)

    def sub(self, comm: Any) -> MPIBackend:
        return MPIBackend(comm)
