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

Each in its own file (``mpi.py``, ``nccl.py``, ``local.py``) beside the library's own
collectives (``mpi_native.py``, ``nccl_native.py``); ``base.py`` is what they share.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgumentError
from .base import CAPABILITIES, PACKED_BYTES, Backend
from .local import LocalBackend
from .mpi import MPIBackend, mpi_comm
from .nccl import NCCLBackend

BACKENDS = ("mpi", "nccl", "local")
__all__ = ["BACKENDS", "CAPABILITIES", "PACKED_BYTES", "Backend", "LocalBackend",
           "MPIBackend", "NCCLBackend", "make_backend", "mpi_comm"]

_CLASSES: dict[str, type[Backend]] = {"mpi": MPIBackend, "nccl": NCCLBackend,
                                      "local": LocalBackend}


def make_backend(name: Any, comm: Any) -> Backend:
    if isinstance(name, str) and name in _CLASSES:
        return _CLASSES[name](comm)
    raise InvalidArgumentError(
        f"backend: unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")
