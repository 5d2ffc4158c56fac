"""What the GPU paths need: CUDA-awareness of MPI, device choice, streams, pinned staging.

Nothing here imports CuPy at module level; the functions that need it import it when a
GPU buffer is in play, so a machine without CUDA imports mpicoll and never calls them.
The decisions (is MPI CUDA-aware? stage or not? which device?) are pure functions of
their inputs, so they are tested without a GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from .arrays import DLPACK_CUDA, DLPACK_CUDA_MANAGED, cupy_module, device_cupy, is_cupy

_CUDA_AWARE_ENV = "MPICOLL_CUDA_AWARE"
_DEVICE_ENV = "MPICOLL_DEVICE"


def parse_flag(value: str | None, name: str) -> bool | None:
    """``"1"``/``"0"`` (also yes/no, true/false) as a bool; None when unset or empty."""
    if value is None or value.strip() == "":
        return None
    v = value.strip().lower()
    if v in ("1", "yes", "true", "on"):
        return True
    if v in ("0", "no", "false", "off"):
        return False
    raise InvalidArgumentError(f"{name}={value!r}: expected 0 or 1")


def mpi_libraries() -> list[Any]:
    """ctypes handles in which to look for the MPI library's symbols: the library
    mpi4py's extension loaded (its dependencies are searched through its handle; the
    process's global namespace does not have them, as Python loads extensions locally),
    then the process itself."""
    from mpi4py import MPI

    handles = []
    for path in (getattr(MPI, "__file__", None), None):
        try:
            handles.append(ctypes.CDLL(path))
        except OSError:
            continue
    return handles


def query_mpi_cuda_support(library: Any = None) -> bool | None:
    """Ask the MPI library whether it passes CUDA device buffers (None: it cannot tell).

    Open MPI (and MPICH builds with the extension) answer ``MPIX_Query_cuda_support()``;
    MPICH 4 answers ``MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &flag)``. Without
    ``library``, the MPI library mpi4py loaded is asked (``mpi_libraries``).
    """
    for lib in mpi_libraries() if library is None else [library]:
        query = getattr(lib, "MPIX_Query_cuda_support", None)
        if query is not None:
            query.restype = ctypes.c_int
            query.argtypes = []
            return bool(query())
        query = getattr(lib, "MPIX_GPU_query_support", None)
        if query is not None:
            flag = ctypes.c_int(0)
            query.restype = ctypes.c_int
            if query(ctypes.c_int(0), ctypes.byref(flag)) == 0:  # 0: MPIX_GPU_SUPPORT_CUDA
                return bool(flag.value)
    return None


def cuda_aware_mpi(environ: Mapping[str, str] | None = None, library: Any = None) -> bool:
    """Whether device buffers go straight to MPI: ``MPICOLL_CUDA_AWARE`` when set, else
    what the MPI library says, else no (staging is always correct)."""
    environ = os.environ if environ is None else environ
    forced = parse_flag(environ.get(_CUDA_AWARE_ENV), _CUDA_AWARE_ENV)
    if forced is not None:
        return forced
    return bool(query_mpi_cuda_support(library))


def choose_device(local_rank: int, device_count: int, current: int | None = None,
                  environ: Mapping[str, str] | None = None) -> int:
    """The CUDA device a rank uses.

    ``MPICOLL_DEVICE`` when set; else ``current`` when the caller chose a device; else
    one GPU per local rank: local rank modulo the node's device count (so 8 ranks on a
    4-GPU node share each GPU by two: the MPI backend's way; NCCL refuses it, see
    ``check_one_gpu_per_rank``).
    """
    if device_count < 1:
        raise InvalidArgumentError("no CUDA device is visible to this rank")
    environ = os.environ if environ is None else environ
    forced = environ.get(_DEVICE_ENV, "").strip()
    if forced:
        if not forced.isdigit() or int(forced) >= device_count:
            raise InvalidArgumentError(
                f"{_DEVICE_ENV}={forced!r}: expected a device index below {device_count}")
        return int(forced)
    if current is not None:
        return current
    return local_rank % device_count


def local_rank_of(comm: Any) -> int:
    """This rank's index among the ranks on its node (``Split_type(COMM_TYPE_SHARED)``)."""
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED, comm.Get_rank())
    try:
        return node.Get_rank()
    finally:
        node.Free()


# -- agreeing before anything that could hang ---------------------------------------------
#
# A rank that cannot use the GPU must not raise alone: the others would wait for it in
# the next collective (NCCL's bootstrap waits forever). Each rank names its problem by a
# code, every rank learns every rank's code (an Allgather of one integer, no pickle), and
# either all go on or all raise the same error, naming the ranks and the reasons.

