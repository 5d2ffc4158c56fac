"""What the GPU paths need: CUDA-awareness of MPI, device choice, streams, pinned staging.

Nothing here imports CuPy at module level; the functions that need it import it when a
GPU buffer is in play, so a machine without CUDA imports mpicoll and never calls them.
The decisions (is MPI CUDA-aware? stage or not? which device?) are pure functions of
their inputs, so they are tested without a GPU.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from .arrays import cupy_module
from .errors import InvalidArgumentError

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


def query_mpi_cuda_support(library: Any = None) -> bool | None:
    """Ask the MPI library whether it passes CUDA device buffers (None: it cannot tell).

    Open MPI (and MPICH builds with the extension) answer ``MPIX_Query_cuda_support()``;
    MPICH 4 answers ``MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &flag)``. The
    symbols are looked up in the process, where mpi4py has loaded the MPI library.
    """
    lib = ctypes.CDLL(None) if library is None else library
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

    ``MPICOLL_DEVICE`` when set; else ``current`` when the caller already chose a device
    (a CUDA context is current); else one GPU per local rank: local rank modulo the
    node's device count, so 8 ranks on a 4-GPU node share each GPU by two.
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


def _context_current() -> bool:
    """Whether this thread already has a CUDA context (the user picked a device)."""
    cupy = cupy_module()
    try:
        return bool(cupy.cuda.driver.ctxGetCurrent())
    except Exception:  # an older CuPy without the binding: assume not chosen
        return False


def select_device(comm: Any = None) -> int:
    """Make the device ``choose_device`` picks current for this thread; return it. Call it
    before allocating CuPy arrays; ``comm`` (default COMM_WORLD) tells the local rank."""
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    cupy = cupy_module()
    count = cupy.cuda.runtime.getDeviceCount()
    current = cupy.cuda.runtime.getDevice() if _context_current() else None
    device = choose_device(local_rank_of(comm), count, current)
    cupy.cuda.Device(device).use()
    return device


def current_stream() -> Any:
    return cupy_module().cuda.get_current_stream()


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
        """Start a collective: every block is free again, merged into one if need be."""
        if len(self._blocks) > 1:
            total = max(self._wanted, self.capacity)
            self._blocks.clear()
            self._memory.clear()
            self._allocate(total)
        self._used = self._wanted = 0

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


def require_nccl() -> None:
    """Refuse the NCCL backend clearly where CuPy or its NCCL binding is missing."""
    cupy_module()
    try:
        from cupy.cuda import nccl
    except ImportError as exc:
        raise InvalidArgumentError(
            "backend 'nccl': cupy.cuda.nccl is not available (CuPy built without NCCL; "
            "pip install nvidia-nccl-cu12 or use a CuPy wheel with NCCL)") from exc
    if not getattr(nccl, "available", True):
        raise InvalidArgumentError("backend 'nccl': CuPy reports NCCL unavailable")
