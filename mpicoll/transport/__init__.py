"""Transports move bytes between ranks; algorithms are written over this interface only.

A transport has a ``rank`` and a ``size`` and moves flat contiguous arrays as raw bytes:
``send``, ``recv``, ``sendrecv`` (a combined exchange that never deadlocks), and the
nonblocking ``isend``/``irecv`` completed together by ``waitall``. Every collective call
starts with ``begin()``, which gives the call a tag of its own so that messages of two
calls can never match. ``scratch`` hands out workspace that is kept between calls, so
hot paths do not allocate per step or per call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ..arrays import cupy_module, is_cupy


class Transport(Protocol):
    rank: int
    size: int

    def begin(self, like: Any = None) -> None: ...
    def use(self, like: Any) -> None: ...
    def send(self, buf: np.ndarray, dest: int) -> None: ...
    def recv(self, buf: np.ndarray, source: int) -> None: ...
    def sendrecv(self, sendbuf: np.ndarray, dest: int, recvbuf: np.ndarray, source: int) -> None: ...
    def isend(self, buf: np.ndarray, dest: int) -> Any: ...
    def irecv(self, buf: np.ndarray, source: int) -> Any: ...
    def waitall(self, requests: Sequence[Any]) -> None: ...
    def scratch(self, count: int, dtype: np.dtype, slot: int = 0, like: Any = None) -> Any: ...


class ScratchPool:
    """Workspace buffers kept between calls, one per slot, grown when a call needs more.

    A caller owns a slot for the length of one algorithm; algorithms document the slots
    they use so that an algorithm calling another never shares one. Workspace lives
    where the call's data lives: ``begin(like)`` (or ``use(like)``) says which array
    library the collective's buffers belong to (NumPy by default, CuPy on a GPU).
    """

    def __init__(self) -> None:
        self._slots: dict[tuple[bool, int], Any] = {}
        self._device = False

    def use(self, like: Any) -> None:
        """Take workspace from ``like``'s array library from now on."""
        self._device = like is not None and type(like) is not np.ndarray and is_cupy(like)

    def scratch(self, count: int, dtype: np.dtype, slot: int = 0, like: Any = None) -> Any:
        dtype = np.dtype(dtype)
        device = self._device if like is None else (type(like) is not np.ndarray and is_cupy(like))
        nbytes = count * dtype.itemsize
        raw = self._slots.get((device, slot))
        if raw is None or raw.nbytes < nbytes:
            # grow geometrically so a slowly growing sweep does not reallocate each call
            size = max(nbytes, 0 if raw is None else 2 * raw.nbytes, 64)
            raw = self._slots[(device, slot)] = (cupy_module().empty(size, np.uint8) if device
                                                 else np.empty(size, np.uint8))
        return raw[:nbytes].view(dtype)
