"""Backends: a transport, a control transport, the library's own collectives, and what
the backend can do, in one object (torch.distributed's ``backend_capability`` table, as
an object per backend instead of string branches through the Communicator).

- ``mpi``: NumPy or CuPy arrays over mpi4py point-to-point messages; MPI's collectives
  as ``native``; host messages (headers, counts, fingerprints) on the same transport.
- ``nccl``: CuPy arrays over ncclSend/ncclRecv; NCCL's collectives as ``native``; host
  messages over MPI (the communicator that bootstrapped NCCL); the program's own
  point-to-point messages on NCCL communicators per pair of ranks and tag.
- ``local``: ranks as threads of one process; no ``native``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import InvalidArgumentError, UnsupportedDtypeError
from .ops import Op

BACKENDS = ("mpi", "nccl", "local")

# broadcasts up to this many bytes travel in one host message with their header
PACKED_BYTES = 4096


def _no_native(op: Op, dtype: np.dtype) -> None:
    raise UnsupportedDtypeError("this backend has no native collectives")


class Backend:
    """One backend's parts and capabilities.

    Attributes:
        name: "mpi", "nccl" or "local".
        transport: what the algorithms' data moves over.
        control: what host messages (headers, counts, fingerprints) move over.
        native: the library's collectives by name, with the algorithms' signatures.
        control_native: the control transport's own collectives ({} on local).
        op_check: raises UnsupportedDtypeError where ``native`` cannot reduce (op, dtype).
        like: the array a rank without input allocates its result like (None: NumPy).
        packed_bytes: broadcasts up to this size go with their header (-1: never).
        queues_on_stream: calls are queued on a CUDA stream (async_op records an event).
        auto_prefers_native: "auto" takes the library's collective wherever it serves.
        traceable: the tracer can wrap the transport.
        device: the GPU this rank runs on (NCCL: chosen once, when the first Communicator
            is made, and kept by its sub-communicators and duplicates); None elsewhere.
        peers: the program's point-to-point messages (None: not on this backend).
    """

    def __init__(self, name: str, transport: Any, native: dict[str, Callable[..., None]],
                 op_check: Callable[[Op, np.dtype], object], *, control: Any = None,
                 control_native: dict[str, Callable[..., None]] | None = None,
                 like: Any = None, packed_bytes: int = PACKED_BYTES,
                 queues_on_stream: bool = False, auto_prefers_native: bool = False,
                 traceable: bool = True, averages_itself: frozenset = frozenset(),
                 make_duplicate: Callable[[], Backend],
                 make_sub: Callable[[Any], Backend] | None = None) -> None:
        self.name, self.transport, self.native, self.op_check = name, transport, native, op_check
        self.control = transport if control is None else control
        self.control_native = native if control_native is None else control_native
        self.separate_control = control is not None  # host messages apart from data (NCCL)
        self.has_native = bool(native)
        self.like, self.packed_bytes = like, packed_bytes
        self.queues_on_stream = queues_on_stream
        self.auto_prefers_native = auto_prefers_native
        self.traceable = traceable
        self.averages_itself = averages_itself  # native functions that divide avg themselves
        self._make_duplicate = make_duplicate
        self._make_sub = make_sub  # None: the backend splits its own way (local)
        self.device: int | None = None
        self.peers: Any = None


    def duplicate(self) -> Backend:
        """The same backend on a duplicate of its communicator (collective)."""
        return self._make_duplicate()

    def sub(self, comm: Any) -> Backend:
        """The same backend over ``comm``, an MPI communicator split from this one's
        (collective over ``comm``), every rank keeping the GPU it runs on here."""
        return self._make_sub(comm)

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
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise InvalidArgumentError(
            f"comm: expected an mpi4py intracommunicator, got {type(comm).__name__}")
    return comm


def mpi_backend(comm: Any = None) -> Backend:
    comm = mpi_comm(comm)
    from .native import NATIVE, check_op
    from .transport.mpi import MPIPeers, MPITransport

    transport = MPITransport(comm)
    backend = Backend("mpi", transport, NATIVE, check_op,
                      make_duplicate=lambda: mpi_backend(transport.comm), make_sub=mpi_backend)
    try:
        backend.peers = MPIPeers(transport)
    except Exception:
        transport.free()
        raise
    return backend


def nccl_backend(comm: Any = None, device: int | None = None) -> Backend:
    """The NCCL backend over ``comm`` (collective). ``device``: the GPU this rank
    already runs on (a parent Communicator's), kept; None: chosen by ``select_device``."""
    comm = mpi_comm(comm)
    from .cuda import keep_device, require_nccl, select_device
    from .native import NATIVE as MPI_NATIVE
    from .native_nccl import AVERAGES_ITSELF, NATIVE, nccl_op
    from .transport.mpi import MPITransport
    from .transport.nccl import NCCLPeers, NCCLTransport

    require_nccl(comm)  # collective: a rank without CuPy or NCCL fails everywhere
    device = select_device(comm) if device is None else keep_device(device)
    control = MPITransport(comm)
    try:
        transport = NCCLTransport(control.comm)
    except Exception:
        control.free()
        raise
    try:
        peers = NCCLPeers(control.comm)
    except Exception:
        transport.free()
        control.free()
        raise
    backend = Backend("nccl", transport, NATIVE, nccl_op, control=control,
                      control_native=MPI_NATIVE, like=transport._device_like,
                      packed_bytes=-1,  # data always goes over NCCL, never in the host packet
                      queues_on_stream=True, auto_prefers_native=True, traceable=False,
                      averages_itself=AVERAGES_ITSELF,
                      make_duplicate=lambda: nccl_backend(control.comm, device),
                      make_sub=lambda sub: nccl_backend(sub, device))
    backend.device, backend.peers = device, peers
    return backend


def local_backend(endpoint: Any) -> Backend:
    from .transport.local import LocalTransport

    if not isinstance(endpoint, LocalTransport):
        raise InvalidArgumentError("comm: backend 'local' takes a LocalWorld endpoint")
    from .transport.local import LocalPeers

    backend = Backend("local", endpoint, {}, _no_native,
                      make_duplicate=lambda: local_backend(endpoint.duplicate()))
    backend.peers = LocalPeers(endpoint)
    return backend


def make_backend(name: Any, comm: Any) -> Backend:
    if name == "mpi":
        return mpi_backend(comm)
    if name == "nccl":
        return nccl_backend(comm)
    if name == "local":
        return local_backend(comm)
    raise InvalidArgumentError(
        f"backend: unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")