OK, NO_CUPY, NO_NCCL, NO_DRIVER, NO_DEVICE, BAD_DEVICE, SHARED_GPU, NO_UNIQUE_ID, \
    NCCL_INIT = range(9)
REASONS = {
    NO_CUPY: "CuPy is not installed (pip install mpicoll[cuda12])",
    NO_NCCL: "CuPy has no NCCL (pip install nvidia-nccl-cu12)",
    NO_DRIVER: "no usable CUDA driver (none, or one too old for this CuPy)",
    NO_DEVICE: "no CUDA device is visible",
    BAD_DEVICE: f"{_DEVICE_ENV} names no visible device",
    SHARED_GPU: "shares its GPU with another rank of its node (NCCL needs one GPU per rank: "
                f"run fewer ranks per node, or give each its own with {_DEVICE_ENV} or "
                "CUDA_VISIBLE_DEVICES)",
    NO_UNIQUE_ID: "could not create NCCL's unique id",
    NCCL_INIT: "could not start NCCL",
}


def agree(comm: Any, code: int, detail: str, what: str) -> None:
    """Collective: go on where every rank's ``code`` is OK; else raise the same error on
    every rank, naming each failing rank's reason (and this rank's own ``detail``).

    Raises:
        InvalidArgumentError: some rank cannot go on.
    """
    codes = np.empty(comm.Get_size(), np.int64)
    comm.Allgather(np.array([code], np.int64), codes)
    if not codes.any():
        return
    ranks: dict[int, list[int]] = {}
    for rank, c in enumerate(codes.tolist()):
        if c != OK:
            ranks.setdefault(c, []).append(rank)
    reasons = "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: "
                        f"{REASONS.get(c, f'problem {c}')}" for c, r in ranks.items())
    here = f" [rank {comm.Get_rank()}: {detail}]" if code != OK and detail else ""
    raise InvalidArgumentError(f"{what}: {reasons}{here}")


def gpu_status(need_nccl: bool = False, need_device: bool = True) -> tuple[int, str]:
    """(code, detail) of what keeps this rank off the GPU (``OK``, "" when nothing):
    CuPy, NCCL when ``need_nccl``, a CUDA driver and a device when ``need_device``."""
    try:
        import cupy
    except ImportError as exc:
        return NO_CUPY, str(exc)
    if need_nccl:
        try:
            from cupy.cuda import nccl
        except ImportError as exc:
            return NO_NCCL, str(exc)
        if not getattr(nccl, "available", True):
            return NO_NCCL, "cupy.cuda.nccl.available is False"
    if not need_device:
        return OK, ""
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError, or no driver library
        return NO_DRIVER, f"{type(exc).__name__}: {exc}"
    return (OK, "") if count > 0 else (NO_DEVICE, "cudaGetDeviceCount() == 0")


def select_device(comm: Any = None) -> int:
    """Collective: make the device ``choose_device`` picks current for this thread, and
    return it. Call it before allocating CuPy arrays; ``comm`` (default COMM_WORLD) tells
    the local rank.

    A device other than 0 already current counts as the caller's choice; device 0 does
    not (every thread starts there, and any CuPy allocation makes a context on it).
    This is for a rank's first choice only: a sub-communicator or a duplicate keeps its
    parent's device (``keep_device``), since neither its rank there nor the device
    current on the thread that makes it says which GPU the rank runs on.

    Raises:
        InvalidArgumentError: on every rank, when any rank has no CuPy, CUDA driver or
            device, or a bad ``MPICOLL_DEVICE``.
    """
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    local_rank = local_rank_of(comm)
    code, detail = gpu_status()
    device = 0
    if code == OK:
        cupy = cupy_module()
        current = cupy.cuda.runtime.getDevice()
        try:
            device = choose_device(local_rank, cupy.cuda.runtime.getDeviceCount(),
                                   current or None)
        except InvalidArgumentError as exc:
            code, detail = BAD_DEVICE, str(exc)
    agree(comm, code, detail, "select_device: not every rank has a GPU")
    cupy_module().cuda.Device(device).use()
    return device


def keep_device(device: int) -> int:
    """Make ``device``, the GPU this rank already runs on (its parent Communicator's),
    current for this thread, and return it: nothing is chosen again.

    A sub-communicator's ranks are not in their parent's order (``new_group`` of the
    ranks reversed, ``split`` by key), and the thread that makes one may have any device
    current (device 0 on a new thread), so choosing again by either would move a rank
    onto a GPU another rank already uses.
    """
    cupy_module().cuda.Device(device).use()
    return device


