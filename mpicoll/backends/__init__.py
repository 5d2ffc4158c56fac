"""Backends: a transport, a control transport, the library's own collectives, and what
the backend can do, in one object: a class per library (torch.distributed's
``backend_capability`` table, as class attributes instead of string branches through
the pipeline).

- ``MPIBackend`` ("mpi"): NumPy or CuPy arrays over mpi4py point-to-point messages;
  MPI's collectives as ``native``; host messages (headers, counts, fingerprints) on the
  same transport.
- ``NCCLBackend`` ("nccl"): CuPy arrays over ncclSend/ncclRecv; NCCL's collectives as
  ``native``; host messages over MPI (the communicator that bootstrapped NCCL); the
  program's own point-to-point messages on NCCL communicators per pair of ranks and tag.
- ``LocalBackend`` ("local"): ranks as threads of one process; no ``native``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError, UnsupportedDtypeError
from ..ops import Op

BACKENDS = ("mpi", "nccl", "local")

# broadcasts up to this many bytes travel in one host message with their header
PACKED_BYTES = 4096

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

        parent = self.control.comm  # the private duplicate: every rank is at this same point
        sub = parent.Split(MPI.UNDEFINED if color is None else int(color), int(key))
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


class LocalBackend(Backend):
    """The local backend of one rank: ``endpoint``, a LocalWorld's endpoint."""

    name = "local"
    device_only = False
    separate_control = False
    packed_bytes = PACKED_BYTES
    queues_on_stream = False
    auto_prefers_native = False
    has_native = False
    native_is_mpi = False
    traceable = True
    merges_traces = False
    ranks_are_threads = True

    def __init__(self, endpoint: Any) -> None:
        from ..transport.local import LocalPeers, LocalTransport

        if not isinstance(endpoint, LocalTransport):
            raise InvalidArgumentError("comm: backend 'local' takes a LocalWorld endpoint")
        super().__init__(endpoint, {}, _no_native)
        self.peers = LocalPeers(endpoint)
        self._splits = 0  # splits so far: the same on every rank, names each sub-world

    def duplicate(self) -> LocalBackend:
        return LocalBackend(self.transport.duplicate())

    def split(self, color: int | None, key: int, colors: np.ndarray,
              keys: np.ndarray) -> LocalBackend | None:
        """A sub-world of this rank's group, its members in (key, rank) order, as
        MPI_Comm_split orders them."""
        self._splits += 1
        if color is None:
            return None
        t = self.transport
        members = sorted((int(keys[r]), r) for r in range(t.size) if colors[r] == color)
        rank = [r for _, r in members].index(t.rank)
        world = t.world.subworld(self._splits, int(color), len(members))
        endpoint = world.endpoint(rank)
        endpoint.job_rank = t.job_rank  # its node is the job rank's
        return LocalBackend(endpoint)


_CLASSES: dict[str, type[Backend]] = {"mpi": MPIBackend, "nccl": NCCLBackend,
                                      "local": LocalBackend}


def make_backend(name: Any, comm: Any) -> Backend:
    if isinstance(name, str) and name in _CLASSES:
        return _CLASSES[name](comm)
    raise InvalidArgumentError(
        f"backend: unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")
