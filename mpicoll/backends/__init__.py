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

from ..errors import InvalidArgumentError, MpicollError
from ..observe.watchdog import DEFAULT_TIMEOUT, making, timeout_setting
from .base import CAPABILITIES, PACKED_BYTES, Backend
from .local import LocalBackend
from .mpi import MPIBackend, mpi_comm
from .nccl import NCCLBackend

BACKENDS = ("mpi", "nccl", "local")
__all__ = ["BACKENDS", "CAPABILITIES", "PACKED_BYTES", "Backend", "LocalBackend",
           "MPIBackend", "NCCLBackend", "make_backend", "mpi_comm", "watched_making"]

_CLASSES: dict[str, type[Backend]] = {"mpi": MPIBackend, "nccl": NCCLBackend,
                                      "local": LocalBackend}


def make_backend(name: Any, comm: Any) -> Backend:
    if isinstance(name, str) and name in _CLASSES:
        return _CLASSES[name](comm)
    raise InvalidArgumentError(
        f"backend: unknown backend {name!r}; expected one of {', '.join(BACKENDS)}")


def watched_making(backend: Any, comm: Any, timeout: Any, site: Any) -> Any:
    """Making a Communicator over MPI (``backend`` "mpi" or "nccl", by name) before it has
    a watch of its own, watched under this rank's timeout (``observe.watchdog.making``): a
    rank that never comes ends the job with a report. A Backend object is a duplicate's,
    made in its parent's watched ``dup()``; the local backend's ranks are threads."""
    if not (isinstance(backend, str) and backend in ("mpi", "nccl")):  # unwatched; an
        rank = getattr(getattr(backend, "transport", None), "rank", 0)  # error of MPI's
        return making(rank, 0, str(getattr(backend, "name", backend)), 0.0, site)  # named
    comm = mpi_comm(comm)  # (its refusal, as the backend's would be)
    try:
        seconds = timeout_setting(timeout)
    except MpicollError:  # (refused on every rank once the settings are agreed)
        seconds = DEFAULT_TIMEOUT
    return making(comm.Get_rank(), comm.Get_size(), backend, seconds, site)