def require_nccl(comm: Any = None) -> None:
    """Refuse the NCCL backend clearly where CuPy or its NCCL binding is missing, and
    with ``comm`` (collective) also a CUDA driver or device, on every rank of ``comm``.

    Without ``comm`` only the installed software is checked, which every rank of a job
    finds alike; what may differ from rank to rank (a driver, a device) is left to the
    collective checks that follow (``select_device``, ``check_one_gpu_per_rank``).
    """
    code, detail = gpu_status(need_nccl=True, need_device=comm is not None)
    if comm is not None:
        agree(comm, code, detail, "backend 'nccl' cannot start")
    elif code != OK:
        raise InvalidArgumentError(f"backend 'nccl' cannot start: {REASONS[code]} ({detail})")


def pci_bus_number(bus_id: str) -> int:
    """A GPU's PCI address ("0000:3b:00.0": domain, bus, device, function) as one int."""
    domain, bus, rest = bus_id.strip().split(":")
    device, function = rest.split(".")
    return (((int(domain, 16) << 8 | int(bus, 16)) << 8 | int(device, 16)) << 4) | int(function, 16)


def check_one_gpu_per_rank(comm: Any) -> None:
    """Collective: refuse, on every rank, where any rank cannot reach a GPU or two ranks
    of one node use the same GPU (NCCL would fail later with "Duplicate GPU detected",
    or hang the ranks that got further).

    GPUs are told apart by PCI address, so ranks that see different devices as device 0
    (``CUDA_VISIBLE_DEVICES``) are not taken for one.
    """
    from mpi4py import MPI

    code, detail = gpu_status(need_nccl=True)
    bus = -1
    if code == OK:
        cupy = cupy_module()
        bus = pci_bus_number(cupy.cuda.Device(cupy.cuda.runtime.getDevice()).pci_bus_id)
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, comm.Get_rank())
    leader = np.array([comm.Get_rank()], np.int64)
    try:
        node.Allreduce(MPI.IN_PLACE, leader, MPI.MIN)  # the node's first rank names it
    finally:
        node.Free()
    table = np.empty((comm.Get_size(), 3), np.int64)
    comm.Allgather(np.array([code, leader[0], bus], np.int64), table)
    users: dict[tuple[int, int], list[int]] = {}
    for rank, (c, node_id, gpu) in enumerate(table.tolist()):
        if c == OK:
            users.setdefault((node_id, gpu), []).append(rank)
    if code == OK and len(users[int(leader[0]), bus]) > 1:
        code = SHARED_GPU
        detail = (f"ranks {', '.join(map(str, users[int(leader[0]), bus]))} all use "
                  f"GPU {cupy_module().cuda.runtime.getDevice()} (PCI {bus:#x})")
    agree(comm, code, detail, "backend 'nccl' cannot start")


def on_gpu(x: Any) -> bool:
    """Whether ``x`` is a CuPy array or a CUDA ``__dlpack__`` tensor (torch, JAX)."""
    if is_cupy(x):
        return True
    try:
        return int(x.__dlpack_device__()[0]) in (DLPACK_CUDA, DLPACK_CUDA_MANAGED)
    except Exception:  # noqa: BLE001 - not a DLPack tensor, or one that cannot tell
        return False


def current_stream() -> Any:
    return cupy_module().cuda.get_current_stream()


def stream_device(stream: Any = None) -> int:
    """The device ``stream`` runs on, as this thread sees it now.

    A stream CuPy made with ``Stream()`` knows its device; ``Stream.null``,
    ``Stream.ptds``, the current stream where none was set (one of those), and an
    ``ExternalStream`` made without ``device_id`` have ``device_id == -1``: the stream of
    whichever device is current. For those (and for no stream) that is the current
    device, never ``Device(-1)``, which CUDA refuses.
    """
    device = getattr(stream, "device_id", None)
    if device is None or int(device) < 0:
        return int(cupy_module().cuda.runtime.getDevice())
    return int(device)


_PER_THREAD_STREAM = 2  # cudaStreamPerThread: the handle of each thread's default stream


def capture_device_and_stream(stream: Any = None,
                              buffers: Iterable[Any] = ()) -> Callable[[], AbstractContextManager]:
    """What a call made on this thread runs under on another one (a progress thread):
    call it on the caller's thread at submit time; the progress thread enters the
    context it returns around the call.

    CUDA's current device and stream belong to a thread: a progress thread starts on
    device 0 and CuPy's null stream, so a call it ran as it is would allocate on device 0
    for a rank of GPU k, and run unordered after the caller's stream. The context makes
    the caller's device and stream (``stream`` when given) current again, and at its end
    waits for that stream, so the result is ready when the call's ``Work`` finishes.
    Where no GPU is in play (no ``stream``, no CuPy buffer, and a host array given or
    CuPy never imported), it does nothing. A call given no array at all (a receiver's
    ``broadcast(None)``, ``scatter``; a ``scatter_v`` root's list of rows) may still
    make a GPU result, as the root's header says: it runs on the caller's device too.
    """
    buffers = [*buffers]
    rows = [r for b in buffers if isinstance(b, (list, tuple)) for r in b]
    if stream is None and not any(on_gpu(b) for b in (*buffers, *rows)):
        if "cupy" not in sys.modules or any(
                isinstance(b, np.ndarray) or hasattr(b, "__dlpack__")
                for b in (*buffers, *rows)):
            return contextlib.nullcontext
        try:  # (no driver, no device: a host call, then)
            cupy = device_cupy()
            device = stream_device(None)
        except Exception:  # noqa: BLE001 - no GPU to run on
            return contextlib.nullcontext
        return _on(cupy, device, cupy.cuda.get_current_stream())
    cupy = cupy_module()
    device = stream_device(stream)
    stream = cupy.cuda.get_current_stream() if stream is None else stream
    return _on(cupy, device, stream)


def _on(cupy: Any, device: int, stream: Any) -> Callable[[], AbstractContextManager]:
    """``capture_device_and_stream``'s context: ``device`` and ``stream`` current, the
    stream waited for at its end."""
    # the per-thread default stream (CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1, Stream.ptds)
    # is each thread's own: on the progress thread it names another stream, which waits
    # (on the GPU) for what the caller's had queued by now
    after = stream.record() if getattr(stream, "ptr", None) == _PER_THREAD_STREAM else None

    @contextlib.contextmanager
    def callers_device_and_stream() -> Iterator[None]:
        with cupy.cuda.Device(device), stream:
            if after is not None:
                stream.wait_event(after)
            yield
            stream.synchronize()

    return callers_device_and_stream


class PinnedStaging:
    """Page-locked host memory that device buffers are staged through when MPI is not
    CUDA-aware, kept for the communicator's life.

    Allocation is a bump pointer over one pinned block: a blocking message takes space
    and gives it back when it completes; a nonblocking one keeps it until ``reset`` at
    the start of the next collective. When a call needs more, another block joins for the
    rest of the call, and at the next reset the blocks are merged into one big enough,
    so a steady workload allocates pinned memory only while it grows.
    """

    def __init__(self) -> None:
        self._blocks: list[np.ndarray] = []  # host views of pinned memory
        self._memory: list[Any] = []  # the PinnedMemoryPointers keeping them alive
        self._used = 0  # bytes taken from the last block
        self._wanted = 0  # bytes this call has asked for in all
        self._readers: dict[int, Any] = {}  # streams with copies from this memory queued

    def read_on(self, stream: Any) -> None:
        """A host-to-device copy from this memory is queued on ``stream``: it reads the
        memory when the stream gets there, so the memory is not reused before that."""
        self._readers[id(stream)] = stream

    @property
    def capacity(self) -> int:
        return sum(b.nbytes for b in self._blocks)

    def _allocate(self, nbytes: int) -> None:
        cupy = cupy_module()
        memory = cupy.cuda.alloc_pinned_memory(nbytes)
        self._memory.append(memory)
        self._blocks.append(np.frombuffer(memory, np.uint8, nbytes))
        self._used = 0

    def reset(self) -> None:
        """Start a collective: every block is free again, merged into one if need be,
        once every stream that copies from it (the last call's, whichever) has done so."""
        for stream in self._readers.values():
            stream.synchronize()
        self._readers.clear()
        if len(self._blocks) > 1:
            total = max(self._wanted, self.capacity)
            self._blocks.clear()
            self._memory.clear()
            self._allocate(total)
        self._used = self._wanted = 0

    def drain(self) -> None:
        """Wait until no queued copy reads this memory any more (it is let go next)."""
        for stream in self._readers.values():
            stream.synchronize()
        self._readers.clear()

    def mark(self) -> tuple[int, int]:
        return len(self._blocks), self._used

    def release(self, mark: tuple[int, int]) -> None:
        """Give back what was taken since ``mark`` (a blocking message has completed)."""
        if mark[0] == len(self._blocks):
            self._used = mark[1]

    def take(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of pinned host memory, 256-byte aligned."""
        if nbytes == 0:  # its own address: MPI refuses aliased buffers, even empty ones
            return np.empty(0, np.uint8)
        self._wanted += nbytes
        start = -(-self._used // 256) * 256
        if not self._blocks or start + nbytes > self._blocks[-1].nbytes:
            self._allocate(max(nbytes, 2 * self.capacity, 1 << 20))
            start = 0
        self._used = start + nbytes
        return self._blocks[-1][start:start + nbytes]
